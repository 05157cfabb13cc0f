#!/usr/bin/env python3
"""Benchmarks for the built-in queue; each prints its figures and a baseline from the same run.

--signals     read_signals() (the four signals in one read-only transaction) filtered to one
              queue and unfiltered, on a table with 2,000,000 finished + 20,000 ready jobs,
              median ms over --runs, against a count(*) of the same ready jobs on two copies
              of the table: one with an ordinary index on (state, queue, run_at, id), one with
              no index but the primary key. First with the ready rows fresh (unvacuumed), then
              after a VACUUM. -v prints the query plans (which index serves each count).
--throughput  no-op jobs per second through one `vultrscale worker` process (concurrency 4),
              through Procrastinate's own worker (`procrastinate worker`, concurrency 4, an
              async no-op task, log level warning) and through PgQueuer's (`pgqueuer.run`,
              at most 4 tasks at once in batches of 2, an async no-op entrypoint, psycopg's
              async driver: asyncpg is not a dependency here), each run on a fresh database,
              rounds in rotated order. Both baselines run async handlers: compare them with
              `--handlers async`.

Postgres: $DATABASE_URL (a server where this user may CREATE DATABASE; a scratch database is
created and dropped), else a throwaway server is started and stopped.

    python scripts/bench_queue.py --signals --throughput
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vultrscale.db import throwaway

HERE = Path(__file__).resolve().parent
BENCH_QUEUE = "bench"


def __getattr__(name: str) -> Any:
    """``bench_queue.procrastinate_app``: the App that `procrastinate --app` loads (lazily)."""
    if name == "procrastinate_app":
        return _procrastinate_app(os.environ["BENCH_DATABASE_URL"])
    raise AttributeError(name)


@contextlib.asynccontextmanager
async def pgqueuer_factory() -> Any:
    """For ``pgqueuer.run``: a PgQueuer with one async no-op entrypoint, on psycopg's async
    driver (the library the rest of the bench uses)."""
    import psycopg
    from pgqueuer import PgQueuer
    from pgqueuer.db import PsycopgDriver

    conn = await psycopg.AsyncConnection.connect(os.environ["BENCH_DATABASE_URL"], autocommit=True)
    pgq = PgQueuer(PsycopgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job: Any) -> None:
        return None

    try:
        yield pgq
    finally:
        await conn.close()


def _pgqueuer(url: str, use: Callable[[Any], Any]) -> Any:
    """Run ``use(queries)`` (a coroutine) with PgQueuer's Queries on a fresh connection."""
    import asyncio

    import psycopg
    from pgqueuer import Queries

    async def go() -> Any:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            return await use(Queries.from_psycopg_connection(conn))
        finally:
            await conn.close()

    return asyncio.run(go())


