"""waits.size(): the wait rule on a fake clock. Every job runs 60 s here; 4 slots an instance."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from vultrscale import waits
from vultrscale.model import Instance, InstanceState, Signals

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
BOOT = timedelta(minutes=12)
TARGET = timedelta(minutes=10)


def vm(
    label: str, state: InstanceState = InstanceState.RUNNING, minutes_ago: float = 60
) -> Instance:
    return Instance(label=label, state=state, created_at=NOW - timedelta(minutes=minutes_ago))


def signals(
    ready: int, *, oldest: float = 0.0, in_flight: int = 0, jobs: int | None = 50
) -> Signals:
    return Signals(
        ready=ready,
        in_flight=in_flight,
        oldest_ready_seconds=oldest,
        recent_jobs=jobs,
        recent_job_seconds=None if jobs is None else 60.0,
    )


def size(sig: Signals, instances: list[Instance], depth: int, **kw: object) -> waits.WaitCall:
    args: dict[str, object] = {
        "jobs_per_instance": 4,
        "boot": BOOT,
        "target_wait": TARGET,
        "depth": depth,
        "now": NOW,
    }
    args.update(kw)
    return waits.size(sig, instances, **args)  # type: ignore[arg-type]


def test_a_backlog_the_running_workers_clear_soon_boots_nothing() -> None:
    # 16 jobs on 1 instance (4 slots, 60 s each): the last starts in 3 minutes.
    call = size(signals(16), [vm("a")], depth=4)
    assert call.applied and call.wanted == 1
    assert "the last in 3m" in call.reason
    assert "within target_wait 10m: no create (the depth rule asked 3)" in call.reason


def test_a_wait_past_the_target_that_outlasts_a_boot_creates_fewer_than_the_depth_rule() -> None:
    # 200 jobs on 1 instance: the last starts in 49 min. As few new instances (ready in 12
    # min) as start it within 12 + 10 min: fewer than the 49 more the depth rule asks.
    call = size(signals(200), [vm("a")], depth=50)
    assert call.applied
    assert 1 < call.wanted < 50
    assert "past target_wait 10m" in call.reason
    assert f"{call.wanted - 1} new instance(s) start the last by" in call.reason
    more = size(signals(200), [vm("a")], depth=50, target_wait=timedelta(minutes=1))
    assert more.wanted > call.wanted  # a tighter target buys more instances


def test_a_wait_past_the_target_that_ends_before_a_boot_creates_nothing() -> None:
    # 40 jobs on 1 instance: the last starts in 9 min, before a new one is ready (12 min).
    call = size(signals(40), [vm("a")], depth=10, target_wait=timedelta(minutes=5))
    assert call.wanted == 1
    assert "every queued job has started before a new instance would be ready in 12m" in (
        call.reason
    )


def test_a_booting_instance_counts_from_its_expected_ready_time() -> None:
    # 60 jobs, nothing running, one instance created 10 min ago: ready in 2 min, 4 slots:
    # the last starts at 2 + 14 = 16 min, past the target; most start before a new one is ready.
    booting = vm("b", InstanceState.BOOTING, minutes_ago=10)
    call = size(signals(60), [booting], depth=15)
    assert "start the oldest in 2m" in call.reason
    assert call.wanted > 1
    # Created just now, it is ready only in 12 min: the same backlog waits longer.
    late = size(signals(60), [vm("b", InstanceState.BOOTING, minutes_ago=0)], depth=15)
    assert "start the oldest in 12m" in late.reason
    assert late.wanted >= call.wanted


def test_the_oldest_job_age_is_part_of_the_wait() -> None:
    # 60 jobs on 1 instance: the last starts in 14 min, within a 20 min target...
    young = size(signals(60), [vm("a")], depth=15, target_wait=timedelta(minutes=20))
    assert young.wanted == 1
    # ...but the oldest has waited 25 min already: past the target, and jobs remain at boot.
    old = size(signals(60, oldest=1500), [vm("a")], depth=15, target_wait=timedelta(minutes=20))
    assert "the oldest waiting 25m" in old.reason
    assert old.wanted > 1


def test_jobs_in_flight_hold_their_slots_for_half_a_run() -> None:
    free = size(signals(8), [vm("a")], depth=3)
    busy = size(signals(8, in_flight=4), [vm("a")], depth=3)
    assert "start the oldest in 0s" in free.reason
    assert "start the oldest in 30s" in busy.reason


def test_no_instance_at_all_never_clears_and_creates() -> None:
    call = size(signals(3), [], depth=1)
    assert call.wanted == 1
    assert "the last in never" in call.reason


def test_too_little_job_history_falls_back_to_the_depth_rule() -> None:
    call = size(signals(16, jobs=waits.MIN_JOBS - 1), [vm("a")], depth=4)
    assert not call.applied and call.wanted == 4
    assert f"{waits.MIN_JOBS - 1} recent finished job(s); {waits.MIN_JOBS} needed" in call.reason


def test_a_preset_without_job_history_falls_back_to_the_depth_rule() -> None:
    call = size(signals(16, jobs=None), [vm("a")], depth=4)
    assert not call.applied and call.wanted == 4
    assert "not reported by this queue preset" in call.reason
