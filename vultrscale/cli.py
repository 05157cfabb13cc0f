"""The command line: parses, builds the real parts, prints, and maps errors to exit codes.

Heavy libraries (httpx, psycopg, paramiko, rich) are imported inside the commands that use
them, so ``--help`` and ``--version`` start fast. Errors become one or two lines here, once:
what is wrong and how to fix it; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vultrscale import __version__
from vultrscale.errors import EXIT_RUNTIME, EXIT_USAGE, UsageError, VultrscaleError, redact

if TYPE_CHECKING:
    from vultrscale.config import Config

app = typer.Typer(
    name="vultrscale",
    help="Scale a fleet of Vultr instances running queue workers from zero to a cap and back.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
db_app = typer.Typer(help="The database schema.", no_args_is_help=True)
sim_app = typer.Typer(help="The Vultr simulator.", no_args_is_help=True)
cloudinit_app = typer.Typer(help="The user-data new instances get.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(db_app, name="db")
app.add_typer(sim_app, name="sim")
app.add_typer(cloudinit_app, name="cloud-init")


@dataclass
class Globals:
    config_path: str | None = None
    debug: bool = False


_globals = Globals()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vultrscale {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    config: Annotated[
        str | None,
        typer.Option(
            "--config", help="TOML config file (default: $VULTRSCALE_CONFIG, ./vultrscale.toml)."
        ),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    _globals.config_path = config
    _globals.debug = debug


def load_config(flags: dict[str, Any] | None = None) -> Config:
    """The resolved config for this invocation (flags > environment > file > defaults)."""
    from vultrscale import config as cfg

    return cfg.load(_globals.config_path, os.environ, flags)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str, sort_keys=False))


def require(value: str, name: str, hint: str) -> str:
    """A secret the command cannot run without; exit 2 with ``hint`` when it is missing."""
    if not value:
        raise UsageError(f"{name} is not set.", hint=hint)
    return value


# --- config ----------------------------------------------------------------------------------


@config_app.command("check")
def config_check(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Load, validate and print the resolved config (secrets masked)."""
    cfg = load_config()
    data = cfg.masked()
    if as_json:
        print_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[green]Configuration is valid[/green] (from {data.pop('source')})")
    for section, values in data.items():
        table = Table(title=f"\\[{section}]", show_header=False, title_justify="left", box=None)
        table.add_column("key", style="cyan")
        table.add_column("value")
        for key, value in values.items():
            table.add_row(key, json.dumps(value) if not isinstance(value, str) else value)
        console.print(table)


# --- db, worker, enqueue (the built-in queue) ------------------------------------------------

_DB_HINT = "Set DATABASE_URL, e.g. export DATABASE_URL=postgresql://user:password@host:5432/db"


def _database_url() -> str:
    return require(os.environ.get("DATABASE_URL", "").strip(), "DATABASE_URL", _DB_HINT)


@db_app.command("init")
def db_init() -> None:
    """Create or upgrade the schema (idempotent, versioned)."""
    from vultrscale.db import schema

    version = schema.migrate(_database_url())
    typer.echo(f"Schema is at version {version}.")


@app.command("worker")
def worker_cmd(
    app_spec: Annotated[
        str | None,
        typer.Option("--app", help="Handler MODULE:FUNC (default: $VULTRSCALE_WORKER_APP)."),
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", help="Jobs run at once (default 4).")
    ] = None,
    drain_seconds: Annotated[
        float | None,
        typer.Option("--drain-seconds", help="On SIGTERM, wait this long for jobs (default 20)."),
    ] = None,
    lease_seconds: Annotated[
        float | None,
        typer.Option("--lease-seconds", help="Lease per job, renewed every third (default 60)."),
    ] = None,
    queue_name: Annotated[
        str | None, typer.Option("--queue", help="Queue to take jobs from (default: default).")
    ] = None,
    backoff_seconds: Annotated[
        float, typer.Option("--backoff-seconds", help="First retry delay; doubles per attempt.")
    ] = 2.0,
) -> None:
    """The reference worker runtime: claim, lease, heartbeat, drain on SIGTERM."""
    from vultrscale import config as cfg_mod
    from vultrscale.worker import runtime

    flags = {
        "worker.app": app_spec,
        "worker.concurrency": concurrency,
        "worker.drain_seconds": drain_seconds,
        "worker.lease_seconds": lease_seconds,
        "worker.queue": queue_name,
    }
    # VULTRSCALE_WORKER_ID names the process, it is not a [worker] config key.
    env = {k: v for k, v in os.environ.items() if k != "VULTRSCALE_WORKER_ID"}
    w = cfg_mod.load(_globals.config_path, env, flags).worker
    if backoff_seconds < 0:
        raise UsageError("--backoff-seconds must be >= 0.", hint="Pass e.g. --backoff-seconds 2.")
    handler = runtime.load_handler(w.app)  # exit 2 before touching the database
    conninfo = require(
        os.environ.get("WORKER_DATABASE_URL", "").strip() or os.environ.get("DATABASE_URL", ""),
        "DATABASE_URL",
        _DB_HINT,
    )
    worker_id = os.environ.get("VULTRSCALE_WORKER_ID", "").strip() or runtime.default_worker_id()
    settings = runtime.WorkerSettings(
        app=w.app,
        concurrency=w.concurrency,
        drain_seconds=w.drain_seconds,
        lease_seconds=w.lease_seconds,
        queue=w.queue,
        worker_id=worker_id,
        instance_label=os.environ.get("VULTRSCALE_INSTANCE_LABEL", "").strip() or worker_id,
        backoff_seconds=backoff_seconds,
    )
    if not _globals.debug:
        # The pool logs each failed reconnect; the worker reports a lost database once, itself.
        import logging

        logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    runtime.Worker(settings, conninfo, handler, say=typer.echo).run()


