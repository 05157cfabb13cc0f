"""Queue commands: the built-in Postgres queue's schema, its worker, putting jobs on it, and
finding which queue a database holds (`queue detect`)."""

from __future__ import annotations

import json
import math
import os
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from vultrscale import params
from vultrscale.cli._common import JsonFlag, examples, group, print_json, shown, state
from vultrscale.core.model import DEFAULT_MAX_ATTEMPTS
from vultrscale.errors import UsageError
from vultrscale.redaction import is_text
from vultrscale.wiring import database_url

if TYPE_CHECKING:
    from vultrscale.db import detect as detect_mod

_SHORTER = "Send long numbers as strings (in quotes)."
_STORABLE = (
    "Leave it out of the payload; write a character above U+FFFF as itself or as a pair of "
    "escapes (\\ud83d\\ude00), and pass the payload as UTF-8."
)


def payload_problem(doc: object) -> str | None:
    """What Postgres' jsonb cannot store in a decoded JSON value, or None: NaN or an infinite
    number, the character U+0000, a lone surrogate (in keys and strings alike). Iterative, so a
    deeply nested payload is walked without recursion."""
    todo = [doc]
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            todo.extend(value.keys())
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)
        elif isinstance(value, float) and not math.isfinite(value):
            return "NaN and infinite numbers are not JSON Postgres can store"
        elif isinstance(value, str):
            if "\x00" in value:
                return "Postgres cannot store the character \\u0000 in JSON"
            if not is_text(value):  # an unpaired \ud800-\udfff escape, or a raw byte
                return (
                    f"{ascii(value)[:60]} holds a lone surrogate (a \\ud800-\\udfff escape "
                    "without its pair, or a byte that is not UTF-8), which is not Unicode text "
                    "Postgres can store"
                )
    return None


app = group()
db_app = group(
    help="The database schema and the workers' role.",
    epilog=examples(
        "vultrscale db init",
        "vultrscale --config /etc/vultrscale/vultrscale.toml db init",
    ),
)
app.add_typer(db_app, name="db")
queue_app = group(
    help="The queue in the database, as the scaler reads it.",
    epilog=examples("vultrscale queue detect", "vultrscale queue detect --json"),
)
app.add_typer(queue_app, name="queue")


@db_app.command(
    "init",
    short_help="Create or upgrade the schema and the workers' role.",
    epilog=examples("DATABASE_URL=postgresql://... vultrscale db init"),
)
def db_init() -> None:
    """Create or upgrade the schema and the workers' role with its grants (idempotent); with
    a directory of fleets, each fleet's workers' role."""
    from vultrscale.cli._common import load_fleets
    from vultrscale.db import roles

    fleets = load_fleets()
    shown: set[str] = set()
    for cfg in fleets.configs:
        for line in roles.init_database(database_url(cfg), cfg):
            if line not in shown:  # the schema's line, and a role two fleets share, once
                shown.add(line)
                typer.echo(line)
    bad = fleets.bad_error()
    if bad is not None:
        raise bad


