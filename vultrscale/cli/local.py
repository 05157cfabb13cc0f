"""Local tools: the demo, the Vultr simulator and the config check, all on this machine."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from vultrscale import params
from vultrscale.cli._common import JsonFlag, examples, group, print_json, shown
from vultrscale.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, UsageError

app = group()
config_app = group(
    help="Inspect the configuration.",
    epilog=examples(
        "vultrscale config check",
        "vultrscale --config /etc/vultrscale/vultrscale.toml config check --json",
    ),
)
sim_app = group(
    help="The Vultr simulator: the Vultr API on loopback, to point VULTR_API_URL at.",
    epilog=examples(
        "vultrscale sim serve",
        "vultrscale sim serve --port 0 --seed 7 --no-rate-limit",
    ),
)
app.add_typer(config_app, name="config")
app.add_typer(sim_app, name="sim")


@app.command(
    "demo",
    epilog=examples(
        "vultrscale demo",
        "vultrscale demo --duration 60 --bursts 0:12 --no-live",
        "vultrscale demo --chaos --seed 7",
    ),
)
def demo_cmd(
    duration: Annotated[
        timedelta,
        typer.Option(
            "--duration",
            parser=params.duration(params.MIN_DEMO_DURATION),
            metavar="DURATION",
            show_default=False,
            help=shown("Stop after this long at most (at least 10s).", "2m"),
        ),
    ] = timedelta(minutes=2),
    bursts: Annotated[
        str,
        typer.Option(
            "--bursts",
            metavar="SECONDS:JOBS,...",
            help="Workload: JOBS enqueued SECONDS into the run.",
        ),
    ] = "0:24,40:12",
    job_seconds: Annotated[
        str,
        typer.Option(
            "--job-seconds",
            metavar="LOW:HIGH",
            help="Each job lasts LOW to HIGH seconds (longer than the 5 s drain: given back).",
        ),
    ] = "1:4",
    no_live: Annotated[
        bool,
        typer.Option(
            "--no-live",
            help="Timestamped log lines even on a terminal (elsewhere they are the default).",
            show_default=False,
        ),
    ] = False,
    as_json: JsonFlag = False,
    seed: Annotated[
        int,
        typer.Option("--seed", metavar="N", help="Seed for job lengths, ids and --chaos faults."),
    ] = 0,
    chaos: Annotated[
        bool,
        typer.Option(
            "--chaos",
            help="Inject faults on the seed: workers and passes SIGKILLed, API 429/500 bursts, "
            "a lost create answer, a host whose SSH stops answering, a stock-out.",
            show_default=False,
        ),
    ] = False,
    logs: Annotated[
        str | None,
        typer.Option("--logs", metavar="PATH", help="Keep each instance's worker log here."),
    ] = None,
) -> int:
    """The whole system on this machine: Postgres, the Vultr simulator, instances running real
    workers behind SSH, a bursty workload and the reconcile loop. Exit 0 when no job was lost
    and the fleet came back down."""
    import contextlib
    import signal
    import threading
    from pathlib import Path

    from rich.live import Live

    from vultrscale import demo
    from vultrscale.cli import views

    logs_dir = Path(logs).expanduser().resolve() if logs else None
    if logs_dir is not None and logs_dir.exists() and not logs_dir.is_dir():
        raise UsageError(  # before Postgres and the workers start, not after
            f"--logs {logs}: {logs_dir} exists and is not a directory",
            hint="Name a directory (it is created if missing).",
        )
    url = os.environ.get("DATABASE_URL", "").strip() or None
    if url is not None:  # before anything starts: as every other command checks it
        from vultrscale.redaction import conninfo_problem, is_text

        problem = "DATABASE_URL is not UTF-8 text" if not is_text(url) else conninfo_problem(url)
        if problem:
            raise UsageError(
                problem, hint="Fix DATABASE_URL, or unset it for a throwaway Postgres."
            )
    settings = demo.Settings(
        duration=duration.total_seconds(),
        bursts=demo.parse_bursts(bursts),
        job_seconds=demo.parse_job_seconds(job_seconds),
        seed=seed,
        chaos=chaos,
        logs_dir=logs_dir,
    )
    # with --json, stdout carries only the summary
    out = views.console(stderr=as_json)
    stop = threading.Event()
    # The live view only on a terminal: elsewhere rich would hold every frame back to the end.
    live = None if no_live or not out.is_terminal else Live(console=out, auto_refresh=False)
    view = views.DemoView(live) if live is not None else views.DemoLog(out)

    def _stop(signum: int, frame: object) -> None:
        # The first signal ends the run after the current pass, cleanly; a second one hurries
        # (cleanup still runs, but a half-started Postgres may be left).
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        # Said from a thread: this handler may have interrupted a redraw holding the console.
        threading.Thread(target=view.say, args=(views.STOPPING,), daemon=True).start()

    # also SIGINT: a shell starts a background job with SIGINT ignored
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop)
    with contextlib.ExitStack() as drawing:
        if live is not None:
            drawing.enter_context(views.keys_not_echoed())
            drawing.enter_context(live)
        summary = demo.run(settings, database_url=url, on_tick=view.update, say=view.say, stop=stop)
    if as_json:
        print_json(summary.to_json())
    else:
        views.print_demo_summary(out, summary)
    if summary.ended_by == "interrupted":
        return EXIT_INTERRUPTED
    return 0 if summary.ok else EXIT_RUNTIME


@app.command(
    "init",
    epilog=examples(
        "vultrscale init",
        "vultrscale init --defaults --region fra --plan vc2-2c-4gb",
        "vultrscale --config prod/vultrscale.toml init --force",
        "sudo vultrscale init --systemd /etc/systemd/system",
    ),
)
def init_cmd(
    defaults: Annotated[
        bool,
        typer.Option(
            "--defaults",
            help="Ask nothing (for scripts): the defaults or the options below.",
            show_default=False,
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Overwrite the files when they exist, keeping each as NAME.bak.",
            show_default=False,
        ),
    ] = False,
    region: Annotated[
        str | None,
        typer.Option(
            "--region", metavar="ID", help=shown("Vultr region.", "ewr"), show_default=False
        ),
    ] = None,
    plan: Annotated[
        str | None,
        typer.Option(
            "--plan", metavar="ID", help=shown("Vultr plan.", "vc2-1c-2gb"), show_default=False
        ),
    ] = None,
    snapshot: Annotated[
        str | None,
        typer.Option(
            "--snapshot",
            metavar="ID",
            help=shown(
                "Snapshot new instances boot from.", "the one `vultrscale snapshot` records"
            ),
            show_default=False,
        ),
    ] = None,
    systemd: Annotated[
        Path | None,
        typer.Option(
            "--systemd",
            metavar="DIR",
            help="Instead: write the scaler's systemd units (the loop; a pass on a timer) "
            "into DIR, with this vultrscale in ExecStart.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Write a commented vultrscale.toml and a .env template (mode 0600, placeholders for the
    secrets) for a real fleet, where --config points (default ./vultrscale.toml). On a terminal
    it asks for the region, plan and snapshot, listing Vultr's choices when VULTR_API_KEY is
    set. It never asks for secrets: fill them into the .env."""
    from dataclasses import replace

    from vultrscale import scaffold
    from vultrscale.cli._common import state
    from vultrscale.config import DEFAULT_API_URL, api_url_problem, resolve_config_path

    if systemd is not None:
        _init_systemd(systemd, state.config_path, force=force)
        return
    path, named = resolve_config_path(state.config_path, os.environ)
    # A directory of fleets (one named that is, or a path not ending .toml with --fleet): a
    # new fleet file in it, NAME.toml; the directory's .env (the account's secrets) written
    # only if it has none.
    name = state.fleet
    into_directory = (named or name is not None) and path.is_dir()
    into_directory = into_directory or (name is not None and path.suffix != ".toml")
    with_env = True
    if into_directory:
        path, with_env = _new_fleet_path(path, name)
    scaffold.refuse_existing(path, force=force, env=with_env)
    given = {"region": region, "plan": plan, "snapshot_id": snapshot}
    answers = replace(scaffold.Answers(), **{k: v for k, v in given.items() if v is not None})
    if not defaults and sys.stdin.isatty() and sys.stdout.isatty():
        key = os.environ.get("VULTR_API_KEY", "").strip()
        catalog = None
        if key:
            from vultrscale.vultr.client import VultrClient

            url = os.environ.get("VULTR_API_URL", "").strip() or DEFAULT_API_URL
            problem = api_url_problem(url)
            if problem:
                raise UsageError(problem, hint="Fix VULTR_API_URL, or unset it for Vultr's API.")
            client = VultrClient(key, url, max_attempts=2)
            catalog = scaffold.ApiCatalog(client)
        else:
            typer.echo("VULTR_API_KEY is not set: type the values (set it to pick from lists).")
        try:
            answers = scaffold.ask(
                lambda q, d: str(typer.prompt(q, default=d, show_default=bool(d))),
                typer.echo,
                catalog,
                answers,
            )
        finally:
            if catalog is not None:
                catalog.client.close()
    elif not defaults:
        typer.echo("No terminal to ask on: writing the defaults and the options given.")
    if into_directory and name is not None:
        answers = answers.named(name)
    written = scaffold.write(path, answers, force=force, env=with_env)
    for line in scaffold.next_steps(written, env_written=with_env or not into_directory):
        typer.echo(line)


