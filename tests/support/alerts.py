"""An alert record, and the mail and webhook servers the notifier tests deliver to."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

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
