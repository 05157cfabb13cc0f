"""Revive before you boot: work that returns while an instance drains starts its worker again.

The decision (pure, on ``Readings``), then whole passes over the in-memory ports, a crash
between any two outside calls of a reviving pass, and the simulator's world.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_reconcile_pass import Calls, Crash, Fleet
from vultrscale.config import Config
from vultrscale.core.model import (
    ActionKind,
    FleetState,
    InstanceState,
    LedgerRow,
    PlanPrice,
    ServiceState,
    Signals,
    WorkerView,
)
from vultrscale.errors import DatabaseError, HostKeyMismatch
from vultrscale.memory import MemoryStore
from vultrscale.ports import Parts
from vultrscale.replay.workload import Trace
from vultrscale.replay.world import RESTART_SECONDS, World
from vultrscale.rules import lifecycle
from vultrscale.rules.decision import (
    Create,
    Decision,
    FlagWorkersDraining,
    Revive,
    SaveFleetState,
    StartDelete,
    Stop,
    decide,
)
from vultrscale.rules.readings import Readings
from vultrscale.vultr.models import VInstance

START = datetime(2026, 5, 11, 9, 0, tzinfo=UTC)
S = InstanceState
CFG = dataclasses.replace(
    Config(), policy=dataclasses.replace(Config().policy, billing_hour_aware=False)
)
NO_REVIVE = dataclasses.replace(CFG, policy=dataclasses.replace(CFG.policy, revive=False))


def _row(label: str, state: InstanceState, age: timedelta, n: int) -> LedgerRow:
    created = START - age
    draining = START - timedelta(seconds=40) if state in (S.DRAINING, S.DELETING) else None
    return LedgerRow.new(
        label, CFG.fleet.name, state, created, instance_id=f"i-{n}", posted_at=created,
        running_at=created + timedelta(minutes=12), draining_at=draining,
        deleting_at=START - timedelta(seconds=5) if state is S.DELETING else None,
        state_since=draining or created, host_key=f"ssh-ed25519 AAAAkey{n}",
        main_ip=f"10.0.0.{n}", hourly_rate=0.015, monthly_cost=10.0,
    )  # fmt: skip


def _readings(
    draining: dict[str, tuple[InstanceState, timedelta, ServiceState | str]],
    *,
    ready: int,
    running: int = 1,
    signals: bool = True,
) -> Readings:
    """``running`` instances with a worker, and the ``draining`` ones: (state, age, what
    `systemctl is-active` said); ``ready`` jobs queued."""
    rows: dict[str, LedgerRow] = {}
    listed: dict[str, VInstance] = {}
    workers: dict[str, WorkerView] = {}
    probes: dict[str, ServiceState | str] = {}
    specs = [(f"r{k}", S.RUNNING, timedelta(hours=3), None) for k in range(running)]
    specs += [(label, st, age, probe) for label, (st, age, probe) in draining.items()]
    for n, (label, state, age, probe) in enumerate(specs, start=1):
        rows[label] = row = _row(label, state, age, n)
        listed[label] = VInstance(
            row.instance_id or "", label, "active", "running", "ok", row.main_ip or "",
            region="ewr", plan="vc2-1c-2gb",
        )  # fmt: skip
        if state is S.RUNNING:
            workers[label] = WorkerView(label, START, False, 0, True)
        if state is S.DRAINING and probe is not None:
            probes[label] = probe
    return Readings(
        now=START,
        rows=rows,
        gone=(),
        listed=listed,
        workers=workers,
        signals=Signals(ready=ready, in_flight=0) if signals else None,
        price=PlanPrice("vc2-1c-2gb", 10.0, 0.015),
        state=FleetState(),
        probes=probes,
        signal_error=None if signals else DatabaseError("queue unreadable"),
    )


def _kinds(d: Decision) -> list[tuple[ActionKind, str | None]]:
    return [(a.kind, a.label) for a in d.plan.actions]


def _steps(d: Decision, kind: type) -> list[Any]:
    return [s for s in d.steps if isinstance(s, kind)]


# --- the decision -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "when"),
    [
        (ServiceState.INACTIVE, "starts now"),
        (ServiceState.FAILED, "starts now"),
        (ServiceState.DEACTIVATING, "starts once its drain ends"),
        (ServiceState.ACTIVATING, "already starting"),
    ],
    ids=lambda v: str(v),
)
def test_work_returning_revives_a_draining_instance_instead_of_creating_one(
    service: ServiceState, when: str
) -> None:
    d = decide(_readings({"d1": (S.DRAINING, timedelta(minutes=50), service)}, ready=8), CFG)
    # 8 jobs at 4 per instance: 2 wanted, 1 running. The draining one comes back; no boot.
    assert _kinds(d) == [(ActionKind.REVIVE, "d1")]
    reason = d.plan.actions[0].reason
    assert "the queue needs 2 instance(s); 1 counted: reviving 1 of 1" in reason
    assert f"worker {service}, {when}" in reason
    assert "10m00s of its paid hour left, until 09:10:00 UTC" in reason
    [revive] = _steps(d, Revive)
    assert (revive.label, revive.target.address, revive.target.host_key) == (
        "d1", "10.0.0.2", "ssh-ed25519 AAAAkey2",
    )  # fmt: skip
    # Its drain ends here: no delete (an inactive worker's verdict), no stop sent again, and
    # its workers are not flagged draining again.
    assert not _steps(d, StartDelete) and not _steps(d, Stop) and not _steps(d, Create)
    assert all("d1" not in f.labels for f in _steps(d, FlagWorkersDraining))
    assert d.rows["d1"].state is S.RUNNING and d.rows["d1"].draining_at is None
    assert _steps(d, SaveFleetState), "a revive is the pass's scale-up"
    assert d.steps.index(revive) < d.steps.index(_steps(d, SaveFleetState)[0])


@pytest.mark.parametrize(
    "service",
    [ServiceState.ACTIVE, "ssh: connection refused", lifecycle.NO_TARGET],
    ids=["active-never-got-the-stop", "unreachable", "no-target"],
)
def test_a_worker_that_cannot_be_started_again_is_not_revived(
    service: ServiceState | str,
) -> None:
    # Active: it read its draining mark and keeps it for life; start would do nothing.
    d = decide(_readings({"d1": (S.DRAINING, timedelta(minutes=50), service)}, ready=8), CFG)
    assert _kinds(d) == [(ActionKind.CREATE, None)]
    assert not _steps(d, Revive)


def test_never_once_its_delete_has_been_sent() -> None:
    d = decide(
        _readings({"d1": (S.DELETING, timedelta(minutes=50), ServiceState.INACTIVE)}, ready=8),
        CFG,
    )
    assert _kinds(d) == [(ActionKind.CREATE, None)] and not _steps(d, Revive)


def test_switched_off_the_drained_instance_is_deleted_and_a_new_one_created() -> None:
    reads = _readings({"d1": (S.DRAINING, timedelta(minutes=50), ServiceState.INACTIVE)}, ready=8)
    d = decide(reads, NO_REVIVE)
    assert _kinds(d) == [(ActionKind.CREATE, None)] and not _steps(d, Revive)
    assert [s.label for s in _steps(d, StartDelete)] == ["d1"]


def test_the_one_with_most_of_its_paid_hour_left_is_revived_and_only_what_is_missing_created() -> (
    None
):
    draining = {
        "d1": (S.DRAINING, timedelta(minutes=55), ServiceState.INACTIVE),  # 5 min left
        "d2": (S.DRAINING, timedelta(minutes=20), ServiceState.DEACTIVATING),  # 40 min left
        "d3": (S.DRAINING, timedelta(minutes=130), ServiceState.INACTIVE),  # 50 min left
    }
    d = decide(_readings(draining, ready=12), CFG)  # 3 wanted, 1 running: 2 come back
    assert _kinds(d) == [(ActionKind.REVIVE, "d3"), (ActionKind.REVIVE, "d2")]
    assert [s.label for s in _steps(d, StartDelete)] == ["d1"]  # drained: deleted as before
    d = decide(_readings(draining, ready=24), CFG)  # 6 wanted, cap 5: 3 back, 1 created
    assert sorted(label for k, label in _kinds(d) if k is ActionKind.REVIVE) == ["d1", "d2", "d3"]
    assert sum(s.count for s in _steps(d, Create)) == 1


def test_nothing_is_revived_while_the_queue_cannot_be_read() -> None:
    reads = _readings(
        {"d1": (S.DRAINING, timedelta(minutes=50), ServiceState.DEACTIVATING)},
        ready=0,
        signals=False,
    )
    assert not _steps(decide(reads, CFG), Revive)


# --- whole passes over the in-memory ports ----------------------------------------------------


class Workers:
    """What the ``workers`` table says of the fleet's hosts, as `vultrscale worker` does: a
    process runs wherever the unit is active (MemoryDrain's answer) on an instance the cloud
    shows active; one that starts registers with the draining flag its instance's ledger row
    gives it (db.queue.register_worker); one that ended is no longer listed."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def report(self) -> None:
        ledger, drain = self.fleet.ledger, self.fleet.drain
        for v in self.fleet.cloud.list_instances():
            row = ledger.instances.get(v.label)
            up = v.status == "active" and drain.services.get(v.label, ServiceState.ACTIVE) in (
                ServiceState.ACTIVE,
                ServiceState.DEACTIVATING,
            )
            if not up:
                ledger.workers_by_label.pop(v.label, None)
            elif v.label not in ledger.workers_by_label:
                flagged = row is not None and row.state in (S.DRAINING, S.DELETING)
                ledger.workers_by_label[v.label] = WorkerView(
                    v.label, self.fleet.clock.now(), flagged, 0, True
                )


def _drained_while_work_returns(tmp_path: Path) -> tuple[Fleet, Workers, str]:
    """Two running instances; one drained (its worker exited, its delete due); then 12 jobs:
    three instances wanted."""
    fleet = Fleet(tmp_path, policy={"max_instances": 3})
    a, _b = fleet.bring_up(8)
    workers = Workers(fleet)
    fleet.drain_now(a)
    fleet.drain.services[a] = ServiceState.INACTIVE
    workers.report()
    fleet.queue(12)
    fleet.clock.advance(60)
    return fleet, workers, a


def test_a_pass_revives_over_the_ports_and_the_worker_claims_again(tmp_path: Path) -> None:
    fleet, workers, a = _drained_while_work_returns(tmp_path)
    posts = fleet.cloud.posts
    result = fleet.run()
    assert result.exit_code == 0, result.errors
    assert fleet.drain.starts == [a] and fleet.cloud.deletes == 0
    assert fleet.cloud.posts == posts + 1  # only the third instance is booted
    row = fleet.ledger.instances[a]
    assert row.state is S.RUNNING and row.draining_at is None
    assert "worker started again: systemctl start --no-block sent" in [
        r["result"] for r in result.results if r["label"] == a
    ]
    assert fleet.ledger.state.last_scale_up == fleet.clock.now()
    workers.report()  # the new process registers: not draining (its row runs)
    assert fleet.ledger.workers_by_label[a].draining is False
    fleet.clock.advance(30)
    fleet.run()
    assert fleet.states()[a] == "running" and fleet.drain.starts == [a]


def test_a_start_refused_is_the_instance_s_error_and_it_drains_again_with_a_create_next_pass(
    tmp_path: Path,
) -> None:
    fleet, workers, a = _drained_while_work_returns(tmp_path)
    result = fleet.run(
        dataclasses.replace(fleet.parts, drain=_RefusingStart(fleet.drain, a))  # type: ignore[arg-type]
    )
    assert result.exit_code == 1
    assert any(e.startswith(f"{a}: systemctl start failed") for e in result.errors)
    # Back to draining, its worker flagged: not counted as capacity, so the next pass creates
    # in its place at once (not after boot_timeout), and never a lost job.
    assert fleet.states()[a] == "draining" and fleet.ledger.instances[a].never_revive
    before = fleet.cloud.posts
    # past the cool-down of this pass's own create of the third instance: the next pass deletes
    # it (inactive; at max_instances=3 it still counts), the one after creates in its place
    fleet.clock.advance(fleet.cfg.policy.scale_up_cooldown.total_seconds() + 1)
    again = [fleet.run(), fleet.run()]  # the start is not tried again
    assert fleet.cloud.posts == before + 1
    assert not [r for p in again for r in p.results if r["result"].startswith("revive")]
    for _ in range(20):
        fleet.clock.advance(61)
        workers.report()
        fleet.run()
    assert a not in fleet.states()
    assert sorted(fleet.states().values()) == ["running"] * 3


class _RefusingStart:
    def __init__(self, drain: Any, label: str) -> None:
        self.drain, self.label = drain, label

    def __getattr__(self, name: str) -> Any:
        return getattr(self.drain, name)

    def start_many(self, targets: list[Any]) -> dict[str, Any]:
        return {t.label: HostKeyMismatch(f"{t.label}: host key changed") for t in targets}


def _crashing(fleet: Fleet, calls: Calls) -> Parts:
    store = MemoryStore(calls.wrap(fleet.ledger, "ledger"), calls.wrap(fleet.signals, "signals"))
    return dataclasses.replace(
        fleet.parts,
        cloud=calls.wrap(fleet.cloud, "cloud"),
        store=store,
        drain=calls.wrap(fleet.drain, "drain"),
    )


def _revive_calls() -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        fleet, _, _ = _drained_while_work_returns(Path(d))
        calls = Calls()
        fleet.run(_crashing(fleet, calls))
    assert "ledger.revive" in calls.names and "drain.start_many" in calls.names
    return calls.names


_NAMES = _revive_calls()


@pytest.mark.parametrize(
    "crash_at", range(len(_NAMES)), ids=[f"{i:02d}-before-{n}" for i, n in enumerate(_NAMES)]
)
def test_a_crash_anywhere_in_a_reviving_pass_is_mended_by_the_next_passes(
    tmp_path: Path, crash_at: int
) -> None:
    fleet, workers, a = _drained_while_work_returns(tmp_path)
    with pytest.raises(Crash):
        fleet.run(_crashing(fleet, Calls(crash_at)))
    for _ in range(20):  # past boot_timeout: a revive cut short is replaced
        result = fleet.run()
        assert result.exit_code == 0, result.errors
        fleet.clock.advance(61)
        workers.report()
    fleet.run()
    at_vultr = sorted(v.label for v in fleet.cloud.list_instances())
    assert at_vultr == sorted(fleet.states()), "every paid instance is in the ledger (no leak)"
    assert len(at_vultr) == 3 and set(fleet.states().values()) == {"running"}
    # Every worker counted claims: none runs flagged draining.
    assert not any(w.draining for w in fleet.ledger.workers_by_label.values())
    revived = a in at_vultr
    # Revived: one boot for the third; cut between the ledger and the start: a replacement too.
    assert fleet.cloud.posts == 2 + (1 if revived else 2)
    assert revived == (fleet.drain.starts == [a])


# --- the simulated world ----------------------------------------------------------------------


def _world() -> World:
    trace = Trace("revive", (0.0, 0.0, 100.0), (50.0, 50.0, 10.0), span=200.0)
    w = World(
        trace, jobs_per_instance=2, drain_seconds=20.0, lease_seconds=60.0,
        boot_time=(0.0, 0.0), seed=1,
    )  # fmt: skip
    w.warm("w1")
    return w


def _run_until(w: World, t: float) -> None:
    import heapq

    while w.events and w.events[0][0] <= t:
        at, kind, _, obj, tok = heapq.heappop(w.events)
        w.now = at
        w.handle(kind, obj, tok)
        w.dispatch()
    w.now = t
    w.dispatch()


@pytest.mark.parametrize("drained_first", [False, True], ids=["still-draining", "exited"])
def test_a_simulated_worker_started_again_claims_after_its_drain(drained_first: bool) -> None:
    w = _world()
    w.arrive(0)
    w.arrive(1)
    w.dispatch()
    _run_until(w, 10.0)
    assert w.stop("w1") and w.service_stopping("w1")
    if drained_first:
        _run_until(w, 31.0)  # the drain time ends: both jobs given back, the worker exits
        assert w.service_active("w1") is False and w.c.given_back == 2
    assert w.start("w1") and w.c.revives == 1
    _run_until(w, 31.0)
    up = 31.0 + RESTART_SECONDS if drained_first else 30.0 + RESTART_SECONDS
    assert w.c.given_back == 2  # the old process gave back what it did not finish
    _run_until(w, up - 0.1)
    assert w.running == 0
    _run_until(w, up)
    assert w.running == 2 and w.live["w1"].claiming(w.now)  # the new one claims again
    _run_until(w, up + 100)
    assert w.c.finished == 2 and w.c.killed == 0


@pytest.mark.usefixtures("one_process")
def test_simulate_counts_the_revive_that_saves_a_boot_and_a_started_hour() -> None:
    from vultrscale.replay import compare, workload
    from vultrscale.replay.fleet import Vultrscale

    # One job boots an instance (2 min); idle, it is drained at 300 s (the down cool-down
    # since its create); a job arrives at 310 s, before the next pass deletes it.
    trace = workload.from_jobs("hand", [(0.0, 60.0), (310.0, 60.0)])
    setup = compare.Setup(interval=30.0, boot_time=(120.0, 120.0), seed=0)
    results = {}
    for revive in (True, False):
        cfg = dataclasses.replace(
            Config(),
            policy=dataclasses.replace(Config().policy, billing_hour_aware=False, revive=revive),
        )
        price = compare.plan_price(cfg)
        pol = Vultrscale(cfg, price, trace.epoch)
        results[revive] = compare.run_one(pol, trace, cfg, setup, price)
    on, off = results[True], results[False]
    assert (on.revives, on.scale_ups, on.billed_hours, on.lost) == (1, 1, 1, 0)
    assert (off.revives, off.scale_ups, off.billed_hours, off.lost) == (0, 2, 2, 0)
    # Revived at the 330 s pass, it claims RESTART_SECONDS on: the second job waits 25 s, less
    # than the first job's boot (120 s, the longest wait); without, a new boot: 140 s.
    assert (on.wait_max, off.wait_max) == (120.0, 140.0)
    assert on.to_json()["revives"] == 1
