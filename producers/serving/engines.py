"""What a serving engine's Prometheus endpoint says of its traffic, read with the Prometheus
client library's own parser (``prometheus_client.parser``), never by hand.

Each engine names its metrics its own way, and renames them between releases; ``ENGINES`` holds
each one's names as its documentation lists them, newest first, so that one reading serves every
release:

- vLLM (docs.vllm.ai, "Production Metrics"): ``vllm:num_requests_running``/``_waiting``,
  ``vllm:request_success_total``, ``vllm:generation_tokens_total``, the histograms
  ``vllm:request_queue_time_seconds`` and ``vllm:time_to_first_token_seconds``, and the KV cache's
  use, ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` before v0.10).
- SGLang (docs.sglang.io, "Production Metrics"): ``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:num_requests_total`` (or the end-to-end latency histogram's
  count where a release has no such counter), ``sglang:generation_tokens_total``,
  ``sglang:queue_time_seconds``, ``sglang:time_to_first_token_seconds``, ``sglang:token_usage``;
  its scheduler's, from each rank that reports them, under ``tp_rank``, ``pp_rank`` and
  ``moe_ep_rank`` (copies of one view: ``Engine.copies``).
- Hugging Face TGI (its "Metrics" reference): ``tgi_batch_current_size``, ``tgi_queue_size``,
  ``tgi_request_success`` (``tgi_request_count`` counts failures too), the histograms
  ``tgi_request_queue_duration`` and ``tgi_request_generated_tokens``.
- NVIDIA Triton (its "Metrics" guide): ``nv_inference_request_success``,
  ``nv_inference_pending_request_count``, ``nv_inference_queue_duration_us`` (a counter of
  microseconds: the mean queue time is its growth over the requests'), ``nv_inference_exec_count``
  over ``nv_inference_count`` for the batch size.

A reading (``Reading``) is cumulative, as the endpoint is; ``traffic`` turns two readings into
what a ``ServingSample`` carries for the time between them. A counter that went down is an
engine that restarted: its new value is what it counted since.
"""

from __future__ import annotations

import functools
import math
import threading
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field

from cachetools import LRUCache
from prometheus_client.parser import text_string_to_metric_families

from producers.serving.pick import lines
from schemas.validate_ids import printable


class EndpointError(ValueError):
    """An endpoint's text that is not Prometheus' exposition format, or names no engine's metrics."""


class ModelError(EndpointError):
    """A page of several models read with none named for the replica, or without the one named."""


@dataclass(frozen=True)
class Engine:
    name: str
    prefix: str  # every metric of the engine starts with it: how a scrape names its engine
    requests: tuple[str, ...]  # counters (or a histogram's _count) of requests finished
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()  # counters (or a histogram's _sum) of tokens generated
    queue_seconds: tuple[str, ...] = ()  # histograms of the time requests waited, in seconds
    queue_us_total: tuple[str, ...] = ()  # counters of the microseconds requests waited (Triton)
    ttft_seconds: tuple[str, ...] = ()  # histograms of the time to the first token
    kv_cache: tuple[str, ...] = ()  # gauges of the KV cache's use, 0..1
    batch: tuple[str, ...] = ()  # a gauge of the batch's size
    executions: tuple[str, ...] = ()  # counters: (executions, inferences), the mean batch their ratio
    model_labels: tuple[str, ...] = ("model_name", "model")
    # labels of the ranks that each report one view of the same requests: a sample's copies under
    # them are read once, their mean (``_slots``)
    copies: tuple[str, ...] = ()


ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("vllm", "vllm:", requests=("vllm:request_success_total", "vllm:e2e_request_latency_seconds_count"),
           running=("vllm:num_requests_running",), waiting=("vllm:num_requests_waiting",),
           tokens=("vllm:generation_tokens_total",), queue_seconds=("vllm:request_queue_time_seconds",),
           ttft_seconds=("vllm:time_to_first_token_seconds",),
           kv_cache=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    Engine("sglang", "sglang:", requests=("sglang:num_requests_total", "sglang:e2e_request_latency_seconds_count"),
           running=("sglang:num_running_reqs",), waiting=("sglang:num_queue_reqs",),
           tokens=("sglang:generation_tokens_total",), queue_seconds=("sglang:queue_time_seconds",),
           ttft_seconds=("sglang:time_to_first_token_seconds",), kv_cache=("sglang:token_usage",),
           copies=("tp_rank", "pp_rank", "moe_ep_rank")),
    Engine("tgi", "tgi_", requests=("tgi_request_success",),
           running=("tgi_batch_current_size",), waiting=("tgi_queue_size",),
           tokens=("tgi_request_generated_tokens_sum",), queue_seconds=("tgi_request_queue_duration",),
           batch=("tgi_batch_current_size",)),
    Engine("triton", "nv_inference_", requests=("nv_inference_request_success",),
           waiting=("nv_inference_pending_request_count",), queue_us_total=("nv_inference_queue_duration_us",),
           executions=("nv_inference_exec_count", "nv_inference_count"), model_labels=("model",)),
)}


