"""The vultrscale policy in the simulator: the real reconcile pass over in-memory ports.

``reconcile.run_pass`` runs unchanged, lifecycle, drain verdicts, ``policy.decide``, apply
and record included. Only its ports are simulated, by core's in-memory adapters
(``vultrscale.memory``) bound to the simulated world:

- the cloud (``WorldCloud``, a ``MemoryCloud``): a POST starts a simulated instance with its
  own boot time; DELETE answers "locked" until Vultr shows the instance active, and kills
  whatever its worker still runs;
- the drain transport (``WorldDrain``): `systemctl stop` is the worker's SIGTERM, `is-active`
  says whether the worker process still runs; a host that has not booted is unreachable;
- the ledger (``SimLedger``, a ``MemoryLedger``): its ``workers`` table and the queue signals
  are refreshed from the world before each pass, as the workers' heartbeats and the queue
  would have them; recorded passes are counted, not kept (days of them would fill memory);
- the clock reads the world's time.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from vultrscale import budget, lifecycle, reconcile
from vultrscale.config import Config, Secret
from vultrscale.errors import HostUnreachable, SSHError
from vultrscale.memory import MemoryCloud, MemoryLedger, MemorySignals, memory_parts
from vultrscale.model import (
    HostTarget,
    InstanceState,
    LedgerRow,
    PassEvent,
    Plan,
    PlanPrice,
    ServiceState,
    Signals,
    WorkerView,
)
from vultrscale.simulate.world import World
from vultrscale.vultr.errors import BadRequest, InstanceLocked, RateLimited
from vultrscale.vultr.models import VInstance, VPlan

SNAPSHOT = "snap-simulated"
SIMULATED_WORKER_DB = "postgresql://worker@simulated.invalid/queue"


class WorldClock:
    """The Clock port reading the world's time."""

    def __init__(self, world: World, epoch: datetime) -> None:
        self.world = world
        self.epoch = budget.utc(epoch)  # wall time in a DST zone would jump an hour

    def now(self) -> datetime:
        return self.epoch + timedelta(seconds=self.world.now)

    def monotonic(self) -> float:
        return self.world.now

    def sleep(self, seconds: float) -> None:  # pragma: no cover - passes never sleep
        raise AssertionError("a simulated pass does not sleep")


class WorldCloud(MemoryCloud):
    """The Cloud port over the simulated world: boots and deletes happen to its instances."""

    def __init__(
        self, world: World, clock: WorldClock, plan: VPlan, region: str, snapshot: str
    ) -> None:
        # The fleet's own snapshot (fleet.snapshot_id) if it names one, else the one the
        # simulated ledger records: either way it exists and is complete.
        snapshots = {SNAPSHOT: "complete", snapshot: "complete"} if snapshot else None
        super().__init__(
            clock,
            plans=(plan,),
            regions={region: {plan.id}},
            snapshots=snapshots or {SNAPSHOT: "complete"},
        )
        self.world = world

    def _api(self) -> None:
        """A 429 burst of the simulated world refuses every call (the client's retries spent)."""
        if self.world.throttled():
            raise RateLimited("429 Too Many Requests (simulated burst)", status=429)

    def list_instances(self, tag: str | None = None) -> list[VInstance]:
        self._api()
        return super().list_instances(tag)

    def get_instance(self, instance_id: str) -> VInstance:
        self._api()
        return super().get_instance(instance_id)

    def create_instance(self, **kwargs: Any) -> VInstance:
        self._api()
        if self.world.stocked_out():
            raise BadRequest(
                "Plan is not available in the selected region (simulated stock-out)", status=400
            )
        v = super().create_instance(**kwargs)
        inst = self.world.create(v.label)
        # Vultr shows it active (an IP, deletable) when the simulated boot says so.
        self._booting[v.id] = self.clock.now() + timedelta(seconds=inst.active_at - inst.created)
        return v

    def delete_instance(self, instance_id: str) -> None:
        self._api()
        v = self.instances.get(instance_id)
        if v is not None and not self.world.delete(v.label):
            raise InstanceLocked(f"instance {instance_id} is locked", status=500)
        super().delete_instance(instance_id)


