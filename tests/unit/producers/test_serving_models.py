"""An endpoint that serves several models (a Triton model repository: an ensemble and the models
it is made of, or models side by side): a replica's reading counts the one model named for it
(``;model=NAME``, a pod's ``gpufleet.io/model``) and is refused, naming the models it saw and how
to name one, where nothing names it. Summed over the page, each request to an ensemble of two
steps counted three times."""

from __future__ import annotations

import itertools

import pytest

from producers.agent.allocations.kubelet import PodMetadata, ScrapeTarget, model_of
from producers.serving.discover import annotated, discover
from producers.serving.engines import EndpointError, ModelError, parse, traffic
from producers.serving.scrape import Endpoint, EndpointSettingError, ServingReader, endpoint
from tests.support.serving_pages import recorded, serve


@pytest.mark.parametrize("model, expected", [
    # the client's requests, once: 400; queue 800,000 us over them; one inference a run
    ("pipeline", {"requests": 400.0, "waiting": 1.0, "queue_time_ms": 2.0, "batch_size": 1.0}),
    # a composing model, as its own service: its dynamic batcher ran 4 requests at once
    ("resnet50", {"requests": 400.0, "waiting": 1.0, "queue_time_ms": 1.5, "batch_size": 4.0}),
])
def test_a_replica_counts_the_requests_of_its_named_model_once(model, expected):
    before = parse(recorded("triton-ensemble"), model=model)
    after = parse(recorded("triton-ensemble-later"), model=model)
    assert before.model == after.model == model
    got = traffic(before, after)
    assert {k: got[k] for k in expected} == pytest.approx(expected)


def test_a_page_of_several_models_with_none_named_is_refused_saying_how_to_name_one():
    with pytest.raises(ModelError) as refused:
        parse(recorded("triton-ensemble"))
    said = str(refused.value)
    assert "several models (pipeline, preprocess, resnet50)" in said and ";model=NAME" in said
    assert isinstance(refused.value, EndpointError)  # (counted by the reader, never a reading)


def test_a_named_model_the_page_does_not_serve_is_refused():
    with pytest.raises(ModelError, match=r"no model 'bert'.*pipeline, preprocess, resnet50"):
        parse(recorded("triton-ensemble"), model="bert")


def test_each_named_model_of_one_page_keeps_its_own_layout():
    """Read again from the kept layout (a later reading of the same lines), each model's values
    are its own: the layout is kept per model."""
    for _ in range(2):
        pipeline, resnet = (parse(recorded("triton-ensemble"), model=m) for m in ("pipeline", "resnet50"))
        assert pipeline.get("nv_inference_exec_count") == 5000.0 and resnet.get("nv_inference_exec_count") == 1250.0
        assert pipeline.get("nv_inference_request_success") == resnet.get("nv_inference_request_success") == 5000.0


def test_a_one_model_page_reads_the_same_with_its_model_named_or_not():
    assert parse(recorded("triton"), model="resnet50") == parse(recorded("triton"))
    tgi = parse(recorded("tgi"), model="bigscience/bloom")  # (TGI labels no sample with a model: all are its one)
    assert tgi.model == "bigscience/bloom" and tgi.values == parse(recorded("tgi")).values


def test_the_setting_names_the_model():
    assert endpoint("0=http://127.0.0.1:8002/metrics;model=pipeline;engine=triton") == \
        Endpoint((0,), "http://127.0.0.1:8002/metrics", "triton", None, "pipeline")
    with pytest.raises(EndpointSettingError, match="model"):
        endpoint("0=http://127.0.0.1:8002/metrics;model=a\x1b[2Jb")


def test_the_reader_counts_a_page_of_several_models_and_reads_the_named_one():
    servers = [serve(recorded("triton-ensemble").encode()) for _ in range(2)]
    unnamed, named = (f"http://127.0.0.1:{s.server_address[1]}/metrics" for s in servers)
    dates = itertools.count(1_000_000)
    reader = ServingReader([Endpoint((0,), unnamed), Endpoint((1,), named, model="pipeline")], 1.0,
                           clock=lambda: float(next(dates)))
    try:
        reader.read_all()
        assert reader.pairs() == []  # (the first reading of each: nothing to pair yet)
        reader.read_all()
    finally:
        reader.stop()
        for s in servers:
            s.shutdown()
    assert reader.failures() == {(unnamed, "models"): 2}
    assert [(e.url, now.model) for e, _, (_, now) in reader.pairs()] == [(named, "pipeline")]


def test_discovery_tells_of_an_endpoint_of_several_models_and_adds_none():
    told: list[tuple[Endpoint, Exception]] = []
    text = recorded("triton-ensemble")
    found = discover({0: {4242}}, set(), lambda url, timeout_s: text, ports_of=lambda pid: {8002: "127.0.0.1"},
                     refused=lambda e, exc: told.append((e, exc)))
    assert found == [] and [(e.url, e.gpus) for e, _ in told] == [("http://127.0.0.1:8002/metrics", (0,))]
    assert isinstance(told[0][1], ModelError)


def test_a_pods_model_annotation_names_the_model_it_is_read_for():
    meta = PodMetadata("uid-1", labels={}, annotations={"gpufleet.io/model": "pipeline"})
    assert model_of(meta) == "pipeline" and model_of(PodMetadata("uid-2")) is None
    target = ScrapeTarget(("GPU-a",), "http://10.0.0.7:8002/metrics", "vision", "pipeline")
    found = annotated([target], {"GPU-a": 0}, set(), lambda url, timeout_s: recorded("triton-ensemble"))
    assert found == [Endpoint((0,), "http://10.0.0.7:8002/metrics", "triton", "vision", "pipeline")]