@app.command("enqueue")
def enqueue_cmd(
    count: Annotated[int, typer.Option("--count", min=1, help="How many jobs.")] = 1,
    payload: Annotated[str, typer.Option("--payload", help="JSON payload of each job.")] = "{}",
    queue_name: Annotated[str, typer.Option("--queue", help="Queue name.")] = "default",
    max_attempts: Annotated[
        int, typer.Option("--max-attempts", min=1, help="Attempts before a job is dead.")
    ] = 3,
) -> None:
    """Put jobs on the built-in queue (tests, demo, smoke checks)."""
    try:
        doc = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--payload is not valid JSON: {exc.msg} at character {exc.pos}.",
            hint="Quote the whole payload for the shell, e.g. --payload '{\"step_seconds\": 1}'.",
        ) from None
    conninfo = _database_url()
    from vultrscale.config import mask_url
    from vultrscale.db import pg, queue

    with pg.session(conninfo, f"cannot enqueue at {mask_url(conninfo)}") as conn:
        ids = queue.enqueue(conn, [doc] * count, queue=queue_name, max_attempts=max_attempts)
    span = f"{ids[0]}" if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"
    typer.echo(f"Enqueued {len(ids)} job(s) on queue {queue_name!r}: id {span}.")


# --- snapshot (the fleet's base image) -------------------------------------------------------

_KEY_HINT = (
    "Set VULTR_API_KEY (my.vultr.com > Account > API), or point VULTR_API_URL at "
    "`vultrscale sim serve` and set any key."
)


