"""Run several policies (or variants of one config) on the same trace and rank them."""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from vultrscale import config as config_mod
from vultrscale.config import Config
from vultrscale.errors import UsageError
from vultrscale.model import PlanPrice
from vultrscale.simulate import baselines, engine
from vultrscale.simulate.fleet import Vultrscale
from vultrscale.simulate.report import PolicyResult, lower_bound_hours, measure
from vultrscale.simulate.workload import Trace
from vultrscale.simulate.world import World

POLICIES = ("always-on", "naive", "keda", "vultrscale")
# Snapshot restores take 10 to 15 minutes at Vultr on top of provisioning (Vultr's snapshot
# docs); the simulated boot is drawn uniformly from this range unless --boot-time says otherwise.
DEFAULT_BOOT_TIME = (600.0, 900.0)
# Plot resolution: points per curve.
PLOT_POINTS = 600


@dataclass(frozen=True)
class Setup:
    """How a replay runs, apart from the fleet's config."""

    interval: float = 30.0  # seconds between passes
    boot_time: tuple[float, float] = DEFAULT_BOOT_TIME
    seed: int = 0
    plot: bool = False  # keep the curves the plot needs


@dataclass(frozen=True)
class Comparison:
    trace: Trace
    results: tuple[PolicyResult, ...]
    lower_bound_hours: float | None  # None: the rows' jobs at once differ (each has its own)
    grace: float
    price: PlanPrice  # the first row's; a sweep over fleet.plan prices each row at its own
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, object]:
        return {
            "workload": {
                "name": self.trace.name,
                "note": self.trace.note,
                "jobs": len(self.trace),
                "span_hours": round(self.trace.span / 3600.0, 2),
                "job_hours": round(self.trace.total_job_seconds / 3600.0, 2),
                "epoch": self.trace.epoch.isoformat(),
            },
            "price": {
                "plan": self.price.plan,
                "monthly": self.price.monthly,
                "hourly": round(self.price.hourly, 5),
            },
            "lower_bound_hours": (
                None if self.lower_bound_hours is None else round(self.lower_bound_hours, 2)
            ),
            "grace_seconds": round(self.grace, 1),
            "results": [r.to_json() for r in self.results],
            "notes": list(self.notes),
        }


def parse_boot_time(text: str) -> tuple[float, float]:
    """``12m`` (fixed) or ``10m..15m`` (uniform range) in seconds."""
    lo_s, sep, hi_s = text.partition("..")
    try:
        lo = config_mod.parse_duration(lo_s.strip(), "--boot-time").total_seconds()
        hi = config_mod.parse_duration(hi_s.strip(), "--boot-time").total_seconds() if sep else lo
    except ValueError as exc:
        raise UsageError(str(exc), hint="Write --boot-time 12m or --boot-time 10m..15m.") from None
    if hi < lo:
        raise UsageError(
            f"--boot-time: {text!r} ends before it starts", hint="Write MIN..MAX, e.g. 10m..15m."
        )
    return lo, hi


def plan_price(cfg: Config, monthly: float | None = None) -> PlanPrice:
    """The fleet plan's price: the given monthly price, else Vultr's list price of the plan."""
    from vultrscale.sim import data

    if monthly is not None:
        if not 0 < monthly <= 1_000_000:  # also refuses NaN and infinity
            raise UsageError(
                f"--monthly-usd must be above 0 and at most 1000000, got {monthly}",
                hint="Give the plan's monthly cost in dollars, e.g. --monthly-usd 10.",
            )
        return PlanPrice(cfg.fleet.plan, monthly)
    for p in data.PLANS:
        if p["id"] == cfg.fleet.plan:
            return PlanPrice(p["id"], float(p["monthly_cost"]), float(p["hourly_cost"]))
    raise UsageError(
        f"no list price known for plan {cfg.fleet.plan!r}",
        hint="Give its price with --monthly-usd (the plan's monthly cost in dollars).",
    )


def peak_concurrency(trace: Trace) -> int:
    """Most jobs running at once if each started the moment it arrived."""
    edges = sorted(
        [(a, 1) for a in trace.arrivals]
        + [(a + d, -1) for a, d in zip(trace.arrivals, trace.durations, strict=True)],
        key=lambda e: (e[0], e[1]),
    )
    peak = cur = 0
    for _, step in edges:
        cur += step
        peak = max(peak, cur)
    return peak