class WorldDrain:
    """The DrainTransport port: SSH to the simulated workers."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.stops = 0

    def stop_many(self, targets: list[HostTarget]) -> dict[str, SSHError | None]:
        out: dict[str, SSHError | None] = {}
        for t in targets:
            ok = self.world.stop(t.label)
            self.stops += ok
            out[t.label] = None if ok else HostUnreachable(f"{t.address}: not reachable yet")
        return out

    def is_active_many(self, targets: list[HostTarget]) -> dict[str, ServiceState | SSHError]:
        out: dict[str, ServiceState | SSHError] = {}
        for t in targets:
            active = self.world.service_active(t.label)
            out[t.label] = (
                HostUnreachable(f"{t.address}: not reachable yet")
                if active is None
                else ServiceState.ACTIVE
                if active
                else ServiceState.INACTIVE
            )
        return out

    def close(self) -> None:
        pass


class SimLedger(MemoryLedger):
    """A MemoryLedger fit for weeks of passes.

    - Recorded passes are counted, not kept (days of them would fill memory).
    - Gone rows are folded: a pass reads rows gone this month only for this month's bill, and
      summing every gone row on every pass makes a month of passes quadratic. When a row goes
      gone its bill per calendar month is final, so it is added to that month's total and
      ``rows`` returns one gone row per month that bills exactly that total.
    """

    def __init__(self, fleet: str) -> None:
        super().__init__(fleet, snapshot=SNAPSHOT)
        self.passes = 0
        self.failed: list[str] = []  # the errors of passes that reported any
        self.gone_bill: dict[datetime, float] = {}  # month start -> its gone rows' total
        self.gone_count = 0
        self._folded: LedgerRow | None = None

    def record_event(self, event: PassEvent) -> None:
        self.passes += 1  # the errors and the time are read; the summaries are never built
        if event["errors"]:
            self.failed.append(f"{event['at'].isoformat()}: {'; '.join(event['errors'])}")

    def transition(self, label: str, state: InstanceState, now: datetime, **kw: Any) -> None:
        super().transition(label, state, now, **kw)
        if state is InstanceState.GONE and label in self.instances:
            self._fold(self.instances.pop(label))

    def _fold(self, row: LedgerRow) -> None:
        assert row.monthly_cost is not None and row.gone_at is not None
        price = PlanPrice(row.plan or "", row.monthly_cost, row.hourly_rate or None)
        start, end = budget.month_bounds(row.created_at)
        while start <= row.gone_at:
            cost = budget.billed(row.created_at, row.gone_at, price, start, end)
            self.gone_bill[start] = self.gone_bill.get(start, 0.0) + cost
            start, end = budget.month_bounds(end)
        self.gone_count += 1

    def rows(self, since: datetime) -> list[LedgerRow]:
        out = sorted(
            (r for r in self.instances.values() if r.state is not InstanceState.GONE),
            key=lambda r: (r.created_at, r.label),
        )
        start, _ = budget.month_bounds(since)
        total = self.gone_bill.get(start, 0.0)
        if total > 0:
            if self._folded is None or (self._folded.created_at, self._folded.hourly_rate) != (
                start,
                total,
            ):
                self._folded = folded_row(self.fleet, start, total)
            out.append(self._folded)
        return out


def folded_row(fleet: str, month_start: datetime, total: float) -> LedgerRow:
    """A gone row billed exactly ``total`` for the month starting at ``month_start``: one
    started hour at an hourly rate and a monthly cap both equal to the total."""
    return LedgerRow.new(
        f"gone-{month_start:%Y-%m}",
        fleet,
        InstanceState.GONE,
        month_start,
        hourly_rate=total,
        monthly_cost=total,
        gone_at=month_start + budget.HOUR,
    )


def scale_up_limit(clamp: str) -> str | None:
    """The limit a plan's clamp names when it held back a scale-up (cap, budget, cool-down,
    max_step_up); None for the scale-in clamps (idle window, billing hour, down cool-down)."""
    name = clamp.partition(":")[0]
    if name == "cap" and "draining" in clamp:  # above the cap: a scale-in
        return None
    if name in ("cap", "budget", "max_step_up") or (
        name == "cool-down" and "scale-up waits" in clamp
    ):
        return name
    return None


class Vultrscale:
    """The policy as deployed: one ``reconcile.run_pass`` per tick."""

    def __init__(
        self,
        cfg: Config,
        price: PlanPrice,
        epoch: datetime,
        name: str = "vultrscale",
        *,
        skip_saturated: bool = True,
    ) -> None:
        if not cfg.secrets.worker_database_url:
            # The simulated workers reach no database, but the pass checks that new instances
            # would be told one; the fleet's own URL is never needed (nor read) here.
            secrets = replace(cfg.secrets, worker_database_url=Secret(SIMULATED_WORKER_DB))
            cfg = replace(cfg, secrets=secrets)
        self.cfg = cfg
        self.price = price
        self.epoch = epoch
        self.name = name
        self.skip_saturated = skip_saturated
        self.ledger = SimLedger(cfg.fleet.name)
        self.signals = MemorySignals()
        self._parts: reconcile.Parts | None = None
        self._last_plan: Plan | None = None  # the plan of the last pass that ran
        self._last_hour = -1
        self.bound: set[str] = set()  # the limits that held back a scale-up

    def start(self, world: World) -> None:
        clock = WorldClock(world, self.epoch)
        plan = VPlan(
            self.cfg.fleet.plan,
            monthly_cost=self.price.monthly,
            hourly_cost=self.price.hourly,
        )
        cloud = WorldCloud(world, clock, plan, self.cfg.fleet.region, self.cfg.fleet.snapshot_id)
        parts = memory_parts(clock, cloud, self.ledger, self.signals, WorldDrain(world))  # type: ignore[arg-type]
        self._parts = parts

    def tick(self, world: World) -> None:
        assert self._parts is not None, "start() first"
        self._observe_world(world)
        result = reconcile.run_pass(self.cfg, self._parts)
        self._last_plan, self._last_hour = result.plan, self._hour(world.now)
        if result.plan is not None:
            self.bound.update(n for c in result.plan.clamps if (n := scale_up_limit(c)))

    def _observe_world(self, world: World) -> None:
        """What the queue and the workers table say now: heartbeats and leases."""
        now_s = world.now
        now = self.epoch + timedelta(seconds=now_s)
        self.signals.signals = Signals(ready=world.ready_count, in_flight=world.in_flight)
        seen_for = lifecycle.WORKER_SEEN_WITHIN.total_seconds()
        workers: dict[str, WorkerView] = {}
        for inst in world.live.values():
            if now_s < inst.worker_at:
                continue  # not registered yet
            last = now_s if inst.exited_at is None else inst.exited_at
            workers[inst.label] = WorkerView(
                instance_label=inst.label,
                last_seen=now if last == now_s else self.epoch + timedelta(seconds=last),
                draining=inst.stop_at is not None,
                live_leases=len(inst.running),
                seen=now_s - last <= seen_for,
            )
        self.ledger.workers_by_label = workers

    def unchanged(self, world: World) -> bool:
        """A saturated fleet: jobs wait, every instance runs with its worker claiming, and the
        last pass, in the same UTC hour, created nothing because the fleet was at its cap
        (``max_instances`` or the budget). Such a pass provably does nothing:

        - no create: the cap is ``max_instances`` or the budget's, and with the fleet unchanged
          the budget's only moves when a new instance's cost to the month's end drops, at a
          whole UTC hour; within the hour the cap is what the last pass computed;
        - no scale-in and no idle clock: the queue is not empty and ``idle_since`` is unset;
        - no replacement, transition, drain or adoption: every row running, its worker seen,
          its address known, and the cloud holds exactly the ledger's instances (only a pass
          changes them, and the last one changed nothing).

        It is checked again at every pass; a test compares whole replays with and without it.
        """
        last = self._last_plan
        if (
            not self.skip_saturated
            or last is None
            or last.actions
            or not world.ready
            or self.ledger.state.idle_since is not None
            or self._hour(world.now) != self._last_hour
        ):
            return False
        rows = self.ledger.instances
        if len(rows) < last.cap or len(rows) != last.capacity or len(world.live) != len(rows):
            return False
        now = world.now
        for label, row in rows.items():
            inst = world.live.get(label)
            if (
                row.state is not InstanceState.RUNNING
                or not row.main_ip
                or inst is None
                or not inst.claiming(now)
            ):
                return False
        return True

    def _hour(self, t: float) -> int:
        return int((self.epoch.timestamp() + t) // 3600)

    def quiet_until(self, world: World) -> float:
        """Idle world and a ledger with nothing left to settle: only an arrival or a floor
        that starts can make a pass do anything."""
        if any(r.state is not InstanceState.GONE for r in self.ledger.instances.values()):
            return 0.0
        if self.cfg.policy.min_instances:
            return 0.0
        now = self.epoch + timedelta(seconds=world.now)
        starts = [
            _next_match(fl.cron, fl.timezone, now)
            for fl in self.cfg.policy.floor
            if fl.min_instances > 0
        ]
        if not starts:
            return math.inf
        return (min(starts) - self.epoch).total_seconds()


def _next_match(cron: str, timezone: str, after: datetime) -> datetime:
    """The earliest UTC instant at or after ``after`` whose wall time in ``timezone`` the
    cron matches, or a moment before it (never later: a skipped pass must not miss a floor).
    Ambiguous wall times resolve to their first occurrence; a minute of slack covers the rest."""
    tz = ZoneInfo(timezone)
    wall = budget.utc(after).astimezone(tz).replace(tzinfo=None, second=0, microsecond=0)
    nxt = croniter(cron, wall - timedelta(minutes=1)).get_next(datetime)
    return nxt.replace(tzinfo=tz).astimezone(budget.utc(after).tzinfo) - timedelta(minutes=1)
