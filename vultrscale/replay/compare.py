"""Run several policies (or variants of one config) on the same trace and rank them."""

from __future__ import annotations

import difflib
import itertools
import math
import multiprocessing
import os
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path

from vultrscale import config as config_mod
from vultrscale.config import Config, Secrets
from vultrscale.core.model import PlanPrice
from vultrscale.errors import UsageError
from vultrscale.replay import baselines, engine
from vultrscale.replay.fleet import Vultrscale, list_price
from vultrscale.replay.report import PolicyResult, lower_bound_hours, measure
from vultrscale.replay.workload import Trace
from vultrscale.replay.world import Faults, World
from vultrscale.rules import offerings

POLICIES = ("always-on", "naive", "keda", "hindsight", "vultrscale")
# The most rows one replay compares: each is a whole replay of the trace (a 199 x 199 sweep ran
# 39,601 of them, for hours, with no word); a grid this size already fills a screen.
MAX_VARIANTS = 100
# Plot resolution: points per curve.
PLOT_POINTS = 600


@dataclass(frozen=True)
class Setup:
    """How a replay runs, apart from the fleet's config."""

    interval: float = 30.0  # seconds between passes
    # Create to worker up, (min, max) seconds; None: each config's simulate.boot_time.
    boot_time: tuple[float, float] | None = None
    seed: int = 0
    plot: bool = False  # keep the curves the plot needs
    workers: int = 1  # processes that replay rows side by side


@dataclass(frozen=True)
class Variant:
    """One config to replay under vultrscale: a sweep's combination, a named variant of a
    variants file, or the fleet's own (current) setting."""

    name: str
    cfg: Config
    price: PlanPrice
    knobs: tuple[tuple[str, str], ...] = ()  # (dotted key, value as given) that make it
    current: bool = False  # the fleet's config as it is


@dataclass(frozen=True)
class Row:
    """One replay to run: a policy, the config it reads, its price."""

    kind: str  # one of POLICIES
    name: str
    cfg: Config
    price: PlanPrice
    knobs: tuple[tuple[str, str], ...] = ()
    current: bool = False
    size: int = 0  # always-on: its fixed fleet
    wanted: int = 0  # always-on: the fleet it would have run without max_instances


@dataclass(frozen=True)
class Comparison:
    trace: Trace
    results: tuple[PolicyResult, ...]
    lower_bound_hours: float | None  # None: the rows' jobs at once differ (each has its own)
    grace: float
    price: PlanPrice  # the first row's; a sweep over fleet.plan prices each row at its own
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def hindsight(self) -> PolicyResult | None:
        return next((r for r in self.results if r.policy == "hindsight"), None)

    @property
    def current(self) -> PolicyResult | None:
        return next((r for r in self.results if r.current), None)

    @property
    def chosen(self) -> PolicyResult | None:
        """The setting to look at: the cheapest vultrscale row on the frontier that waits no
        longer (p95) than the current setting; the current one if none does."""
        cur = self.current
        if cur is None:
            return None
        better = [
            r
            for r in self.results
            if r.on_frontier and not r.baseline and r.wait_p95 <= cur.wait_p95
        ]
        return min(better, key=lambda r: (cost_key(r), r.wait_p95), default=cur)

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
                None if self.lower_bound_hours is None else round(self.lower_bound_hours, 4)
            ),
            "hindsight_cost_usd": (
                None if self.hindsight is None else round(self.hindsight.cost_usd, 4)
            ),
            "grace_seconds": round(self.grace, 1),
            "chosen": None if self.chosen is None else self.chosen.policy,
            "results": [r.to_json() for r in self.results],
            "notes": list(self.notes),
        }


def parse_boot_time(text: str) -> tuple[float, float]:
    """``12m`` (fixed) or ``10m..15m`` (uniform range) in seconds."""
    try:
        return config_mod.duration_range(text, "--boot-time")
    except ValueError as exc:
        raise UsageError(str(exc), hint="Write --boot-time 12m or --boot-time 10m..15m.") from None


def boot_range(cfg: Config, setup: Setup) -> tuple[float, float]:
    """The boot time a replay of ``cfg`` draws from: ``--boot-time``, else simulate.boot_time."""
    if setup.boot_time is not None:
        return setup.boot_time
    return config_mod.duration_range(cfg.simulate.boot_time, "simulate.boot_time")


