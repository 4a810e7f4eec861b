"""Kubernetes' allocations on this node: the kubelet's pod resources API (v1, gRPC on its unix
socket), which says which device ids each container of each pod was given, and the pods'
labels and annotations from the API server for owner and team.

``List`` answers every pod on the node with the devices of each of its containers: the GPUs of
the NVIDIA device plugin (``nvidia.com/gpu``, device ids that are GPU UUIDs, or MIG UUIDs under
the single MIG strategy) and its MIG resources (``nvidia.com/mig-1g.10gb`` and the like). A pod
holding any of them is a job: its workflow is ``k8s-pod-<uid>``, as its processes are
attributed from their cgroup. A pod that leaves the list has ended; a list that fails (the
kubelet restarting) ends nothing.

The labels come from the API server (the agent's service account needs ``get`` on pods): the
owner from the first of the configured label or annotation keys the pod has, the team likewise,
else its namespace. Without the API server the pod is known by namespace and name only.

A pod whose labels (or annotations) have one of ``serving_labels`` (``KEY`` or ``KEY=VALUE``;
``gpufleet.io/service`` by default) is declared a serving replica: its allocation names the
service (``service_of``), and the worker judges it by its traffic from its first window.

The same answer says where a pod's metrics are: a pod annotated for scraping the way Prometheus'
Kubernetes configurations read (``prometheus.io/scrape: "true"``, ``prometheus.io/port``, and
``prometheus.io/path`` and ``prometheus.io/scheme`` where not ``/metrics`` over HTTP) at its IP is
a ``ScrapeTarget`` of its GPUs (``scrape_targets``), which the serving discovery asks whether an
engine answers there (``producers.serving.discover``).
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import msgspec

from producers.agent.allocations.allocation import KUBERNETES, Allocation, Allocations
from schemas.validate_sample import service_error

log = logging.getLogger(__name__)

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")  # a name, or a prefix ending in "-"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class PodMetadata(msgspec.Struct, frozen=True):
    uid: str
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    ip: str | None = None  # the pod's IP (status.podIP), where its containers listen


class ScrapeTarget(msgspec.Struct, frozen=True):
    """Where a pod's annotations say its metrics are, and the GPUs (device ids) it holds."""

    gpus: tuple[str, ...]
    url: str
    service: str | None = None  # as the pod's labels name it (``service_of``)
    model: str | None = None  # the model its engine is read for, of several (``model_of``)


def scrape_url(meta: PodMetadata) -> str | None:
    """The URL of a pod's metrics as its Prometheus scrape annotations give it; None where it is
    not annotated for scraping, names no port, or has no IP yet."""
    a = meta.annotations
    port = a.get("prometheus.io/port", "")
    scheme = a.get("prometheus.io/scheme", "http")
    if a.get("prometheus.io/scrape", "").lower() != "true" or not meta.ip or scheme not in ("http", "https") \
            or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    path = a.get("prometheus.io/path") or "/metrics"
    host = f"[{meta.ip}]" if ":" in meta.ip else meta.ip
    return f"{scheme}://{host}:{int(port)}{path if path.startswith('/') else '/' + path}"


def service_of(meta: PodMetadata, name: str | None = None) -> str | None:
    """The service a pod is a replica of, as its labels name it: ``gpufleet.io/service`` (label or
    annotation), else ``app.kubernetes.io/name``, else ``app``, else ``name`` (the pod's)."""
    found = {**meta.annotations, **meta.labels}
    return found.get("gpufleet.io/service") or meta.labels.get("app.kubernetes.io/name") or \
        meta.labels.get("app") or name


def model_of(meta: PodMetadata) -> str | None:
    """The model a pod's engine is read for, where it serves several from one endpoint (Triton):
    ``gpufleet.io/model`` (label or annotation); None where the pod names none."""
    return {**meta.annotations, **meta.labels}.get("gpufleet.io/model") or None


def declares(meta: PodMetadata, serving_labels: tuple[str, ...]) -> bool:
    """Whether a pod's labels or annotations have one of ``serving_labels`` (``KEY``: any value
    but empty; ``KEY=VALUE``: that value)."""
    found = {**meta.annotations, **meta.labels}
    for label in serving_labels:
        key, sep, value = label.partition("=")
        if (found.get(key) == value) if sep else bool(found.get(key)):
            return True
    return False


class Pods(Protocol):
    def get(self, namespace: str, name: str) -> PodMetadata | None: ...


class ApiServerPods:
    """Pods' metadata from the Kubernetes API server, with the pod's service account (in a
    cluster: ``KUBERNETES_SERVICE_HOST``, the token and CA the kubelet mounts)."""

    def __init__(self, base_url: str, token: str | None = None, ca_file: str | None = None,
                 timeout_s: float = 2.0) -> None:
        self.base_url, self.token, self.timeout_s = base_url.rstrip("/"), token, timeout_s
        self.context = ssl.create_default_context(cafile=ca_file) if base_url.startswith("https") else None

    @classmethod
    def in_cluster(cls) -> ApiServerPods | None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not (SERVICE_ACCOUNT / "token").exists():
            return None
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", (SERVICE_ACCOUNT / "token").read_text().strip(),
                   str(SERVICE_ACCOUNT / "ca.crt"))

    def get(self, namespace: str, name: str) -> PodMetadata | None:
        path = f"/api/v1/namespaces/{urllib.parse.quote(namespace, safe='')}/pods/{urllib.parse.quote(name, safe='')}"
        request = urllib.request.Request(self.base_url + path, headers={"Accept": "application/json"})
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self.context) as response:
                pod = json.loads(response.read())
                meta = pod.get("metadata") or {}
        except (OSError, ValueError) as exc:
            log.warning("pod %s/%s from the API server: %s", namespace, name, exc)
            return None
        if not isinstance(meta.get("uid"), str):
            return None
        ip = (pod.get("status") or {}).get("podIP")
        return PodMetadata(meta["uid"], _strings(meta.get("labels")), _strings(meta.get("annotations")),
                           ip if isinstance(ip, str) and ip else None)


