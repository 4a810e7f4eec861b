"""Reading a component's Prometheus page."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(port: int) -> dict[tuple, float]:
    """Every sample on the page: (name, sorted labels) -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(page: dict, name: str, **labels) -> float:
    """The sum of ``name`` over the series whose labels include ``labels``."""
    return sum(v for (n, ls), v in page.items() if n == name and labels.items() <= dict(ls).items())