@dataclass(frozen=True)
class Reading:
    """One scrape of an endpoint: its engine, the model it serves, and the sums over every series
    of each metric the engine names (a series' copies read once: ``_slots``; histograms as their
    ``_sum`` and ``_count``)."""

    engine: str
    model: str | None
    values: dict[str, float] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        """A metric by the name its engine documents (the parser names a counter's sample
        ``<name>_total`` where the text does not)."""
        value = self.values.get(name)
        return self.values.get(f"{name}_total") if value is None else value

    def first(self, names: tuple[str, ...]) -> float | None:
        """The value of the first of ``names`` the endpoint has (the newest name first)."""
        return next((v for n in names if (v := self.get(n)) is not None), None)


def _named(spec: Engine) -> tuple[str, ...]:
    """The names of the samples ``spec`` reads, as the text may write them."""
    names = (*spec.requests, *spec.running, *spec.waiting, *spec.tokens, *spec.queue_us_total, *spec.kv_cache,
             *spec.batch, *spec.executions)
    hists = (*spec.queue_seconds, *spec.ttft_seconds)
    return tuple({*names, *(f"{n}_total" for n in names), *(f"{h}_{s}" for h in hists for s in ("sum", "count"))})


@functools.cache
def _families(spec: Engine) -> tuple[frozenset[str], tuple[str, ...]]:
    """The families ``spec`` reads a sample of, and the names of those samples."""
    names = _named(spec)
    # a name as its family may be called: itself, or without the suffix the parser adds to a
    # counter's or a histogram's samples (a superset: each kept line is matched by its name)
    return frozenset(f for n in names for f in (n, *(n.removesuffix(x) for x in ("_total", "_sum", "_count")))), names


def _picked(text: str, spec: Engine) -> list[str]:
    """The lines of ``text`` that hold what ``spec`` reads, as the parser reads them, in their
    order (``pick.lines``): the TYPE lines of the families it reads, and its samples."""
    return lines(text, *_written(spec))


@functools.cache
def _written(spec: Engine) -> tuple[frozenset[str], frozenset[str]]:
    """The families ``spec`` reads a sample of, and its samples' names as a page may write them (a
    counter's without its ``_total`` too: the parser adds it)."""
    families, names = _families(spec)
    return families, frozenset({*names, *(n.removesuffix("_total") for n in names)})


def restricted(url: str, engine: str) -> str:
    """``url`` asking for only the samples ``engine``'s reading needs: the Prometheus client
    libraries' exposition (vLLM's and SGLang's) answers ``name[]`` with those alone, a page
    a few lines long; servers that do not know it answer the whole page, as without."""
    names = sorted(_named(ENGINES[engine]))
    return url + ("&" if "?" in url else "?") + urllib.parse.urlencode([("name[]", n) for n in names])


def parse(text: str, engine: str | None = None, model: str | None = None) -> Reading:
    """A scrape's text as a ``Reading``; ``engine`` names the engine where the text alone may not
    (else the prefix of its metrics does). Raises ``EndpointError`` on text that is not the
    exposition format, or that holds no engine's metrics.

    An engine may serve several models from one endpoint (a Triton model repository: an ensemble
    counts each request once for itself and once for each model it is made of; or models side by
    side). ``model`` names the one the replica is read for: samples labelled with another model
    are left out, and samples no model label names (TGI's: one model) are its. With no ``model``,
    a page whose samples name more than one model raises ``ModelError`` (a sum over them would
    count an ensemble's requests once per step), as does a named model the page does not serve."""
    if engine is None:
        engine = next((e.name for e in ENGINES.values() if e.prefix in text), None)
    spec = ENGINES.get(engine or "")
    if spec is None:
        raise EndpointError("no serving engine's metrics (vLLM, SGLang, TGI, Triton) in the text")
    lines = _picked(text, spec)
    heads, tails = _split(lines)
    with _LAYOUTS_LOCK:
        layout = _LAYOUTS.get((spec.name, model, heads))
    if layout is not None:
        try:
            return _reading(spec, layout, [_value(t) for t in tails])
        except ValueError:
            pass  # a value token the layout's reading does not take: the parser reads the text whole
    reading, layout = _parsed(lines, spec, tails, model)
    if layout is not None:
        with _LAYOUTS_LOCK:
            _LAYOUTS[(spec.name, model, heads)] = layout
    return reading


