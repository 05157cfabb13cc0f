"""`vultrscale simulate` from parsed options to output; the CLI parses and calls ``execute``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from vultrscale import config as config_mod
from vultrscale.config import Config
from vultrscale.core import boottime
from vultrscale.errors import EXIT_OK, UsageError
from vultrscale.replay import compare, render, workload
from vultrscale.replay.compare import Comparison, Setup


@dataclass(frozen=True)
class Options:
    workload: str = "bursty-day"  # a shape name or a CSV path
    from_db: bool = False
    since: str = "7d"
    days: int = 7
    jobs_per_day: int | None = None
    policies: Sequence[str] = compare.POLICIES
    seed: int = 0
    boot_time: str | None = None  # None: the config's simulate.boot_time
    interval: str = "30s"
    sweeps: Sequence[str] = field(default_factory=tuple)
    variants: Path | None = None  # a TOML file of named variants
    monthly_usd: float | None = None
    plot: Path | None = None
    as_json: bool = False
    wide: bool = False
    workers: int = 0  # processes; 0: one per core, at most 2 (the machines this runs on)


def load_trace(opts: Options, cfg: Config) -> workload.Trace:
    if opts.from_db:
        from vultrscale.db import history

        history.of_preset(cfg.queue.preset)  # a library that keeps no finished jobs: refused
        database_url = cfg.secrets.database_url.reveal()
        if not database_url:
            raise UsageError(
                "--from-db needs DATABASE_URL",
                hint="Set DATABASE_URL to the queue's database (in the environment or .env).",
            )
        try:
            since = config_mod.parse_duration(opts.since, "--since")
        except ValueError as exc:
            raise UsageError(str(exc), hint="Write --since 7d, 36h or 90m.") from None
        rows = history.finished_jobs(database_url, since, cfg.queue.queue, cfg.queue.preset)
        return workload.from_history(rows, since=since)
    if opts.workload in workload.SHAPES:
        from vultrscale.params import MAX_REPLAY_JOBS

        if opts.jobs_per_day and opts.days * opts.jobs_per_day > MAX_REPLAY_JOBS:
            raise UsageError(
                f"{opts.days} days of {opts.jobs_per_day} jobs is more than a replay holds "
                f"({MAX_REPLAY_JOBS:,} jobs)",
                hint="Replay fewer days, or a lower --jobs-per-day: the policies compare the same.",
            )
        return workload.shape(
            opts.workload, days=opts.days, seed=opts.seed, jobs_per_day=opts.jobs_per_day
        )
    if Path(opts.workload).suffix.lower() == ".csv" or Path(opts.workload).exists():
        return workload.load_csv(opts.workload)
    return workload.shape(opts.workload, days=opts.days, seed=opts.seed)  # names the choices


def _setup(opts: Options) -> Setup:
    try:
        interval = config_mod.parse_duration(opts.interval, "--interval").total_seconds()
    except ValueError as exc:
        raise UsageError(str(exc), hint="Write --interval 30s.") from None
    if interval < 1:
        raise UsageError(f"--interval must be at least 1s, got {opts.interval}")
    return Setup(
        interval=interval,
        boot_time=None if opts.boot_time is None else compare.parse_boot_time(opts.boot_time),
        seed=opts.seed,
        plot=opts.plot is not None,
        workers=opts.workers or min(2, os.cpu_count() or 1),
    )


def execute(
    opts: Options,
    cfg: Config,
    *,
    config_path: str | None,
    env: Mapping[str, str],
    out: Console,
    err: Console,
    print_json: Callable[[Any], None],
) -> int:
    """Run the replay the options describe and print it. Bad input raises UsageError (exit 2)
    before any simulation runs."""
    plot = render.plot_path(opts.plot) if opts.plot is not None else None
    if not opts.policies:
        raise UsageError(
            "--policies names no policy",
            hint=f"Name one or more of {', '.join(compare.POLICIES)} (comma-separated).",
        )
    unknown = [p for p in opts.policies if p not in compare.POLICIES]
    if unknown:
        raise UsageError(
            f"unknown polic{'y' if len(unknown) == 1 else 'ies'}: {', '.join(unknown)}",
            hint=f"Choose from {', '.join(compare.POLICIES)} (comma-separated).",
        )
    setup = _setup(opts)
    price = compare.plan_price(cfg, opts.monthly_usd)
    variants = None
    if opts.sweeps or opts.variants is not None:
        if "vultrscale" not in opts.policies:
            raise UsageError(
                "--sweep and --variants vary vultrscale's config, but --policies leaves it out",
                hint="Add vultrscale to --policies (the baselines replay your config as it is).",
            )
        sweeps = compare.parse_sweeps(opts.sweeps)
        named = compare.load_variants(opts.variants) if opts.variants is not None else []
        if setup.boot_time is not None and (
            any(k == "simulate.boot_time" for k, _ in sweeps)
            or any("simulate.boot_time" in flags for _, flags in named)
        ):
            raise UsageError(
                "--boot-time fixes the boot time that the sweep varies (simulate.boot_time)",
                hint="Drop --boot-time, or stop sweeping simulate.boot_time.",
            )
        variants = compare.with_current(
            compare.sweep_configs(
                sweeps,
                config_path,
                env,
                monthly=opts.monthly_usd,
                named=named,
                current=cfg,
                variants_file=opts.variants,
            ),
            cfg,
            price,
        )
    trace = load_trace(opts, cfg)
    notes: list[str] = []
    if opts.from_db and setup.boot_time is None:
        setup, learned = _learn_boot(cfg, opts, setup)
        notes += learned

    progress, done = _progress(err)
    try:
        result: Comparison = compare.compare(
            trace, cfg, setup, opts.policies, price=price, variants=variants, progress=progress
        )
    finally:
        done()
    result = replace(result, notes=(*notes, *result.notes))
    if variants is not None:
        title = f"{len(variants)} setting(s) and the baselines, cheapest first"
    else:
        title = "policies on the same trace, cheapest first"
    if plot is not None:
        render.plot(result, plot)
    if opts.as_json:
        doc = result.to_json()
        if plot is not None:
            doc["plot"] = str(plot)
        print_json(doc)
    else:
        if opts.wide and not out.is_terminal:
            out.width = max(out.width, render.table_width(result))  # a pipe: never squeeze it
        elif not out.is_terminal:
            out.width = render.NARROW
        out.print(render.table(result, title=title, wide=opts.wide))
        # The notes wrap to the terminal, or to NARROW on a pipe (a --wide table's width
        # is for its columns, not for prose).
        notes_width = out.width if out.is_terminal else render.NARROW
        for line in render.footer(result):
            out.print(line, highlight=False, width=notes_width)
        if plot is not None:
            out.print(f"plot written to {plot}", highlight=False)
    return EXIT_OK


def _learn_boot(cfg: Config, opts: Options, setup: Setup) -> tuple[Setup, list[str]]:
    """With --from-db and no --boot-time: the boot time the fleet's own ledger shows (create
    to the worker's first registration), if it has any; else simulate.boot_time."""
    from vultrscale.db import history

    since = config_mod.parse_duration(opts.since, "--since")
    rows = history.boot_rows(cfg.secrets.database_url.reveal(), cfg.fleet.name, since)
    boots = boottime.boot_seconds(rows, None)  # the rows are those within --since
    if not boots:
        return setup, [
            f"boot time: the ledger has no instance of fleet {cfg.fleet.name!r} whose worker "
            f"came up within {opts.since}; simulate.boot_time ({cfg.simulate.boot_time}) used"
        ]
    lo, hi = boottime.replay_range(boots)
    median = sorted(boots)[(len(boots) - 1) // 2]
    return replace(setup, boot_time=(lo, hi)), [
        f"boot time learned from the ledger: {len(boots)} instance(s) of fleet "
        f"{cfg.fleet.name!r}, create to the pass that first saw its worker, median "
        f"{median:.0f}s; replayed as {lo:.0f}s..{hi:.0f}s (their 10th to 90th percentile; "
        "--boot-time overrides)"
    ]


def _progress(err: Console) -> tuple[Callable[[str, float], None] | None, Callable[[], None]]:
    """A progress bar on stderr when it is a terminal; nothing otherwise."""
    if not (err.is_terminal and sys.stderr.isatty()):
        return None, lambda: None
    from rich.progress import Progress

    bar = Progress(console=err, transient=True)
    bar.start()
    tasks: dict[str, Any] = {}

    def update(name: str, fraction: float) -> None:
        if name not in tasks:
            tasks[name] = bar.add_task(name, total=1.0)
        bar.update(tasks[name], completed=fraction)

    return update, bar.stop