def plan_price(cfg: Config, monthly: float | None = None) -> PlanPrice:
    """The price of the fleet's plan (its first offering's): the given monthly price, else
    Vultr's list price of the plan."""
    plan = offerings.of(cfg)[0].plan
    if monthly is not None:
        if not 0 < monthly <= 1_000_000:  # also refuses NaN and infinity
            raise UsageError(
                f"--monthly-usd must be above 0 and at most 1000000, got {monthly}",
                hint="Give the plan's monthly cost in dollars, e.g. --monthly-usd 10.",
            )
        return PlanPrice(plan, monthly)
    return list_price(plan)


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
    longest = trace.longest * cfg.simulate.duration_scale
    return boot_range(cfg, setup)[1] + longest + cfg.drain.timeout.total_seconds()


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


def make_policy(row: Row, trace: Trace, setup: Setup) -> engine.Policy:
    """The policy a row replays."""
    cfg, per = row.cfg, row.cfg.queue.jobs_per_instance
    if row.kind == "always-on":
        pol: engine.Policy = baselines.AlwaysOn(row.size, per, row.name)
        if row.wanted > row.size:
            pol.bound.add("cap")
        return pol
    if row.kind == "naive":
        return baselines.Naive(cfg.policy.max_instances, per)
    if row.kind == "keda":
        return baselines.Keda(cfg.policy.max_instances, per)
    if row.kind == "hindsight":
        return baselines.Hindsight(cfg.policy.max_instances, per, boot_range(cfg, setup)[1])
    if row.kind == "vultrscale":
        return Vultrscale(cfg, row.price, trace.epoch, name=row.name)
    raise UsageError(f"unknown policy {row.kind!r}", hint=f"Choose from {', '.join(POLICIES)}.")


def baseline_rows(names: Sequence[str], cfg: Config, trace: Trace, price: PlanPrice) -> list[Row]:
    """The named baselines (``vultrscale`` is not one), on the fleet's own config."""
    per = cfg.queue.jobs_per_instance
    out: list[Row] = []
    for name in names:
        if name == "always-on":
            wanted = max(1, math.ceil(peak_concurrency(trace) / per))
            peak = min(cfg.policy.max_instances, wanted)
            out.append(Row(name, f"always-on {peak} (peak)", cfg, price, size=peak, wanted=wanted))
            if peak != 1 and cfg.policy.max_instances >= 1:  # none at all with a cap of 0
                out.append(Row(name, "always-on 1", cfg, price, size=1, wanted=1))
        elif name in ("naive", "keda", "hindsight"):
            out.append(Row(name, name, cfg, price))
        elif name != "vultrscale":
            raise UsageError(f"unknown policy {name!r}", hint=f"Choose from {', '.join(POLICIES)}.")
    return out


def _policies(
    names: Sequence[str], cfg: Config, trace: Trace, price: PlanPrice, setup: Setup = Setup()
) -> list[engine.Policy]:
    rows = baseline_rows(names, cfg, trace, price)
    if "vultrscale" in names:
        rows.append(Row("vultrscale", "vultrscale", cfg, price, current=True))
    return [make_policy(r, trace, setup) for r in rows]


def play(
    pol: engine.Policy,
    trace: Trace,
    cfg: Config,
    setup: Setup,
    *,
    progress: Callable[[float], None] | None = None,
    end: float | None = None,
) -> tuple[World, engine.RunStats]:
    """Play ``trace`` under ``pol`` to ``end`` (the trace's end plus its grace) in the world
    ``cfg``'s [simulate] table describes; the world and the run's statistics, for measuring
    (and for tests that look inside)."""
    until = replay_end(cfg, setup, trace) if end is None else end
    sim = cfg.simulate
    world = World(
        trace,
        jobs_per_instance=worker_slots(cfg),
        drain_seconds=cfg.worker.drain_seconds,
        lease_seconds=cfg.worker.lease_seconds,
        boot_time=boot_range(cfg, setup),
        seed=setup.seed,
        duration_scale=sim.duration_scale,
        faults=Faults.draw(
            until=until,
            seed=setup.seed,
            stockout_every=sim.stockout_every.total_seconds(),
            stockout_for=sim.stockout_for.total_seconds(),
            throttle_every=sim.throttle_every.total_seconds(),
            throttle_for=sim.throttle_for.total_seconds(),
            dead_boot_share=sim.dead_boot_share,
            stockout_offering=stockout_offering(cfg),
        ),
    )
    stats = engine.run(
        world,
        pol,
        interval=setup.interval,
        until=until,
        sample_every=setup.interval if setup.plot else 0.0,
        progress=progress,
    )
    return world, stats


