"""Ids from jobs and hosts: what the contract allows, and what each stage does with the rest."""

import pytest

from schemas.sample_columns import blocks_of, columns_of
from schemas.validate_ids import MAX_ID_LENGTH, id_error, ids_error
from schemas.validate_sample import validate_sample
from tests.support.samples import sample


@pytest.mark.parametrize("value", [
    "wf-1", "slurm-4242", "torchelastic-3f2a9c", "alice@example.com", "ml/infra", "a", "x" * MAX_ID_LENGTH,
    "job 7 of sweep", "idle", "unattributed", "k8s:ns/job=train,#3~v+1",
])
def test_ids_that_jobs_and_hosts_really_have_are_allowed(value):
    assert id_error("workflow_id", value) is None


@pytest.mark.parametrize("value, says", [
    ("wf\nBcc: victim@example.com", "U+000A at 2"),
    ("wf\r", "U+000D at 2"),
    ("<script>alert(1)</script>", "U+003C at 0"),
    ("wf'; DROP TABLE x; --", "U+0027 at 2"),
    ("wf\x00", "U+0000 at 2"),
    ("wf\u202eevil", "U+202E at 2"),  # right-to-left override: looks like another id
    ("wf-\u0430", "U+0430 at 3"),  # a Cyrillic letter that looks Latin
    ("", "is empty"),
    (" wf", "starts or ends with a space"),
    ("wf ", "starts or ends with a space"),
    ("x" * (MAX_ID_LENGTH + 1), f"has {MAX_ID_LENGTH + 1} characters (at most {MAX_ID_LENGTH})"),
    (7, "is a int, not a string"),
])
def test_other_ids_are_refused_saying_which_field_and_why(value, says):
    reason = id_error("workflow_id", value)
    assert reason is not None and reason.startswith("workflow_id") and says in reason


def test_a_long_hostile_id_is_shown_shortened_in_the_reason():
    reason = id_error("owner", "a\n" + "b" * 10_000)
    assert reason is not None and len(reason) < 300


def test_owner_and_team_may_be_null_but_workflow_and_host_may_not():
    assert ids_error({"workflow_id": "wf", "host": "h", "owner": None, "team": None}) is None
    assert ids_error({"workflow_id": "wf", "host": None}) == "host is missing"


@pytest.mark.parametrize("field", ["workflow_id", "host", "owner", "team"])
def test_a_sample_with_a_hostile_id_is_unusable(field):
    s = sample(**{field: "evil\nid"})
    reason = validate_sample(s)
    assert reason is not None and reason.startswith(f"{field} 'evil\\nid' has the character U+000A")


@pytest.mark.parametrize("field", ["workflow_id", "host", "owner", "team"])
def test_a_block_with_a_hostile_id_is_refused_whole(field):
    block = columns_of([sample(**{field: "evil\nid"}) for _ in range(3)])[0]
    good, reasons = blocks_of("GpuSampleColumns", block)
    assert good == [] and len(reasons) == 1 and reasons[0].startswith(f"{field} 'evil\\nid'")
