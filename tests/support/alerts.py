"""An alert record, a job's summary, and the mail and webhook servers the notifier tests deliver to."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

from schemas.goodput_buckets import JOULES_FIELDS, SECONDS_FIELDS
from tests.support.samples import BASE_MS


class Mailbox:
    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((envelope.rcpt_tos, envelope.content.decode()))
        return "250 OK"


def alert(alert_id, status, notify, team, owner):
    return {"alert_id": alert_id, "detector": "low_utilization", "severity": "CRITICAL", "status": status,
            "notify": notify, "workflow_id": "wf-1", "owner": owner, "team": team, "window_start": BASE_MS,
            "window_end": BASE_MS + 60_000, "since": BASE_MS, "observed": 9.5, "threshold": 15.0,
            "wasted_gpu_hours_so_far": 3.2, "message": "4 GPU(s) at 9.5% mean utilisation.",
            "advice": "Raise DataLoader num_workers.", "fired_at": BASE_MS}



class Refusing(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(403 if self.path.startswith("/forbidden") else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


def job_summary(workflow_id: str, team: str, owner: str) -> dict:
    seconds = dict.fromkeys(SECONDS_FIELDS, 0.0) | {"startup_gpu_seconds": 600.0, "input_bound_gpu_seconds": 5400.0,
                                                    "productive_gpu_seconds": 1200.0}
    return {"workflow_id": workflow_id, "owner": owner, "team": team, "first_window_start": BASE_MS,
            "last_window_end": BASE_MS + 1_800_000, "end_reason": "silent for 600 s", "windows": 30, "max_gpus": 4,
            "gpu_seconds": 7200.0, "active_gpu_seconds": 6600.0, "wasted_gpu_seconds": 5000.0,
            "zero_util_gpu_seconds": 600.0, "throttled_gpu_seconds": 0.0, "utilization_mean_pct": 30.0,
            "memory_peak_fraction": 0.5, "energy_joules": 2.0e6, "xid_count": 0, "gpu_model": "NVIDIA H100 80GB HBM3",
            **seconds, **dict.fromkeys(JOULES_FIELDS, 0.0), "productive_joules": 2.0e6,
            "alerts_fired": ["input_bound"], "summarized_at": BASE_MS + 2_000_000}