@app.command("snapshot")
def snapshot_cmd(
    from_instance: Annotated[
        str | None,
        typer.Option("--from-instance", metavar="ID", help="Instance to snapshot (its id)."),
    ] = None,
    description: Annotated[
        str | None,
        typer.Option(
            "--description",
            metavar="TEXT",
            help="Snapshot description (default: <fleet>-<UTC time>).",
        ),
    ] = None,
    keep: Annotated[
        int, typer.Option("--keep", metavar="N", help="Fleet snapshots to keep, newest first.")
    ] = 3,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Return after the request; use --resume later.")
    ] = False,
    timeout: Annotated[
        str,
        typer.Option(
            "--timeout", metavar="DURATION", help="How long to wait for `complete` (e.g. 60m)."
        ),
    ] = "60m",
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            metavar="SNAPSHOT_ID",
            help="Wait for a snapshot made earlier (--no-wait, a timeout), then record and prune.",
        ),
    ] = None,
) -> None:
    """Bake the base image: snapshot an instance, wait until complete, record it, prune."""
    from datetime import timedelta

    from vultrscale.config import parse_duration

    if bool(from_instance) == bool(resume):
        raise UsageError(
            "give exactly one of --from-instance ID and --resume SNAPSHOT_ID",
            hint="Find instance ids with `vultrscale instances`.",
        )
    if resume and no_wait:
        raise UsageError("--no-wait has no meaning with --resume", hint="Drop --no-wait.")
    try:
        wait_for: timedelta = parse_duration(timeout, "--timeout")
    except ValueError as exc:
        raise UsageError(str(exc), hint="Write it like 90s, 30m or 2h.") from None
    if keep < 1 or wait_for.total_seconds() <= 0:
        raise UsageError(
            "--keep must be at least 1 and --timeout positive",
            hint="The new snapshot is always kept; --keep 1 deletes every older fleet snapshot.",
        )
    cfg = load_config()
    api_key = require(cfg.secrets.api_key.reveal(), "VULTR_API_KEY", _KEY_HINT)
    db_url = require(cfg.secrets.database_url.reveal(), "DATABASE_URL", _DB_HINT)

    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column

    from vultrscale import snapshot as snapshots
    from vultrscale.vultr.client import VultrClient

    out, err = Console(), Console(stderr=True)
    what = f"snapshot of instance {from_instance}" if from_instance else f"snapshot {resume}"
    # elapsed time before the text, so a narrow terminal cuts the text, not the clock
    progress = Progress(
        SpinnerColumn(table_column=Column(min_width=1, no_wrap=True)),
        TimeElapsedColumn(table_column=Column(min_width=7, no_wrap=True)),
        TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis")),
        console=err,
        transient=True,
    )
    task = progress.add_task(f"requesting {what}", total=None)

    def show(p: snapshots.Progress) -> None:
        note = f" ({p.note})" if p.note else f" (next check in {p.next_poll:.0f}s)"
        progress.update(task, description=f"[bold]{p.status}[/bold] snapshot {p.snapshot_id}{note}")

    with VultrClient(api_key, cfg.api_url) as client, progress:
        if resume:
            result = snapshots.resume(
                client, db_url, cfg, resume, keep=keep, timeout=wait_for, on_progress=show
            )
        else:
            assert from_instance is not None
            result = snapshots.bake(
                client,
                db_url,
                cfg,
                from_instance,
                description=description,
                keep=keep,
                wait=not no_wait,
                timeout=wait_for,
                on_progress=show,
            )

    fleet = cfg.fleet.name
    if not result.is_complete:
        out.print(
            f"Snapshot [bold]{result.snapshot_id}[/bold] ({result.description}) requested; "
            f"it is {result.status} at Vultr and listed for fleet {fleet!r}, but is not its "
            "snapshot until complete."
        )
        out.print(
            f"Run `vultrscale snapshot --resume {result.snapshot_id}` to wait for it and make "
            "it the fleet's snapshot."
        )
        return
    minutes, seconds = divmod(int(result.elapsed), 60)
    size = f", {result.size / 1024**3:.1f} GiB" if result.size else ""
    out.print(
        f"[green]Snapshot {result.snapshot_id}[/green] ({result.description}) is complete "
        f"after {minutes}m{seconds:02d}s{size}; it is now the snapshot of fleet {fleet!r}"
        + (f" (was {result.previous})." if result.previous else ".")
    )
    if cfg.fleet.snapshot_id and cfg.fleet.snapshot_id != result.snapshot_id:
        err.print(
            f"[yellow]Note:[/yellow] fleet.snapshot_id = {cfg.fleet.snapshot_id!r} in the config "
            'takes precedence; set it to "" to boot new instances from this snapshot.'
        )
    if result.deleted:
        out.print(
            f"Deleted {len(result.deleted)} older fleet snapshot(s): " + ", ".join(result.deleted)
        )
    else:
        out.print(f"No older fleet snapshots to delete (keeping {keep}).")
    for problem in result.delete_errors:
        err.print(f"[yellow]Warning:[/yellow] could not delete {problem}; the next bake retries.")


# --- cloud-init (what a new instance boots with) ---------------------------------------------


@cloudinit_app.command("render")
def cloudinit_render(
    label: Annotated[
        str | None,
        typer.Option("--label", help="Instance label (default: <fleet.label_prefix>-preview)."),
    ] = None,
    show_secrets: Annotated[
        bool,
        typer.Option("--show-secrets", help="Print the database password and private host key."),
    ] = False,
) -> None:
    """Print the user-data a new instance would get (secrets masked unless --show-secrets)."""
    from vultrscale import cloudinit, ssh

    cfg = load_config()
    scaler_key = ssh.public_key_line(cfg.fleet.ssh_key)
    host_private, host_public = ssh.generate_host_key()
    text = cloudinit.render_user_data(
        cfg,
        label or f"{cfg.fleet.label_prefix}-preview",
        host_private,
        host_public,
        scaler_key,
        show_secrets=show_secrets,
    )
    typer.echo(text, nl=False)
    typer.echo(
        "# (host key generated for this preview; each instance gets its own at create)",
        err=True,
    )


# --- instances (the fleet as the Vultr API reports it) ---------------------------------------

_API_KEY_HINT = (
    "export VULTR_API_KEY=... (my.vultr.com > Account > API), or point VULTR_API_URL at "
    "`vultrscale sim serve` and set any key."
)

if TYPE_CHECKING:
    from rich.table import Table

    from vultrscale.vultr.models import VInstance


