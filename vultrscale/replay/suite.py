"""The workload suite: the policy's defaults are judged on every shape of work, never on one.

A cell is a workload (a built-in shape at a volume), a seed and a boot time. In each cell the
same trace is replayed under the candidate setting (the defaults, unless told otherwise) and
under four baselines on the same fleet:

- ``depth``: the depth rule alone (``policy.target_wait = "0s"``, no forecast), the policy
  before the wait rule; the candidate is held to it: never dearer, its p95 wait close;
- ``keda``: KEDA-style scaling on queue length (``baselines.Keda``);
- ``hindsight``: what a perfect forecast of the trace runs (``baselines.Hindsight``);
- ``always-on 1``: one instance that never stops.

``scripts/bench_policy.py`` runs it and prints each cell and the summary (``summarize``);
docs/policy.md carries its table. The fleet every cell replays is ``BASE``: the defaults with
a cap and a budget that the larger workloads reach only at their peaks.
"""

from __future__ import annotations

import bisect
import math
import multiprocessing
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache
from pathlib import Path

from vultrscale import config as config_mod
from vultrscale.config import Config
from vultrscale.replay import compare, report, workload
from vultrscale.rules import waits

DAYS = 14
SEEDS = (0, 1, 2)
BOOTS = (60.0, 240.0, 720.0)  # create to worker up, seconds: a fast image, a slow one, Vultr's
# The fleet of every cell, as `vultrscale.toml` would say it: the rest is the defaults.
BASE = """
[policy]
max_instances = 10

[budget]
monthly_ceiling_usd = 150.0
"""
# The depth rule alone: the candidate's config with these settings.
DEPTH = {"policy.target_wait": "0s", "policy.forecast.mode": "off"}
BASELINES = ("depth", "keda", "hindsight", "always-on 1")
# Two results within this much are the same cost, and within this many seconds the same wait:
# a replay's bill moves by a started hour, its p95 by a pass.
SAME_COST = 0.01
SAME_WAIT = 1.0
# The candidate's p95 wait is close to the depth rule's when within this factor of it, or
# this many seconds above it (issue 32's bound).
WAIT_FACTOR = 1.25
WAIT_SLACK = 60.0


@dataclass(frozen=True)
class Workload:
    """A built-in shape at a volume (None: the shape's default jobs per day)."""

    name: str
    shape: str
    jobs_per_day: int | None = None


WORKLOADS = (
    *(Workload(s, s) for s in workload.SHAPES),
    Workload("bursty-heavy", "bursty-day", 1_000),  # weeks of 5-6k jobs
)


@dataclass(frozen=True)
class Cell:
    workload: Workload
    seed: int
    boot: float  # seconds

    @property
    def name(self) -> str:
        return f"{self.workload.name}/{self.seed}/{_t(self.boot)}"


def cells(
    workloads: Sequence[Workload] = WORKLOADS,
    seeds: Sequence[int] = SEEDS,
    boots: Sequence[float] = BOOTS,
) -> list[Cell]:
    return [Cell(w, s, b) for b in boots for w in workloads for s in seeds]


@dataclass(frozen=True)
class Outcome:
    """One row of one cell."""

    cost: float
    p50: float
    p95: float
    lost: int
    # The share of jobs that waited longer than the candidate's target_wait plus the boot
    # time (what target_wait promises, docs/policy.md, "The wait rule"); None: a baseline.
    over_target: float | None = None
    # The limits that held back a scale-up the row wanted (cap, budget, cool, step).
    bound: tuple[str, ...] = ()


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    rows: Mapping[str, Outcome]  # by row name: the candidates' and BASELINES


# A candidate's settings that are no config keys: the wait rule's constants
# (``waits.AUTO_SHARE = 0.5``, ``waits.AUTO_MAX = 60`` in seconds), to choose them on the suite.
CONSTANTS = "waits."


