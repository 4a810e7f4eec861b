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
    yield ApiServerPods(f"http://127.0.0.1:{server.server_address[1]}", token="t0ken"), seen
    server.shutdown()


def test_pods_holding_gpus_are_jobs_with_owner_and_team_from_their_labels(kubelet, api_server):
    servicer, socket = kubelet
    pods, seen = api_server
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
    from pathlib import Path

    grpc_tools = pytest.importorskip("grpc_tools.protoc")
    root = Path(__file__).resolve().parents[3]
    proto = "producers/podresources_v1/api.proto"
    assert grpc_tools.main(["protoc", f"-I{root}", f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                            str(root / proto)]) == 0
    for name in ("api_pb2.py", "api_pb2_grpc.py"):
        assert (tmp_path / "producers/podresources_v1" / name).read_text() == (root / proto).with_name(name).read_text()