@app.command("instances")
def instances_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """The fleet's instances as the Vultr API reports them (no database needed)."""
    cfg = load_config()
    api_key = require(cfg.secrets.api_key.reveal(), "VULTR_API_KEY", _API_KEY_HINT)
    from vultrscale.vultr.client import VultrClient

    with VultrClient(api_key, cfg.api_url) as client:
        found = client.list_instances(tag=cfg.fleet.tag)
    found.sort(key=lambda i: (i.date_created is None, i.date_created, i.label))
    if as_json:
        print_json(
            {
                "fleet": cfg.fleet.name,
                "tag": cfg.fleet.tag,
                "api_url": cfg.api_url,
                "count": len(found),
                "instances": [_instance_json(i) for i in found],
            }
        )
        return
    from rich.console import Console

    console = Console()
    where = f"fleet {cfg.fleet.name!r}, tag {cfg.fleet.tag!r}"
    if not found:
        console.print(f"No instances carry the tag ({where}) at {cfg.api_url}; the key works.")
        return
    console.print(_instances_table(found, console.width))
    console.print(f"{len(found)} instance(s): {where}\nAPI: {cfg.api_url}", highlight=False)


def _instance_json(inst: VInstance) -> dict[str, Any]:
    created = inst.date_created.isoformat() if inst.date_created else None
    return {
        "id": inst.id,
        "label": inst.label,
        "status": inst.status,
        "power_status": inst.power_status,
        "server_status": inst.server_status,
        "main_ip": inst.main_ip,
        "internal_ip": inst.internal_ip,
        "region": inst.region,
        "plan": inst.plan,
        "date_created": created,
        "tags": list(inst.tags),
    }


def _instances_table(found: list[VInstance], width: int) -> Table:
    """One column per field when the terminal is wide; stacked cells that fit 80 columns."""
    from rich import box
    from rich.table import Table

    def when(inst: VInstance) -> str:
        return inst.date_created.strftime("%Y-%m-%d %H:%M") if inst.date_created else "-"

    def ip(inst: VInstance) -> str:
        return inst.main_ip if inst.has_address else "-"

    status_style = {"active": "green", "pending": "yellow"}
    if width >= 150:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for name in ("id", "label", "status", "power", "server", "main IP", "region", "plan"):
            table.add_column(name, no_wrap=name in ("id", "main IP"))
        table.add_column("created (UTC)", no_wrap=True)
        table.add_column("tags", overflow="fold")
        for i in found:
            style = status_style.get(i.status, "red")
            table.add_row(
                i.id,
                i.label,
                f"[{style}]{i.status}[/{style}]",
                i.power_status,
                i.server_status,
                ip(i),
                i.region,
                i.plan,
                when(i),
                ", ".join(i.tags),
            )
        return table
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_lines=False)
    # Each cell stacks three fields; the header names them in the same order.
    table.add_column("id\nlabel\ntags", min_width=36, overflow="fold")
    table.add_column("status\npower\nserver", min_width=17, overflow="fold")
    table.add_column("main IP\nregion plan\ncreated (UTC)", min_width=16, overflow="fold")
    for n, i in enumerate(found):
        style = status_style.get(i.status, "red")
        table.add_row(
            f"{i.id}\n[bold]{i.label}[/bold]\n[dim]{', '.join(i.tags)}[/dim]",
            f"[{style}]{i.status}[/{style}]\n{i.power_status}\n{i.server_status}",
            f"{ip(i)}\n{i.region} {i.plan}\n{when(i)}",
            end_section=n < len(found) - 1,
        )
    return table


# --- reconcile, status, events (the lead's section) ------------------------------------------

_DB_HINT = "export DATABASE_URL=postgresql://user:password@host/db, then `vultrscale db init`."
_KEY_HINT = (
    "export VULTR_API_KEY=... (my.vultr.com > Account > API), or point VULTR_API_URL at "
    "`vultrscale sim serve` and set any key."
)


class _LazyDrain:
    """The SSH drain transport, built on first use so a pass with no drain never imports
    paramiko nor reads the key; closed after every pass (connections live within one pass)."""

    def __init__(self, key_path: str) -> None:
        self.key_path = key_path
        self._drain: Any = None

    def _get(self) -> Any:
        if self._drain is None:
            from vultrscale.ssh import SSHDrain

            self._drain = SSHDrain(self.key_path)
        return self._drain

    def stop_many(self, targets: list[Any]) -> Any:
        return self._get().stop_many(targets)

    def is_active_many(self, targets: list[Any]) -> Any:
        return self._get().is_active_many(targets)

    def close(self) -> None:
        if self._drain is not None:
            self._drain.close()
            self._drain = None


