"""The monthly reports (issue 42): each owner and each team's lead gets the last whole month's
GPU-hours, goodput, largest losses, the jobs to look at with their pages, and the change since
the month before, by e-mail to a real SMTP server, once: through a restart too."""

from __future__ import annotations

import email
import email.policy
from datetime import UTC, datetime

import pytest
from aiosmtpd.controller import Controller

from gpufleet.local.ports import free_port
from gpufleet.reports.periodic import PeriodicReports, last_whole, period_start, report, usage
from sinks.clickhouse_ddl import WORKFLOW_WINDOWS_TABLE
from sinks.route_alerts import Routing, SmtpSettings
from sinks.sent_log import SentLog
from sinks.write_clickhouse import ClickHouseWriter, Row
from tests.support.alerts import Mailbox
from tests.support.samples import window

HOUR = 3_600_000
NOV = int(datetime(2026, 11, 10, tzinfo=UTC).timestamp() * 1000)
OCT = int(datetime(2026, 10, 10, tzinfo=UTC).timestamp() * 1000)


def job(n: int, workflow_id: str, owner: str, team: str, at_ms: int, productive: float, idle: float) -> Row:
    return Row(0, n, window(workflow_id=workflow_id, owner=owner, team=team, window_start=at_ms,
                            window_end=at_ms + 60_000, gpu_seconds=productive + idle, productive_gpu_seconds=productive,
                            idle_gpu_seconds=idle, low_util_gpu_seconds=0.0, wasted_gpu_seconds=idle))


def test_periods_are_whole_and_in_utc():
    now = datetime(2026, 12, 3, 17, 49, tzinfo=UTC)
    assert last_whole("month", now) == (datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
    assert last_whole("week", now) == (datetime(2026, 11, 23, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC))
    assert last_whole("day", now) == (datetime(2026, 12, 2, tzinfo=UTC), datetime(2026, 12, 3, tzinfo=UTC))
    assert last_whole("month", datetime(2026, 1, 5, tzinfo=UTC))[0] == datetime(2025, 12, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="a period is one of"):
        period_start("fortnight", now)


def test_owners_and_sponsors_get_last_months_report_once(chdb_client, database, tmp_path):
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [
        job(0, "wf-n1", "ana", "vision", NOV, 3600.0, 1800.0),
        job(1, "wf-n2", "ana", "vision", NOV + HOUR, 0.0, 3600.0),
        job(2, "wf-o1", "ana", "vision", OCT, 3600.0, 0.0),
        job(3, "wf-b1", "bo", "vision", NOV, 7200.0, 0.0),
        job(4, "wf-c1", "cy", "nlp", NOV, 3600.0, 0.0),  # no address known for cy: no mail
    ]) == []
    mailbox, port = Mailbox(), free_port()
    smtp = Controller(mailbox, hostname="127.0.0.1", port=port)
    smtp.start()
    try:
        routing = Routing(owner_emails={"ana": "ana@example.org", "bo": "bo@example.org",
                                        "carla": "carla@example.org"},
                          smtp=SmtpSettings(host="127.0.0.1", port=port), pages="https://gpufleet.example.org")

        def reports(sent: SentLog) -> PeriodicReports:
            return PeriodicReports(lambda: chdb_client, database, routing, lambda: {"vision": {"carla"}}, sent,
                                   clock=lambda: datetime(2026, 12, 3, 8, 0, tzinfo=UTC))

        sent = SentLog(tmp_path / "sent.log")
        assert reports(sent).tick() == 3
        assert reports(sent).tick() == 0
        sent.close()
        assert reports(SentLog(tmp_path / "sent.log")).tick() == 0  # a restarted notifier: nothing twice
    finally:
        smtp.stop()

    mails = {to[0]: email.message_from_string(raw, policy=email.policy.default) for to, raw in mailbox.messages}
    assert set(mails) == {"ana@example.org", "bo@example.org", "carla@example.org"}
    ana = mails["ana@example.org"]
    assert ana["Subject"] == "[gpufleet monthly report] your GPU use, 2026-11-01 to 2026-11-30"
    text = ana.get_body(("plain",)).get_content()
    assert "GPU-hours: 2.50, 1.00 the period before (+1.50)" in text  # 3600 + 1800 + 3600 GPU-s in November
    assert "goodput: 40.0%, 100.00% the period before (-60.00%)" in text
    assert "idle while allocated                     1.50 GPU-h  60.0%" in text
    assert "wf-n2: 1.00 of 1.00 GPU-h wasted, mostly idle while allocated  https://gpufleet.example.org/jobs/wf-n2" \
        in text and "wf-o1" not in text  # October's job is last month's
    team = mails["carla@example.org"].get_body(("plain",)).get_content()
    assert mails["carla@example.org"]["Subject"].startswith("[gpufleet monthly report] team vision")
    assert "GPU-hours: 4.50" in team and "ana " in team and "bo " in team and "cy" not in team


def test_an_owners_report_speaks_of_their_services_by_the_traffic_they_served(chdb_client, database):
    """A serving replica's owner reads their service as `gpufleet serving` says it: the replicas
    its busiest 10 minutes needed against those held, and the replicas that served no request."""
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [job(0, "chat-r1", "bo", "vision", NOV, 0.0, 10800.0),
                                                  job(1, "chat-r2", "bo", "vision", NOV, 0.0, 10800.0)]) == []
    for replica in ("chat-r1", "chat-r2"):
        for minute in range(180):  # chat-r1 served 120 requests in its first minute; nothing else, ever
            requests = 120.0 if (replica, minute) == ("chat-r1", 0) else 0.0
            start = NOV + minute * 60_000
            chdb_client.command(f"""
                INSERT INTO {database}.serving_windows
                    (workflow_id, owner, team, service, window_start, window_end, gpu_count, gpu_seconds,
                     requests, state, capacity_per_s, closed_at)
                VALUES ('{replica}', 'bo', 'vision', 'chat', fromUnixTimestamp64Milli({start}),
                        fromUnixTimestamp64Milli({start + 60_000}), 1, 60.0, {requests},
                        '{"BUSY" if requests else "IDLE"}', 2.0, now64(3))""")
    start, end = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)
    now = usage(chdb_client, database, "owner", start, end)
    (load,) = now["bo"].services
    assert (load.service, load.replicas, load.replicas_needed) == ("chat", 2, 1)
    _, text, _ = report("owner", "bo", "month", start, end, now["bo"], None, None)
    assert "The services of your replicas, by the traffic they served:" in text
    assert ("The busiest 10 min of chat (0.20 requests/s) needed 1 replica with +20% headroom: 2 held; "
            "3.0 of its 6.0 GPU-hours were held beyond the replicas needed.") in text  # 1 of 2, 3 h
    assert "2 of 2 replicas of chat served no request for their last 2.0 h or more: chat-r2 (3.0 h), chat-r1 (3.0 h)" \
        in text
    _, linked, _ = report("owner", "bo", "month", start, end, now["bo"], None, "https://gpufleet.example.org")
    assert "held beyond the replicas needed. https://gpufleet.example.org/services/chat\n" in linked
