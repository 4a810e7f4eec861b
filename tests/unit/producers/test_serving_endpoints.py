"""The serving engines' endpoints as the agent reads them: each engine's documented scrape text
(``tests/data/serving``, with its source) parsed by the Prometheus client's parser, the renames
between releases, and an endpoint that is down, slow or answers garbage never holding up a tick."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest

from producers.serving.engines import EndpointError, parse, traffic
from producers.serving.scrape import Endpoint, EndpointSettingError, ServingObserver, ServingReader, endpoint
from schemas.codec import Codec
from tests.support.integration import wait_until
from tests.support.serving_pages import EngineServer, recorded


def read(name: str, engine: str | None = None):
    return parse(recorded(name), engine)


@pytest.mark.parametrize("engine, first, later, expected", [
    ("vllm", "vllm-0.6", "vllm-0.6-later",
     {"requests": 100.0, "tokens": 12000.0, "running": 6.0, "waiting": 3.0, "queue_time_ms": 100.0, "ttft_ms": 120.0,
      "kv_cache_usage": 0.42, "batch_size": None}),
    ("sglang", "sglang", "sglang-later",
     {"requests": 200.0, "tokens": 10000.0, "running": 12.0, "waiting": 5.0, "queue_time_ms": None,
      "ttft_ms": 250.0, "kv_cache_usage": 0.28, "batch_size": None}),
    ("tgi", "tgi", "tgi-later",
     {"requests": 50.0, "tokens": 10000.0, "running": 16.0, "waiting": 4.0, "queue_time_ms": 500.0,
      "ttft_ms": None, "kv_cache_usage": None, "batch_size": 16.0}),
    ("triton", "triton", "triton-later",  # queue: 800,000 us over 400 requests; batch: 4,000 inferences in 200 runs
     {"requests": 400.0, "tokens": None, "running": None, "waiting": 2.0, "queue_time_ms": 2.0, "ttft_ms": None,
      "kv_cache_usage": None, "batch_size": 20.0}),
])
def test_each_engines_endpoint_gives_the_traffic_between_two_readings(engine, first, later, expected):
    before, after = read(first), read(later)
    assert before.engine == after.engine == engine
    assert traffic(before, after) == pytest.approx(expected)


def test_the_model_is_the_engines_label():
    assert read("vllm-0.6").model == "meta-llama/Llama-3.1-8B-Instruct"
    assert read("triton").model == "resnet50"
    assert read("tgi").model is None  # TGI serves one model and does not label it: the setting names the service


def test_vllms_kv_cache_metric_renamed_in_0_10_reads_the_same():
    old, new = read("vllm-0.6"), read("vllm-0.10")
    assert "vllm:gpu_cache_usage_perc" in old.values and "vllm:kv_cache_usage_perc" in new.values
    assert traffic(old, old)["kv_cache_usage"] == traffic(new, new)["kv_cache_usage"] == 0.42


def test_an_engine_that_restarted_counts_from_zero_again():
    before, after = read("vllm-0.6-later"), read("vllm-0.10")  # success 1,100 -> 500: a restart
    assert traffic(before, after)["requests"] == 500.0


@pytest.mark.parametrize("text, why", [
    ("<html>502 Bad Gateway</html>", "no serving engine"),
    ("vllm:request_success_total abc\n", "not Prometheus"),
    ("node_cpu_seconds_total 12\n", "no serving engine"),
    ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n", "no vllm request counter"),
    ("vllm:request_success_total{model_name=\"a\" 3\n", "not Prometheus"),
])
def test_garbage_is_refused_with_the_reason(text, why):
    with pytest.raises(EndpointError, match=why):
        parse(text)


def test_the_setting_names_gpus_url_service_and_engine():
    assert endpoint("0,1=http://127.0.0.1:8000/metrics;service=llama-70b;engine=vllm") == \
        Endpoint((0, 1), "http://127.0.0.1:8000/metrics", "vllm", "llama-70b")
    for bad in ("http://x/metrics", "a=http://x", "0=ftp://x", "0=http://x;colour=red", "0=http://x;engine=onnx",
                "-1=http://x"):
        with pytest.raises(EndpointSettingError, match="GPUS=URL|options are"):
            endpoint(bad)
    with pytest.raises(EndpointSettingError, match=r"service 'chat\\x1b' is not a printable name"):
        endpoint("0=http://x/metrics;service=chat\x1b")  # (the worker would refuse each of its samples)


def test_a_setting_with_a_password_is_refused_without_saying_it():
    """The setting is on the agent's command line, which every user of the host reads."""
    assert endpoint("0=http://ana@127.0.0.1:8000/metrics").url == "http://ana@127.0.0.1:8000/metrics"  # (no password)
    with pytest.raises(EndpointSettingError) as refused:
        endpoint("0=http://ana:s3cret@127.0.0.1:8000/metrics;service=chat")
    assert "--serving-netrc" in str(refused.value) and "s3cret" not in str(refused.value)
    assert "http://127.0.0.1:8000/metrics" in str(refused.value)


