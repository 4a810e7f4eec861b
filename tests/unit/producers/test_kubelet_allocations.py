"""The agent's Kubernetes allocation source against a gRPC server made from the kubelet's
published pod resources API (v1), on a unix socket as the kubelet serves it, and an HTTP server
answering the API server's pod requests. No kubelet can run here."""

from __future__ import annotations

import json
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest

from producers.agent.allocations.kubelet import ApiServerPods, KubeletAllocations
from producers.podresources_v1 import api_pb2, api_pb2_grpc

GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.pods: list[api_pb2.PodResources] = []
        self.failing = False

    def List(self, request, context):
        if self.failing:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)


def pod(namespace: str, name: str, *containers: list[tuple[str, list[str]]]) -> api_pb2.PodResources:
    return api_pb2.PodResources(name=name, namespace=namespace, containers=[
        api_pb2.ContainerResources(name=f"c{i}", devices=[
            api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices])
        for i, devices in enumerate(containers)])


@pytest.fixture
def kubelet(tmp_path):
    servicer = Kubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    socket = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    yield servicer, str(socket)
    server.stop(None)


@pytest.fixture
def api_server():
    pods = {"ml/train-0": {"metadata": {"uid": "6f1c2a9e-0000-4000-8000-000000000001",
                                        "labels": {"gpufleet.io/owner": "ana", "app": "train"},
                                        "annotations": {"gpufleet.io/team": "vision"}}},
            "ml/notebook": {"metadata": {"uid": "6f1c2a9e-0000-4000-8000-000000000002", "labels": {}}}}
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            parts = self.path.split("/")  # /api/v1/namespaces/<ns>/pods/<name>
            found = pods.get(f"{parts[4]}/{parts[6]}") if len(parts) == 7 else None
            body = json.dumps(found or {"kind": "Status", "code": 404}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield ApiServerPods(f"http://127.0.0.1:{server.server_address[1]}", token="t0ken"), seen, pods
    server.shutdown()


def test_pods_holding_gpus_are_jobs_with_owner_and_team_from_their_labels(kubelet, api_server):
    servicer, socket = kubelet
    pods, seen, _ = api_server
    servicer.pods = [
        pod("ml", "train-0", [(GPU, ["GPU-a", "GPU-b"]), ("example.com/nic", ["nic0"])], [(GPU, ["GPU-c"])]),
        pod("ml", "notebook", [(MIG, ["MIG-x"])]),
        pod("web", "frontend", [("cpu", [])]),  # no GPU: not a job of ours
    ]
    source = KubeletAllocations(socket, pods=pods, cluster="east")
    now = source.read(1_000)
    assert now.ended == ()
    by = {a.name: a for a in now.current}
    assert set(by) == {"train-0", "notebook"}
    train = by["train-0"]
    assert (train.workflow_id, train.job_id, train.gpus) == (
        "k8s-pod-6f1c2a9e-0000-4000-8000-000000000001", "6f1c2a9e-0000-4000-8000-000000000001",
        ("GPU-a", "GPU-b", "GPU-c"))
    assert (train.owner, train.team, train.scheduler, train.started_ms, train.cluster) == (
        "ana", "vision", "kubernetes", 1_000, "east")
    assert (by["notebook"].owner, by["notebook"].team, by["notebook"].gpus) == (None, "ml", ("MIG-x",))  # namespace
    assert all(auth == "Bearer t0ken" for _, auth in seen) and len(seen) == 2
    source.read(2_000)
    assert len(seen) == 2  # asked once per pod, not every tick
    source.close()


def test_a_pod_that_leaves_the_list_has_ended_and_a_failing_kubelet_ends_nothing(kubelet, api_server):
    servicer, socket = kubelet
    servicer.pods = [pod("ml", "train-0", [(GPU, ["GPU-a"])]), pod("ml", "notebook", [(GPU, ["GPU-b"])])]
    source = KubeletAllocations(socket, pods=api_server[0])
    source.read(1_000)
    servicer.failing = True
    during = source.read(2_000)
    assert {a.name for a in during.current} == {"train-0", "notebook"} and during.ended == ()
    servicer.failing = False
    servicer.pods = servicer.pods[:1]
    after = source.read(3_000)
    assert [a.name for a in after.current] == ["train-0"]
    assert [(a.name, a.ended_ms, a.started_ms) for a in after.ended] == [("notebook", 3_000, 1_000)]
    assert source.read(4_000).ended == ()  # told once
    source.close()


def test_without_the_api_server_a_pod_is_known_by_namespace_and_name(kubelet):
    servicer, socket = kubelet
    servicer.pods = [pod("ml", "train-0", [(GPU, ["GPU-a"])])]
    source = KubeletAllocations(socket, pods=None)
    a, = source.read(1_000).current
    assert (a.workflow_id, a.job_id, a.team, a.owner) == ("k8s-pod-ml.train-0", "ml/train-0", "ml", None)
    source.close()


def test_the_generated_modules_match_the_proto(tmp_path):
    """The committed api_pb2*.py are what `make proto` makes of api.proto."""
    from importlib.metadata import version
    from pathlib import Path

    grpc_tools = pytest.importorskip("grpc_tools.protoc")
    root = Path(__file__).resolve().parents[3]
    proto = "producers/podresources_v1/api.proto"
    assert grpc_tools.main(["protoc", f"-I{root}", f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                            str(root / proto)]) == 0
    made_by = f"grpcio-tools {version('grpcio-tools')}"
    for name in ("api_pb2.py", "api_pb2_grpc.py"):
        made = (tmp_path / "producers/podresources_v1" / name).read_text()
        assert made == (root / proto).with_name(name).read_text(), (
            f"{name} as {made_by} makes it differs from the committed one: the dev extra pins the release "
            "that made them; where the pin moves, run `make proto` and raise the kubernetes extra's grpcio")


def test_a_pod_annotated_for_scraping_is_where_the_discovery_finds_its_engine(kubelet, api_server):
    """An inference pod annotated as Prometheus' Kubernetes configurations read it: its engine found
    at the pod's IP and annotated port and path, an endpoint of the GPUs the kubelet gave the pod
    (by their index on this host), named by the pod's service label; a pod annotated for another
    exporter, or not annotated, is none."""
    from producers.agent.gpus.reading import GpuReading
    from producers.serving.discover import Discovery, gpu_indices
    from producers.serving.scrape import ServingReader
    from tests.support.serving_pages import DATA, serve

    servicer, socket = kubelet
    client, _, pods = api_server
    engine, other = serve((DATA / "vllm-0.6.prom").read_bytes(), "/v1/metrics"), serve(b"<html></html>")
    try:
        def annotated(uid: str, port: int, labels: dict) -> dict:
            return {"metadata": {"uid": uid, "labels": labels, "annotations": {
                "prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/v1/metrics"}},
                "status": {"podIP": "127.0.0.1"}}
        pods["ai/llm-0"] = annotated("u-llm", engine.server_address[1], {"app.kubernetes.io/name": "llama-70b"})
        pods["ai/exporter"] = annotated("u-exp", other.server_address[1], {})
        servicer.pods = [pod("ai", "llm-0", [(GPU, ["GPU-c", "GPU-d"])]), pod("ai", "exporter", [(GPU, ["GPU-e"])]),
                         pod("ml", "train-0", [(GPU, ["GPU-a"])])]
        source = KubeletAllocations(socket, pods=client)
        source.read(1_000)
        targets = {t.url.rsplit(":", 1)[1]: t for t in source.scrape_targets()}
        assert {k: (t.gpus, t.service) for k, t in targets.items()} == {
            f"{engine.server_address[1]}/v1/metrics": (("GPU-c", "GPU-d"), "llama-70b"),
            f"{other.server_address[1]}/v1/metrics": (("GPU-e",), None)}
        readings = [GpuReading(index=i, uuid=u, name="H200") for i, u in enumerate(["GPU-a", "GPU-b", "GPU-c",
                                                                                       "GPU-d", "GPU-e"])]
        reader = ServingReader([], 10.0)
        found = Discovery(reader, dict, targets=source.scrape_targets,
                          indices=lambda: gpu_indices(readings)).once()
        assert [(e.gpus, e.url, e.engine, e.service) for e in found] == [
            ((2, 3), f"http://127.0.0.1:{engine.server_address[1]}/v1/metrics", "vllm", "llama-70b")]
        servicer.pods = servicer.pods[1:]  # the inference pod ends: no target of it is left
        source.read(2_000)
        assert [t.gpus for t in source.scrape_targets()] == [("GPU-e",)]
        source.close()
    finally:
        engine.shutdown()
        other.shutdown()


def test_a_scrape_url_needs_the_annotation_a_port_and_an_ip():
    from producers.agent.allocations.kubelet import PodMetadata, scrape_url

    on = {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"}
    assert scrape_url(PodMetadata("u", annotations=on, ip="10.1.2.3")) == "http://10.1.2.3:8000/metrics"
    assert scrape_url(PodMetadata("u", annotations={**on, "prometheus.io/scheme": "https", "prometheus.io/path":
                                                    "stats"}, ip="fd00::7")) == "https://[fd00::7]:8000/stats"
    assert scrape_url(PodMetadata("u", annotations=on)) is None  # no IP yet
    assert scrape_url(PodMetadata("u", annotations={**on, "prometheus.io/scrape": "false"}, ip="10.1.2.3")) is None
    for port in ("", "http", "0", "70000"):
        assert scrape_url(PodMetadata("u", annotations={**on, "prometheus.io/port": port}, ip="10.1.2.3")) is None
    assert scrape_url(PodMetadata("u", annotations={**on, "prometheus.io/scheme": "file"}, ip="10.1.2.3")) is None


def test_a_pod_its_labels_declare_a_serving_replica_names_its_service(kubelet, api_server):
    """``gpufleet.io/service`` (the default) or a label the site names (``--serving-labels``)
    declares a pod a replica, of the service its labels name; a pod without is none, and a
    service that cannot be a name declares nothing."""
    servicer, socket = kubelet
    client, _, pods = api_server
    pods["ai/sd-0"] = {"metadata": {"uid": "u-sd", "labels": {"gpufleet.io/service": "sd-xl"}}}
    pods["ai/chat-0"] = {"metadata": {"uid": "u-chat", "labels": {"app.kubernetes.io/component": "inference",
                                                                  "app.kubernetes.io/name": "chat-llm"}}}
    pods["ai/batch-0"] = {"metadata": {"uid": "u-batch", "labels": {"app.kubernetes.io/component": "batch"}}}
    pods["ai/bad-0"] = {"metadata": {"uid": "u-bad", "annotations": {"gpufleet.io/service": "sd\nxl"}}}
    servicer.pods = [pod("ai", name, [(GPU, [f"GPU-{i}"])]) for i, name in
                     enumerate(["sd-0", "chat-0", "batch-0", "bad-0"])] + [pod("ml", "train-0", [(GPU, ["GPU-9"])])]
    by_default = KubeletAllocations(socket, pods=client)
    assert {a.name: a.service for a in by_default.read(1_000).current} == {
        "sd-0": "sd-xl", "chat-0": None, "batch-0": None, "bad-0": None, "train-0": None}
    by_component = KubeletAllocations(socket, pods=client, serving_labels=(
        "gpufleet.io/service", "app.kubernetes.io/component=inference"))
    assert {a.name: a.service for a in by_component.read(1_000).current} == {
        "sd-0": "sd-xl", "chat-0": "chat-llm", "batch-0": None, "bad-0": None, "train-0": None}
    by_default.close()
    by_component.close()


def test_a_pod_of_an_engine_serving_several_models_is_read_for_the_model_it_names(kubelet, api_server):
    """Two Triton pods serving the same ensemble and the models it is made of: the one whose
    ``gpufleet.io/model`` names the ensemble is found and read for it; the one naming none is
    counted (reason ``models``) and not read, its requests never summed over the models."""
    from producers.agent.gpus.reading import GpuReading
    from producers.serving.discover import Discovery, gpu_indices
    from producers.serving.scrape import ServingReader
    from tests.support.serving_pages import DATA, serve

    servicer, socket = kubelet
    client, _, pods = api_server
    text = (DATA / "triton-ensemble.prom").read_bytes()
    named, unnamed = serve(text), serve(text)
    try:
        for uid, server, labels in (("u-0", named, {"app": "vision", "gpufleet.io/model": "pipeline"}),
                                    ("u-1", unnamed, {"app": "vision"})):
            pods[f"ai/vision-{uid[-1]}"] = {"metadata": {"uid": uid, "labels": labels, "annotations": {
                "prometheus.io/scrape": "true", "prometheus.io/port": str(server.server_address[1])}},
                "status": {"podIP": "127.0.0.1"}}
        servicer.pods = [pod("ai", "vision-0", [(GPU, ["GPU-a"])]), pod("ai", "vision-1", [(GPU, ["GPU-b"])])]
        source = KubeletAllocations(socket, pods=client)
        source.read(1_000)
        readings = [GpuReading(index=i, uuid=u, name="H200") for i, u in enumerate(["GPU-a", "GPU-b"])]
        reader = ServingReader([], 10.0)
        found = Discovery(reader, dict, targets=source.scrape_targets, indices=lambda: gpu_indices(readings)).once()
        url = "http://127.0.0.1:{}/metrics".format
        assert [(e.gpus, e.url, e.engine, e.service, e.model) for e in found] == [
            ((0,), url(named.server_address[1]), "triton", "vision", "pipeline")]
        assert reader.failures() == {(url(unnamed.server_address[1]), "models"): 1}
        source.close()
    finally:
        named.shutdown()
        unnamed.shutdown()