def build_parts(cfg: Config) -> Any:
    """The real parts of a pass: the Vultr client, Postgres, SSH, cloud-init, the system clock,
    and the local check of the scaler's key made before a pass changes anything."""
    from vultrscale.clock import SystemClock
    from vultrscale.db.ledger import PgStore
    from vultrscale.reconcile import Parts
    from vultrscale.vultr.client import VultrClient

    api_key = require(cfg.secrets.api_key.reveal(), "VULTR_API_KEY", _KEY_HINT)
    db_url = require(cfg.secrets.database_url.reveal(), "DATABASE_URL", _DB_HINT)
    client = VultrClient(api_key, cfg.api_url)

    scaler_key: list[str] = []

    def keygen() -> tuple[str, str]:
        from vultrscale.ssh import generate_host_key

        return generate_host_key()

    def render(label: str, private: str, public: str) -> str:
        from vultrscale import cloudinit, ssh

        if not scaler_key:
            scaler_key.append(ssh.public_key_line(cfg.fleet.ssh_key))
        return cloudinit.render_user_data(
            cfg, label, private, public, scaler_key[0], show_secrets=True
        )

    def key_usable() -> None:
        from vultrscale.ssh import check_key_file

        check_key_file(cfg.fleet.ssh_key)

    return Parts(
        cloud=client,
        store=PgStore(db_url),
        drain=_LazyDrain(cfg.fleet.ssh_key),
        clock=SystemClock(),
        keygen=keygen,
        render_user_data=render,
        preflight=(key_usable,),
    )


def _print_pass(result: Any, as_json: bool) -> None:
    if as_json:
        print_json(result.to_json())
        return
    from rich.console import Console

    console = Console()
    if result.lock_held:
        console.print("Another reconcile pass holds the lock for this fleet; nothing to do.")
        return
    plan = result.plan
    head = "[bold]dry run[/bold]: " if result.dry_run else ""
    if plan is not None:
        console.print(
            f"{head}desired {plan.desired}, target {plan.target} "
            f"(capacity {plan.capacity}, floor {plan.floor}, cap {plan.cap})"
        )
        for reason in plan.reasons:
            console.print(f"  why: {reason}", markup=False)
        for clamp in plan.clamps:
            console.print(f"  clamp: {clamp}", style="yellow", markup=False)
        from vultrscale.status import grouped

        verb = "would" if result.dry_run else "do"
        for line in grouped(a.describe() for a in plan.actions):
            console.print(f"  {verb}: {line}", style="cyan", markup=False)
        for warning in plan.warnings:
            console.print(f"  warning: {warning}", style="red", markup=False)
    for r in result.results:
        console.print(f"  {r['label']}: {r['result']}", markup=False)
    for e in result.errors:
        console.print(f"  error: {e}", style="red", markup=False)


@app.command("reconcile")
def reconcile_cmd(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; change nothing.")
    ] = False,
    loop: Annotated[bool, typer.Option("--loop", help="Run passes until interrupted.")] = False,
    interval: Annotated[
        str, typer.Option("--interval", help="Time between passes with --loop (e.g. 30s).")
    ] = "30s",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON document per pass.")
    ] = False,
    metrics_file: Annotated[
        str | None,
        typer.Option("--metrics-file", help="Write Prometheus metrics here (textfile collector)."),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option("--metrics-port", help="With --loop, serve /metrics on 127.0.0.1:PORT."),
    ] = None,
) -> int:
    """One reconcile pass (or a loop): observe, progress drains, decide, act, record."""
    from vultrscale.config import parse_duration
    from vultrscale.reconcile import run_forever, run_pass

    try:
        every = parse_duration(interval, "--interval")
    except ValueError as exc:
        raise UsageError(str(exc), hint="Write durations like 30s, 5m or 1h.") from None
    if metrics_port is not None and not loop:
        raise UsageError(
            "--metrics-port needs --loop", hint="Use --metrics-file for single passes."
        )
    cfg = load_config()
    parts = build_parts(cfg)
    metrics = None
    if metrics_file or metrics_port is not None:
        from vultrscale import metrics as metrics_mod

        metrics = metrics_mod.Metrics(cfg.fleet.name)
        if metrics_file:
            target = metrics_file
            parts.preflight = (*parts.preflight, lambda: metrics_mod.check_textfile(target))
        if metrics_port is not None:
            metrics.serve(metrics_port)

    def report(result: Any) -> None:
        _print_pass(result, as_json)
        if metrics is not None:
            metrics.observe(result)
            if metrics_file:
                metrics.write_textfile(metrics_file)

    def report_error(exc: VultrscaleError) -> None:
        _fail(exc.message, exc.hint, exc.exit_code)

    try:
        if not loop:
            result = run_pass(cfg, parts, dry_run=dry_run)
            report(result)
            return int(result.exit_code)
        return run_forever(
            cfg, parts, interval=every, dry_run=dry_run, on_result=report, on_error=report_error
        )
    finally:
        parts.cloud.close()


