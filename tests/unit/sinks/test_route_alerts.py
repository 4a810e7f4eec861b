from sinks.notify_owner import subject, text
from sinks.route_alerts import load_routing
from tests.support.alerts import alert


def test_routing_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SMTP_SECRET", "s3cret")
    path = tmp_path / "routing.toml"
    path.write_text("""
[default]
webhook = "http://hooks/default"
email_owners = true
[teams.nlp]
webhook = "http://hooks/nlp"
[owners.ana]
email = "ana@corp.example"
[smtp]
host = "mail.example"
port = 587
starttls = true
username = "gpufleet"
password_env = "SMTP_SECRET"
""")
    r = load_routing(path)
    assert r.webhook_for({"team": "nlp"}) == "http://hooks/nlp"
    assert r.webhook_for({"team": "vision"}) == "http://hooks/default"
    assert r.email_for({"owner": "ana"}) == "ana@corp.example"
    assert r.email_for({"owner": "bo@corp.example"}) == "bo@corp.example"  # email_owners
    assert r.email_for({"owner": "bo"}) is None
    assert r.smtp.password == "s3cret" and "s3cret" not in repr(r.smtp)


def test_without_smtp_there_is_no_mail(tmp_path):
    path = tmp_path / "routing.toml"
    path.write_text('[owners.ana]\nemail = "ana@x"\n')
    assert load_routing(path).email_for({"owner": "ana"}) is None


def test_message_says_what_is_wrong_and_what_to_try():
    a = alert("a1", "FIRING", True, "nlp", "ana")
    assert subject(a) == "[gpufleet critical] low utilization: wf-1"
    body = text(a)
    assert "9.5% mean utilisation" in body and "What to try:" in body and "owner ana" in body
    resolved = text({**a, "status": "RESOLVED"})
    assert resolved.startswith("[gpufleet resolved]") and "What to try" not in resolved


def test_the_root_cause_message_lists_the_findings():
    a = {**alert("a1", "FIRING", True, "nlp", "ana"), "profile_request_id": "auto-1",
         "root_cause": "GPU idle 99 % of the profiled time.", "findings": [
             {"rule": "launch_bound", "severity": "WARNING", "title": "Launch-bound trains of short kernels",
              "evidence": "29 runs of 10+ kernels", "recommendation": "Capture the step in CUDA graphs.",
              "gpu_seconds_at_stake": 0.11, "ranks": 1}]}
    assert subject(a) == "[gpufleet root cause] low utilization: wf-1"
    body = text(a)
    assert "What the automatic profile (auto-1) found:" in body
    assert "- Launch-bound trains of short kernels [WARNING, 0.11 GPU-s at stake]: 29 runs of 10+ kernels" in body
    assert "  try: Capture the step in CUDA graphs." in body