@app.command(
    "worker",
    epilog=examples(
        "vultrscale worker --app myjobs:handle",
        "vultrscale worker --app myjobs:handle --queue emails --concurrency 8",
        "vultrscale worker --app myjobs:handle --drain-seconds 2m --lease-seconds 90s",
    ),
)
def worker_cmd(
    app_spec: Annotated[
        str | None,
        typer.Option(
            "--app",
            metavar="MODULE:FUNC",
            help=shown("The job handler.", "$VULTRSCALE_WORKER_APP"),
            show_default=False,
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency", metavar="N", help=shown("Jobs run at once.", "4"), show_default=False
        ),
    ] = None,
    drain_seconds: Annotated[
        timedelta | None,
        typer.Option(
            "--drain-seconds",
            parser=params.duration(),
            metavar="DURATION",
            help=shown("On SIGTERM, wait this long for jobs.", "20s"),
            show_default=False,
        ),
    ] = None,
    lease_seconds: Annotated[
        timedelta | None,
        typer.Option(
            "--lease-seconds",
            parser=params.duration(),
            metavar="DURATION",
            help=shown("Lease per job, renewed every third.", "60s"),
            show_default=False,
        ),
    ] = None,
    queue_name: Annotated[
        str | None,
        typer.Option(
            "--queue",
            parser=params.queue_name,
            metavar="NAME",
            help=shown("Queue to take jobs from.", "default"),
            show_default=False,
        ),
    ] = None,
    outage_seconds: Annotated[
        timedelta | None,
        typer.Option(
            "--outage-seconds",
            parser=params.duration(),
            metavar="DURATION",
            help=shown(
                "Ride out an unreachable database this long, then exit 1 (0: the lease time).",
                "0s",
            ),
            show_default=False,
        ),
    ] = None,
    backoff: Annotated[
        timedelta,
        typer.Option(
            "--backoff-seconds",
            parser=params.duration(),
            metavar="DURATION",
            show_default=False,
            help=shown("First retry delay; doubles per attempt.", "2s"),
        ),
    ] = timedelta(seconds=2),
) -> None:
    """The reference worker runtime: claim, lease, heartbeat, drain on SIGTERM."""
    from vultrscale import config as cfg_mod
    from vultrscale.worker import runtime

    flags = {
        "worker.app": app_spec,
        "worker.concurrency": concurrency,
        "worker.drain_seconds": params.seconds(drain_seconds),
        "worker.lease_seconds": params.seconds(lease_seconds),
        "worker.queue": queue_name,
        "worker.outage_seconds": params.seconds(outage_seconds),
    }
    # VULTRSCALE_WORKER_ID names the process, it is not a [worker] config key.
    env = {k: v for k, v in os.environ.items() if k != "VULTRSCALE_WORKER_ID"}
    cfg = cfg_mod.load(state.config_path, env, flags)
    w = cfg.worker
    handler = runtime.load_handler(w.app)  # exit 2 before touching the database
    conninfo = database_url(cfg, worker=True)
    worker_id = os.environ.get("VULTRSCALE_WORKER_ID", "").strip() or runtime.default_worker_id()
    settings = runtime.WorkerSettings(
        app=w.app,
        concurrency=w.concurrency,
        drain_seconds=w.drain_seconds,
        lease_seconds=w.lease_seconds,
        queue=w.queue,
        worker_id=worker_id,
        instance_label=os.environ.get("VULTRSCALE_INSTANCE_LABEL", "").strip() or worker_id,
        backoff_seconds=backoff.total_seconds(),
        outage_seconds=w.outage_seconds,
    )
    if not state.debug:
        # The pool logs each failed reconnect; the worker reports a lost database once, itself.
        import logging

        logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    runtime.Worker(settings, conninfo, handler, say=typer.echo).run()


@app.command(
    "enqueue",
    epilog=examples(
        "vultrscale enqueue --count 20",
        'vultrscale enqueue --queue emails --payload \'{"to": "a@example.com"}\'',
    ),
)
def enqueue_cmd(
    count: Annotated[
        int,
        typer.Option(
            "--count",
            parser=params.count(params.MAX_ENQUEUE_COUNT),
            metavar="N",
            help="How many jobs.",
        ),
    ] = 1,
    payload: Annotated[
        str, typer.Option("--payload", metavar="JSON", help="JSON payload of each job.")
    ] = "{}",
    queue_name: Annotated[
        str,
        typer.Option("--queue", parser=params.queue_name, metavar="NAME", help="Queue name."),
    ] = "default",
    max_attempts: Annotated[
        int,
        typer.Option(
            "--max-attempts",
            parser=params.count(),
            metavar="N",
            help="Attempts before a job is dead.",
        ),
    ] = DEFAULT_MAX_ATTEMPTS,
) -> None:
    """Put jobs on the built-in queue (tests, demo, smoke checks)."""
    try:
        doc = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--payload is not valid JSON: {exc.msg} at character {exc.pos}.",
            hint="Quote the whole payload for the shell, e.g. --payload '{\"step_seconds\": 1}'.",
        ) from None
    except RecursionError:
        raise UsageError(
            "--payload is nested too deeply to read (arrays or objects inside each other).",
            hint="Flatten the payload.",
        ) from None
    except ValueError as exc:  # an integer longer than Python reads (4300 digits)
        raise UsageError(f"--payload cannot be read: {exc}.", hint=_SHORTER) from None
    # What Postgres' jsonb refuses, refused here with the reason instead of a database error.
    problem = payload_problem(doc)
    if problem:
        raise UsageError(f"--payload: {problem}.", hint=_STORABLE)
    from vultrscale.cli._common import load_config
    from vultrscale.redaction import mask_url

    conninfo = database_url(load_config(any_fleet=True))  # its secrets: any fleet's
    from vultrscale.db import pg, queue

    with pg.session(conninfo, f"cannot enqueue at {mask_url(conninfo)}") as conn:
        ids = queue.enqueue(conn, [doc] * count, queue=queue_name, max_attempts=max_attempts)
    span = f"{ids[0]}" if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"
    typer.echo(f"Enqueued {len(ids)} job(s) on queue {queue_name!r}: id {span}.")


