import pytest

from producers.simulate.fleet import HEALTHY, IDLE, MODERATE, UNDERUTILIZED, build_fleet
from schemas.codec import Codec
from schemas.validate_sample import validate_sample

START = 1_767_225_600_000


def test_same_seed_same_fleet_and_samples():
    a, b = build_fleet(seed=11), build_fleet(seed=11)
    assert a == b
    assert list(a.samples_at(5, START, 1000)) == list(b.samples_at(5, START, 1000))
    assert list(a.samples_at(5, START, 1000)) != list(build_fleet(seed=12).samples_at(5, START, 1000))


def test_every_gpu_belongs_to_exactly_one_workflow():
    fleet = build_fleet(seed=3, hosts=5, gpus_per_host=4, workflows=7)
    uuids = [g.uuid for w in fleet.workflows for g in w.gpus]
    assert len(uuids) == len(set(uuids)) == 20 == fleet.gpu_count
    assert all(w.gpus for w in fleet.workflows)


def test_one_idle_workflow_and_some_underutilised():
    fleet = build_fleet(seed=7, workflows=12)
    profiles = [w.profile for w in fleet.workflows]
    assert profiles[0] is IDLE
    assert profiles.count(UNDERUTILIZED) == 3
    assert set(profiles) <= {IDLE, UNDERUTILIZED, HEALTHY, MODERATE}


def test_profiles_bound_utilisation_so_the_alert_set_is_known():
    fleet = build_fleet(seed=5, hosts=4, gpus_per_host=8, workflows=10)
    for tick in range(200):
        for s in fleet.samples_at(tick, START, 1000):
            p = fleet.workflow(s["workflow_id"]).profile
            if p is IDLE:
                assert s["utilization_pct"] == 0.0 and s["memory_used_bytes"] > 0
            elif p is UNDERUTILIZED:
                assert s["utilization_pct"] < 30.0
            else:
                assert s["utilization_pct"] >= 40.0


def test_samples_are_valid_and_encodable():
    codec = Codec()
    fleet = build_fleet(seed=1, hosts=2, gpus_per_host=2, workflows=3)
    samples = list(fleet.samples_at(0, START, 1000))
    assert len(samples) == 4
    for s in samples:
        assert validate_sample(s) is None
        assert codec.decode(codec.encode("GpuSample", s))[1]["gpu_uuid"] == s["gpu_uuid"]


def test_impossible_layouts_are_refused():
    with pytest.raises(ValueError, match="at least as many GPUs"):
        build_fleet(hosts=1, gpus_per_host=2, workflows=3)


def test_a_scheduler_gives_some_gpus_to_no_job_and_some_jobs_never_open_theirs():
    from producers.simulate.fleet import UNTOUCHED
    from schemas.validate_sample import UNALLOCATED

    fleet = build_fleet(seed=7, hosts=4, gpus_per_host=8, workflows=8, planted=True, scheduler=True)
    assert len(fleet.free) == 4 and fleet.gpu_count == 32
    untouched = [w for w in fleet.workflows if w.profile is UNTOUCHED]
    partial = [w for w in fleet.workflows if w.untouched_gpus]
    assert [w.workflow_id for w in untouched] == [fleet.workflows[-1].workflow_id] and len(partial) == 1
    samples = list(fleet.samples_at(400, START, 1000))
    assert len(samples) == 32 and all(validate_sample(s) is None for s in samples)
    by_gpu = {s["gpu_uuid"]: s for s in samples}
    for g in fleet.free:
        assert (by_gpu[g.uuid]["workflow_id"], by_gpu[g.uuid]["process_count"]) == (UNALLOCATED, 0)
    for g in untouched[0].gpus:
        s = by_gpu[g.uuid]
        assert (s["process_count"], s["utilization_pct"], s["memory_used_bytes"]) == (0, 0.0, 0)
    p = partial[0]
    opened = [by_gpu[g.uuid]["process_count"] for g in p.gpus]
    assert opened == [1] * (len(p.gpus) - p.untouched_gpus) + [0] * p.untouched_gpus
    held = len(untouched[0].gpus) + p.untouched_gpus
    assert fleet.untouched(60, 1000) == 60 * held and fleet.unallocated(60, 1000) == 60 * 4
    # Without a scheduler the layout and the samples are as they were.
    plain = build_fleet(seed=7, hosts=4, gpus_per_host=8, workflows=8, planted=True)
    assert not plain.free and all("process_count" not in s for s in plain.samples_at(400, START, 1000))