def _status_once(cfg: Config, parts: Any) -> tuple[Any, Any]:
    from vultrscale.reconcile import run_pass

    result = run_pass(cfg, parts, dry_run=True, take_lock=False)
    return result, parts.clock.now()


@app.command("status")
def status_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh every few seconds.")] = False,
    every: Annotated[float, typer.Option("--every", help="Seconds between refreshes.")] = 5.0,
) -> int:
    """The fleet: every instance, the queue, desired count and why, budget used."""
    from vultrscale import status

    cfg = load_config()
    parts = build_parts(cfg)
    ceiling = cfg.budget.monthly_ceiling_usd
    try:
        result, now = _status_once(cfg, parts)
        if as_json:
            print_json(status.status_document(result.observation, result.plan, now, ceiling))
            return int(result.exit_code)
        from rich.console import Console
        from rich.live import Live

        console = Console()
        view = status.render(result.observation, result.plan, now, ceiling, cfg.fleet.name)
        if not watch:
            console.print(view)
            return int(result.exit_code)
        import time

        with Live(view, console=console, auto_refresh=False) as live:
            while True:
                time.sleep(max(0.5, every))
                result, now = _status_once(cfg, parts)
                live.update(
                    status.render(result.observation, result.plan, now, ceiling, cfg.fleet.name),
                    refresh=True,
                )
    finally:
        parts.cloud.close()


@app.command("events")
def events_cmd(
    since: Annotated[str, typer.Option("--since", help="How far back (e.g. 1h, 30m, 2d).")] = "1h",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """The decision ledger: every pass, its inputs, the clamps, actions and results."""
    from datetime import UTC, datetime

    from vultrscale.config import parse_duration
    from vultrscale.db import ledger, pg

    try:
        window = parse_duration(since, "--since")
    except ValueError as exc:
        raise UsageError(str(exc), hint="Write durations like 30m, 1h or 2d.") from None
    cfg = load_config()
    db_url = require(cfg.secrets.database_url.reveal(), "DATABASE_URL", _DB_HINT)
    with pg.session(db_url, "cannot read the events") as conn:
        rows = ledger.events(conn, cfg.fleet.name, datetime.now(UTC) - window)
    if as_json:
        print_json({"fleet": cfg.fleet.name, "since": since, "events": rows})
        return
    from rich.console import Console

    from vultrscale.status import events_table

    if not rows:
        typer.echo(f"No passes recorded for fleet {cfg.fleet.name} in the last {since}.")
        return
    Console().print(events_table(rows))


# --- sim (the Vultr simulator on loopback) ---------------------------------------------------


@sim_app.command("serve")
def sim_serve(
    port: Annotated[int, typer.Option("--port", help="TCP port; 0 picks a free one.")] = 8090,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (keep it on loopback).")
    ] = "127.0.0.1",
    seed: Annotated[int, typer.Option("--seed", help="Seed for ids, IPs and faults.")] = 0,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="The key the simulator accepts (default: $VULTR_API_KEY, else a new one).",
        ),
    ] = None,
    no_rate_limit: Annotated[
        bool, typer.Option("--no-rate-limit", help="Turn off the 30 requests/s limit.")
    ] = False,
) -> None:
    """Run the Vultr API simulator until Ctrl-C; point VULTR_API_URL at it."""
    import secrets
    import signal
    import threading

    from vultrscale.clock import SystemClock
    from vultrscale.sim import Simulator, start_server

    if api_key:
        key, key_source = api_key, "given"
    elif os.environ.get("VULTR_API_KEY"):
        key, key_source = os.environ["VULTR_API_KEY"], "env"
    else:
        key, key_source = "sim-" + secrets.token_hex(16), "generated"
    sim = Simulator(key, clock=SystemClock(), seed=seed, rate_limit=None if no_rate_limit else 30)
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


# --- demo (the whole loop on this machine) ---------------------------------------------------