def _procrastinate_app(url: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop", queue=BENCH_QUEUE)
    async def noop() -> None:
        return None

    return app


# --- database --------------------------------------------------------------------------------


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


# --- --signals -------------------------------------------------------------------------------


_FINISHED_SQL = """
INSERT INTO {table} (queue, state, attempts, run_at, created_at, finished_at)
SELECT CASE WHEN g %% 5 = 0 THEN 'reports' ELSE 'default' END,
       CASE WHEN g %% 100 = 0 THEN 'dead' WHEN g %% 50 = 0 THEN 'failed' ELSE 'succeeded' END,
       1, now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, %s) g
"""
_READY_SQL = """
INSERT INTO {table} (queue, state, run_at)
SELECT CASE WHEN g %% 5 = 0 THEN 'reports' ELSE 'default' END, 'ready',
       now() - (g %% 600) * interval '1 second'
  FROM generate_series(1, %s) g
"""
# The baselines hold the same rows as `jobs` (ours: partial indexes on the ready rows):
#   jobs_plain  an ordinary (not partial) index on the same columns, state first
#   jobs_naive  no index but the primary key
_BASELINES = {
    "jobs_plain": "CREATE INDEX jobs_plain_idx ON jobs_plain (state, queue, run_at, id)",
    "jobs_naive": None,
}


def _count_sql(table: str, queue: str | None) -> str:
    where = f" AND queue = '{queue}'" if queue else ""
    return f"SELECT count(*) FROM {table} WHERE state = 'ready' AND run_at <= now(){where}"


def _count(conn: Any, table: str, queue: str | None) -> object:
    return conn.execute(_count_sql(table, queue)).fetchone()


def bench_signals(
    url: str, finished: int, ready: int, runs: int, queue: str, verbose: bool
) -> dict[str, float]:
    """read_signals filtered to ``queue`` (and unfiltered) against a count of the same ready
    jobs on the baseline tables, first with the ready rows fresh (unvacuumed: the finished
    rows were vacuumed before they arrived, as autovacuum would have), then after a VACUUM."""
    import psycopg

    from vultrscale.config import QueueConfig
    from vultrscale.db import schema
    from vultrscale.db.presets.builtin import COUNT_PLANNER, ready_count_query
    from vultrscale.db.signals import read_signals

    schema.migrate(url)
    leased, expired = 150, 50
    tables = ["jobs", *_BASELINES]
    t = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '256MB'")
        for table, index in _BASELINES.items():
            conn.execute(f"CREATE TABLE {table} (LIKE jobs INCLUDING DEFAULTS)")
            conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (id)")
            if index:
                conn.execute(index)
        for table in tables:
            conn.execute(_FINISHED_SQL.format(table=table), (finished,))
            conn.execute(f"VACUUM ANALYZE {table}")
        for table in tables:
            conn.execute(_READY_SQL.format(table=table), (ready,))
            conn.execute(f"ANALYZE {table}")  # autovacuum's analyze; no vacuum yet
        conn.execute(
            """
            WITH j AS (
                INSERT INTO jobs (state, attempts) SELECT 'leased', 1
                  FROM generate_series(1, %(n)s) RETURNING id)
            INSERT INTO job_leases (job_id, worker_id, expires_at, token)
            SELECT id, 'w' || (id %% 8),
                   CASE WHEN row_number() OVER (ORDER BY id) <= %(expired)s
                        THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END,
                   gen_random_uuid()
              FROM j
            """,
            {"n": leased + expired, "expired": expired},
        )
        conn.execute("ANALYZE job_leases")
        for table in _BASELINES:  # the same rows as ours: the leased ones too
            conn.execute(
                f"INSERT INTO {table} (state, attempts) SELECT 'leased', 1 "
                "FROM generate_series(1, %s)",
                (leased + expired,),
            )
            conn.execute(f"ANALYZE {table}")
    print(
        f"built {finished:,} finished + {ready:,} ready jobs in each of {', '.join(tables)} "
        f"(+ {leased + expired} leased in each, {expired} of them expired in jobs) in "
        f"{time.perf_counter() - t:.1f} s"
    )
    print(
        f"compares: read_signals (4 signals, 1 txn; ours: partial indexes) filtered to queue "
        f"{queue!r} and unfiltered, against a bare count(*) of the same ready jobs with an "
        "ordinary index on (state, queue, run_at, id) and with no index; unvacuumed, then vacuumed"
    )
    cfg_all = QueueConfig(preset="vultrscale")
    cfg_one = QueueConfig(preset="vultrscale", queue=queue)
    figures: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        s = read_signals(conn, cfg_one)
        for table in tables:
            row = conn.execute(_count_sql(table, queue)).fetchone()
            assert row is not None and row[0] == s.ready, (table, row, s)
        assert (read_signals(conn, cfg_all).in_flight, s.expired_leases) == (leased, expired), s
        for phase in ("unvacuumed", "vacuumed"):
            if phase == "vacuumed":
                for table in tables:
                    conn.execute(f"VACUUM ANALYZE {table}")
            if verbose:
                from vultrscale.db.signals import explain_ready_count

                print(f"plan of our ready count, queue {queue!r}, {phase}:")
                for line in explain_ready_count(conn, cfg_one):
                    print(f"    {line}")
                for table in _BASELINES:
                    print(f"plan of the baseline count on {table}, {phase}:")
                    for (line,) in conn.execute("EXPLAIN " + _count_sql(table, queue)):
                        print(f"    {line}")

            def ours_count() -> object:
                """Our ready count alone, as read_signals runs it: like for like with the
                baselines' one count."""
                with conn.transaction():
                    conn.execute(COUNT_PLANNER)
                    return conn.execute(ready_count_query(queue)).fetchone()

            def planned(table: str) -> object:
                """A baseline's count under our read's planner settings."""
                with conn.transaction():
                    conn.execute(COUNT_PLANNER)
                    return _count(conn, table, queue)

            # Each baseline is timed under the planner's defaults and under our read's settings;
            # the faster of the two is its figure, so neither setting flatters ours.
            reads: dict[str, Callable[[], object]] = {
                "ours_one": lambda: read_signals(conn, cfg_one),
                "ours_count": ours_count,
                "ours_all": lambda: read_signals(conn, cfg_all),
                **{table: functools.partial(_count, conn, table, queue) for table in _BASELINES},
                **{f"{t}_ours_planner": functools.partial(planned, t) for t in _BASELINES},
            }
            for fn in reads.values():  # warm the caches
                _median_ms(fn, 2)
            # Interleaved in rotated order, so that each sees the same cache and machine load.
            times: dict[str, list[float]] = {name: [] for name in reads}
            names = list(reads)
            for r in range(runs):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    times[name].append(_median_ms(reads[name], 1))
            med = {name: statistics.median(v) for name, v in times.items()}
            for table in _BASELINES:
                med[f"{table}_default_planner"] = med[table]
                med[table] = min(med[table], med[f"{table}_ours_planner"])
            figures.update({f"{name}_{phase}_ms": m for name, m in med.items()})
            print(f"{phase}, median of {runs} runs:")
            print(f"  read_signals, queue={queue!r} (ours)             {med['ours_one']:8.2f} ms")
            print(f"  read_signals, all queues (ours)                 {med['ours_all']:8.2f} ms")
            print(f"  count(*) of ready, our partial indexes (jobs)   {med['ours_count']:8.2f} ms")
            for table, what in (("jobs_plain", "ordinary index"), ("jobs_naive", "no index")):
                label = f"{what} ({table})"
                print(
                    f"  count(*) of ready, {label:<28} {med[table]:8.2f} ms (planner "
                    f"defaults {med[f'{table}_default_planner']:.2f}, "
                    f"ours {med[f'{table}_ours_planner']:.2f}: the faster counts)"
                )
            print(
                "  count alone, ordinary index / ours: "
                f"{med['jobs_plain'] / med['ours_count']:.2f}x; "
                f"no index / ours: {med['jobs_naive'] / med['ours_count']:.1f}x"
            )
    return figures


# --- --throughput ----------------------------------------------------------------------------


def _wait(check: Callable[[], bool], deadline_s: float, what: str, proc: subprocess.Popen) -> None:
    end = time.monotonic() + deadline_s
    while not check():
        if proc.poll() is not None:
            raise SystemExit(f"{what}: the worker exited with {proc.returncode}")
        if time.monotonic() > end:
            raise SystemExit(f"{what}: not reached within {deadline_s:g} s")
        time.sleep(0.02)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run_rate(
    name: str,
    cmd: list[str],
    env: dict[str, str],
    enqueue: Callable[[int], None],
    done: Callable[[], int],
    jobs: int,
    log: Path,
) -> float:
    """Start the worker, warm it up with one job, then time ``jobs`` jobs from enqueue to done."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            base = done()
            enqueue(1)
            _wait(lambda: done() >= base + 1, 60, f"{name} warm-up", proc)
            enqueue(jobs)
            t0 = time.perf_counter()
            _wait(lambda: done() >= base + 1 + jobs, 600, f"{name} {jobs} jobs", proc)
            elapsed = time.perf_counter() - t0
        finally:
            _stop(proc)
    rate = jobs / elapsed
    print(f"{name:<44} {jobs:>6} jobs in {elapsed:6.2f} s = {rate:8.0f} jobs/s")
    return rate


def _system_run(
    name: str,
    url: str,
    jobs: int,
    concurrency: int,
    logfile: Path,
    plog: str,
    label_prefix: str,
) -> float:
    """One timed run of one system on a fresh database (both schemas, nothing else in it)."""
    import psycopg

    from vultrscale.db import queue, schema

    schema.migrate(url)
    # Build the App from the imported module, as the worker does (not from __main__).
    sys.path.insert(0, str(HERE))
    import bench_queue

    papp = bench_queue._procrastinate_app(url)
    env = dict(os.environ, DATABASE_URL=url, BENCH_DATABASE_URL=url)
    env.pop("WORKER_DATABASE_URL", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH", "")]))
    with psycopg.connect(url, autocommit=True) as conn, papp.open():
        papp.schema_manager.apply_schema()
        if name == "procrastinate":
            task = papp.tasks["noop"]
            label = f"procrastinate worker (async no-op, c={concurrency})"
            cmd = [
                sys.executable, "-m", "procrastinate",
                "--app", "bench_queue.procrastinate_app",
                # Default warning: no log line per job, as our worker writes none.
                "--log-level", plog,
                "worker", "--queues", BENCH_QUEUE, "--concurrency", str(concurrency),
            ]  # fmt: skip

            def enqueue(n: int) -> None:
                task.batch_defer(*([{}] * n))

            done_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        elif name == "pgqueuer":
            _pgqueuer(url, lambda q: q.install())
            label = f"pgqueuer.run (async no-op, max {concurrency} tasks)"
            # PgQueuer's own runner (pgqueuer.run, what `pgqueuer run` calls): its CLI fails
            # under this Typer release before it starts (a log level read as text).
            run = (
                # At most `concurrency` jobs at once, as our worker's; PgQueuer wants its
                # global limit at least twice its batch size (an entrypoint's own limit made
                # it wait for the next notification or the 30 s dequeue timeout: 2 jobs/s).
                "import asyncio, pgqueuer, bench_queue; "
                "asyncio.run(pgqueuer.run(bench_queue.pgqueuer_factory, "
                f"batch_size={max(1, concurrency // 2)}, max_concurrent_tasks={concurrency}))"
            )
            cmd = [sys.executable, "-c", run]
            enqueued = [0]

            def enqueue(n: int) -> None:
                _pgqueuer(url, lambda q: q.enqueue(["noop"] * n, [None] * n, [0] * n))
                enqueued[0] += n

            # A finished job leaves the pgqueuer table (its log row is written in batches):
            # done = enqueued - still there.
            done_sql = "SELECT %s - count(*) FROM pgqueuer WHERE entrypoint = 'noop'"
        else:
            handler = name.removeprefix("vultrscale-")
            func = "noop" if handler == "sync" else "noop_async"
            label = f"vultrscale worker ({handler} no-op, c={concurrency})"
            cmd = [
                sys.executable, "-m", "vultrscale.cli", "worker",
                "--app", f"vultrscale.worker.examples:{func}",
                "--concurrency", str(concurrency), "--queue", BENCH_QUEUE,
            ]  # fmt: skip

            def enqueue(n: int) -> None:
                queue.enqueue(conn, [{}] * n, queue=BENCH_QUEUE)

            done_sql = (
                f"SELECT count(*) FROM jobs WHERE queue = '{BENCH_QUEUE}' AND state = 'succeeded'"
            )

        def done() -> int:
            if name == "pgqueuer":
                row = conn.execute(done_sql, (enqueued[0],)).fetchone()  # type: ignore[arg-type]
            else:
                row = conn.execute(done_sql).fetchone()  # type: ignore[arg-type]
            return int(row[0]) if row else 0

        return _run_rate(f"{label_prefix} {label}", cmd, env, enqueue, done, jobs, logfile)


def bench_throughput(
    admin: str,
    jobs: int,
    concurrency: int,
    handlers: list[str],
    rounds: int,
    logdir: Path,
    plog: str = "warning",
) -> dict[str, float]:
    print(
        f"compares: no-op jobs/s through one `vultrscale worker` against Procrastinate's and "
        f"PgQueuer's own workers (async handlers), concurrency {concurrency}, {jobs} jobs, each "
        f"run on a fresh database, {rounds} round(s) in rotated order"
    )
    names = [f"vultrscale-{h}" for h in handlers] + ["procrastinate", "pgqueuer"]
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        # Rotate the order each round: the machine's load drifts.
        for name in names[r % len(names) :] + names[: r % len(names)]:
            # A fresh database per run: finished rows of earlier runs must not slow this one.
            with throwaway.scratch_database(admin, prefix="vs_bench_") as url:
                rates[name].append(
                    _system_run(
                        name,
                        url,
                        jobs,
                        concurrency,
                        logdir / f"bench-{name}-{r + 1}.log",
                        plog,
                        f"[{r + 1}/{rounds}]",
                    )
                )
    medians = {name: statistics.median(v) for name, v in rates.items()}
    print(f"median over {rounds} round(s), {jobs} no-op jobs each, concurrency {concurrency}:")
    for name, m in medians.items():
        print(f"  {name:<24} {m:8.0f} jobs/s")
    for base_name in ("procrastinate", "pgqueuer"):
        base = medians[base_name]
        for name, m in medians.items():
            if name.startswith("vultrscale"):
                like = " (like for like: async)" if name.endswith("async") else " (sync vs async)"
                print(f"ratio {name} / {base_name}: {m / base:.2f}{like}")
    return {f"{name}_jobs_per_s": m for name, m in medians.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Postgres: $DATABASE_URL (scratch database created and dropped) or a throwaway.",
    )
    ap.add_argument("--signals", action="store_true", help="signal query vs naive count(*)")
    ap.add_argument(
        "--throughput", action="store_true", help="jobs/s: ours vs Procrastinate and PgQueuer"
    )
    ap.add_argument("--finished", type=int, default=2_000_000, help="finished jobs (--signals)")
    ap.add_argument("--ready", type=int, default=20_000, help="ready jobs (--signals)")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per query (--signals)")
    ap.add_argument("--queue", default="default", help="the queue --signals filters to")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the query plans")
    ap.add_argument("--json", action="store_true", help="end with the figures as JSON")
    ap.add_argument("--jobs", type=int, default=5000, help="jobs per worker (--throughput)")
    ap.add_argument("--concurrency", type=int, default=4, help="worker concurrency")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per worker (--throughput)")
    ap.add_argument(
        "--procrastinate-log-level",
        default="warning",
        choices=["debug", "info", "warning"],
        help="log level of Procrastinate's worker (info logs two lines per job)",
    )
    ap.add_argument(
        "--handlers",
        default="sync,async",
        help="our worker's no-op handler kinds to measure: sync, async or both (--throughput)",
    )
    ap.add_argument(
        "--logdir", type=Path, default=None, help="workers' logs (default: a temporary directory)"
    )
    args = ap.parse_args(argv)
    if not (args.signals or args.throughput):
        ap.error("choose --signals and/or --throughput")
    handlers = [h.strip() for h in args.handlers.split(",") if h.strip()]
    if not handlers or any(h not in ("sync", "async") for h in handlers):
        ap.error("--handlers: sync, async or sync,async")
    figures: dict[str, float] = {}
    with throwaway.given_or_throwaway(os.environ.get("DATABASE_URL")) as admin:
        # One database per benchmark (per run, for throughput): none sees another's rows.
        if args.signals:
            with throwaway.scratch_database(admin, prefix="vs_bench_") as url:
                figures.update(
                    bench_signals(
                        url, args.finished, args.ready, args.runs, args.queue, args.verbose
                    )
                )
        if args.throughput:
            logdir = args.logdir or Path(tempfile.mkdtemp(prefix="vultrscale-bench-"))
            figures.update(
                bench_throughput(
                    admin,
                    args.jobs,
                    args.concurrency,
                    handlers,
                    args.rounds,
                    logdir,
                    args.procrastinate_log_level,
                )
            )
            print(f"worker logs: {logdir}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