# An engine's page keeps its lines from one reading to the next: the same metrics, the same label
# sets, in the same order; only the values move. The parser's cost is in the names and labels
# (~17 us a line, most of it scanning label values a character at a time), so what it read of a
# page's lines is kept, keyed by the lines without their values: a later reading of the same
# lines converts only each line's value token, as the parser converts it. A layout is
# kept only where the parser's values are exactly the lines' last tokens (no timestamp, no
# exemplar); any other text, or a token that conversion refuses, is parsed whole, as before.
_LAYOUTS: LRUCache = LRUCache(maxsize=256)
_LAYOUTS_LOCK = threading.Lock()  # (the agent's ticks and the discovery's thread both read pages)


@dataclass(frozen=True)
class _Layout:
    slots: tuple[int | None, ...]  # per sample line, the series its value is added to (None: not read)
    series: tuple[tuple[str, int], ...]  # per series, the name it is summed under and its copies (``_slots``)
    model: str | None
    means: tuple[tuple[str, int], ...] = ()  # the fractions read (``_fractions``), each with its series' count


def _split(lines: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """The lines without their values (comments whole), and the sample lines' last tokens."""
    heads, tails = [], []
    for line in lines:
        if line.startswith("#"):
            heads.append(line)
        else:
            head, _, tail = line.rpartition(" ")
            heads.append(head)
            tails.append(tail)
    return tuple(heads), tails


def _parsed(lines: list[str], spec: Engine, tails: list[str], model: str | None) -> tuple[Reading, _Layout | None]:
    """The reading of an engine's wanted lines by the client library's parser, of ``model``'s
    samples (``parse``), and the layout that reads the same lines again from their values alone
    (None where the values are not the lines' last tokens)."""
    samples: list = []
    try:
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            samples += family.samples
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise EndpointError(f"not Prometheus' text format: {exc}") from None
    read = frozenset(_families(spec)[1])  # (a line picked may name a sample no reading reads: its model counts not)
    labelled = [next((s.labels[k] for k in spec.model_labels if s.labels.get(k)), None) if s.name in read else None
                for s in samples]
    served = sorted({m for m in labelled if m is not None})
    if (model is None and len(served) > 1) or (model is not None and served and model not in served):
        raise ModelError(_models_said(served, model))
    names = [None if s.name.endswith(("_bucket", "_created")) or (model and m and m != model) else s.name
             for s, m in zip(samples, labelled)]
    slots, series = _slots(samples, names, spec.copies)
    means = Counter(n for n, _ in series if n in _fractions(spec))
    layout = _Layout(slots, series, model or (served[0] if served else None), tuple(means.items()))
    reading = _reading(spec, layout, [s.value for s in samples])
    try:
        values = [_value(t) for t in tails]
    except ValueError:
        return reading, None  # (a value followed by a timestamp or an exemplar: no layout)
    if len(values) != len(samples) or any(s.timestamp is not None or s.exemplar is not None or not _same(s.value, v)
                                          for s, v in zip(samples, values)):
        return reading, None
    return reading, layout


def _slots(samples: list, names: list[str | None], copies: tuple[str, ...]
           ) -> tuple[tuple[int | None, ...], tuple[tuple[str, int], ...]]:
    """Each sample read as a series: the samples of one name whose labels differ only in the
    engine's ``copies`` (its ranks: SGLang's tensor-parallel ranks each write the scheduler's view
    of the same requests) are one series, read as their mean, and so is a label set written twice.
    Per sample, the index of its series (None: not read); per series, in the order of its first
    sample, its name and how many samples it holds."""
    index: dict[tuple, int] = {}
    slots: list[int | None] = []
    series: list[list] = []
    for sample, name in zip(samples, names):
        if name is None:
            slots.append(None)
            continue
        key = (name, tuple(sorted((k, v) for k, v in sample.labels.items() if k not in copies)))
        slot = index.setdefault(key, len(series))
        if slot == len(series):
            series.append([name, 0])
        series[slot][1] += 1
        slots.append(slot)
    return tuple(slots), tuple((n, c) for n, c in series)


def _models_said(served: list[str], model: str | None) -> str:
    """Why a page's models refuse its reading, and what to do (the models named as printable, a few)."""
    names = ", ".join(printable(m[:80]) for m in served[:6])
    names += f", ... ({len(served)} in all)" if len(served) > 6 else ""
    if model is not None:
        return f"no model '{printable(model[:80])}' on the page; it serves {names}"
    return (f"serves several models ({names}): name the one the replica is read for, --serving-endpoint "
            "GPUS=URL;model=NAME (on Kubernetes, the pod's gpufleet.io/model)")


def _value(token: str) -> float:
    """A value token as the parser converts it (``prometheus_client.parser._parse_value``: no
    underscore, no surrounding space, then what Python reads as a number; its int first is the
    same float), without its int attempt's exception on every decimal (a third of a reading's
    cost). The property test holds the two equal."""
    if "_" in token or token != token.strip():
        raise ValueError(f"Invalid value: {token!r}")
    value = float(token)
    if math.isinf(value) and "inf" not in token.lower() and _integer(token):
        raise ValueError(f"Invalid value: {token[:40]!r}")  # (an integer past a double's range: the parser's int)
    return value  # (a float past it, "1E310", is the parser's float too: infinite)


def _integer(token: str) -> bool:
    """Whether the parser reads ``token`` as an int (a number past a double's range alone asks)."""
    try:
        int(token)
    except ValueError:
        return False
    return True


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@functools.cache
def _fractions(spec: Engine) -> frozenset[str]:
    """The gauges ``spec`` reads that are a share of something, 0..1 (the KV cache's use), as the
    parser may name them: an engine's copies behind one endpoint (vLLM's data-parallel engines,
    SGLang's ``dp_rank``) each report theirs, and the replica's is their mean (equal caches), where
    counts of requests and tokens are their sum."""
    return frozenset({*spec.kv_cache, *(f"{n}_total" for n in spec.kv_cache)})


def _reading(spec: Engine, layout: _Layout, values: list[float]) -> Reading:
    """The sums over every series of each name the layout reads, a series' copies as their mean
    (``_slots``; of a fraction, the mean of its series: ``_fractions``); refused without a request
    counter."""
    totals = [0.0] * len(layout.series)
    for slot, value in zip(layout.slots, values):
        if slot is not None:
            try:
                totals[slot] += float(value)
            except OverflowError:  # (an integer the parser read that no double holds)
                raise EndpointError(f"{layout.series[slot][0]}: a value past a number's range") from None
    sums: dict[str, float] = {}
    for (name, copies), total in zip(layout.series, totals):
        sums[name] = sums.get(name, 0.0) + total / copies
    for name, count in layout.means:
        sums[name] /= count
    reading = Reading(spec.name, layout.model, sums)
    if reading.first(spec.requests) is None:
        raise EndpointError(f"no {spec.name} request counter ({' or '.join(spec.requests)}) in the text")
    return reading


def _grown(before: float | None, after: float | None) -> float | None:
    """A counter's growth; a counter that went down restarted (its value is what it counted since)."""
    if after is None:
        return None
    if before is None or after < before:
        return after if before is not None else None
    return after - before


def _histogram(prev: Reading, cur: Reading, names: tuple[str, ...]) -> tuple[float | None, float | None]:
    """(growth of the sum, growth of the count) of the first histogram of ``names`` both have."""
    for n in names:
        if f"{n}_count" in cur.values:
            return (_grown(prev.values.get(f"{n}_sum"), cur.values.get(f"{n}_sum")),
                    _grown(prev.values.get(f"{n}_count"), cur.values.get(f"{n}_count")))
    return None, None


def traffic(prev: Reading, cur: Reading) -> dict:
    """What the engine did between two readings of one endpoint: requests finished, tokens
    generated, the mean queue time and time to first token of the requests that finished (ms),
    and the gauges as ``cur`` read them. Fields the engine does not report are None."""
    spec = ENGINES[cur.engine]
    requests = _grown(prev.first(spec.requests), cur.first(spec.requests)) or 0.0
    q_sum, q_count = _histogram(prev, cur, spec.queue_seconds)
    queue_ms = q_sum * 1000 / q_count if q_sum is not None and q_count else None
    if spec.queue_us_total:
        waited = _grown(prev.first(spec.queue_us_total), cur.first(spec.queue_us_total))
        queue_ms = waited / 1000 / requests if waited is not None and requests else None
    t_sum, t_count = _histogram(prev, cur, spec.ttft_seconds)
    batch = cur.first(spec.batch)
    if spec.executions:
        execs, inferences = (_grown(prev.get(n), cur.get(n)) for n in spec.executions)
        batch = inferences / execs if execs and inferences is not None else None
    return {
        "requests": requests,
        "tokens": _grown(prev.first(spec.tokens), cur.first(spec.tokens)),
        "running": cur.first(spec.running),
        "waiting": cur.first(spec.waiting),
        "queue_time_ms": queue_ms,
        "ttft_ms": t_sum * 1000 / t_count if t_sum is not None and t_count else None,
        "kv_cache_usage": cur.first(spec.kv_cache),
        "batch_size": batch,
    }