def grace_seconds(cfg: Config, setup: Setup, trace: Trace) -> float:
    """Time past the trace's end for its last jobs to finish: a boot, the longest job and a
    drain. A job not finished by then counts as lost."""
    return setup.boot_time[1] + trace.longest + cfg.drain.timeout.total_seconds()


def replay_end(cfg: Config, setup: Setup, trace: Trace) -> float:
    """Where every replay stops, and what every policy is measured (and billed) up to."""
    return trace.span + grace_seconds(cfg, setup, trace)


def worker_slots(cfg: Config) -> int:
    """How many jobs a simulated instance runs at once: the reference worker's
    ``worker.concurrency`` (what the user-data gives it) with the built-in queue; with another
    preset the workers are the app's own, taken to run ``queue.jobs_per_instance``. The
    policies still size the fleet by ``queue.jobs_per_instance``, as the real pass does."""
    return (
        cfg.worker.concurrency if cfg.queue.preset == "vultrscale" else cfg.queue.jobs_per_instance
    )


def _policies(
    names: Sequence[str], cfg: Config, trace: Trace, price: PlanPrice
) -> list[engine.Policy]:
    per = cfg.queue.jobs_per_instance
    out: list[engine.Policy] = []
    for name in names:
        if name == "always-on":
            peak = min(cfg.policy.max_instances, max(1, math.ceil(peak_concurrency(trace) / per)))
            out.append(baselines.AlwaysOn(peak, per, f"always-on {peak} (peak)"))
            if peak != 1 and cfg.policy.max_instances >= 1:  # none at all with a cap of 0
                out.append(baselines.AlwaysOn(1, per, "always-on 1"))
        elif name == "naive":
            out.append(baselines.Naive(cfg.policy.max_instances, per))
        elif name == "keda":
            out.append(baselines.Keda(cfg.policy.max_instances, per))
        elif name == "vultrscale":
            out.append(Vultrscale(cfg, price, trace.epoch))
        else:
            raise UsageError(f"unknown policy {name!r}", hint=f"Choose from {', '.join(POLICIES)}.")
    return out


def play(
    pol: engine.Policy,
    trace: Trace,
    cfg: Config,
    setup: Setup,
    *,
    progress: Callable[[float], None] | None = None,
    end: float | None = None,
) -> tuple[World, engine.RunStats]:
    """Play ``trace`` under ``pol`` to ``end`` (the trace's end plus its grace); the world and
    the run's statistics, for measuring (and for tests that look inside)."""
    world = World(
        trace,
        jobs_per_instance=worker_slots(cfg),
        drain_seconds=cfg.worker.drain_seconds,
        lease_seconds=cfg.worker.lease_seconds,
        boot_time=setup.boot_time,
        seed=setup.seed,
    )
    stats = engine.run(
        world,
        pol,
        interval=setup.interval,
        until=replay_end(cfg, setup, trace) if end is None else end,
        sample_every=setup.interval if setup.plot else 0.0,
        progress=progress,
    )
    return world, stats


def run_one(
    pol: engine.Policy,
    trace: Trace,
    cfg: Config,
    setup: Setup,
    price: PlanPrice,
    *,
    name: str | None = None,
    progress: Callable[[float], None] | None = None,
    end: float | None = None,
) -> PolicyResult:
    """Play and measure one policy, to ``end`` (None: this config's replay end)."""
    end = replay_end(cfg, setup, trace) if end is None else end
    world, stats = play(pol, trace, cfg, setup, progress=progress, end=end)
    return measure(
        name or pol.name,
        world,
        stats,
        price=price,
        end=end,
        jobs_per_instance=worker_slots(cfg),
        curve_points=PLOT_POINTS if setup.plot else 0,
    )


def compare(
    trace: Trace,
    cfg: Config,
    setup: Setup,
    names: Sequence[str] = POLICIES,
    *,
    price: PlanPrice,
    progress: Callable[[str, float], None] | None = None,
) -> Comparison:
    """Every named policy on the same trace."""
    results = []
    for pol in _policies(names, cfg, trace, price):
        cb = (lambda f, n=pol.name: progress(n, f)) if progress else None
        results.append(run_one(pol, trace, cfg, setup, price, progress=cb))
    return _comparison(trace, results, cfg, setup, price)


