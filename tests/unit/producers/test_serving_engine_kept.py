"""The engine an endpoint's page names is kept for its later readings, where no setting names it:
its page is not searched for every engine's metrics again (on TGI's page of 94 KB, the search for
vLLM's and SGLang's names cost a reading 85 us of its 300). A port that answers another engine
later (a replica redeployed with another) is read as that engine from its next reading."""

from __future__ import annotations

import itertools

from producers.serving.scrape import Endpoint, ServingReader
from tests.support.serving_pages import recorded, serve


def test_an_endpoint_that_answers_another_engine_is_read_as_it_at_once():
    page = [recorded("vllm-0.6").encode()]
    httpd = serve(lambda: page[0])
    dates = itertools.count(1_000_000)
    reader = ServingReader([Endpoint((0,), f"http://127.0.0.1:{httpd.server_address[1]}/metrics")], 1.0,
                           clock=lambda: float(next(dates)))
    engines = []
    try:
        for served in ("vllm-0.6", "vllm-0.6-later", "sglang", "sglang-later", "tgi", "tgi-later"):
            page[0] = recorded(served).encode()
            reader.read_all()
            engines += [now.engine for _, _, (_, now) in reader.pairs()]
    finally:
        reader.stop()
        httpd.shutdown()
    # (each pair: the newest two readings; the first of a new engine pairs with the last of the old)
    assert engines == ["vllm", "sglang", "sglang", "tgi", "tgi"]
    assert reader.failures() == {}  # (no reading of the new engine counted as garbage)
