"""An SGLang replica whose scheduler is run by several ranks: each rank that reports writes the
same view of the same requests under its own ``tp_rank``, ``pp_rank`` and ``moe_ep_rank``
(``--enable-metrics-for-all-schedulers`` makes every tensor-parallel rank report, and each
pipeline stage reports by default), while a ``dp_rank`` is a copy of the model serving requests
of its own. A reading takes the ranks' copies of one view once (their mean) and adds the
data-parallel copies up. Summed over every label set, 5 + 5 + 7 + 7 requests read as 24
running where 12 ran, and the queue twice as long as it was."""

from __future__ import annotations

import pytest

from producers.serving.engines import ENGINES, parse, traffic
from tests.support.serving_pages import by_the_library, recorded


def test_the_ranks_copies_of_a_schedulers_view_are_read_once_and_data_parallel_copies_added_up():
    for _ in range(2):  # (the first reading learns the page's layout, the second reads by it)
        before, after = parse(recorded("sglang-dp2-tp4")), parse(recorded("sglang-dp2-tp4-later"))
        assert before.get("sglang:num_running_reqs") == 12.0 and before.get("sglang:num_queue_reqs") == 3.0
        assert traffic(before, after) == pytest.approx({
            "requests": 100.0, "tokens": 10000.0, "running": 14.0, "waiting": 3.0,
            "queue_time_ms": 50.0,  # (5 s over the 100 requests the two data-parallel copies queued)
            "ttft_ms": 80.0, "kv_cache_usage": 0.7, "batch_size": None})


def test_each_pipeline_stage_reporting_the_same_queue_is_one_queue():
    model = 'model_name="m"'
    text = ("# TYPE sglang:num_requests_total counter\n"
            f"sglang:num_requests_total{{{model}}} 10\n"
            "# TYPE sglang:num_queue_reqs gauge\n"
            f'sglang:num_queue_reqs{{{model},pp_rank="0",tp_rank="0"}} 4\n'
            f'sglang:num_queue_reqs{{{model},pp_rank="1",tp_rank="0"}} 4\n')
    assert parse(text).get("sglang:num_queue_reqs") == 4.0


def test_another_engines_rank_label_is_a_label_like_any_other():
    """Only the engine whose ranks repeat one view names them (``Engine.copies``): elsewhere a
    label set is a series of its own."""
    assert ENGINES["sglang"].copies and not ENGINES["vllm"].copies
    text = ("# TYPE vllm:request_success_total counter\nvllm:request_success_total 3\n"
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{tp_rank="0"} 2\nvllm:num_requests_running{tp_rank="1"} 5\n')
    assert parse(text).get("vllm:num_requests_running") == 7.0


def test_the_tests_own_reading_by_the_client_library_means_the_copies_too():
    expected = by_the_library(recorded("sglang-dp2-tp4"), "sglang")
    assert expected["sglang:num_running_reqs"] == 12.0 and expected["sglang:token_usage"] == pytest.approx(0.6)
    assert parse(recorded("sglang-dp2-tp4")).values == pytest.approx(expected)