def load_config(settings: Mapping[str, object] = {}) -> Config:
    """``BASE`` with ``settings`` (dotted keys), loaded and checked as a fleet's file is."""
    keys = {k: v for k, v in settings.items() if not k.startswith(CONSTANTS)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vultrscale.toml"
        path.write_text(BASE, encoding="utf-8")
        return config_mod.load(path, {}, flags=keys)


@cache
def _trace(w: Workload, seed: int, days: int) -> workload.Trace:
    return workload.shape(w.shape, days=days, seed=seed, jobs_per_day=w.jobs_per_day)


# The configs a worker process replays, set once per process (not pickled per task).
_CONFIGS: dict[str, Config] = {}
_CONSTANTS: dict[str, dict[str, object]] = {}
_DEFAULTS = {name: getattr(waits, name) for name in ("AUTO_SHARE", "AUTO_MAX")}


def _init(configs: dict[str, Config], constants: dict[str, dict[str, object]]) -> None:
    _CONFIGS.clear()
    _CONFIGS.update(configs)
    _CONSTANTS.clear()
    _CONSTANTS.update(constants)


def _constants(settings: Mapping[str, object]) -> dict[str, object]:
    """The wait rule's constants a candidate sets (``CONSTANTS``)."""
    out: dict[str, object] = {}
    for key, value in settings.items():
        if not key.startswith(CONSTANTS):
            continue
        name = key[len(CONSTANTS) :]
        if name not in _DEFAULTS:
            raise ValueError(f"{key}: not one of the wait rule's constants {sorted(_DEFAULTS)}")
        number = float(str(value))
        out[name] = timedelta(seconds=number) if name == "AUTO_MAX" else number
    return out


def _replay(cell: Cell, row: str, days: int) -> tuple[Cell, str, Outcome]:
    """One row of one cell: the baselines on the depth rule's config (the fleet as it is), a
    candidate with the wait rule's constants it sets (put back after)."""
    cfg = _CONFIGS[row] if row in _CONFIGS else _CONFIGS["depth"]
    try:
        for name, value in _CONSTANTS.get(row, {}).items():
            setattr(waits, name, value)
        return _measure(cell, row, cfg, days)
    finally:
        for name, value in _DEFAULTS.items():
            setattr(waits, name, value)


def _measure(cell: Cell, row: str, cfg: Config, days: int) -> tuple[Cell, str, Outcome]:
    trace = _trace(cell.workload, cell.seed, days)
    setup = compare.Setup(boot_time=(cell.boot, cell.boot), seed=cell.seed)
    price = compare.plan_price(cfg)
    kind = {"keda": "keda", "hindsight": "hindsight", "always-on 1": "always-on"}
    pol = compare.make_policy(
        compare.Row(kind.get(row, "vultrscale"), row, cfg, price, size=1, wanted=1), trace, setup
    )
    end = compare.replay_end(cfg, setup, trace)
    world, stats = compare.play(pol, trace, cfg, setup, end=end)
    r = report.measure(
        row, world, stats, price=price, end=end, jobs_per_instance=compare.worker_slots(cfg)
    )
    over = None
    if row not in BASELINES:
        boot = timedelta(seconds=cell.boot)
        limit = (waits.target(cfg.policy.target_wait, boot) + boot).total_seconds()
        each, _ = report.job_waits(world, end)
        over = (len(each) - bisect.bisect_right(each, limit)) / len(each) if each else 0.0
    bound = tuple(sorted(pol.bound))
    return cell, row, Outcome(r.cost_usd, r.wait_p50, r.wait_p95, r.lost, over, bound)


def run(
    candidates: Mapping[str, Mapping[str, object]],
    grid: Sequence[Cell],
    *,
    days: int = DAYS,
    workers: int = 2,
    progress: Callable[[int, int], None] | None = None,
) -> list[CellResult]:
    """Every cell of ``grid`` under each candidate (name -> settings) and the baselines; the
    depth rule's row is the first candidate's config with ``DEPTH``."""
    if clash := sorted(set(candidates) & {*BASELINES}):
        raise ValueError(f"a candidate is named as a baseline: {', '.join(clash)}")
    # The baselines replay one fleet: the candidates may differ in their policy only.
    fleet = {frozenset(_fleet_keys(s).items()) for s in candidates.values()}
    if len(fleet) > 1:
        raise ValueError(
            "the candidates set other keys than policy.* differently: judge them in runs of "
            "their own (the baselines replay one fleet)"
        )
    first = next(iter(candidates.values()), {})
    configs = {name: load_config(s) for name, s in candidates.items()}
    configs["depth"] = load_config({**first, **DEPTH})
    constants = {name: _constants(s) for name, s in candidates.items()}
    rows = [*candidates, *BASELINES]
    tasks = [(c, r) for c in grid for r in rows]
    found: dict[Cell, dict[str, Outcome]] = {c: {} for c in grid}
    if workers <= 1:  # in this process (the tests)
        _init(configs, constants)
        for done, (c, r) in enumerate(tasks, start=1):
            found[c][r] = _replay(c, r, days)[2]
            if progress is not None:
                progress(done, len(tasks))
        return [CellResult(c, {r: found[c][r] for r in rows}) for c in grid]
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
    with ProcessPoolExecutor(
        max(1, workers), mp_context=ctx, initializer=_init, initargs=(configs, constants)
    ) as pool:
        futures = [pool.submit(_replay, c, r, days) for c, r in tasks]
        for done, fut in enumerate(as_completed(futures), start=1):
            cell, row, outcome = fut.result()
            found[cell][row] = outcome
            if progress is not None:
                progress(done, len(tasks))
    return [CellResult(c, {r: found[c][r] for r in rows}) for c in grid]


# --- the summary -------------------------------------------------------------------------------


def _fleet_keys(settings: Mapping[str, object]) -> dict[str, str]:
    """A candidate's settings that are not its policy (nor the wait rule's constants)."""
    return {
        k: repr(v) for k, v in settings.items() if not k.startswith(("policy.", CONSTANTS))
    }


def dominated(a: Outcome, by: Outcome) -> bool:
    """``by`` is both cheaper and quicker at p95 than ``a`` (by more than ``SAME_COST`` and
    ``SAME_WAIT``): ``a`` costs more for a longer wait. A tie on one is no domination; the
    bar's other two counts (dearer, p95 not close) catch a worse cost or wait alone."""
    return by.cost < a.cost - SAME_COST and by.p95 < a.p95 - SAME_WAIT


def wait_close(a: Outcome, depth: Outcome) -> bool:
    """``a``'s p95 within ``WAIT_FACTOR`` of the depth rule's, or ``WAIT_SLACK`` above it."""
    return a.p95 <= max(depth.p95 * WAIT_FACTOR, depth.p95 + WAIT_SLACK) + SAME_WAIT


def p95_vs(a: Outcome, depth: Outcome) -> float:
    """``a``'s p95 wait over the depth rule's, a wait under ``WAIT_SLACK`` counted as that
    much (3 s against 1 s is no wait to speak of, not three times as long)."""
    return max(a.p95, WAIT_SLACK) / max(depth.p95, WAIT_SLACK)


@dataclass(frozen=True)
class Summary:
    """One candidate over the suite."""

    name: str
    cells: int
    dominated_by_depth: tuple[str, ...]
    dominated_by_keda: tuple[str, ...]
    dearer_than_depth: tuple[str, ...]
    wait_not_close: tuple[str, ...]  # p95 beyond the bound of the depth rule's
    median_cost_vs_depth: float
    worst_p95_vs_depth: float
    worst_p95_cell: str
    median_cost_vs_hindsight: float
    lost: int
    # The share of jobs past target_wait + boot: the median over the cells, and the largest in
    # a cell where neither the cap nor the budget held the fleet back (``Outcome.bound``).
    median_over_target: float
    worst_over_target: float
    worst_over_cell: str
    by_boot: Mapping[str, float] = field(default_factory=dict)  # median cost vs depth per boot

    @property
    def holds(self) -> bool:
        """Issue 32's bar: never dominated, never dearer, p95 close, nothing lost."""
        return not (
            self.dominated_by_depth
            or self.dominated_by_keda
            or self.dearer_than_depth
            or self.wait_not_close
            or self.lost
        )


def _ratio(a: float, b: float) -> float:
    if b <= 0:
        return 1.0 if a <= 0 else math.inf
    return a / b


def summarize(results: Sequence[CellResult], name: str) -> Summary:
    """How candidate ``name`` fares against the baselines, cell by cell."""
    dom_depth, dom_keda, dearer, far = [], [], [], []
    cost_ratios, hind_ratios = [], []
    by_boot: dict[str, list[float]] = {}
    worst, worst_cell, lost = 0.0, "", 0
    overs: list[float] = []
    over, over_cell = 0.0, ""
    for res in results:
        a, depth, keda = res.rows[name], res.rows["depth"], res.rows["keda"]
        cell = res.cell.name
        if dominated(a, depth):
            dom_depth.append(cell)
        if dominated(a, keda):
            dom_keda.append(cell)
        if a.cost > depth.cost + SAME_COST:
            dearer.append(cell)
        if not wait_close(a, depth):
            far.append(cell)
        ratio = _ratio(a.cost, depth.cost)
        cost_ratios.append(ratio)
        by_boot.setdefault(_t(res.cell.boot), []).append(ratio)
        hind_ratios.append(_ratio(a.cost, res.rows["hindsight"].cost))
        p95 = p95_vs(a, depth)
        if p95 > worst:
            worst, worst_cell = p95, cell
        lost += a.lost
        overs.append(a.over_target or 0.0)
        if (a.over_target or 0.0) > over and not {"cap", "budget"} & set(a.bound):
            over, over_cell = a.over_target or 0.0, cell
    return Summary(
        name=name,
        cells=len(results),
        dominated_by_depth=tuple(dom_depth),
        dominated_by_keda=tuple(dom_keda),
        dearer_than_depth=tuple(dearer),
        wait_not_close=tuple(far),
        median_cost_vs_depth=statistics.median(cost_ratios) if cost_ratios else 1.0,
        worst_p95_vs_depth=worst,
        worst_p95_cell=worst_cell,
        median_cost_vs_hindsight=statistics.median(hind_ratios) if hind_ratios else 1.0,
        lost=lost,
        median_over_target=statistics.median(overs) if overs else 0.0,
        worst_over_target=over,
        worst_over_cell=over_cell,
        by_boot={b: statistics.median(v) for b, v in by_boot.items()},
    )


def _t(seconds: float) -> str:
    return f"{seconds / 60:g}m" if seconds >= 60 else f"{seconds:g}s"
