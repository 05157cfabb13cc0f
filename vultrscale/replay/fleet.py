"""The vultrscale policy in the simulator: the real reconcile pass over in-memory ports.

``reconcile.run_pass`` runs unchanged, lifecycle, drain verdicts, ``policy.decide``, apply
and record included. Only its ports are simulated, by core's in-memory adapters
(``vultrscale.memory``) bound to the simulated world:

- the cloud (``WorldCloud``, a ``MemoryCloud``): a POST starts a simulated instance with its
  own boot time; DELETE answers "locked" until Vultr shows the instance active, and kills
  whatever its worker still runs;
- the drain transport (``WorldDrain``): `systemctl stop` is the worker's SIGTERM, `is-active`
  says whether the worker process still runs (deactivating while it drains), `systemctl start`
  starts it again (after its drain); a host that has not booted is unreachable;
- the ledger (``SimLedger``, a ``MemoryLedger``): its ``workers`` table and the queue signals
  are refreshed from the world before each pass, as the workers' heartbeats and the queue
  would have them; recorded passes are counted, not kept (days of them would fill memory);
- the clock reads the world's time.

Passes are skipped only where the core itself says a pass changes nothing: after a pass with
nothing to carry out, until ``decision.next_change`` and, for a busy fleet, while the queue's
demand stays within ``decision.demand_band`` and the instances and their workers are as they
were. The simulator keeps no model of its own of when the policy acts.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from vultrscale import reconcile
from vultrscale.config import Config, Secret
from vultrscale.core import boottime, forecast
from vultrscale.core.forecast import Bucket
from vultrscale.core.model import (
    HostTarget,
    InstanceState,
    LedgerRow,
    PassEvent,
    PlanPrice,
    ServiceState,
    Signals,
    WorkerView,
)
from vultrscale.errors import HostUnreachable, SSHError, UsageError
from vultrscale.memory import MemoryCloud, MemoryLedger, MemorySignals, memory_parts
from vultrscale.ports import Parts
from vultrscale.replay.world import World
from vultrscale.rules import budget, decision, lifecycle, offerings
from vultrscale.vultr.errors import InstanceLocked, RateLimited
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


def list_price(plan: str) -> PlanPrice:
    """Vultr's list price of ``plan`` (the simulator's copy of ``GET /v2/plans``)."""
    from vultrscale.fake_vultr import data

    for p in data.PLANS:
        if p["id"] == plan:
            return PlanPrice(p["id"], float(p["monthly_cost"]), float(p["hourly_cost"]))
    raise UsageError(
        f"no list price known for plan {plan!r}",
        hint="Give its price with --monthly-usd (the plan's monthly cost in dollars), or "
        "list only plans of GET /v2/plans in [[fleet.offerings]].",
    )


class WorldCloud(MemoryCloud):
    """The Cloud port over the simulated world: boots and deletes happen to its instances."""

    def __init__(
        self,
        world: World,
        clock: WorldClock,
        offerings: Mapping[tuple[str, str], tuple[VPlan, int]],
        snapshot: str,
    ) -> None:
        """``offerings``: (region, plan) -> the plan (its price) and the jobs an instance of
        it runs at once; the first is the replay's own plan, billed at the replay's price."""
        # The fleet's own snapshot (fleet.snapshot_id) if it names one, else the one the
        # simulated ledger records: either way it exists and is complete.
        snapshots = {SNAPSHOT: "complete", snapshot: "complete"} if snapshot else None
        regions: dict[str, set[str]] = {}
        for region, plan in offerings:
            regions.setdefault(region, set()).add(plan)
        super().__init__(
            clock,
            plans=tuple({p.id: p for p, _ in offerings.values()}.values()),
            regions=regions,
            snapshots=snapshots or {SNAPSHOT: "complete"},
        )
        self.world = world
        self.offerings = dict(offerings)
        self._own = next(iter(offerings), None)  # the replay's plan: the world's slots, price

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
        # The world's stock-out windows sell the offering out in the memory cloud, whose rule
        # refuses the create as Vultr words it (``MemoryCloud.sell_out``).
        offering = (kwargs["region"], kwargs["plan"])
        if self.world.stocked_out(offering):
            self.sell_out(*offering)
        else:
            self.restock(*offering)
        v = super().create_instance(**kwargs)
        if offering == self._own:
            inst = self.world.create(v.label)
        else:  # another offering: its own size and price
            plan, slots = self.offerings[offering]
            inst = self.world.create(
                v.label, slots=slots, price=(plan.monthly_cost, plan.hourly_cost)
            )
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

    def start_many(self, targets: list[HostTarget]) -> dict[str, SSHError | None]:
        out: dict[str, SSHError | None] = {}
        for t in targets:
            ok = self.world.start(t.label)
            out[t.label] = None if ok else HostUnreachable(f"{t.address}: not reachable yet")
        return out

    def is_active_many(self, targets: list[HostTarget]) -> dict[str, ServiceState | SSHError]:
        out: dict[str, ServiceState | SSHError] = {}
        for t in targets:
            active = self.world.service_active(t.label)
            out[t.label] = (
                HostUnreachable(f"{t.address}: not reachable yet")
                if active is None
                else ServiceState.DEACTIVATING
                if self.world.service_stopping(t.label)
                else ServiceState.ACTIVE
                if active
                else ServiceState.INACTIVE
            )
        return out

    def close(self) -> None:
        pass


class WorldHistory:
    """The JobHistory port over the replayed past only: the jobs that arrived before the
    world's now, each with its run time once it has finished by then. A replay's forecast
    never reads the trace's future (docs/policy.md, "The floor forecast").

    The buckets are kept across the replay (``forecast.Tally``): each call adds the jobs
    that arrived and finished since the last one, instead of bucketing weeks of jobs again."""

    def __init__(self, world: World, epoch: datetime) -> None:
        self.world = world
        self.epoch = budget.utc(epoch)
        self._tally: forecast.Tally | None = None
        self._next = 0  # the first job not counted yet
        self._running: dict[int, datetime] = {}  # counted, not finished: job -> its bucket

    def buckets(self, since: datetime, until: datetime, width: timedelta) -> list[Bucket]:
        world, epoch = self.world, self.epoch
        stop = bisect.bisect_left(
            world.arrival,
            (min(until, epoch + timedelta(seconds=world.now)) - epoch).total_seconds(),
        )
        tally = self._tally
        if tally is None or tally.width != width or stop < self._next:
            tally = self._tally = forecast.Tally(width)
            self._next, self._running = 0, {}
        running = self._running
        for j in range(self._next, stop):
            running[j] = tally.due(epoch + timedelta(seconds=world.arrival[j]))
        self._next = max(self._next, stop)
        finished, duration = world.finished_at, world.duration
        for j in [j for j in running if finished[j] is not None]:
            tally.finished(running.pop(j), duration[j])
        return tally.buckets(since)


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
        # The newest boots among the folded rows: the boot time is learned from them too.
        self._gone_boots: list[LedgerRow] = []

    def record_event(self, event: PassEvent) -> int:
        self.passes += 1  # the errors and the time are read; the summaries are never built
        if event["errors"]:
            self.failed.append(f"{event['at'].isoformat()}: {'; '.join(event['errors'])}")
        return self.passes

    def transition(self, move: decision.Move, now: datetime) -> None:
        super().transition(move, now)
        if move.state is InstanceState.GONE and move.label in self.instances:
            self._fold(self.instances.pop(move.label))

    def boots(self) -> list[LedgerRow]:
        return boottime.newest_boots([*self._gone_boots, *self.instances.values()])

    def _fold(self, row: LedgerRow) -> None:
        assert row.monthly_cost is not None and row.gone_at is not None
        if boottime.is_boot(row):
            self._gone_boots = boottime.newest_boots([row, *self._gone_boots])
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
        self._parts: Parts | None = None
        self._last_decision: decision.Decision | None = None  # of the last pass that ran
        # While the last pass was steady on a busy queue: the demands and the time within
        # which a pass on the same fleet stays steady, and the fleet's inputs it saw.
        self._band: tuple[int, int | None] | None = None
        self._steady_until = 0.0
        self._inputs_then: tuple[tuple[str, bool], ...] = ()
        self.bound: set[str] = set()  # the limits that held back a scale-up

    def start(self, world: World) -> None:
        clock = WorldClock(world, self.epoch)
        cloud = WorldCloud(world, clock, self._offerings(world), self.cfg.fleet.snapshot_id)
        history = WorldHistory(world, self.epoch)
        drain = WorldDrain(world)
        parts = memory_parts(clock, cloud, self.ledger, self.signals, drain, history=history)  # type: ignore[arg-type]
        self._parts = parts

    def _offerings(self, world: World) -> dict[tuple[str, str], tuple[VPlan, int]]:
        """Every offering of the fleet, as the simulated cloud sells it: the first at the
        replay's price with the world's slots, the others at their list price, each with the
        jobs its workers run (its own ``jobs_per_instance``, the concurrency the pass gives
        its workers)."""
        out: dict[tuple[str, str], tuple[VPlan, int]] = {}
        for k, o in enumerate(offerings.of(self.cfg)):
            if k == 0:
                price = self.price
                slots = world.slots
            else:
                price = list_price(o.plan)
                slots = o.jobs_per_instance or world.slots
            plan = VPlan(o.plan, monthly_cost=price.monthly, hourly_cost=price.hourly)
            out.setdefault((o.region, o.plan), (plan, slots))
        return out

    def tick(self, world: World) -> None:
        assert self._parts is not None, "start() first"
        self._observe_world(world)
        result = reconcile.run_pass(self.cfg, self._parts)
        last = self._last_decision = result.decision
        self._band = None if last is None else decision.demand_band(self.cfg, last)
        if self._band is not None:
            assert last is not None
            until = decision.next_change(self.cfg, last)
            self._steady_until = math.inf if until is None else self._seconds(until)
            self._inputs_then = self._inputs(world)
        if result.plan is not None:
            # The limits that held back a scale-up (cap, budget, cool-down, max_step_up).
            self.bound.update(c.kind.rule for c in result.plan.clamps if c.kind.holds_scale_up)

    def _observe_world(self, world: World) -> None:
        """What the queue and the workers table say now: heartbeats and leases."""
        now_s = world.now
        now = self.epoch + timedelta(seconds=now_s)
        jobs, mean = world.recent_jobs()
        self.signals.signals = Signals(
            ready=world.ready_count,
            in_flight=world.in_flight,
            oldest_ready_seconds=world.oldest_ready_seconds(),
            recent_jobs=jobs,
            recent_job_seconds=mean,
            recent_arrivals=world.recent_arrivals(),
        )
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
        """The pass would carry nothing out, as the core says it: the last pass had nothing to
        carry out, the core's time answer (``decision.next_change``) has not come, the queue's
        demand is within the band the core gave (``decision.demand_band``), and the rest of
        the pass's input is as it was then: the same instances, each worker still claiming
        (in the simulated world only a pass changes those). It is checked again at every
        pass; a test compares whole replays with and without it."""
        band = self._band
        if not self.skip_saturated or band is None or world.now >= self._steady_until:
            return False
        demand = world.ready_count + world.in_flight
        if demand < band[0] or (band[1] is not None and demand > band[1]):
            return False
        return self._inputs(world) == self._inputs_then

    def _inputs(self, world: World) -> tuple[tuple[str, bool], ...]:
        now = world.now
        return tuple((label, inst.claiming(now)) for label, inst in world.live.items())

    def quiet_until(self, world: World) -> float:
        """When the world is idle (no instance, no job): the time before which a pass changes
        nothing, as the core says it (``decision.next_change``) after a pass that had nothing
        to carry out on this same idle world; 0 when the last pass still acted."""
        last = self._last_decision
        if last is None or not last.steady:
            return 0.0
        when = decision.next_change(self.cfg, last)
        return math.inf if when is None else self._seconds(when)

    def _seconds(self, when: datetime) -> float:
        """Seconds into the replay of a wall-clock time."""
        return (budget.utc(when) - budget.utc(self.epoch)).total_seconds()
