"""A service's idle replicas told together: what the message says, with the count of the
replicas the service held in their time where it could be read, and without it where not."""

from sinks.serving_digest import ServingDigests, digest_message


def idle(wf: str, minutes: float, service: str = "chat-llm", status: str = "FIRING") -> dict:
    return {"alert_id": f"idle_replica:{wf}:0", "detector": "idle_replica", "status": status, "workflow_id": wf,
            "service": service, "owner": "ana", "team": "llm", "since": 0, "window_start": 0, "window_end": 60_000,
            "observed": minutes, "wasted_gpu_hours_so_far": minutes / 60,
            "message": f"The replica of {service} served no request for {minutes:.0f} min while it held 1 GPU(s).",
            "advice": "Scale the deployment down when traffic is low, or send it traffic."}


CHAT = [idle("svc-3", 30), idle("svc-2", 42), idle("svc-4", 35)]


def test_the_digest_says_how_many_of_the_replicas_the_service_held_are_idle():
    title, body, payload = digest_message(CHAT, "https://gpufleet.example.org", held=8)
    assert title == "[gpufleet warning] 3 of 8 replicas of chat-llm served no request"
    assert body.startswith(f"{title}\n\n3 of 8 replicas of chat-llm served no request for 30 min or more "
                           "while holding GPUs:\n- svc-2: no request for 42 min")
    assert body.endswith("The service's page: https://gpufleet.example.org/services/chat-llm")
    assert payload["gpufleet_idle_replicas"]["replicas_held"] == 8
    title, body, _ = digest_message([idle("sd-1", 31, "sd-xl")], None, held=4)
    assert title == "[gpufleet warning] idle replica: sd-1 of sd-xl"
    assert "\n1 of 4 replicas of sd-xl served no request for 31 min or more" in body
    _, body, _ = digest_message([idle("sd-1", 31, "sd-xl")], None, held=1)
    assert "\n1 of 1 replica of sd-xl served no request" in body


def test_without_a_count_or_with_one_the_sink_has_not_caught_up_on_it_says_how_many_are_idle():
    for held in (None, 2):  # (2: fewer than are idle, the windows of some not stored yet)
        title, body, payload = digest_message(CHAT, None, held)
        assert title == "[gpufleet warning] 3 replicas of chat-llm served no request"
        assert "\n3 replicas of chat-llm served no request for 30 min or more" in body
        assert payload["gpufleet_idle_replicas"]["replicas_held"] is None
    _, body, _ = digest_message([idle("sd-1", 31, "sd-xl")], None)
    assert "\n1 replica of sd-xl served no request for 31 min or more" in body


def test_the_replicas_no_longer_idle_are_named_without_the_count():
    resolved = [idle("svc-2", 42, status="RESOLVED"), idle("svc-3", 30, status="RESOLVED")]
    title, body, _ = digest_message(resolved, None, held=8)
    assert title == "[gpufleet resolved] 2 replicas of chat-llm no longer idle"
    assert "2 replicas of chat-llm are no longer idle:\n- svc-2: " in body


class Message:
    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def topic(self) -> str:
        return "alerts"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


def test_the_alerts_held_from_partitions_taken_away_are_released_and_the_rest_stay_held():
    digests = ServingDigests(wait_s=300, clock=lambda: 0.0)
    for partition, offset, alert in ((0, 5, idle("svc-2", 42)), (1, 7, idle("svc-3", 30)),
                                     (1, 9, idle("sd-1", 31, "sd-xl")), (2, 3, idle("svc-4", 35))):
        digests.hold(alert, Message(partition, offset))
    released = digests.release({("alerts", 1)})
    assert sorted([a["workflow_id"] for a, _ in digest] for digest in released) == [["sd-1"], ["svc-3"]]
    assert [sorted(digest.alerts) for digest in digests.held.values()] == \
        [["idle_replica:svc-2:0", "idle_replica:svc-4:0"]]  # (sd-xl's digest, now empty, is gone)
    assert digests.positions({("alerts", 1): 10}) == {("alerts", 0): 5, ("alerts", 1): 10, ("alerts", 2): 3}
    assert digests.release({("alerts", 1)}) == []
