"""A reading of an engine's page equals the Prometheus client library's own reading of it, however
the values move: the agent keeps what the parser read of a page's lines (names, labels) and reads
a later page with the same lines from its values alone (``engines._LAYOUTS``), and falls back to
the parser wherever the values are not the lines' last tokens."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from producers.serving import engines
from producers.serving.engines import EndpointError, parse
from tests.support.serving_pages import DATA, by_the_library, same

PAGES = {"vllm": "vllm-0.6", "sglang": "sglang", "tgi": "tgi", "triton": "triton"}
SAMPLE = re.compile(r"^([^#\s][^\n]*?) (\S+)$", re.MULTILINE)  # a sample line: up to its value token, and the token


def moved(text: str, values: list[str]) -> str:
    """``text`` with its sample lines' values replaced, in turn, by ``values`` (cycled)."""
    it = iter(values * (len(text) // max(1, len(values)) + 1))
    return SAMPLE.sub(lambda m: f"{m.group(1)} {next(it)}", text)


values = st.one_of(st.integers(0, 10**15).map(str), st.floats(0, 1e12, allow_nan=False).map(repr),
                   st.sampled_from(["NaN", "+Inf", "1e3", "2.5E-3", "0", "-0.0"]))


@pytest.mark.parametrize("engine", PAGES)
@settings(max_examples=60, deadline=None)
@given(st.lists(values, min_size=1, max_size=12))
def test_a_later_reading_of_the_same_lines_is_the_parsers(engine, new):
    text = (DATA / f"{PAGES[engine]}.prom").read_text()
    parse(text, engine)  # (the page's lines learnt)
    later = moved(text, new)
    assert same(parse(later, engine).values, by_the_library(later, engine))


def test_the_layout_is_used_and_a_value_it_cannot_take_goes_to_the_parser(monkeypatch):
    text = (DATA / "vllm-0.6.prom").read_text()
    engines._LAYOUTS.clear()
    parse(text, "vllm")
    assert len(engines._LAYOUTS) == 1
    parsed = []
    real = engines._parsed
    monkeypatch.setattr(engines, "_parsed", lambda *a: parsed.append(1) or real(*a))
    later = moved(text, ["7", "8.5"])
    assert same(parse(later, "vllm").values, by_the_library(later, "vllm")) and parsed == []
    # a value with a timestamp after a tab: no token the layout takes; the parser reads it (9, then a time)
    tabbed = re.sub(r"^(vllm:num_requests_running\{[^\n]*\}) (\S+)$", r"\1 9\t1700000000000", later,
                    flags=re.MULTILINE)
    assert parse(tabbed, "vllm").get("vllm:num_requests_running") == 9.0 and parsed == [1]
    with pytest.raises(EndpointError):
        parse(moved(text, ["1_000"]), "vllm")  # refused by the parser's conversion, as by the parser


def test_lines_with_timestamps_are_never_read_from_a_layout():
    text = "# TYPE vllm:request_success_total counter\nvllm:request_success_total{model_name=\"m\"} 5 1700000000000\n"
    engines._LAYOUTS.clear()
    assert parse(text, "vllm").get("vllm:request_success_total") == 5.0
    assert len(engines._LAYOUTS) == 0
    assert parse(text.replace(" 5 ", " 6 "), "vllm").get("vllm:request_success_total") == 6.0


@settings(max_examples=400, deadline=None)
@example("1E310")  # (a float past a double's range: the parser's float, inf; an integer past it is refused)
@example("-" + "9" * 400)
@given(st.one_of(st.text(alphabet="0123456789+-._eEinfaINFAxX\t\u0663", max_size=12),
                 st.floats().map(repr), st.integers().map(str)).filter(lambda t: " " not in t))
def test_a_value_token_is_converted_as_the_parser_converts_it(token):
    from prometheus_client.parser import _parse_value  # the parser's own conversion, to hold ours to

    try:
        expected = float(_parse_value(token))
    except (ValueError, OverflowError):
        with pytest.raises(ValueError):
            engines._value(token)
        return
    assert same({"v": engines._value(token)}, {"v": expected})


def test_a_value_past_a_numbers_range_is_refused_on_every_reading():
    text = (DATA / "vllm-0.6.prom").read_text()
    huge = re.sub(r"^(vllm:request_success_total\{[^\n]*\}) (\S+)$", r"\1 " + "9" * 400, text, flags=re.MULTILINE)
    engines._LAYOUTS.clear()
    with pytest.raises(EndpointError, match="past a number's range"):
        parse(huge, "vllm")
    parse(text, "vllm")  # (the page's layout learnt)
    with pytest.raises(EndpointError, match="past a number's range"):
        parse(huge, "vllm")