def _new_fleet_path(directory: Path, name: str | None) -> tuple[Path, bool]:
    """Where `init --fleet NAME` writes a new fleet of ``directory``, and whether the .env
    is to be written too (the directory has none yet). UsageError when no name is given, the
    name is not a fleet name, or a fleet file there has the name or the tag already."""
    from vultrscale.config.fleets import clash
    from vultrscale.config.kinds import FLEET_NAME

    if not name:
        raise UsageError(
            f"{directory} is a directory of fleets: init writes one new fleet into it",
            hint=f"Name it: vultrscale --config {directory} init --fleet NAME",
        )
    if not FLEET_NAME.fullmatch(name):
        raise UsageError(
            f"--fleet {name[:80]!r} is not a fleet name (1-64 letters, digits, '.', '_' or '-')",
            hint="Pick a name such as web, reports or gpu.",
        )
    tag = f"vultrscale-{name}"
    found = clash(directory, name, tag) if directory.is_dir() else None
    if found:
        raise UsageError(
            f"fleet {name!r} (tag {tag!r}) cannot join {directory}: {found}; nothing written",
            hint="Pick another --fleet NAME, or edit that file.",
        )
    return directory / f"{name}.toml", not (directory / ".env").exists()


@sim_app.command(
    "serve",
    short_help="Run the Vultr API simulator until Ctrl-C.",
    epilog=examples(
        "vultrscale sim serve", "vultrscale sim serve --port 0 --seed 7 --no-rate-limit"
    ),
)
def sim_serve(
    port: Annotated[
        int,
        typer.Option(
            "--port",
            parser=params.port_or_zero,
            metavar="PORT",
            help="TCP port; 0 picks a free one.",
        ),
    ] = 8090,
    host: Annotated[
        str,
        typer.Option(
            "--host", metavar="ADDRESS", help="Address to listen on (keep it on loopback)."
        ),
    ] = "127.0.0.1",
    seed: Annotated[
        int, typer.Option("--seed", metavar="N", help="Seed for ids, IPs and faults.")
    ] = 0,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            metavar="KEY",
            help=shown("The key the simulator accepts.", "$VULTR_API_KEY, else a new one"),
            show_default=False,
        ),
    ] = None,
    no_rate_limit: Annotated[
        bool,
        typer.Option(
            "--no-rate-limit", help="Turn off the 30 requests/s limit.", show_default=False
        ),
    ] = False,
    sold_out: Annotated[
        list[str] | None,
        typer.Option(
            "--sold-out",
            metavar="REGION/PLAN",
            help="Refuse creates of this offering as Vultr does when it is out of stock "
            "(availability still lists it; add :unlisted to drop it there too). Repeatable.",
            show_default=False,
        ),
    ] = None,
    max_instances: Annotated[
        int | None,
        typer.Option(
            "--max-instances",
            metavar="N",
            min=0,
            help="The account's instance limit: refuse creates past N instances.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the Vultr API simulator until Ctrl-C; point VULTR_API_URL at it."""
    import secrets
    import signal
    import threading

    from vultrscale.core.clock import SystemClock
    from vultrscale.fake_vultr import Simulator, start_server

    if api_key:
        key, key_source = api_key, "given"
    elif os.environ.get("VULTR_API_KEY"):
        key, key_source = os.environ["VULTR_API_KEY"], "env"
    else:
        key, key_source = "sim-" + secrets.token_hex(16), "generated"
    sim = Simulator(
        key,
        clock=SystemClock(),
        seed=seed,
        rate_limit=None if no_rate_limit else 30,
        max_instances=max_instances,
    )
    for offering in sold_out or ():
        _sell_out(sim, offering)
    try:
        handle = start_server(sim, host, port)
    except OSError as exc:
        raise UsageError(
            f"Cannot listen on {host}:{port}: {exc.strerror or exc}.",
            hint="Pick another --port, or --port 0 for a free one.",
        ) from exc

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # also SIGINT: a shell may start a background job with SIGINT ignored
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    typer.echo(f"Vultr simulator listening on {handle.url} (seed {seed}). Ctrl-C stops it.")
    typer.echo(f"export VULTR_API_URL={handle.url}")
    if key_source == "env":
        typer.echo("# using VULTR_API_KEY from the environment")
    else:
        typer.echo(f"export VULTR_API_KEY={key}")
    sys.stdout.flush()
    try:
        forever = threading.Event()
        while not forever.wait(3600):
            pass
    except KeyboardInterrupt:
        typer.echo("Stopping the simulator.")
    finally:
        handle.stop()


def _sell_out(sim: Any, offering: str) -> None:
    """``--sold-out REGION/PLAN[:unlisted]`` carried out, or a usage error naming it."""
    from vultrscale.fake_vultr import SimulatorError

    where, _, how = offering.partition(":")
    region, _, plan = where.partition("/")
    hint = "Write --sold-out REGION/PLAN, e.g. ewr/vc2-1c-2gb (or ewr/vc2-1c-2gb:unlisted)."
    if not region or not plan or how not in ("", "unlisted"):
        raise UsageError(f"--sold-out {offering!r} is not REGION/PLAN[:unlisted].", hint=hint)
    try:
        sim.stock_out(region, plan, listed=how != "unlisted")
    except SimulatorError as exc:
        raise UsageError(f"--sold-out {offering!r}: {exc}.", hint=hint) from None


@config_app.command(
    "check",
    short_help="Validate the config, listing every problem; print it.",
    epilog=examples("vultrscale config check", "vultrscale --config prod.toml config check --json"),
)
def config_check(as_json: JsonFlag = False) -> None:
    """Load, validate and print the resolved config (secrets masked), and which database role
    the workers use (warning when it can write the scaler's tables); warn when the scaler
    counts jobs the fleet's workers never take. `vultrscale queue detect` reads the queue."""
    from dataclasses import asdict

    from vultrscale.cli._common import load_fleets
    from vultrscale.config import queue_warnings
    from vultrscale.db.roles import worker_access

    fleets = load_fleets()
    docs = []
    for cfg in fleets.configs:
        access = worker_access(cfg)
        warnings = queue_warnings(cfg)
        docs.append((cfg, cfg.masked(), access, warnings))
    bad = fleets.bad_error()
    if not fleets.directory:  # a single file: as it always printed
        cfg, data, access, warnings = docs[0]
        if as_json:
            print_json({**data, "worker_access": asdict(access), "warnings": list(warnings)})
            return
        from vultrscale.cli.views import print_config

        print_config(data, access, warnings)
        typer.echo(
            f"The queue (preset {cfg.queue.preset}) as a pass reads it, and which queues the "
            "database holds: vultrscale queue detect"
        )
        return
    if as_json:
        print_json(
            {
                "directory": str(fleets.source),
                "account": fleets.configs[0].masked()["account"] if fleets.configs else None,
                "fleets": [
                    {**d, "worker_access": asdict(a), "warnings": list(w)} for _, d, a, w in docs
                ],
                "invalid": [
                    {"file": str(b.path), "fleet": b.name, "problems": list(b.problems)}
                    for b in fleets.bad
                ],
            }
        )
    else:
        from vultrscale.cli.views import print_config, print_fleets

        print_fleets(fleets)
        for _, data, access, warnings in docs:
            print_config(data, access, warnings)
    if bad is not None:  # the valid fleets are printed (and run); the invalid ones said: exit 2
        raise bad


def _init_systemd(directory: Path, config_path: str | None, *, force: bool) -> None:
    """``init --systemd DIR``: the units, ExecStart naming the vultrscale that runs now."""
    from vultrscale import scaffold

    executable = _this_program()
    config = Path(config_path) if config_path else None
    units = scaffold.systemd_units(executable, config)
    written = scaffold.write_units(directory, units, force=force)
    steps = (
        scaffold.fleets_next_steps
        if scaffold.is_fleets_dir(config)
        else scaffold.systemd_next_steps
    )
    for line in steps(written, " ".join(executable), scaffold.unit_files(config)):
        typer.echo(line)
    # The real interpreter and the prefixes it loads from: a venv's python is a link to them.
    runtime = [os.path.realpath(sys.executable), sys.base_prefix, sys.prefix]
    warning = scaffold.hidden_runtime(runtime)
    if warning:
        typer.echo(f"Warning: {warning}\nFix: {scaffold.UNIT_RUNTIME_FIX}", err=True)


def _this_program() -> list[str]:
    """The vultrscale command that runs now, as an absolute path (not resolved: pipx's and uv's
    links keep their path across upgrades); `python -m vultrscale` when run that way."""
    import shutil

    argv0 = Path(sys.argv[0])
    if argv0.name == "vultrscale" and os.access(argv0, os.X_OK):
        return [os.path.abspath(argv0)]
    found = shutil.which("vultrscale")
    return [os.path.abspath(found)] if found else [sys.executable, "-m", "vultrscale"]
