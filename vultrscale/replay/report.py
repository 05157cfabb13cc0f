"""What a replay measured, per policy: hours, bills, waits, killed and lost work.

Billing is Vultr's (``vultrscale.rules.budget``): each instance pays the hourly rate per started
hour from its creation, at most the monthly price per calendar month. Instance-hours and bills
cover everything the replay ran, for every policy alike: each instance from its creation to its
deletion, or to the replay's end (the trace's end plus its grace) if it is still alive then. A
job finished in the grace ran on an instance, and that instance is paid for.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from vultrscale.core.model import PlanPrice
from vultrscale.replay.engine import RunStats, Sample
from vultrscale.replay.world import World
from vultrscale.rules import budget


@dataclass(frozen=True)
class PolicyResult:
    """One policy (or one sweep combination) on one trace."""

    policy: str
    plan: str  # the plan it was priced at (a --sweep over fleet.plan prices each at its own)
    monthly_usd: float
    hourly_usd: float
    instance_hours: float  # alive: created to deleted, or to the replay's end
    billed_hours: int  # started hours billed, none past the monthly cap
    cost_usd: float
    # Wait: seconds from a job's arrival to its result, less its own run time: queueing,
    # boots, and any earlier run that was killed or given back. A lost job has no result: it
    # counts as waiting at least to the replay's end (less its run time), and a percentile
    # that rests on such a job is only a floor (its *_at_least flag is set).
    wait_p50: float
    wait_p95: float
    wait_max: float
    wait_p50_at_least: bool
    wait_p95_at_least: bool
    wait_max_at_least: bool
    jobs: int
    finished: int
    killed: int  # runs killed mid-job (an instance deleted under them)
    given_back: int  # runs handed back by a drain (attempt refunded)
    lost: int  # never finished by the end of the trace plus its grace, dead ones included
    scale_ups: int  # instances created
    scale_downs: int  # instances deleted
    passes: int
    passes_skipped: int
    lower_bound_hours: float
    samples: tuple[Sample, ...] = ()
    cost_curve: tuple[tuple[float, float], ...] = ()  # (second, cumulative cost)
    # The world's faults it met (``[simulate]``): creates refused by a stock-out, API calls
    # answered 429 (a baseline: passes), instances whose worker never started.
    refused_creates: int = 0
    throttled: int = 0
    dead_boots: int = 0
    # Set by the comparison: the knobs that make this row (sweep key, value), whether it is the
    # fleet's config as it is, a baseline, on the cost/wait frontier; its cost over hindsight's.
    knobs: tuple[tuple[str, str], ...] = ()
    current: bool = False
    baseline: bool = False
    on_frontier: bool = False
    cost_vs_hindsight: float | None = None
    # The limits that held back a scale-up the row wanted (cap, budget, cool-down,
    # max_step_up), by name: a row equal to another because the budget bound both says so.
    bound_by: tuple[str, ...] = ()
    replay_seconds: float = 0.0  # wall time of the replay itself (scripts/bench_*; not in JSON)
    revives: int = 0  # draining instances whose worker was started again instead of a create

    @property
    def ratio(self) -> float:
        """Instance-hours against the offline lower bound."""
        return self.instance_hours / self.lower_bound_hours if self.lower_bound_hours else math.inf

    @property
    def cost_ratio(self) -> float:
        """Cost against the lower bound's cost (its instance-hours at the hourly rate, no
        started-hour rounding): what boots, idle time and whole-hour billing add."""
        floor = self.lower_bound_hours * self.hourly_usd
        return self.cost_usd / floor if floor else math.inf

    @property
    def scale_events(self) -> int:
        return self.scale_ups + self.scale_downs

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d.pop("samples")
        d.pop("cost_curve")
        d.pop("replay_seconds")
        # No lower bound (no work): no ratio. JSON has no infinity; null says "none".
        d["ratio_to_lower_bound"] = round(self.ratio, 3) if math.isfinite(self.ratio) else None
        d["cost_vs_lower_bound"] = (
            round(self.cost_ratio, 3) if math.isfinite(self.cost_ratio) else None
        )
        if self.cost_vs_hindsight is not None:
            d["cost_vs_hindsight"] = round(self.cost_vs_hindsight, 3)
        d["scale_events"] = self.scale_events
        for k in ("wait_p50", "wait_p95", "wait_max"):
            d[k] = round(d[k], 2)
        d["cost_usd"] = round(self.cost_usd, 4)
        d["knobs"] = dict(self.knobs)
        d["bound_by"] = list(self.bound_by)
        return d


def wait_percentile(
    waits: list[float], q: float, lowest_floor: float = math.inf
) -> tuple[float, bool]:
    """Nearest-rank percentile of ascending waits, and whether it is only a floor: it is when
    the lowest floor among them (a lost job's wait so far) is at or below it (raising that
    one, to whatever the job's true wait is, could raise the percentile). (0, False) for an
    empty list."""
    if not waits:
        return 0.0, False
    value = waits[max(1, math.ceil(q * len(waits))) - 1]
    return max(0.0, value), lowest_floor <= value


def lower_bound_hours(total_job_seconds: float, jobs_per_instance: int) -> float:
    """No instance ever booting or idle: every slot busy from the first job to the last."""
    return total_job_seconds / jobs_per_instance / 3600.0


def monthly_cap_hours(price: PlanPrice) -> int:
    """Started hours in a month after which the monthly price is reached (672 for $10 at
    $0.0149/h: the 672nd hour is charged in part, later ones not at all)."""
    # Rounded first: monthly / (monthly / 672) must give 672, not 672.0000000001 -> 673.
    return math.ceil(round(price.monthly / price.hourly, 6))


def instance_bill(
    created: float, gone: float, epoch: datetime, price: PlanPrice
) -> tuple[int, float]:
    """(billed hours, cost) of one instance alive from ``created`` to ``gone`` (seconds).

    Billed hours are the started hours that add to the bill: at most ``monthly_cap_hours``
    per calendar month, past which the monthly price caps the cost and an hour costs nothing.
    """
    start = epoch + timedelta(seconds=created)
    stop = epoch + timedelta(seconds=gone)
    hours, cost = 0, 0.0
    cap = monthly_cap_hours(price)
    month_start, month_end = budget.month_bounds(start)
    while month_start < stop:
        lo, hi = max(start, month_start), min(stop, month_end)
        hours += min(budget.started_hours(lo, hi), cap)
        cost += budget.billed(start, stop, price, month_start, month_end)
        month_start, month_end = budget.month_bounds(month_end)
    return hours, cost


def job_waits(world: World, end: float) -> tuple[list[float], float]:
    """Every job's wait (arrival to result, less its run time), ascending, and the lowest of
    the waits that are only floors. A job never finished waited at least until the replay
    stopped (``end`` - arrival - its run time, a floor); left out, a policy that loses work
    would show shorter waits. Plain floats, sorted once: a replay has up to millions of jobs."""
    arrivals, durations = world.trace.arrivals, world.duration
    waits = [
        (fin if fin is not None else end) - arrivals[j] - durations[j]
        for j, fin in enumerate(world.finished_at)
    ]
    lowest_floor = min(
        (w for w, fin in zip(waits, world.finished_at, strict=True) if fin is None),
        default=math.inf,
    )
    waits.sort()
    return waits, lowest_floor


def measure(
    name: str,
    world: World,
    stats: RunStats,
    *,
    price: PlanPrice,
    end: float,
    jobs_per_instance: int,
    curve_points: int = 0,
) -> PolicyResult:
    """Read the outcome off a world played to ``end`` (the trace's end plus its grace): every
    instance it created counts from its creation to its deletion, or to ``end``."""
    trace = world.trace
    alive = 0.0
    hours = 0
    cost = 0.0
    spans: list[tuple[float, float, PlanPrice]] = []
    for inst in world.instances:
        gone = min(inst.gone_at if inst.gone_at is not None else end, end)
        own = price if inst.price is None else PlanPrice(price.plan, *inst.price)
        spans.append((inst.created, gone, own))
        alive += gone - inst.created
        inst_hours, inst_cost = instance_bill(inst.created, gone, trace.epoch, own)
        hours += inst_hours
        cost += inst_cost
    durations = world.duration  # as the world ran them
    waits, lowest_floor = job_waits(world, end)
    p50, p50_floor = wait_percentile(waits, 0.50, lowest_floor)
    p95, p95_floor = wait_percentile(waits, 0.95, lowest_floor)
    top, top_floor = wait_percentile(waits, 1.0, lowest_floor)
    curve: list[tuple[float, float]] = []
    if curve_points:
        step = end / curve_points
        for k in range(curve_points + 1):
            t = k * step
            curve.append(
                (
                    t,
                    sum(
                        instance_bill(a, min(b, t), trace.epoch, own)[1]
                        for a, b, own in spans
                        if a < t
                    ),
                )
            )
    c = world.c
    return PolicyResult(
        policy=name,
        plan=price.plan,
        monthly_usd=price.monthly,
        hourly_usd=price.hourly,
        instance_hours=alive / 3600.0,
        billed_hours=hours,
        cost_usd=cost,
        wait_p50=p50,
        wait_p95=p95,
        wait_max=top,
        wait_p50_at_least=p50_floor,
        wait_p95_at_least=p95_floor,
        wait_max_at_least=top_floor,
        jobs=len(trace),
        finished=c.finished,
        killed=c.killed,
        given_back=c.given_back,
        lost=len(trace) - c.finished,
        scale_ups=c.creates,
        scale_downs=c.deletes,
        passes=stats.passes,
        passes_skipped=stats.skipped,
        lower_bound_hours=lower_bound_hours(math.fsum(durations), jobs_per_instance),
        samples=tuple(stats.samples),
        cost_curve=tuple(curve),
        refused_creates=c.refused_creates,
        throttled=c.throttled,
        dead_boots=c.dead_boots,
        revives=c.revives,
    )