class Engine(BaseHTTPRequestHandler):
    """A serving engine's endpoint: ``/good`` the vLLM text, ``/garbage``, ``/slow`` (answers
    only once the test lets it)."""

    protocol_version = "HTTP/1.1"  # kept-open connections, as the engines' servers offer
    release = threading.Event()
    pages: ClassVar[dict[str, bytes]] = {"/good": recorded("vllm-0.6").encode(),
                                         "/garbage": b"\x00\xffnot metrics{"}
    authorizations: ClassVar[list[str | None]] = []

    def do_GET(self):
        self.authorizations.append(self.headers.get("Authorization"))
        if self.path == "/slow":
            self.release.wait(30)
        body = self.pages.get(self.path, self.pages["/good"])
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the reader gave up waiting (the slow endpoint): what the test wants

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = EngineServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    Engine.release.set()
    httpd.shutdown()
    Engine.release.clear()


def stepped(reader: ServingReader, done, what: str):
    """Ticks ``reader`` (its clock stopped: nothing more comes due) until ``done()``."""
    return wait_until(lambda: (reader.step(), done())[1], 30, what)


def test_an_endpoint_down_slow_or_garbled_is_counted_and_never_holds_up_a_tick(server):
    """Read in the agent's ticks: each endpoint asked at one tick, its answer taken at a later one;
    the slow endpoint's request stays in flight while the ticks go on and the good endpoint's
    readings become a sample, until its timeout gives it up."""
    import socket

    closed = socket.socket()  # (bound and never listening, to the test's end: refused, and no other socket takes it)
    closed.bind(("127.0.0.1", 0))
    down = f"http://127.0.0.1:{closed.getsockname()[1]}/metrics"
    endpoints = [Endpoint((0,), f"{server}/good"), Endpoint((1,), down), Endpoint((2,), f"{server}/garbage"),
                 Endpoint((3,), f"{server}/slow")]
    now = [0.0]  # the agent's ticks' clock, in seconds
    reader = ServingReader(endpoints, interval_s=1.0, timeout_s=2.0, clock=lambda: 100 + 10 * now[0],
                           monotonic=lambda: now[0])
    stepped(reader, lambda: 0 in reader._latest and len(reader.errors) == 2, "the first answers")
    assert dict(reader.errors) == {(down, "unreachable"): 1, (f"{server}/garbage", "garbage"): 1}
    spooled = []
    observe = ServingObserver(reader, lambda schema, key, record: spooled.append(record), host="h")
    samples = [{"gpu_index": g, "gpu_uuid": f"GPU-{g}", "workflow_id": "svc-1", "owner": "ana", "team": "ml"}
               for g in range(4)]
    observe(samples, {})  # a tick: nothing to send yet (one reading of /good)
    assert spooled == []
    now[0] = 1.0  # the next second: the endpoints asked again, but the slow one, still in flight
    wait_until(lambda: (observe(samples, {}), spooled)[1], 30, "the good endpoint's sample")
    assert [(r["workflow_id"], r["gpu_uuids"], r["service"], r["engine"], r["interval_ms"]) for r in spooled] == \
        [("svc-1", ["GPU-0"], "meta-llama/Llama-3.1-8B-Instruct", "vllm", 10_000)]
    Codec().encode("ServingSample", spooled[0])  # what the agent spools is the schema's
    # the sample went while the slow endpoint had not answered: no tick waited for it
    assert not Engine.release.is_set() and [a.url for a in reader._flight.values()] == [f"{server}/slow"]
    assert (f"{server}/slow", "timeout") not in reader.errors
    now[0] = 2.5  # past its timeout: given up
    reader.step()
    assert reader.errors[(f"{server}/slow", "timeout")] == 1