def _strings(value) -> dict[str, str]:
    return (
        {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(value, dict) else {}
    )


class KubeletAllocations:
    """The agent's view of the kubelet's pod resources: the pods holding GPUs now, and those
    that stopped holding them since the last tick."""

    scheduler = KUBERNETES

    def __init__(self, socket: str = SOCKET, pods: Pods | None = None,
                 owner_keys: tuple[str, ...] = ("gpufleet.io/owner",),
                 team_keys: tuple[str, ...] = ("gpufleet.io/team",),
                 resources: tuple[str, ...] = GPU_RESOURCES, timeout_s: float = 2.0,
                 cluster: str | None = None, serving_labels: tuple[str, ...] = ("gpufleet.io/service",)) -> None:
        import grpc  # the optional 'kubernetes' extra: only an agent that reads the kubelet needs it

        from producers.podresources_v1 import api_pb2, api_pb2_grpc

        self._request = api_pb2.ListPodResourcesRequest()
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._list = api_pb2_grpc.PodResourcesListerStub(self._channel).List
        self._errors = (grpc.RpcError,)
        self.pods, self.owner_keys, self.team_keys = pods, owner_keys, team_keys
        self.resources, self.timeout_s, self.cluster = resources, timeout_s, cluster
        self.serving_labels = serving_labels
        self._held: dict[tuple[str, str], Allocation] = {}  # (namespace, name) -> its allocation
        self._meta: dict[tuple[str, str], PodMetadata] = {}  # what the API server said of each held pod
        self._failing = False

    def close(self) -> None:
        self._channel.close()

    def _gpu(self, resource: str) -> bool:
        return any(resource == r or (r.endswith("-") and resource.startswith(r)) for r in self.resources)

    def read(self, now_ms: int) -> Allocations:
        try:
            answer = self._list(self._request, timeout=self.timeout_s)
        except self._errors as exc:
            if not self._failing:
                log.warning("the kubelet's pod resources did not answer (%s); keeping the last known allocations",
                            exc.code() if hasattr(exc, "code") else exc)
            self._failing = True
            return Allocations(tuple(self._held.values()))
        if self._failing:
            log.info("the kubelet's pod resources answer again")
            self._failing = False
        held: dict[tuple[str, str], Allocation] = {}
        for pod in answer.pod_resources:
            devices = [d for c in pod.containers for dev in c.devices if self._gpu(dev.resource_name)
                       for d in dev.device_ids]
            if not devices:
                continue
            key = (pod.namespace, pod.name)
            before = self._held.get(key)
            held[key] = before if before is not None and set(before.gpus) == set(devices) else \
                self._allocation(pod.namespace, pod.name, tuple(dict.fromkeys(devices)), before, now_ms)
        ended = tuple(msgspec.structs.replace(a, ended_ms=now_ms) for key, a in self._held.items() if key not in held)
        self._held = held
        self._meta = {key: meta for key, meta in self._meta.items() if key in held}  # (replaced whole: read by
        return Allocations(tuple(held.values()), ended)                              # the discovery's thread)

    def scrape_targets(self) -> list[ScrapeTarget]:
        """The held pods that their annotations say to scrape, with their GPUs (``scrape_url``)."""
        held, meta = self._held, self._meta
        out = []
        for key, m in meta.items():
            url, job = scrape_url(m), held.get(key)
            if url is not None and job is not None:
                out.append(ScrapeTarget(job.gpus, url, service_of(m), model_of(m)))
        return out

    def _allocation(self, namespace: str, name: str, gpus: tuple[str, ...], before: Allocation | None,
                    now_ms: int) -> Allocation:
        if before is not None:  # the same pod with other devices (resized): what we knew of it stays
            return msgspec.structs.replace(before, gpus=gpus)
        meta = self.pods.get(namespace, name) if self.pods is not None else None
        if meta is not None:
            self._meta = {**self._meta, (namespace, name): meta}
        found = {**meta.annotations, **meta.labels} if meta else {}
        job = meta.uid if meta else f"{namespace}/{name}"
        service = service_of(meta, name) if meta and declares(meta, self.serving_labels) else None
        if (wrong := service_error(service)) is not None:
            log.warning("pod %s/%s: %s; it is not declared a serving replica", namespace, name, wrong)
            service = None
        return Allocation(
            scheduler=KUBERNETES, job_id=job,
            workflow_id=f"k8s-pod-{meta.uid}" if meta else f"k8s-pod-{namespace}.{name}",
            gpus=gpus, owner=next((found[k] for k in self.owner_keys if found.get(k)), None),
            team=next((found[k] for k in self.team_keys if found.get(k)), namespace),
            partition=namespace, name=name, cluster=self.cluster, started_ms=now_ms, service=service,
        )

    def forget(self, ended: Iterable[Allocation]) -> None:
        """Ends are told once, from memory: an agent restarted after a pod left does not know it."""