def stockout_offering(cfg: Config) -> tuple[str, str]:
    """The (region, plan) the world's stock-outs hit: ``simulate.stockout_offering``, else
    the fleet's first offering (fleet.region and fleet.plan without [[fleet.offerings]])."""
    region, _, plan = cfg.simulate.stockout_offering.partition("/")
    first = offerings.of(cfg)[0]
    return (region, plan) if region and plan else (first.region, first.plan)


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
    result = measure(
        name or pol.name,
        world,
        stats,
        price=price,
        end=end,
        jobs_per_instance=worker_slots(cfg),
        curve_points=PLOT_POINTS if setup.plot else 0,
    )
    return replace(result, bound_by=tuple(sorted(pol.bound)))


def run_row(
    row: Row,
    trace: Trace,
    setup: Setup,
    end: float,
    progress: Callable[[float], None] | None = None,
) -> PolicyResult:
    started = time.perf_counter()
    pol = make_policy(row, trace, setup)
    result = run_one(
        pol, trace, row.cfg, setup, row.price, name=row.name, progress=progress, end=end
    )
    return replace(
        result,
        knobs=row.knobs,
        current=row.current,
        baseline=row.kind != "vultrscale",
        replay_seconds=time.perf_counter() - started,
    )


# The trace a worker process replays, set once per process (not pickled per row).
_TRACE: Trace | None = None


def _init_worker(trace: Trace) -> None:
    global _TRACE
    _TRACE = trace


def _run_in_worker(row: Row, setup: Setup, end: float) -> PolicyResult:
    assert _TRACE is not None
    return run_row(row, _TRACE, setup, end)


def run_rows(
    rows: Sequence[Row],
    trace: Trace,
    setup: Setup,
    end: float,
    progress: Callable[[str, float], None] | None = None,
) -> list[PolicyResult]:
    """Every row over the same trace and window; ``setup.workers`` processes side by side (the
    replays share nothing: each builds its own world)."""
    workers = max(1, min(setup.workers, len(rows)))
    if workers == 1:
        out = []
        for row in rows:
            cb = (lambda f, n=row.name: progress(n, f)) if progress else None
            out.append(run_row(row, trace, setup, end, cb))
        return out
    # fork where there is one: the children start at once and share the loaded modules.
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
    with ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_init_worker, initargs=(trace,)
    ) as pool:
        futures = [pool.submit(_run_in_worker, row, setup, end) for row in rows]
        if progress is not None:
            for done, _ in enumerate(as_completed(futures), start=1):
                progress(f"{len(rows)} replays", done / len(rows))
        return [f.result() for f in futures]


