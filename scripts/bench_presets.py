#!/usr/bin/env python3
"""Each queue preset's signal read on a big history: median ms, and the ratio to the built-in
preset's in the same run.

Every preset gets a database of its own with its library's schema (the built-in's migrations,
Procrastinate's schema.sql, PgQueuer's install DDL, the graphile-worker and pg-boss schemas
under tests/fixtures/) and the same queue: --finished jobs finished over the last 7 days (one
every 7 d / N, each ran 2 s; as the library records them: Procrastinate's events, PgQueuer's
log, pg-boss's completed rows), 20,000 ready jobs enqueued over the last 10 minutes, 200 in
flight of which 20 stalled (a stale heartbeat, an expired lease or lock). graphile-worker
deletes a job when it succeeds: its table gets 50,000 permanently failed jobs instead.

Then read_signals() --runs times per preset (median ms; the three round trips of a read of
its own: BEGIN, the statements in one pipeline, COMMIT), the presets in turn, the order
rotated each round (a shared machine's load drifts), the numbers each read, and with
--history the replay's read (`simulate --from-db --since 1d`) and the forecast's buckets over
28 days. -v prints each statement's plan (EXPLAIN ANALYZE).

Postgres: $DATABASE_URL (a server where this user may CREATE DATABASE; scratch databases are
created and dropped), else a throwaway server is started and stopped.

    python scripts/bench_presets.py                      # 1,000,000 finished jobs
    python scripts/bench_presets.py --finished 100000 --presets vultrscale,pgqueuer -v
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from vultrscale.config import QueueConfig
from vultrscale.db import history, throwaway
from vultrscale.db.presets import PRESETS
from vultrscale.db.signals import preset_read, read_signals

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
READY, IN_FLIGHT, STALLED = 20_000, 200, 20
FAILED_GRAPHILE = 50_000


def _step(n: int) -> str:
    """The interval between two finished jobs: N of them over 7 days."""
    return f"{7 * 86400 / max(1, n):.6f} seconds"


def fill_vultrscale(conn: psycopg.Connection[Any], n: int) -> None:
    from vultrscale.db import schema

    schema.migrate(conn.info.dsn)
    conn.execute(
        f"""
        INSERT INTO jobs (queue, state, attempts, run_at, created_at, started_at, finished_at)
        SELECT 'default', 'succeeded', 1, t, t, t + interval '1 second', t + interval '3 seconds'
          FROM (SELECT now() - interval '7 days' + g * interval '{_step(n)}' AS t
                  FROM generate_series(1, {n}) g) s
        """
    )
    conn.execute(
        f"""
        INSERT INTO jobs (queue, state, run_at, created_at)
        SELECT 'default', 'ready', t, t FROM (
            SELECT now() - interval '10 minutes' + g * interval '0.03 seconds' AS t
              FROM generate_series(1, {READY}) g) s
        """
    )
    conn.execute(
        f"""
        WITH j AS (
            INSERT INTO jobs (queue, state, attempts, run_at, created_at, started_at)
            SELECT 'default', 'leased', 1, now() - interval '1 minute',
                   now() - interval '1 minute', now() - interval '30 seconds'
              FROM generate_series(1, {IN_FLIGHT}) RETURNING id)
        INSERT INTO job_leases (job_id, worker_id, expires_at, token)
        SELECT id, 'w' || (id % 10),
               CASE WHEN row_number() OVER (ORDER BY id) <= {STALLED}
                    THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END,
               gen_random_uuid()
          FROM j
        """
    )


def fill_procrastinate(conn: psycopg.Connection[Any], n: int) -> None:
    import procrastinate

    conn.execute((Path(procrastinate.__file__).parent / "sql" / "schema.sql").read_bytes())
    # The rows as Procrastinate's triggers would have written them, faster: triggers off.
    conn.execute("ALTER TABLE procrastinate_jobs DISABLE TRIGGER USER")
    conn.execute(
        "INSERT INTO procrastinate_workers (last_heartbeat) "
        "VALUES (now()), (now() - interval '5 minutes')"
    )
    conn.execute(
        f"""
        INSERT INTO procrastinate_jobs (queue_name, task_name, status, attempts)
        SELECT 'default', 'task', 'succeeded', 1 FROM generate_series(1, {n});
        INSERT INTO procrastinate_jobs (queue_name, task_name, status, attempts, worker_id)
        SELECT 'default', 'task', 'doing', 0, CASE WHEN g <= {STALLED} THEN 2 ELSE 1 END
          FROM generate_series(1, {IN_FLIGHT}) g;
        INSERT INTO procrastinate_jobs (queue_name, task_name, status)
        SELECT 'default', 'task', 'todo' FROM generate_series(1, {READY});
        """
    )
    # Events in the order they happened (ids grow with time, as Procrastinate writes them).
    conn.execute(
        f"""
        INSERT INTO procrastinate_events (job_id, type, at)
        SELECT job_id, type::procrastinate_job_event_type, at FROM (
            SELECT j.id AS job_id, e.type, t + e.after AS at
              FROM (SELECT id, now() - interval '7 days' + id * interval '{_step(n)}' AS t
                      FROM procrastinate_jobs WHERE id <= {n}) j
             CROSS JOIN (VALUES ('deferred', interval '0'), ('started', interval '1 second'),
                                ('succeeded', interval '3 seconds')) e(type, after)
            UNION ALL
            SELECT id, e.type, now() - interval '1 minute' + e.after
              FROM procrastinate_jobs CROSS JOIN (VALUES ('deferred', interval '0'),
                   ('started', interval '30 seconds')) e(type, after)
             WHERE status = 'doing'
            UNION ALL
            SELECT id, 'deferred', now() - interval '10 minutes'
                   + (id - {n + IN_FLIGHT}) * interval '0.03 seconds'
              FROM procrastinate_jobs WHERE status = 'todo'
        ) e ORDER BY at
        """
    )
    conn.execute("ALTER TABLE procrastinate_jobs ENABLE TRIGGER USER")


def fill_pgqueuer(conn: psycopg.Connection[Any], n: int) -> None:
    from pgqueuer.adapters.persistence import schema_ddl
    from pgqueuer.domain.settings import DBSettings

    conn.execute(schema_ddl.render_install(DBSettings()).encode())
    conn.execute(
        f"""
        INSERT INTO pgqueuer (priority, status, entrypoint, execute_after, created)
        SELECT 0, 'queued', 'default', t, t FROM (
            SELECT now() - interval '10 minutes' + g * interval '0.03 seconds' AS t
              FROM generate_series(1, {READY}) g) s;
        INSERT INTO pgqueuer (priority, status, entrypoint, queue_manager_id, heartbeat)
        SELECT 0, 'picked', 'default', CASE WHEN g <= {STALLED}
               THEN '00000000-0000-0000-0000-000000000002'::uuid
               ELSE '00000000-0000-0000-0000-000000000001'::uuid END,
               CASE WHEN g <= {STALLED} THEN now() - interval '5 minutes' ELSE now() END
          FROM generate_series(1, {IN_FLIGHT}) g;
        """
    )
    # The log as PgQueuer writes it (queued, picked, successful per finished job), in time
    # order; job ids below the live table's (finished jobs left it).
    conn.execute(
        f"""
        INSERT INTO pgqueuer_log (job_id, status, entrypoint, priority, created)
        SELECT job_id, status::pgqueuer_status, 'default', 0, at FROM (
            SELECT -g AS job_id, e.status,
                   now() - interval '7 days' + g * interval '{_step(n)}' + e.after AS at
              FROM generate_series(1, {n}) g
             CROSS JOIN (VALUES ('queued', interval '0'), ('picked', interval '1 second'),
                                ('successful', interval '3 seconds')) e(status, after)
            UNION ALL
            SELECT id, 'queued', created FROM pgqueuer
        ) l ORDER BY at
        """
    )


def fill_graphile(conn: psycopg.Connection[Any], n: int) -> None:
    conn.execute((FIXTURES / "graphile-worker-0.18.0.schema.sql").read_bytes())
    conn.execute("INSERT INTO graphile_worker._private_tasks (identifier) VALUES ('task')")
    conn.execute(
        f"""
        INSERT INTO graphile_worker._private_jobs (task_id, run_at, attempts, max_attempts,
                                                   created_at, last_error)
        SELECT 1, now() - interval '2 days', 25, 25, now() - interval '3 days', 'boom'
          FROM generate_series(1, {FAILED_GRAPHILE});
        INSERT INTO graphile_worker._private_jobs (task_id, run_at, created_at)
        SELECT 1, t, t FROM (
            SELECT now() - interval '10 minutes' + g * interval '0.03 seconds' AS t
              FROM generate_series(1, {READY}) g) s;
        INSERT INTO graphile_worker._private_jobs (task_id, run_at, attempts, locked_at,
                                                   locked_by)
        SELECT 1, now() - interval '1 minute', 1,
               CASE WHEN g <= {STALLED} THEN now() - interval '5 hours' ELSE now() END,
               CASE WHEN g <= {STALLED} THEN 'pool-dead' ELSE 'pool-live' END
          FROM generate_series(1, {IN_FLIGHT}) g;
        """
    )


def fill_pgboss(conn: psycopg.Connection[Any], n: int) -> None:
    conn.execute((FIXTURES / "pg-boss-12.38.1.schema.sql").read_bytes())
    conn.execute("SELECT pgboss.create_queue('default', '{\"policy\": \"standard\"}')")
    conn.execute(
        f"""
        INSERT INTO pgboss.job (name, state, created_on, start_after, started_on, completed_on)
        SELECT 'default', 'completed', t, t, t + interval '1 second', t + interval '3 seconds'
          FROM (SELECT now() - interval '7 days' + g * interval '{_step(n)}' AS t
                  FROM generate_series(1, {n}) g) s;
        INSERT INTO pgboss.job (name, state, created_on, start_after)
        SELECT 'default', 'created', t, t FROM (
            SELECT now() - interval '10 minutes' + g * interval '0.03 seconds' AS t
              FROM generate_series(1, {READY}) g) s;
        INSERT INTO pgboss.job (name, state, created_on, start_after, started_on)
        SELECT 'default', 'active', now() - interval '20 minutes', now() - interval '20 minutes',
               CASE WHEN g <= {STALLED} THEN now() - interval '16 minutes' ELSE now() END
          FROM generate_series(1, {IN_FLIGHT}) g;
        """
    )


# Filling takes a while: the live workers' heartbeats are beaten again just before the reads.
BEAT = {
    "procrastinate": "UPDATE procrastinate_workers SET last_heartbeat = now() WHERE id = 1",
    "pgqueuer": "UPDATE pgqueuer SET heartbeat = now() "
    "WHERE queue_manager_id = '00000000-0000-0000-0000-000000000001'",
}

FILL: dict[str, Callable[[psycopg.Connection[Any], int], None]] = {
    "vultrscale": fill_vultrscale,
    "procrastinate": fill_procrastinate,
    "pgqueuer": fill_pgqueuer,
    "graphile-worker": fill_graphile,
    "pg-boss": fill_pgboss,
}


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def _explain(conn: psycopg.Connection[Any], cfg: QueueConfig) -> None:
    for statement in preset_read(cfg).statements:
        query = statement.query
        text = query if isinstance(query, str) else query.as_string(conn)
        if not text.lstrip().upper().startswith("SELECT SET_CONFIG"):
            plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {text}").fetchall()
            print("\n".join(f"      {row[0]}" for row in plan), "\n")


def fill(admin: str, name: str, n: int, stack: ExitStack) -> str:
    """A database of its own for the preset, filled; dropped when ``stack`` closes."""
    url = stack.enter_context(throwaway.scratch_database(admin, prefix="vs_bench_"))
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        FILL[name](conn, n)
        conn.execute("VACUUM ANALYZE")
    print(f"  {name:16} filled in {time.perf_counter() - t0:.0f} s", flush=True)
    return url


def measure(urls: dict[str, str], runs: int) -> dict[str, float]:
    """Median ms of each preset's read_signals, the presets taken in turn, the order rotated
    each round: a machine whose load drifts slows them alike."""
    conns = {name: psycopg.connect(url, autocommit=True) for name, url in urls.items()}
    try:
        for name, conn in conns.items():
            if name in BEAT:
                conn.execute(BEAT[name])  # type: ignore[arg-type]
            read_signals(conn, QueueConfig(preset=name))  # warm the cache and the plans
        times: dict[str, list[float]] = {name: [] for name in urls}
        names = list(urls)
        for r in range(runs):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t = time.perf_counter()
                read_signals(conns[name], QueueConfig(preset=name))
                times[name].append((time.perf_counter() - t) * 1000)
        return {name: statistics.median(ms) for name, ms in times.items()}
    finally:
        for conn in conns.values():
            conn.close()


def show(url: str, name: str, with_history: bool, runs: int, verbose: bool) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        if name in BEAT:
            conn.execute(BEAT[name])  # type: ignore[arg-type]
        s = read_signals(conn, QueueConfig(preset=name))
        print(
            f"{name:16} ready {s.ready}, in flight {s.in_flight}, stalled {s.expired_leases}, "
            f"oldest {s.oldest_ready_seconds:.0f} s, recent {s.recent_jobs} job(s) "
            f"mean {s.recent_job_seconds} s, arrivals {s.recent_arrivals}"
        )
        if verbose:
            _explain(conn, QueueConfig(preset=name))
        if with_history and PRESETS[name].history is not None:
            _history(conn, name, runs)


def _history(conn: psycopg.Connection[Any], name: str, runs: int) -> None:
    now = datetime.now(UTC)
    day = timedelta(days=1)
    rows: list[Any] = []

    def replay() -> None:
        rows[:] = history.finished_jobs_in(conn, day, preset=name)

    ms = _median_ms(replay, max(1, runs // 4))
    print(f"    simulate --from-db --since 1d: {len(rows)} jobs in {ms:.0f} ms")
    got: list[Any] = []

    def buckets() -> None:
        got[:] = history.forecast_buckets(conn, now - 28 * day, now, timedelta(hours=1), "", name)

    ms = _median_ms(buckets, max(1, runs // 4))
    print(f"    forecast buckets, 28 days: {len(got)} buckets in {ms:.0f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--finished", type=int, default=1_000_000, help="finished jobs")
    parser.add_argument("--runs", type=int, default=41, help="reads per preset (the median)")
    parser.add_argument(
        "--presets", default=",".join(FILL), help=f"comma-separated, of {', '.join(FILL)}"
    )
    parser.add_argument("--history", action="store_true", help="time the history reads too")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the plans")
    args = parser.parse_args(argv)
    names = [p for p in args.presets.split(",") if p]
    unknown = [p for p in names if p not in FILL]
    if unknown:
        parser.error(f"unknown preset(s): {', '.join(unknown)}")
    if "vultrscale" not in names:
        names.insert(0, "vultrscale")  # the baseline of the ratios
    given = os.environ.get("DATABASE_URL")
    print(
        f"{args.finished:,} finished jobs, {READY:,} ready, {IN_FLIGHT} in flight "
        f"({STALLED} stalled); median of {args.runs} reads"
    )
    with throwaway.given_or_throwaway(given) as admin, ExitStack() as stack:
        urls = {name: fill(admin, name, args.finished, stack) for name in names}
        medians = measure(urls, args.runs)
        for name, url in urls.items():
            show(url, name, args.history, args.runs, args.verbose)
    base = medians["vultrscale"]
    print("\npreset           median ms   x built-in")
    for name, ms in medians.items():
        print(f"{name:16} {ms:9.2f}   {ms / base:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
