"""Whole-host metrics for one agent tick (psutil) -> ``HostSample``: CPU, I/O wait, memory,
disk and network rates, and the CPU and memory of each workflow's processes and their children
(data-loader workers hold no GPU but are the workflow's input pipeline)."""

from __future__ import annotations

import time

import psutil


class HostSampler:
    def __init__(self) -> None:
        psutil.cpu_percent(None)
        psutil.cpu_times_percent(None)
        self._disk = psutil.disk_io_counters()
        self._net = psutil.net_io_counters()
        self._t = time.monotonic()
        self._procs: dict[int, psutil.Process] = {}

    def sample(self, event_time: int, interval_ms: int, host: str, workflows: dict[str, set[int]],
               spool_dropped_total: int = 0) -> dict:
        now = time.monotonic()
        dt = max(now - self._t, 1e-6)
        self._t = now
        disk, net = psutil.disk_io_counters(), psutil.net_io_counters()
        mem = psutil.virtual_memory()
        times = psutil.cpu_times_percent(None)
        record = {
            "event_time": event_time,
            "interval_ms": interval_ms,
            "host": host,
            "cpu_count": psutil.cpu_count() or 1,
            "cpu_pct": float(psutil.cpu_percent(None)),
            "iowait_pct": float(getattr(times, "iowait", 0.0)),
            "memory_used_bytes": int(mem.total - mem.available),
            "memory_total_bytes": int(mem.total),
            "disk_read_bytes_per_s": _rate(self._disk, disk, "read_bytes", dt),
            "disk_write_bytes_per_s": _rate(self._disk, disk, "write_bytes", dt),
            "net_rx_bytes_per_s": _rate(self._net, net, "bytes_recv", dt),
            "net_tx_bytes_per_s": _rate(self._net, net, "bytes_sent", dt),
            "workflows": [self._usage(wf, pids) for wf, pids in sorted(workflows.items())],
            "spool_dropped_total": spool_dropped_total,
        }
        self._disk, self._net = disk, net
        return record

    def _usage(self, workflow_id: str, pids: set[int]) -> dict:
        cpu, rss, seen = 0.0, 0, set()
        for pid in pids:
            proc = self._process(pid)
            if proc is None:
                continue
            try:
                family = [proc, *proc.children(recursive=True)]
            except psutil.Error:
                family = [proc]
            for p in family:
                if p.pid in seen:
                    continue
                seen.add(p.pid)
                p = self._process(p.pid) or p
                try:
                    cpu += p.cpu_percent(None)  # since this process's previous call: first call is 0
                    rss += p.memory_info().rss
                except psutil.Error:
                    continue
        return {"workflow_id": workflow_id, "processes": len(seen), "cpu_pct": cpu, "rss_bytes": rss}

    def _process(self, pid: int) -> psutil.Process | None:
        proc = self._procs.get(pid)
        if proc is None or not proc.is_running():
            try:
                proc = self._procs[pid] = psutil.Process(pid)
            except psutil.Error:
                self._procs.pop(pid, None)
                return None
        return proc


def _rate(before, after, field: str, dt: float) -> float | None:
    if before is None or after is None:
        return None
    return max(0.0, (getattr(after, field) - getattr(before, field)) / dt)