@queue_app.command(
    "detect",
    short_help="Name the queues whose tables the database holds, and count them.",
    epilog=examples(
        "DATABASE_URL=postgresql://... vultrscale queue detect",
        "vultrscale queue detect --json",
    ),
)
def queue_detect(as_json: JsonFlag = False) -> None:
    """Look in DATABASE_URL for the tables of every queue preset (vultrscale, Procrastinate,
    PgQueuer, graphile-worker, pg-boss) and print each one found with the numbers a reconcile
    pass reads from it: ready, in flight, stalled, the oldest ready job's age, and the recent
    finished jobs and arrivals the wait rule needs. Changes nothing. Exit 0 when a queue is
    found, 2 when none is (or only a version of one that its preset does not read)."""
    from vultrscale.cli._common import load_config
    from vultrscale.config import mask_url
    from vultrscale.db import detect, pg
    from vultrscale.db.presets import PRESETS

    cfg = load_config()
    url = database_url(cfg)
    with pg.session(url, f"cannot look for the queue at {mask_url(url)}") as conn:
        found = detect.detect(conn, cfg.queue)
    if as_json:
        print_json(
            {
                "database": mask_url(url),
                "configured": cfg.queue.preset,
                "presets": [d.to_json() for d in found],
            }
        )
    else:
        typer.echo(f"Queues in {mask_url(url)} (queue.preset = {cfg.queue.preset}):")
        for d in found:
            for line in _detected_lines(d, configured=d.preset == cfg.queue.preset):
                typer.echo(line)
    if not any(d.found for d in found):
        looked = "; ".join(
            f"{p.name}: {', '.join(p.tables)}" for p in PRESETS.values() if p.tables
        )
        raise UsageError(
            "no queue found whose preset can read it (looked for " + looked + ")",
            hint="Point DATABASE_URL at the queue's database, install the library's schema "
            'first, or read your own queue with queue.preset = "custom".',
        )
    if not any(d.found and d.preset == cfg.queue.preset for d in found):
        names = ", ".join(d.preset for d in found if d.found)
        typer.echo(
            f"Warning: queue.preset = {cfg.queue.preset!r} is not among those found here "
            f"({names}): set queue.preset to the queue your workers take.",
            err=True,
        )


def _detected_lines(d: detect_mod.Detected, *, configured: bool) -> list[str]:
    """A preset as `queue detect` shows it: found (and its numbers), not this version (what is
    missing), or not here (one line)."""
    from vultrscale.config import format_duration
    from vultrscale.db.presets import PRESETS
    from vultrscale.rules.waits import ARRIVAL_WINDOW, RECENT_WINDOW

    p = PRESETS[d.preset]
    mark = "  <- queue.preset" if configured else ""
    name = f"{p.name} ({p.supported})"
    if d.preset != "custom" and not d.tables_found:
        return [f"  {p.name}: not here{mark}"]
    if d.partial:
        return [
            f"  {name}: its tables are here, but not as the versions it reads make them"
            f"{mark}",
            *(f"      {m} is missing" for m in d.missing),
        ]
    version = f", {d.version}" if d.version else ""
    lines = [f"  {name}: found{version}{mark}"]
    s = d.signals
    if s is None:
        return [*lines, f"      signals unreadable: {d.error}"]
    lines.append(
        f"      ready {s.ready}, in flight {s.in_flight}, stalled/expired {s.expired_leases}, "
        f"oldest ready {s.oldest_ready_seconds:.0f} s"
    )
    if s.recent_jobs is None or s.recent_arrivals is None:
        lines.append(f"      no job history: {p.no_history or 'not reported'} (the depth rule)")
    else:
        mean = "-" if s.recent_job_seconds is None else f"{s.recent_job_seconds:.1f} s"
        lines.append(
            f"      finished {s.recent_jobs} (newest within {format_duration(RECENT_WINDOW)}, "
            f"mean run {mean}), arrived {s.recent_arrivals} within "
            f"{format_duration(ARRIVAL_WINDOW)}"
        )
    return lines
