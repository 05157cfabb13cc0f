"""The simulate command: replay a workload (a built-in shape, a CSV, or the queue's own
history) through the real pass, and compare policies and settings."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from vultrscale import params
from vultrscale.cli._common import JsonFlag, examples, group, print_json, shown
from vultrscale.errors import UsageError
from vultrscale.replay.workload import DEFAULT_JOBS_PER_DAY, PER_WEEKDAY, SHAPES

app = group()


@app.command(
    "simulate",
    epilog=examples(
        "vultrscale simulate",
        "vultrscale simulate --workload steady --days 3 --boot-time 1m..3m --json",
        "vultrscale --config prod.toml simulate --from-db --since 14d --plot week.png",
        "vultrscale simulate --sweep policy.idle_before_scale_down=0s,5m,15m "
        "--sweep policy.billing_hour_aware=true,false",
        'vultrscale simulate --sweep \'policy.floor=[],[{cron="* 8-17 * * mon-fri",'
        "min_instances=2}]' --sweep simulate.boot_time=2m,12m --plot frontier.png",
        "vultrscale simulate --variants variants.toml --wide",
    ),
)
def simulate_cmd(
    workload: Annotated[
        str | None,
        typer.Option(
            "--workload",
            metavar="SHAPE|PATH.csv",
            help=shown(
                f"{', '.join(SHAPES)}, or a CSV of arrival_seconds,duration_seconds.",
                "bursty-day",
            ),
            show_default=False,
        ),
    ] = None,
    from_db: Annotated[
        bool,
        typer.Option("--from-db", help="Replay the queue's own history (DATABASE_URL)."),
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="DURATION",
            help=shown("With --from-db: how far back.", "7d"),
            show_default=False,
        ),
    ] = None,
    days: Annotated[
        int,
        typer.Option(
            "--days",
            parser=params.count(params.MAX_SIMULATE_DAYS),
            metavar="N",
            help="Days of a built-in shape.",
        ),
    ] = 7,
    jobs_per_day: Annotated[
        int | None,
        typer.Option(
            "--jobs-per-day",
            parser=params.count_or_zero(params.MAX_JOBS_PER_DAY),
            metavar="N",
            help="Volume of a built-in shape (default: "
            + ", ".join(f"{name} {n}" for name, n in DEFAULT_JOBS_PER_DAY.items())
            + f"; {' and '.join(PER_WEEKDAY)} per weekday).",
        ),
    ] = None,
    policies: Annotated[
        str,
        typer.Option(
            "--policies",
            metavar="LIST",
            help="Comma-separated: always-on,naive,keda,hindsight,vultrscale.",
        ),
    ] = "always-on,naive,keda,hindsight,vultrscale",
    seed: Annotated[
        int, typer.Option("--seed", metavar="N", help="Seed for the workload and boots.")
    ] = 0,
    boot_time: Annotated[
        str | None,
        typer.Option(
            "--boot-time",
            metavar="DURATION|MIN..MAX",
            help="Create to worker up (default: simulate.boot_time, 10m..15m).",
        ),
    ] = None,
    interval: Annotated[
        str, typer.Option("--interval", metavar="DURATION", help="Time between passes.")
    ] = "30s",
    sweep: Annotated[
        list[str] | None,
        typer.Option(
            "--sweep",
            metavar="KEY=V1,V2",
            help="Run vultrscale once per combination of config values, any key, "
            "simulate.* too (repeatable).",
        ),
    ] = None,
    variants: Annotated[
        str | None,
        typer.Option(
            "--variants",
            metavar="PATH.toml",
            help="Named variants: one TOML table each, holding the config keys it changes.",
        ),
    ] = None,
    wide: Annotated[
        bool, typer.Option("--wide", help="Every column and whole names (wider than 100).")
    ] = False,
    monthly_usd: Annotated[
        float | None,
        typer.Option(
            "--monthly-usd", metavar="USD", help="The plan's monthly price (default: list price)."
        ),
    ] = None,
    plot: Annotated[
        str | None,
        typer.Option(
            "--plot", metavar="PATH.png", help="Draw queue, fleet and cost (needs [plot])."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> int:
    """Replay a workload through the real pass and compare policies (cost, waits, lost work)."""
    from pathlib import Path

    from vultrscale.cli import views
    from vultrscale.cli._common import state
    from vultrscale.replay import command

    # Flags the chosen workload would ignore are refused, not dropped in silence.
    if from_db and workload is not None:
        raise UsageError(
            "--workload and --from-db name two workloads: --from-db replays the queue's own "
            "history",
            hint="Drop --workload to replay the history, or --from-db to replay the shape.",
        )
    if since is not None and not from_db:
        raise UsageError(
            "--since says how far back --from-db reads the queue's history; without --from-db "
            "it has no meaning",
            hint="Add --from-db, or use --days for a built-in shape.",
        )
    opts = command.Options(
        workload=workload or "bursty-day",
        from_db=from_db,
        since=since or "7d",
        days=days,
        jobs_per_day=jobs_per_day,
        policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
        seed=seed,
        boot_time=boot_time,
        interval=interval,
        sweeps=tuple(sweep or ()),
        variants=Path(variants) if variants else None,
        wide=wide,
        monthly_usd=monthly_usd,
        plot=Path(plot) if plot else None,
        as_json=as_json,
    )
    from vultrscale.cli._common import load_fleets

    fleets = load_fleets()
    if not fleets.directory:
        return command.execute(
            opts,
            fleets.one(),
            config_path=state.config_path,
            env=os.environ,
            out=views.console(),
            err=views.console(stderr=True),
            print_json=print_json,
        )
    if not from_db or len(fleets.configs) + len(fleets.bad) == 1:
        cfg = fleets.one()  # one workload replays through one fleet's config
        return command.execute(
            opts,
            cfg,
            config_path=cfg.source,
            env=os.environ,
            out=views.console(),
            err=views.console(stderr=True),
            print_json=print_json,
        )
    return _simulate_fleets(fleets, opts, as_json)


def _simulate_fleets(fleets: Any, opts: Any, as_json: bool) -> int:
    """`simulate --from-db` of a directory: each fleet's own queue history replayed through its
    own config, one after the other; one table each (one JSON document for all). A fleet whose
    replay is refused (a preset that keeps no history) is said and the others replay."""
    from vultrscale.cli import fail, views
    from vultrscale.errors import VultrscaleError
    from vultrscale.replay import command

    out = views.console()
    docs: list[dict[str, Any]] = []
    codes: list[int] = []
    for cfg in fleets.configs:
        name = cfg.fleet.name
        got: list[Any] = []
        if not as_json:
            out.print(
                f"fleet {name} (queue {cfg.queue.queue or '*'} of {cfg.queue.preset}):",
                style="bold",
                markup=False,
                highlight=False,
            )
        try:
            codes.append(
                command.execute(
                    opts,
                    cfg,
                    config_path=cfg.source,
                    env=os.environ,
                    out=out,
                    err=views.console(stderr=True),
                    print_json=got.append,
                )
            )
        except VultrscaleError as exc:
            codes.append(exc.exit_code)
            if as_json:
                docs.append({"fleet": name, "exit_code": exc.exit_code, "error": exc.message})
            else:
                fail(f"fleet {name}: {exc.message}", exc.hint, exc.exit_code)
            continue
        docs += [{"fleet": name, **doc} for doc in got]
    bad = fleets.bad_error()
    if bad is not None:
        codes.append(bad.exit_code)
        if not as_json:
            fail(bad.message, bad.hint, bad.exit_code)
    if as_json:
        invalid = [{"file": str(b.path), "problems": list(b.problems)} for b in fleets.bad]
        print_json({"fleets": docs, "invalid": invalid})
    return max(codes, default=0)