@app.command("demo")
def demo_cmd(
    duration: Annotated[
        float, typer.Option("--duration", min=10, help="Stop after this many seconds at most.")
    ] = 120.0,
    bursts: Annotated[
        str,
        typer.Option("--bursts", help="Workload: SECONDS:JOBS,... enqueued into the run."),
    ] = "0:24,40:12",
    no_live: Annotated[
        bool, typer.Option("--no-live", help="Plain log lines instead of the live fleet view.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as one JSON document.")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed for job lengths and ids.")] = 0,
    logs: Annotated[
        str | None,
        typer.Option("--logs", metavar="DIR", help="Keep each instance's worker log in DIR."),
    ] = None,
) -> int:
    """The whole system on this machine: Postgres, the Vultr simulator, instances running real
    workers behind SSH, a bursty workload and the reconcile loop. Exit 0 when no job was lost
    and the fleet came back down."""
    import logging
    import signal
    import threading
    from pathlib import Path

    from rich.console import Console

    from vultrscale import demo

    settings = demo.Settings(
        duration=duration,
        bursts=demo.parse_bursts(bursts),
        seed=seed,
        logs_dir=Path(logs).expanduser().resolve() if logs else None,
    )
    # with --json, stdout carries only the summary
    console = Console(stderr=as_json)
    stop = threading.Event()

    def _stop(signum: int, frame: object) -> None:
        # The first signal ends the run after the current pass, cleanly; a second one hurries
        # (cleanup still runs, but a half-started Postgres may be left).
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        console.print("Stopping: cleaning up (again to hurry).", style="yellow")

    # also SIGINT: a shell starts a background job with SIGINT ignored
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop)
    url = os.environ.get("DATABASE_URL", "").strip() or None
    # paramiko logs a client that hangs up mid-handshake as an error; the drain reports its own
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    logging.getLogger("paramiko").propagate = False

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    if no_live:
        summary = demo.run(settings, database_url=url, on_tick=_demo_log(say), say=say, stop=stop)
    else:
        from rich.live import Live

        with Live(console=console, auto_refresh=False, transient=False) as live:
            view = _DemoView(live)
            summary = demo.run(
                settings, database_url=url, on_tick=view.update, say=view.say, stop=stop
            )
    if as_json:
        print_json(summary.to_json())
    else:
        _print_demo_summary(console, summary)
    if summary.ended_by == "interrupted":
        return 130
    return 0 if summary.ok else EXIT_RUNTIME


def _demo_counts(tick: Any) -> str:
    jobs = tick.jobs
    done = sum(jobs.get(s, 0) for s in ("succeeded", "failed", "dead"))
    states: dict[str, int] = {}
    if tick.result is not None and tick.result.observation is not None:
        for i in tick.result.observation.instances:
            states[i.state.value] = states.get(i.state.value, 0) + 1
    fleet = ", ".join(f"{n} {s}" for s, n in states.items()) or "none"
    return (
        f"[{tick.elapsed:5.1f}s] instances: {fleet} | jobs: {jobs.get('ready', 0)} ready, "
        f"{jobs.get('leased', 0)} running, {done}/{tick.enqueued} done"
    )


def _demo_log(say: Any) -> Any:
    def log(tick: Any) -> None:
        say(_demo_counts(tick))
        for note in tick.notes:
            say(f"         {note}")
        if tick.result is not None:
            for r in tick.result.results:
                say(f"         {r['label']}: {r['result']}")
            for e in tick.result.errors:
                say(f"         error: {e}")
        if tick.error:
            say(f"         error: {tick.error}")

    return log


class _DemoView:
    """The live view: the fleet table of `vultrscale status` and the run's recent events."""

    def __init__(self, live: Any) -> None:
        self.live = live
        self.lines: list[str] = []

    def say(self, line: str) -> None:
        self.live.console.print(line, markup=False, highlight=False)

    def update(self, tick: Any) -> None:
        from datetime import UTC, datetime

        from rich.console import Group
        from rich.text import Text

        from vultrscale import status

        for note in tick.notes:
            self.lines.append(f"{tick.elapsed:5.1f}s  {note}")
        if tick.result is not None:
            for r in tick.result.results:
                self.lines.append(f"{tick.elapsed:5.1f}s  {r['label']}: {r['result']}")
        if tick.error:
            self.lines.append(f"{tick.elapsed:5.1f}s  error: {tick.error}")
        self.lines = self.lines[-8:]
        parts: list[Any] = [Text(_demo_counts(tick), style="bold")]
        result = tick.result
        if result is not None and result.observation is not None and result.plan is not None:
            cfg = tick.config
            parts.append(
                status.render(
                    result.observation,
                    result.plan,
                    datetime.now(UTC),
                    cfg.budget.monthly_ceiling_usd,
                    cfg.fleet.name,
                )
            )
        parts.append(Text("\n".join(self.lines), style="dim"))
        self.live.update(Group(*parts), refresh=True)


def _print_demo_summary(console: Any, s: Any) -> None:
    verdict = "[green]OK[/green]" if s.ok else "[red]FAILED[/red]"
    console.print(f"\n[bold]Demo summary[/bold] ({s.wall_seconds:.0f}s): {verdict}")
    console.print(
        f"  jobs: {s.enqueued} enqueued, {s.succeeded} succeeded, {s.failed} failed, "
        f"{s.dead} dead, [bold]{s.lost} lost[/bold] ({s.retried} needed a retry)"
    )
    console.print(
        f"  fleet: peak {s.peak} of max {s.max_instances}, {s.created} created, "
        f"{s.scale_ups} scale-up(s), {s.scale_ins} scale-in(s), {s.final} left at the end"
    )
    console.print(
        f"  instance time: {s.instance_seconds:.0f} instance-seconds against "
        f"{s.always_on_seconds:.0f} for {s.max_instances} always-on instances "
        f"({s.saved_pct:.0f}% less)"
    )
    console.print(
        f"  workers: {s.booted} booted, {s.worker_clean_exits} drained and exited cleanly, "
        f"{s.worker_failed_exits} failed, {s.killed_at_power_off} killed at power-off; "
        f"SSH: {s.ssh['stop']} stop, {s.ssh['is_active']} is-active, "
        f"{s.ssh['refused_commands'] + s.ssh['refused_logins']} refused"
    )
    for problem in s.problems:
        console.print(f"  [red]problem:[/red] {problem}", highlight=False)


