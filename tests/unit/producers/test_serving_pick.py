"""The reading of a whole page picks the lines it reads (``engines._picked``) before the client
library's parser reads them: on any page in Prometheus' text format, what it picks must read as
the library reads the whole page. Pages are drawn as the format allows them (each metric one
group, its HELP and TYPE lines optional and first; samples without a TYPE line untyped), with the
engine's own metric names among others that share their prefixes, labels of models and of
ranks (an engine's copies of one view: ``Engine.copies``), label values holding any
character (line separators other than ``\\n`` included), and blank lines, comments, carriage
returns and leading blanks where the format lets a line have them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.serving import engines
from producers.serving.engines import ENGINES, EndpointError, ModelError, parse
from tests.support.serving_pages import by_the_library, models, same

TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def names_of(engine: str) -> list[str]:
    """Metric names for a page of ``engine``: those it reads, and others beside them that share
    their beginnings (a longer name, a shorter one, another of the engine's metrics)."""
    read = sorted(engines._families(ENGINES[engine])[0])
    prefix = ENGINES[engine].prefix
    return read + [f"{n}_extra" for n in read[:4]] + [n[:-3] for n in read[:4]] + [f"{prefix}histogram_seconds",
                                                                                  f"{prefix}x"]


label_values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
values = st.one_of(st.integers(0, 10**12).map(str), st.floats(0, 1e9, allow_nan=False).map(repr),
                   st.sampled_from(["NaN", "+Inf", "0", "2.5E-3"]))


def escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def group(draw, name: str) -> list[str]:
    """One metric's lines: optional HELP and TYPE, then its samples over a few label sets."""
    typ = draw(st.sampled_from(TYPES))
    typed = typ != "untyped" or draw(st.booleans())  # (an untyped metric may say so, or not)
    comments = [f"# TYPE {name} {typ}"] if typed else []
    if draw(st.booleans()):
        comments.insert(draw(st.integers(0, len(comments))), f"# HELP {name} what it counts")
    keys = st.sampled_from(["model_name", "model", "engine", "tp_rank", "dp_rank"])
    label_sets = draw(st.lists(st.dictionaries(keys, label_values, max_size=2), min_size=1, max_size=3))
    suffixes = {"histogram": [("_bucket", {"le": "1.0"}), ("_bucket", {"le": "+Inf"}), ("_sum", {}), ("_count", {})],
                "summary": [("", {"quantile": "0.5"}), ("_sum", {}), ("_count", {})]}.get(typ, [("", {})])
    lines = []
    for labels in label_sets:
        for suffix, extra in suffixes:
            pairs = ",".join(f'{k}="{escaped(v)}"' for k, v in {**labels, **extra}.items())
            head = name + suffix + (f"{{{pairs}}}" if pairs else "")
            sep = draw(st.sampled_from([" ", " ", " ", "\t", "  "]))
            stamp = draw(st.sampled_from(["", "", "", " 1700000000000"]))
            lines.append(draw(st.sampled_from(["", "", " ", "\t"])) + head + sep + draw(values) + stamp
                         + draw(st.sampled_from(["", "", "\r"])))
    return comments + lines


@st.composite
def page(draw) -> tuple[str, str]:
    engine = draw(st.sampled_from(sorted(ENGINES)))
    chosen = draw(st.lists(st.sampled_from(names_of(engine)), min_size=1, max_size=8, unique=True))
    lines: list[str] = []
    for name in chosen:
        lines += draw(group(name))
        lines += draw(st.sampled_from([[], [], [""], ["# a comment"]]))
    return engine, "\n".join(lines) + draw(st.sampled_from(["\n", ""]))


@settings(max_examples=600, deadline=None)
@given(page())
def test_what_is_picked_reads_as_the_whole_page(drawn):
    engine, text = drawn
    expected = by_the_library(text, engine)
    wanted = set(engines._named(ENGINES[engine]))
    if not any(n in expected for r in ENGINES[engine].requests for n in (r, f"{r}_total")):
        try:
            parse(text, engine)
        except EndpointError:
            return
        raise AssertionError("a page without the engine's request counter was read")
    served = models(text, engine)
    if len(served) > 1:  # (a page of several models is read for one named: its samples and those of none)
        with pytest.raises(ModelError):
            parse(text, engine)
        model = min(served)
        expected = by_the_library(text, engine, model)
        if not any(n in expected for r in ENGINES[engine].requests for n in (r, f"{r}_total")):
            with pytest.raises(EndpointError):
                parse(text, engine, model)
            return
    else:
        model = None
    for _ in range(2):  # (the first reading learns the page's layout, the second reads by it)
        got = {k: v for k, v in parse(text, engine, model).values.items() if k in wanted}
        assert same(got, expected)


def test_an_untyped_sample_after_a_metric_not_read_is_read():
    text = ("# TYPE vllm:histogram_seconds histogram\n"
            'vllm:histogram_seconds_bucket{le="+Inf"} 3\nvllm:histogram_seconds_sum 1.5\n'
            "vllm:histogram_seconds_count 3\n"
            "vllm:request_success_total 7\n")
    assert parse(text, "vllm").get("vllm:request_success_total") == 7.0


def test_a_label_value_holding_a_line_separator_is_one_line():
    text = ('# TYPE vllm:request_success_total counter\n'
            'vllm:request_success_total{model_name="a\u2028b\x85c\rd"} 7\n')
    reading = parse(text, "vllm")
    assert reading.get("vllm:request_success_total") == 7.0 and reading.model == "a\u2028b\x85c\rd"


def test_a_counter_written_without_its_total_is_read_as_the_parser_names_it():
    text = "# TYPE vllm:request_success counter\nvllm:request_success 7\n  vllm:num_requests_running 2\r\n"
    reading = parse(text, "vllm")
    assert reading.get("vllm:request_success_total") == 7.0 and reading.get("vllm:num_requests_running") == 2.0
