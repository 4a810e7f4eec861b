"""An engine that runs several copies of its model behind one endpoint (vLLM's data parallel: an
engine a copy, each labelled ``engine``; SGLang's ``dp_rank``): a reading counts the requests,
tokens and queues of its engines together, and takes the KV cache's use as the share of all
their caches in use, their mean, a fraction of 0..1 as the worker takes it. Summed, two engines
at 0.9 and 0.7 read 1.6, and every sample of the replica was a dead letter."""

from __future__ import annotations

import pytest

from producers.serving.engines import parse, traffic
from schemas.validate_sample import serving_error
from tests.support.serving_pages import by_the_library, recorded


def test_a_data_parallel_replicas_traffic_is_its_engines_together():
    for _ in range(2):  # (the first reading learns the page's layout, the second reads by it)
        before, after = parse(recorded("vllm-dp2")), parse(recorded("vllm-dp2-later"))
        assert traffic(before, after) == pytest.approx({
            "requests": 100.0, "tokens": 10000.0, "running": 13.0, "waiting": 3.0,
            "queue_time_ms": 10.0, "ttft_ms": 80.0,  # (1.0 s and 8.0 s over the 100 requests of both)
            "kv_cache_usage": 0.8, "batch_size": None})


def test_its_samples_are_taken_by_the_worker():
    record = {"event_time": 1_790_000_000_000, "interval_ms": 10_000, "service": "llama-70b",
              **traffic(parse(recorded("vllm-dp2")), parse(recorded("vllm-dp2-later")))}
    assert serving_error(record) is None


def test_the_mean_is_what_the_client_librarys_reading_of_the_page_means():
    """The tests' own reading of a page by the client library's parser (``by_the_library``) holds
    the KV cache's use as the engines' mean too."""
    assert by_the_library(recorded("vllm-dp2-later"), "vllm")["vllm:kv_cache_usage_perc"] == pytest.approx(0.8)
    assert parse(recorded("vllm-dp2-later")).get("vllm:kv_cache_usage_perc") == pytest.approx(0.8)