def compare(
    trace: Trace,
    cfg: Config,
    setup: Setup,
    names: Sequence[str] = POLICIES,
    *,
    price: PlanPrice,
    variants: Sequence[Variant] | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> Comparison:
    """The named baselines on the fleet's config and vultrscale once per variant (by default
    the fleet's own config, the current setting), all over one window: the longest grace any
    row needs (each row's own would bill the same behaviour over a longer window)."""
    if variants is None:
        variants = [Variant("vultrscale", cfg, price, current=True)]
    rows = baseline_rows(names, cfg, trace, price)
    if "vultrscale" in names:
        rows += [Row("vultrscale", v.name, v.cfg, v.price, v.knobs, v.current) for v in variants]
    grace = max(grace_seconds(r.cfg, setup, trace) for r in rows) if rows else 0.0
    results = run_rows(rows, trace, setup, trace.span + grace, progress)
    notes = []
    world_keys = sorted({k for v in variants for k, _ in v.knobs if k.startswith("simulate.")})
    if world_keys and "hindsight" in names:
        notes.append(
            f"the sweep varies the world ({', '.join(world_keys)}): the baselines and hindsight "
            "replay the fleet's own [simulate] settings"
        )
    return _comparison(trace, results, cfg, setup, price, grace, tuple(notes))


def cost_key(r: PolicyResult) -> float:
    """A row's cost as rows are compared: to a millionth of a dollar. A bill is a sum of
    per-instance bills, and two rows billed the same hours can differ in the last bits of
    their sums (2.2647999999999953 against 2.264799999999997): a tie, not a cheaper row."""
    return round(r.cost_usd, 6)


def frontier(results: Sequence[PolicyResult]) -> set[int]:
    """Indexes of the rows no other row beats on both cost and p95 wait (no worse on either,
    better on one). A row that lost jobs is neither on it nor counted against others: its
    waits are floors and its cost buys less work."""
    ok = [i for i, r in enumerate(results) if r.lost == 0]
    out = set()
    for i in ok:
        a = results[i]
        if not any(
            cost_key(results[j]) <= cost_key(a)
            and results[j].wait_p95 <= a.wait_p95
            and (cost_key(results[j]) < cost_key(a) or results[j].wait_p95 < a.wait_p95)
            for j in ok
        ):
            out.add(i)
    return out


def _comparison(
    trace: Trace,
    results: Sequence[PolicyResult],
    cfg: Config,
    setup: Setup,
    price: PlanPrice,
    grace: float | None = None,
    notes: tuple[str, ...] = (),
) -> Comparison:
    ranked = sorted(results, key=lambda r: (r.lost > 0, cost_key(r), r.wait_p95))
    on = frontier(ranked)
    hind = next((r.cost_usd for r in ranked if r.policy == "hindsight"), None)
    ranked = [
        replace(
            r,
            on_frontier=i in on,
            cost_vs_hindsight=(r.cost_usd / hind) if hind else None,
        )
        for i, r in enumerate(ranked)
    ]
    # One lower bound for the table only when every row shares it (a sweep over
    # queue.jobs_per_instance gives each row its own).
    bounds = {r.lower_bound_hours for r in ranked} or {
        lower_bound_hours(trace.total_job_seconds, cfg.queue.jobs_per_instance)
    }
    first = next((r for r in ranked if not r.baseline), None)
    shown = price if first is None else PlanPrice(first.plan, first.monthly_usd, first.hourly_usd)
    return Comparison(
        trace,
        tuple(ranked),
        bounds.pop() if len(bounds) == 1 else None,
        grace_seconds(cfg, setup, trace) if grace is None else grace,
        shown,
        notes,
    )


# --- sweeps ----------------------------------------------------------------------------------


def known_keys() -> list[str]:
    """Every dotted config key a sweep may vary (the secrets come from the environment only)."""
    return config_mod.setting_keys()


def check_key(key: str, where: str) -> None:
    """UsageError (exit 2) for a key no config has, with the nearest one: the config reads an
    unknown VULTRSCALE_<SECTION>_<KEY> as no setting at all, so every row would be the same."""
    keys = known_keys()
    if key in keys:
        return
    near = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if not near:  # a key right but its section wrong, or the reverse
        tail = key.rpartition(".")[2]
        near = [k for k in keys if k.endswith("." + tail)][:1]
    hint = f"Did you mean {near[0]}?" if near else "Sweep a key `vultrscale config check` lists."
    raise UsageError(f"{where}: {key!r} is not a config key", hint=hint)


def split_values(text: str) -> list[str]:
    """Values split at the commas outside brackets, braces and quotes: a floor (a TOML list of
    tables) is one value: ``[],[{cron="* 8-17 * * mon-fri", min_instances=2}]``."""
    out: list[str] = []
    cur: list[str] = []
    depth, quote = 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return [v for v in out if v]


def parse_sweeps(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``KEY=V1,V2`` items -> [(key, [values])]; keys are dotted config keys, checked."""
    out: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        section, dot, name = key.partition(".")
        vals = split_values(values)
        if not sep or not dot or not name or not vals:
            raise UsageError(
                f"--sweep {item!r} is not KEY=V1,V2,...",
                hint="Example: --sweep policy.idle_before_scale_down=0s,5m,15m",
            )
        check_key(key, "--sweep")
        if any(k == key for k, _ in out):
            raise UsageError(
                f"--sweep {key} is given twice", hint="Give all its values in one --sweep."
            )
        out.append((key, vals))
    return out


def load_variants(path: str | Path) -> list[tuple[str, dict[str, object]]]:
    """A variants file: one TOML table per named variant, holding the config keys it changes
    (``[business-floor]`` with ``policy.floor = [{cron = "* 8-17 * * mon-fri",
    min_instances = 2}]``); an empty table is the config as it is."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read the variants file {p}: {exc.strerror}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(
            f"{p} is not a TOML file of variants: {exc}",
            hint='One table per variant: [idle-15m] then policy.idle_before_scale_down = "15m".',
        ) from None
    out: list[tuple[str, dict[str, object]]] = []
    for name, table in data.items():
        if not isinstance(table, dict):
            raise UsageError(
                f"{p}: {name!r} is not a table of config keys",
                hint=f"Write [{name}] and under it keys like policy.max_instances = 3.",
            )
        keys: dict[str, object] = {}
        for section, inner in table.items():
            if not isinstance(inner, dict):
                check_key(section, f"{p} [{name}]")  # a bare key: never a config key
            assert isinstance(inner, dict)
            _variant_keys(section, inner, keys, f"{p} [{name}]")
        out.append((name, keys))
    if not out:
        raise UsageError(f"{p}: no variant in it", hint="One table per variant: [idle-15m] ...")
    return out


def _variant_keys(
    prefix: str, table: dict[str, object], keys: dict[str, object], where: str
) -> None:
    """Add ``table``'s config keys under ``prefix`` to ``keys``; a table under a key that is no
    setting of its own is a section within (``policy.forecast.mode = "scale"``)."""
    known = set(known_keys())
    for key, value in table.items():
        full = f"{prefix}.{key}"
        if isinstance(value, dict) and full not in known:
            _variant_keys(full, value, keys, where)
            continue
        check_key(full, where)
        keys[full] = value


def value_text(value: object) -> str:
    """A config value as a person writes it: 15m, true, or a TOML inline list of tables."""
    return value if isinstance(value, str) else config_mod.toml_value(value)


def _same(a: Config, b: Config) -> bool:
    """The same fleet setting, wherever each was read from."""
    return replace(a, source="", secrets=Secrets()) == replace(b, source="", secrets=Secrets())


def sweep_configs(
    sweeps: Sequence[tuple[str, Sequence[str]]],
    config_path: str | None,
    env: Mapping[str, str] | None = None,
    *,
    monthly: float | None = None,
    named: Sequence[tuple[str, Mapping[str, object]]] = (),
    current: Config | None = None,
    variants_file: str | Path | None = None,
) -> list[Variant]:
    """One config per combination of the swept values (times each named variant), each loaded
    and validated as the fleet's own would be (the swept values are read like
    VULTRSCALE_<SECTION>_<KEY> settings, the named variants' like the file's), and priced at its
    own plan (or at ``monthly``): every variant refused before any replay. A variant that is
    the ``current`` config is marked so. ``variants_file``: where ``named`` was read, for
    the messages."""
    base_env = dict(os.environ if env is None else env)
    keys = [k for k, _ in sweeps]
    for name, flags in named:
        both = sorted(set(flags) & set(keys))
        if both:
            raise UsageError(
                f"variant {name!r} sets {', '.join(both)}, which --sweep varies too",
                hint="Vary each key in one place: the variants file or --sweep.",
            )
    factors = [(f"--sweep {k}", len(v)) for k, v in sweeps]
    if named:
        factors.append((str(variants_file or "the variants file"), len(named)))
    count = math.prod(n for _, n in factors)
    if count > MAX_VARIANTS:
        raise _too_many(factors, count, named_last=bool(named))
    out = []
    for variant, flags in list(named) or [("", {})]:
        for combo in itertools.product(*(v for _, v in sweeps)):
            overrides = {
                "VULTRSCALE_" + k.replace(".", "_", 1).upper(): v
                for k, v in zip(keys, combo, strict=True)
            }
            knobs = tuple((k, value_text(v)) for k, v in flags.items()) + tuple(
                zip(keys, combo, strict=True)
            )
            label = " ".join(
                [variant] * bool(variant) + [f"{k}={v}" for k, v in zip(keys, combo, strict=True)]
            )
            try:
                cfg = config_mod.load(config_path, {**base_env, **overrides}, flags=flags)
                price = plan_price(cfg, monthly)
            except UsageError as exc:
                raise UsageError(f"--sweep {label}: {exc}", hint=exc.hint) from None
            is_current = current is not None and _same(cfg, current)
            out.append(Variant(label or "current", cfg, price, knobs, is_current))
    return out


def _too_many(factors: Sequence[tuple[str, int]], count: int, *, named_last: bool) -> UsageError:
    """The refusal of a grid past MAX_VARIANTS: what makes it (each --sweep, the variants
    file), and how far its largest factor must shrink, alone, to fit."""
    last = len(factors) - 1
    parts = [
        f"{what} ({n} {'variants' if named_last and i == last else 'values'})"
        for i, (what, n) in enumerate(factors)
    ]
    message = (
        f"{' x '.join(parts)} make {count:,} variants, more than the {MAX_VARIANTS} a replay "
        "compares (each is a whole replay of the trace)"
    )
    i, (what, n) = max(enumerate(factors), key=lambda f: f[1][1])
    room = MAX_VARIANTS // (count // n)  # what the largest may keep, the others as they are
    if room < 1:
        hint = "Sweep fewer keys at once"
    elif named_last and i == last:
        hint = f"Keep at most {room} variants in {what}"
    else:
        hint = f"Give {what} at most {room} values"
    return UsageError(message, hint=f"{hint}: start coarse, then narrow around the best row.")


def with_current(variants: Sequence[Variant], cfg: Config, price: PlanPrice) -> list[Variant]:
    """The variants, and the fleet's own setting first if none of them is it."""
    if any(v.current for v in variants):
        return list(variants)
    return [Variant("current", cfg, price, current=True), *variants]