def test_an_answer_that_came_in_time_is_taken_at_a_tick_that_came_late(server):
    """An agent that ticks less often than the endpoints' timeout (``--interval 5``), or a tick
    that came late: an answer that came while the agent slept is in its socket, and is taken."""
    reader = ServingReader([Endpoint((0,), f"{server}/good")], interval_s=10.0, timeout_s=0.2)
    reader.step()  # asked
    asked = time.monotonic()
    wait_until(lambda: time.monotonic() - asked > 0.4, 30, "twice the timeout without a tick")
    reader.step()
    assert 0 in reader._latest and not reader.errors


def test_a_replica_whose_gpus_no_workflow_holds_sends_nothing():
    reader = ServingReader([Endpoint((5,), "http://x/metrics")], interval_s=1.0)
    reader.step = lambda: None  # (its readings set by hand)
    reader._latest[0] = (1.0, read("vllm-0.6"))
    reader.pairs()
    reader._latest[0] = (2.0, read("vllm-0.6-later"))
    spooled = []
    observe = ServingObserver(reader, lambda *a: spooled.append(a), host="h")
    observe([{"gpu_index": 5, "gpu_uuid": "GPU-5", "workflow_id": "unallocated"}], {})
    assert spooled == [] and observe.unattributed == 1


class _Page:
    """A collector exposing a recorded scrape's metrics again, through the client library."""

    def __init__(self, text: str) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        self.families = list(text_string_to_metric_families(text))

    def collect(self):
        return iter(self.families)