def _comparison(
    trace: Trace,
    results: Sequence[PolicyResult],
    cfg: Config,
    setup: Setup,
    price: PlanPrice,
    grace: float | None = None,
) -> Comparison:
    # One lower bound for the table only when every row shares it (a sweep over
    # queue.jobs_per_instance gives each row its own).
    bounds = {r.lower_bound_hours for r in results} or {
        lower_bound_hours(trace.total_job_seconds, cfg.queue.jobs_per_instance)
    }
    return Comparison(
        trace,
        tuple(results),
        bounds.pop() if len(bounds) == 1 else None,
        grace_seconds(cfg, setup, trace) if grace is None else grace,
        price,
    )


# Each combination is a full replay: a 199 x 199 grid (39,601 replays) ran without limit.
MAX_SWEEP_VARIANTS = 100


def parse_sweeps(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``KEY=V1,V2`` items -> [(key, [values])]; keys are dotted config keys, checked here (read
    as VULTRSCALE_ variables later, a misspelled one was reported as a variable of the
    environment), and the grid at most MAX_SWEEP_VARIANTS combinations."""
    out: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        section, dot, name = key.strip().partition(".")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not dot or not name or not vals:
            raise UsageError(
                f"--sweep {item!r} is not KEY=V1,V2,...",
                hint="Example: --sweep policy.idle_before_scale_down=0s,5m,15m",
            )
        problem = config_mod.setting_key_problem(f"{section}.{name}")
        if problem:
            raise UsageError(
                f"--sweep {problem}",
                hint="Name a key of the config file as SECTION.KEY, e.g. "
                "--sweep policy.idle_before_scale_down=0s,5m,15m",
            )
        out.append((f"{section}.{name}", vals))
    variants = math.prod(len(vals) for _, vals in out)
    if variants > MAX_SWEEP_VARIANTS:
        raise UsageError(
            f"--sweep makes {variants} combinations to replay; at most "
            f"{MAX_SWEEP_VARIANTS} are run",
            hint="Sweep fewer values, or one key at a time and then around the best value.",
        )
    return out


def sweep_configs(
    sweeps: Sequence[tuple[str, Sequence[str]]],
    config_path: str | None,
    env: Mapping[str, str] | None = None,
    *,
    monthly: float | None = None,
) -> list[tuple[str, Config, PlanPrice]]:
    """One config per combination of the swept values, each loaded and validated as the
    fleet's own would be (the values are read like VULTRSCALE_<SECTION>_<KEY> settings), and
    priced at its own plan (or at ``monthly``): every variant refused before any replay."""
    base_env = dict(os.environ if env is None else env)
    keys = [k for k, _ in sweeps]
    out = []
    for combo in itertools.product(*(v for _, v in sweeps)):
        overrides = {
            "VULTRSCALE_" + k.replace(".", "_", 1).upper(): v
            for k, v in zip(keys, combo, strict=True)
        }
        label = " ".join(f"{k}={v}" for k, v in zip(keys, combo, strict=True))
        try:
            cfg = config_mod.load(config_path, {**base_env, **overrides})
            price = plan_price(cfg, monthly)
        except UsageError as exc:
            raise UsageError(f"--sweep {label}: {exc}", hint=exc.hint) from None
        out.append((label, cfg, price))
    return out


def sweep(
    trace: Trace,
    variants: Sequence[tuple[str, Config, PlanPrice]],
    setup: Setup,
    *,
    progress: Callable[[str, float], None] | None = None,
) -> Comparison:
    """vultrscale once per variant (``sweep_configs``), each at its own price, ranked by cost
    (then p95 wait)."""
    # One window for every row, the longest grace any variant needs: each row's own (a sweep
    # of drain.timeout) billed the same behaviour over a longer window, and ranked it dearer.
    grace = max(grace_seconds(cfg, setup, trace) for _, cfg, _ in variants)
    results = []
    for label, cfg, price in variants:
        cb = (lambda f, n=label: progress(n, f)) if progress else None
        pol = Vultrscale(cfg, price, trace.epoch, name=label)
        results.append(
            run_one(pol, trace, cfg, setup, price, name=label, progress=cb, end=trace.span + grace)
        )
    results.sort(key=lambda r: (r.lost, r.cost_usd, r.wait_p95))
    first = next(price for label, _, price in variants if label == results[0].policy)
    return _comparison(trace, results, variants[0][1], setup, first, grace)