# --- entry point -----------------------------------------------------------------------------


@app.command("simulate")
def simulate_cmd(
    workload: Annotated[
        str,
        typer.Option(
            "--workload",
            metavar="SHAPE|PATH.csv",
            help="bursty-day, steady, spiky, or a CSV of arrival_seconds,duration_seconds.",
        ),
    ] = "bursty-day",
    from_db: Annotated[
        bool,
        typer.Option("--from-db", help="Replay the built-in queue's own history (DATABASE_URL)."),
    ] = False,
    since: Annotated[
        str, typer.Option("--since", metavar="DURATION", help="With --from-db: how far back.")
    ] = "7d",
    days: Annotated[int, typer.Option("--days", metavar="N", help="Days of a built-in shape.")] = 7,
    jobs_per_day: Annotated[
        int | None,
        typer.Option("--jobs-per-day", metavar="N", help="Volume of a built-in shape."),
    ] = None,
    policies: Annotated[
        str,
        typer.Option(
            "--policies", metavar="LIST", help="Comma-separated: always-on,naive,keda,vultrscale."
        ),
    ] = "always-on,naive,keda,vultrscale",
    seed: Annotated[
        int, typer.Option("--seed", metavar="N", help="Seed for the workload and boots.")
    ] = 0,
    boot_time: Annotated[
        str,
        typer.Option(
            "--boot-time",
            metavar="DUR|MIN..MAX",
            help="Create to worker up (snapshot restores: 10-15 min at Vultr).",
        ),
    ] = "10m..15m",
    interval: Annotated[
        str, typer.Option("--interval", metavar="DURATION", help="Time between passes.")
    ] = "30s",
    sweep: Annotated[
        list[str] | None,
        typer.Option(
            "--sweep",
            metavar="KEY=V1,V2",
            help="Run vultrscale once per combination of config values (repeatable).",
        ),
    ] = None,
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
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
) -> int:
    """Replay a workload through the real pass and compare policies (cost, waits, lost work)."""
    from pathlib import Path

    from rich.console import Console

    from vultrscale.simulate import command

    opts = command.Options(
        workload=workload,
        from_db=from_db,
        since=since,
        days=days,
        jobs_per_day=jobs_per_day,
        policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
        seed=seed,
        boot_time=boot_time,
        interval=interval,
        sweeps=tuple(sweep or ()),
        monthly_usd=monthly_usd,
        plot=Path(plot) if plot else None,
        as_json=as_json,
    )
    return command.execute(
        opts,
        load_config(),
        config_path=_globals.config_path,
        env=os.environ,
        out=Console(),
        err=Console(stderr=True),
        print_json=print_json,
    )


def _fail(message: str, hint: str, code: int) -> int:
    from vultrscale.config import Secrets

    secrets = Secrets.from_env(os.environ).values()
    text = redact(message, secrets)
    typer.echo(f"Error: {text}", err=True)
    if hint:
        typer.echo(f"Fix: {redact(hint, secrets)}", err=True)
    return code


def _click_exceptions() -> Any:
    """Click's exception classes as this Typer raises them: recent Typer releases carry their
    own copy of click (``typer._click``), older ones use the ``click`` package."""
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions  # type: ignore[no-redef]
    return exceptions


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit code (DESIGN §2)."""
    errors = _click_exceptions()
    exits = (typer.Exit, getattr(errors, "Exit", typer.Exit))
    aborts = (typer.Abort, getattr(errors, "Abort", typer.Abort))
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="vultrscale", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except exits as exc:
        code = exc.exit_code
    except aborts:
        typer.echo("Aborted.", err=True)
        code = EXIT_RUNTIME
    except errors.ClickException as exc:
        exc.show()
        code = EXIT_USAGE if isinstance(exc, errors.UsageError) else exc.exit_code
    except VultrscaleError as exc:
        if _globals.debug:
            import traceback

            traceback.print_exc()
        code = _fail(exc.message, exc.hint, exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("Interrupted.", err=True)
        code = 130
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