def test_an_engine_known_is_asked_only_for_what_its_reading_needs():
    """vLLM and SGLang expose their metrics with the Prometheus client library, which answers
    ``name[]`` with those samples alone: after the first reading the agent asks for only its
    names, and reads the same traffic from a page a fraction of the size. A server that answers
    the question with an error is read whole again."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import CollectorRegistry, make_wsgi_app

    text = recorded("vllm-0.6") + "".join(
        f"# TYPE vllm:unread_{i}_seconds histogram\n"
        + "".join(f'vllm:unread_{i}_seconds_bucket{{le="{b}"}} {b}\n' for b in (1, 2, 4, 8, "+Inf"))
        + f"vllm:unread_{i}_seconds_count 8\nvllm:unread_{i}_seconds_sum 20\n" for i in range(10))
    registry = CollectorRegistry(auto_describe=True)  # (its names known, as the library's own metrics')
    registry.register(_Page(text))
    app, asked = make_wsgi_app(registry), []

    def served(environ, start_response):
        query = environ.get("QUERY_STRING", "")
        if query and environ["PATH_INFO"] == "/strict":
            start_response("400 Bad Request", [("Content-Length", "0")])
            return [b""]
        body = b"".join(app(environ, lambda status, headers: start_response(status, headers)))
        asked.append((environ["PATH_INFO"], query, len(body)))
        return [body]

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    httpd = make_server("127.0.0.1", 0, served, handler_class=Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        times = iter(range(100, 200, 10))
        reader = ServingReader([Endpoint((0,), f"{base}/metrics"), Endpoint((1,), f"{base}/strict")], 10.0,
                               clock=lambda: float(next(times)))
        pairs = []
        for _ in range(2):
            reader.read_all()  # (both asked at once, as the agent's ticks ask them)
            pairs += reader.pairs()
    finally:
        httpd.shutdown()
    whole, narrow = [a for a in asked if a[0] == "/metrics"]
    assert whole[1] == "" and "name%5B%5D=vllm%3Arequest_success_total" in narrow[1]
    assert narrow[2] * 3 < whole[2]  # a fraction of the page
    assert [q for p, q, _ in asked if p == "/strict"] == ["", ""]  # refused once: whole from then on
    assert not reader.errors
    (_, (_, first), (_, second)), (_, (_, strict_first), (_, strict_second)) = pairs
    assert second.values == first.values == strict_second.values == strict_first.values  # the same, either way


def test_the_ticks_read_every_endpoint_and_a_slow_one_holds_up_no_other():
    """Each endpoint on its own connection: while the slow endpoint's request waits out its
    timeout (1 s), each good one is asked again at its rate (every 0.25 s of the ticks' clock),
    its answer taken at the next tick, on no thread of the reader's own."""
    httpd = EngineServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    now = [0.0]
    reader = ServingReader([Endpoint((0,), f"{base}/good"), Endpoint((1,), f"{base}/slow"),
                            Endpoint((2,), f"{base}/good?copy")], interval_s=0.25, timeout_s=1.0,
                           clock=lambda: now[0], monotonic=lambda: now[0])
    read_at: dict[int, set[float]] = {0: set(), 2: set()}  # when each good endpoint's readings were asked
    try:
        while (f"{base}/slow", "timeout") not in reader.errors:
            stepped(reader, lambda: not {0, 2} & {a.endpoint for a in reader._flight.values()}, "the good answers")
            for i, at in read_at.items():
                at.add(reader._latest[i][0])
            now[0] += 0.25
            assert now[0] < 10
        assert not [t.name for t in threading.enumerate() if t.name.startswith("serving")]  # (no thread of its own)
    finally:
        Engine.release.set()
        httpd.shutdown()
        Engine.release.clear()
    # the slow one asked at 0 s and given up after its 1 s; each good one read at every beat meanwhile
    assert read_at[0] >= {0.0, 0.25, 0.5, 0.75, 1.0} and read_at[2] >= {0.0, 0.25, 0.5, 0.75, 1.0}, read_at
    assert reader.errors[(f"{base}/slow", "timeout")] == 1 and len(reader.errors) == 1


def test_an_endpoint_added_is_read_at_the_next_tick_and_stop_ends_the_readings(server):
    reader = ServingReader([], interval_s=60.0)
    assert reader.add(Endpoint((0,), f"{server}/good")) and not reader.add(Endpoint((1,), f"{server}/good"))
    stepped(reader, lambda: reader._latest, "the added endpoint read")  # at once, not a minute later
    reader.add(Endpoint((1,), f"{server}/slow"))
    reader.step()
    assert reader._flight
    reader.stop()
    assert reader.stopping.is_set() and not reader._flight  # (the discovery's thread ends with it)
    reader.step()  # a tick after the stop reads nothing
    assert not reader._flight and not reader.errors


@pytest.mark.parametrize("setting, declared, expected", [
    (None, None, "meta-llama/Llama-3.1-8B-Instruct"),  # the model the engine serves
    (None, "sd-xl", "sd-xl"),  # the service the workflow's labels or environment declare
    ("chat", "sd-xl", "chat"),  # the endpoint's own setting first
])
def test_a_replicas_samples_are_named_by_setting_then_declaration_then_model(setting, declared, expected):
    reader = ServingReader([Endpoint((0,), "http://x/metrics", service=setting)], interval_s=1.0)
    reader.step = lambda: None  # (its readings set by hand)
    reader._latest[0] = (1.0, read("vllm-0.6"))
    reader.pairs()
    reader._latest[0] = (2.0, read("vllm-0.6-later"))
    spooled = []
    observe = ServingObserver(reader, lambda *a: spooled.append(a[2]), host="h",
                              declared={"svc-1": declared}.get)
    observe([{"gpu_index": 0, "gpu_uuid": "GPU-0", "workflow_id": "svc-1", "owner": "ana", "team": "ml"}], {})
    assert [r["service"] for r in spooled] == [expected]


def test_a_fault_of_the_readers_own_is_counted_and_the_readings_go_on(server, caplog):
    now = [0.0]
    reader = ServingReader([Endpoint((0,), f"{server}/good")], interval_s=1.0, monotonic=lambda: now[0])
    answers, faults = reader._answers, []

    def faulty():
        if not faults:
            faults.append(1)
            raise RuntimeError("a fault of the reader's own")
        answers()

    reader._answers = faulty
    with caplog.at_level("ERROR"):
        reader.step()  # asked
        reader.step()  # the fault: the request in flight dropped
    assert reader.errors[("reader", "fault")] == 1 and "a fault of the reader's own" in caplog.text
    assert not reader._flight
    now[0] = 1.0  # asked again when next due
    stepped(reader, lambda: reader._latest, "a reading after the fault")


def test_the_failed_readings_are_on_the_agents_metrics_endpoint(server, tmp_path):
    from prometheus_client import generate_latest

    from producers.agent.metrics import AgentMetrics
    from producers.agent.spool.disk import Spool

    reader = ServingReader([Endpoint((0,), f"{server}/garbage"), Endpoint((1,), f"{server}/good")], interval_s=1.0)
    stepped(reader, lambda: reader._latest and reader.errors, "a reading of each")
    text = generate_latest(AgentMetrics(Spool(tmp_path), serving=reader).registry).decode()
    assert f'gpufleet_agent_serving_errors_total{{endpoint="{server}/garbage",reason="garbage"}} 1.0' in text
    assert f"{server}/good" not in text


def test_an_endpoints_password_is_sent_but_never_shown(server, tmp_path, caplog):
    """An engine behind basic auth, the credentials in the setting's URL. Before, the URL was
    shown whole: the agent's log and its metrics endpoint (a failure's label) said the password,
    and a replica whose engine names no model was the service ``ana:s3cret@host:port``, sent to
    Kafka, stored, and shown on its owners' pages."""
    from prometheus_client import generate_latest

    from producers.agent.metrics import AgentMetrics
    from producers.agent.spool.disk import Spool

    Engine.authorizations.clear()
    secret = server.replace("http://", "http://ana:s3cret@")
    reader = ServingReader([Endpoint((0,), f"{secret}/garbage"), Endpoint((1,), f"{secret}/good")], interval_s=1.0)
    with caplog.at_level("DEBUG"):
        stepped(reader, lambda: reader._latest and reader.errors, "a reading of each")
    assert set(Engine.authorizations) == {"Basic YW5hOnMzY3JldA=="}  # (ana:s3cret: sent with every request)
    text = generate_latest(AgentMetrics(Spool(tmp_path), serving=reader).registry).decode()
    assert f'gpufleet_agent_serving_errors_total{{endpoint="{server}/garbage",reason="garbage"}} 1.0' in text
    assert "s3cret" not in text and "s3cret" not in caplog.text and f"{server}/garbage" in caplog.text

    reader = ServingReader([Endpoint((0,), "http://ana:s3cret@10.0.0.5:3000/metrics")], interval_s=1.0)
    reader.step = lambda: None  # (its readings set by hand: TGI's, which name no model)
    reader._latest[0] = (1.0, read("tgi"))
    reader.pairs()
    reader._latest[0] = (2.0, read("tgi-later"))
    spooled = []
    ServingObserver(reader, lambda *a: spooled.append(a[2]), host="h")(
        [{"gpu_index": 0, "gpu_uuid": "GPU-0", "workflow_id": "svc-1", "owner": "ana", "team": "ml"}], {})
    assert [r["service"] for r in spooled] == ["10.0.0.5:3000"]


def test_credentials_from_a_netrc_file_are_sent_and_kept_off_the_command_line(server, tmp_path):
    """Every user of a host reads each process's command line (``/proc/PID/cmdline``), so a
    password in ``--serving-endpoint``'s URL is the host's to read. ``--serving-netrc`` names a
    file of the credentials instead (netrc's format, read by libcurl), for the endpoints the
    setting names and for those the discovery finds."""
    netrc = tmp_path / "serving.netrc"
    netrc.write_text("machine 127.0.0.1 login ana password s3cret\n")
    Engine.authorizations.clear()
    reader = ServingReader([Endpoint((0,), f"{server}/good")], interval_s=1.0, netrc=str(netrc))
    stepped(reader, lambda: reader._latest, "a reading")
    reader.add(Endpoint((1,), f"{server}/found"))  # (as the discovery adds one)
    stepped(reader, lambda: len(reader._latest) == 2, "a reading of the endpoint added")
    assert set(Engine.authorizations) == {"Basic YW5hOnMzY3JldA=="}
