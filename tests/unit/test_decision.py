"""The decision is the whole pass: every port call ``apply`` makes follows from its steps.

Each fleet below is driven through real passes on the in-memory ports; on every pass the
port calls are recorded and compared with the calls derived from the decision's steps alone
(ports that all answer "done"). A rule left in ``apply`` (a call no step asked for, a step
not carried out, a different order) fails here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from vultrscale import reconcile
from vultrscale.config import Config, FloorConfig, Secret
from vultrscale.core.clock import FakeClock
from vultrscale.core.model import (
    FleetState,
    InstanceState,
    LedgerRow,
    PlanPrice,
    ServiceState,
    Signals,
    WorkerView,
)
from vultrscale.errors import DatabaseError
from vultrscale.memory import (
    SNAPSHOT,
    MemoryCloud,
    MemoryDrain,
    MemoryLedger,
    MemorySignals,
    memory_parts,
)
from vultrscale.rules import decision as decision_mod
from vultrscale.rules import lifecycle
from vultrscale.rules.decision import (
    Adopt,
    Create,
    Decision,
    Fail,
    FlagWorkersDraining,
    MarkDraining,
    Move,
    Note,
    RetryDelete,
    Revive,
    SaveFleetState,
    StartDelete,
    Step,
    Stop,
    UpdateAddress,
)
from vultrscale.rules.readings import Readings
from vultrscale.vultr.models import VInstance

START = datetime(2026, 5, 11, 9, 0, tzinfo=UTC)
S = InstanceState
CFG = dataclasses.replace(
    Config(),
    fleet=dataclasses.replace(Config().fleet, snapshot_id=SNAPSHOT),
    policy=dataclasses.replace(
        Config().policy, max_instances=5, billing_hour_aware=False, min_instances=0
    ),
    secrets=dataclasses.replace(
        Config().secrets, worker_database_url=Secret("postgresql://w@db.invalid/q")
    ),
)
# What a port call is, as recorded: (port.method, the argument that names what it acts on).
Call = tuple[Any, ...]
_WRITES = {
    "ledger": (
        "transition",
        "adopt",
        "update_address",
        "mark_workers_draining",
        "mark_draining",
        "revive",
        "insert_intent",
        "save_fleet_state",
        "note_error",
    ),
    "cloud": ("create_instance", "delete_instance", "get_instance"),
    "drain": ("stop_many", "start_many"),
}


def derived(step: Step) -> list[Call]:
    """The port calls one step makes when every port answers "done" (an instance deleted is
    gone when looked up, a create is accepted)."""
    match step:
        case UpdateAddress(label):
            return [("ledger.update_address", label)]
        case Adopt(label):
            return [("ledger.adopt", label)]
        case Move(label, _, state):
            return [("ledger.transition", label, state)]
        case FlagWorkersDraining(labels):
            return [("ledger.mark_workers_draining", tuple(labels))]
        case Note() | Fail():
            return []
        case StartDelete(label, instance_id):
            return [("ledger.transition", label, S.DELETING), *_deleted(label, instance_id)]
        case RetryDelete(label, instance_id):
            return _deleted(label, instance_id)
        case MarkDraining(label):
            return [("ledger.mark_draining", label)]
        case Stop(targets):
            return [("drain.stop_many", tuple(t.label for t in targets))]
        case Revive(label):
            return [("ledger.revive", label), ("drain.start_many", (label,))]
        case Create(count):
            one = [("ledger.insert_intent",), ("cloud.create_instance",), ("ledger.transition",)]
            return one * count
        case SaveFleetState():
            return [("ledger.save_fleet_state",)]
    raise AssertionError(f"no derivation for {step!r}")


def _deleted(label: str, instance_id: str | None) -> list[Call]:
    if not instance_id:
        return [("ledger.transition", label, S.GONE)]
    return [
        ("cloud.delete_instance", instance_id),
        ("cloud.get_instance", instance_id),
        ("ledger.transition", label, S.GONE),
    ]


def expected(decision: Decision) -> list[Call]:
    return [c for step in decision.steps for c in derived(step)]


class Recorded:
    """A fleet on the in-memory ports whose write calls are recorded, pass by pass."""

    def __init__(self, cfg: Config = CFG) -> None:
        self.cfg = cfg
        self.clock = FakeClock(START)
        self.cloud = MemoryCloud(self.clock)
        self.ledger = MemoryLedger(cfg.fleet.name)
        self.signals = MemorySignals(Signals(ready=0, in_flight=0))
        self.drain = MemoryDrain()
        self.parts = memory_parts(self.clock, self.cloud, self.ledger, self.signals, self.drain)
        self.calls: list[Call] = []
        self._depth = 0
        for port, names in _WRITES.items():
            obj = getattr(self, port)
            for name in names:
                setattr(obj, name, self._spy(f"{port}.{name}", getattr(obj, name)))

    def _spy(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:  # a port's own use of its other methods is not a call
                self.calls.append(_key(name, args, kwargs))
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return call

    def run(self, monkeypatch: pytest.MonkeyPatch) -> tuple[Decision, list[Call]]:
        """One pass; the decision it carried out and the port calls ``apply`` made (the
        pass's reads before it, a GET for an instance the list missed, are observation)."""
        seen: list[Decision] = []
        real = reconcile.apply

        def apply(cfg: Config, parts: Any, ledger: Any, d: Decision, *rest: Any) -> None:
            seen.append(d)
            self.calls = []
            real(cfg, parts, ledger, d, *rest)

        monkeypatch.setattr(reconcile, "apply", apply)
        reconcile.run_pass(self.cfg, self.parts)
        (d,) = seen
        return d, self.calls

    def workers_report(self, live: int = 0) -> None:
        for v in self.cloud.list_instances():
            if v.status == "active":
                self.ledger.workers_by_label[v.label] = WorkerView(
                    v.label, self.clock.now(), False, live, True
                )


def _key(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    if name == "ledger.transition":
        move = args[0]
        if move.instance_id and move.state is S.PENDING:
            return (name,)  # a create's outcome: the label is the pass's own
        return (name, move.label, move.state)
    if name in ("ledger.adopt", "ledger.update_address"):
        return (name, args[0].label)
    if name in ("ledger.insert_intent", "cloud.create_instance", "ledger.save_fleet_state"):
        return (name,)
    if name == "ledger.mark_workers_draining":
        return (name, tuple(args[0]))
    if name in ("drain.stop_many", "drain.start_many"):
        return (name, tuple(t.label for t in args[0]))
    return (name, args[0])


def _burst(f: Recorded) -> None:
    f.signals.signals = Signals(ready=12, in_flight=0)


def _stranger(f: Recorded) -> None:
    f.cloud.instances["by-hand"] = VInstance(
        id="by-hand",
        label="made-by-hand",
        status="active",
        power_status="running",
        server_status="ok",
        main_ip="10.9.9.9",
        region="ewr",
        plan="vc2-1c-2gb",
        date_created=START - timedelta(hours=2),
        tags=(CFG.fleet.tag,),
    )


def _scenario_burst_boot_idle_drain_delete(f: Recorded, run: Callable[[], Decision]) -> None:
    _burst(f)
    run()  # creates
    f.clock.advance(61)
    run()  # pending -> booting, addresses
    f.workers_report()
    f.clock.advance(30)
    run()  # booting -> running
    f.signals.signals = Signals(ready=0, in_flight=0)
    f.workers_report()
    for _ in range(14):  # idle window and cool-down pass: drains, stops, deletes
        f.clock.advance(30)
        run()


def _scenario_stranger_adopted(f: Recorded, run: Callable[[], Decision]) -> None:
    _stranger(f)
    run()
    f.clock.advance(30)
    run()


def _scenario_stuck_boot_replaced(f: Recorded, run: Callable[[], Decision]) -> None:
    f.signals.signals = Signals(ready=3, in_flight=0)
    f.cloud.boot_after = timedelta(hours=2)  # never active within boot_timeout
    run()
    f.clock.advance(16 * 60)
    run()


def _scenario_locked_delete_retried(f: Recorded, run: Callable[[], Decision]) -> None:
    _burst(f)
    run()
    f.clock.advance(61)
    f.workers_report()
    run()
    f.clock.advance(30)
    run()
    f.signals.signals = Signals(ready=0, in_flight=0)  # no work for it: no revive
    label = next(iter(f.ledger.workers_by_label))
    f.ledger.mark_draining(label, f.clock.now())
    f.drain.services[label] = ServiceState.INACTIVE
    iid = f.ledger.instances[label].instance_id
    f.cloud.locked.add(iid or "")
    f.clock.advance(30)
    run()
    f.cloud.locked.clear()
    f.clock.advance(30)
    run()


def _scenario_work_returns_while_draining(f: Recorded, run: Callable[[], Decision]) -> None:
    _burst(f)
    run()
    f.clock.advance(61)
    f.workers_report()
    run()
    f.clock.advance(30)
    run()
    label = next(iter(f.ledger.workers_by_label))
    f.ledger.mark_draining(label, f.clock.now())  # as a scale-in would have, then the work came
    f.drain.services[label] = ServiceState.DEACTIVATING
    f.clock.advance(30)
    run()  # revived (its stop not sent again, no verdict); the rest of the queue's need
    f.clock.advance(30)
    run()


def _scenario_floor_starts(f: Recorded, run: Callable[[], Decision]) -> None:
    run()
    f.clock.advance(3600)
    run()


FLOOR = dataclasses.replace(
    CFG,
    policy=dataclasses.replace(
        CFG.policy, floor=(FloorConfig(cron="* 10-11 * * *", timezone="UTC", min_instances=2),)
    ),
)


@pytest.mark.parametrize(
    ("scenario", "cfg", "needs"),
    [
        (
            _scenario_burst_boot_idle_drain_delete,
            CFG,
            {Create, Move, MarkDraining, Stop, FlagWorkersDraining, StartDelete, SaveFleetState},
        ),
        (_scenario_stranger_adopted, CFG, {Adopt, UpdateAddress}),
        (_scenario_stuck_boot_replaced, CFG, {StartDelete, Create}),
        (_scenario_locked_delete_retried, CFG, {StartDelete, RetryDelete}),
        (_scenario_floor_starts, FLOOR, {Create}),
        (_scenario_work_returns_while_draining, CFG, {Revive, SaveFleetState}),
    ],
    ids=[
        "burst-boot-idle-drain-delete",
        "stranger-adopted",
        "stuck-boot-replaced",
        "locked-delete-retried",
        "floor-starts",
        "work-returns-while-draining",
    ],
)
def test_every_port_call_of_a_pass_follows_from_its_decision(
    scenario: Callable[[Recorded, Callable[[], Decision]], None],
    cfg: Config,
    needs: set[type],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    f = Recorded(cfg)
    kinds: set[type] = set()
    passes = 0

    def run() -> Decision:
        nonlocal passes
        d, calls = f.run(monkeypatch)
        passes += 1
        kinds.update(type(s) for s in d.steps)
        if any(c[0] == "ledger.note_error" for c in calls):
            # A locked DELETE: its outcome is the ledger's note and no lookup; the calls up
            # to the DELETE are still the steps'.
            cut = calls.index(next(c for c in calls if c[0] == "cloud.delete_instance"))
            assert calls[: cut + 1] == expected(d)[: cut + 1]
            return d
        assert calls == expected(d), (d.steps, calls)
        return d

    scenario(f, run)
    assert passes >= 2 and needs <= kinds, "the scenario must reach the steps it is for"


def _running_fleet(max_instances: int, ready: int, monkeypatch: pytest.MonkeyPatch) -> Recorded:
    """A fleet brought up for ``ready`` jobs, every instance running, cool-downs over."""
    cfg = dataclasses.replace(
        CFG, policy=dataclasses.replace(CFG.policy, max_instances=max_instances)
    )
    f = Recorded(cfg)
    f.signals.signals = Signals(ready=ready, in_flight=0)
    f.run(monkeypatch)
    f.clock.advance(61)
    f.workers_report(live=1)
    f.run(monkeypatch)
    f.clock.advance(600)
    f.workers_report(live=1)
    return f


@pytest.mark.parametrize(
    ("max_instances", "band"),
    [(5, (1, 8)), (2, (1, None))],
    ids=["below-cap-up-to-what-the-fleet-serves", "at-cap-any-demand"],
)
def test_a_steady_busy_fleet_stays_steady_within_its_demand_band(
    max_instances: int, band: tuple[int, int | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    f = _running_fleet(max_instances, 8, monkeypatch)  # 8 jobs at 4 per instance: 2 instances
    d, _ = f.run(monkeypatch)
    assert d.steady and decision_mod.demand_band(f.cfg, d) == band
    for demand in (1, 8, 40):
        f.signals.signals = Signals(ready=demand, in_flight=0)
        inside = band[1] is None or demand <= band[1]
        assert f.run(monkeypatch)[0].steady is inside, demand


def test_no_demand_band_while_the_queue_is_idle_or_an_instance_boots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    f = Recorded()
    f.signals.signals = Signals(ready=8, in_flight=0)
    f.run(monkeypatch)
    f.clock.advance(30)
    d, _ = f.run(monkeypatch)  # pending, cool-down running: nothing to do, but not running
    assert d.steady and decision_mod.demand_band(f.cfg, d) is None
    f = _running_fleet(5, 8, monkeypatch)
    f.signals.signals = Signals(ready=0, in_flight=0)
    assert decision_mod.demand_band(f.cfg, f.run(monkeypatch)[0]) is None


# --- next_change: never later than the first change ------------------------------------------

_TICK = timedelta(microseconds=1)


def _readings(row: LedgerRow, v: VInstance, now: datetime, probes: dict[str, Any]) -> Readings:
    return Readings(
        now=now,
        rows={row.label: row},
        gone=(),
        listed={row.label: v},
        workers={},
        signals=Signals(ready=1, in_flight=0),  # one job: the one instance is needed
        price=PlanPrice("vc2-1c-2gb", 10.0, 0.015),
        state=FleetState(),
        probes=probes,
    )


def _draining_unreachable() -> Readings:
    # No pinned host key: its worker cannot be asked. The deadline (drain.timeout + margin,
    # 5m30s) comes before the unreachable grace (10m): past it, a drain with no lease is deleted.
    began = START - CFG.drain.timeout - lifecycle.DRAIN_MARGIN
    row = LedgerRow.new(
        "w-1", CFG.fleet.name, S.DRAINING, began - timedelta(minutes=20),
        instance_id="i-1", draining_at=began, state_since=began, main_ip="10.0.0.1",
    )  # fmt: skip
    v = VInstance("i-1", "w-1", "active", "running", "ok", "10.0.0.1", region="ewr")
    return _readings(row, v, START, {"w-1": lifecycle.NO_TARGET})


def _stuck_in_boot() -> Readings:
    # Pending since its POST exactly boot_timeout ago: replaced once it is past it.
    posted = START - CFG.policy.boot_timeout
    row = LedgerRow.new(
        "w-1", CFG.fleet.name, S.PENDING, posted, instance_id="i-1", posted_at=posted
    )
    v = VInstance("i-1", "w-1", "pending", "stopped", "none", region="ewr")
    return _readings(row, v, START, {})


@pytest.mark.parametrize(
    "readings",
    [_draining_unreachable, _stuck_in_boot],
    ids=["drain-deadline-reached-now", "boot-timeout-reached-now"],
)
def test_next_change_is_no_later_than_a_deadline_that_is_reached_at_this_very_pass(
    readings: Callable[[], Readings],
) -> None:
    # A deadline is passed only after it (drain: waited > deadline; boot: age > boot_timeout):
    # a pass at the deadline itself waits, and the one a moment later acts. The core must not
    # say the next change is later than that moment.
    reads = readings()
    now = decision_mod.decide(reads, CFG)
    later = decision_mod.decide(dataclasses.replace(reads, now=reads.now + _TICK), CFG)
    assert now.steps != later.steps  # the table is about such a moment
    when = decision_mod.next_change(CFG, now)
    assert when is not None and when <= reads.now + _TICK


# --- the replace guard -----------------------------------------------------------------------


def _quiet_worker_past_boot_timeout(signals: Signals | None, live: int) -> Readings:
    # It ran; its worker went quiet (back to booting) long past boot_timeout, yet the workers
    # table still shows ``live`` leases of it.
    since = START - CFG.policy.boot_timeout - timedelta(minutes=1)
    row = LedgerRow.new(
        "w-1", CFG.fleet.name, S.BOOTING, since - timedelta(hours=1), instance_id="i-1",
        posted_at=since - timedelta(hours=1), running_at=since - timedelta(minutes=30),
        state_since=since, main_ip="10.0.0.1",
    )  # fmt: skip
    v = VInstance("i-1", "w-1", "active", "running", "ok", "10.0.0.1", region="ewr")
    reads = _readings(row, v, START, {})
    worker = WorkerView("w-1", since, False, live, False)
    return dataclasses.replace(reads, signals=signals, workers={"w-1": worker})


@pytest.mark.parametrize(
    ("signals", "live", "deleted"),
    [
        (Signals(ready=1, in_flight=0), 0, True),
        (Signals(ready=1, in_flight=1), 1, False),
        (None, 0, False),
    ],
    ids=["no-lease-replaced", "live-lease-kept", "queue-unreadable-kept"],
)
def test_an_instance_stuck_in_boot_is_deleted_for_a_replacement_only_with_no_live_lease(
    signals: Signals | None, live: int, deleted: bool
) -> None:
    reads = _quiet_worker_past_boot_timeout(signals, live)
    if signals is None:
        reads = dataclasses.replace(reads, signal_error=DatabaseError("connection refused"))
    d = decision_mod.decide(reads, CFG)
    assert any(isinstance(s, StartDelete) for s in d.steps) is deleted
