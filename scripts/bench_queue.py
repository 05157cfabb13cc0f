#!/usr/bin/env python3
"""Benchmarks for the built-in queue; each prints its figures and a baseline from the same run.

--signals     read_signals() (the four signals in one read-only transaction) on a table with
              2,000,000 finished + 20,000 ready jobs, median ms over --runs, against a naive
              count(*) of the ready jobs on a copy of the table that has no partial indexes.
--throughput  no-op jobs per second through one `vultrscale worker` process (concurrency 4)
              and, on the same database in the same run, through Procrastinate's own worker
              (`procrastinate worker`, concurrency 4, an async no-op task, log level warning).

Postgres: $DATABASE_URL (a server where this user may CREATE DATABASE; a scratch database is
created and dropped), else a throwaway server is started and stopped.

    python scripts/bench_queue.py --signals --throughput
"""

from __future__ import annotations

import argparse
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


def bench_signals(url: str, finished: int, ready: int, runs: int) -> None:
    import psycopg

    from vultrscale.config import QueueConfig
    from vultrscale.db import schema
    from vultrscale.db.signals import read_signals

    schema.migrate(url)
    leased, expired = 150, 50
    t = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO jobs (queue, state, attempts, run_at, created_at, finished_at)
            SELECT CASE WHEN g %% 5 = 0 THEN 'reports' ELSE 'default' END,
                   CASE WHEN g %% 100 = 0 THEN 'dead' WHEN g %% 50 = 0 THEN 'failed'
                        ELSE 'succeeded' END,
                   1, now() - interval '2 days', now() - interval '2 days',
                   now() - interval '1 day'
              FROM generate_series(1, %s) g
            """,
            (finished,),
        )
        conn.execute(
            """
            INSERT INTO jobs (queue, state, run_at)
            SELECT CASE WHEN g %% 5 = 0 THEN 'reports' ELSE 'default' END, 'ready',
                   now() - (g %% 600) * interval '1 second'
              FROM generate_series(1, %s) g
            """,
            (ready,),
        )
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
        # The baseline: the same rows, no partial indexes (only the primary key).
        conn.execute("CREATE TABLE jobs_naive (LIKE jobs INCLUDING DEFAULTS)")
        conn.execute("INSERT INTO jobs_naive SELECT * FROM jobs")
        conn.execute("ALTER TABLE jobs_naive ADD PRIMARY KEY (id)")
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("VACUUM ANALYZE job_leases")
        conn.execute("VACUUM ANALYZE jobs_naive")
    print(
        f"built {finished:,} finished + {ready:,} ready + {leased + expired} leased jobs "
        f"({expired} leases expired) in {time.perf_counter() - t:.1f} s"
    )

    with psycopg.connect(url, autocommit=True) as conn:
        cfg_all = QueueConfig(preset="vultrscale")
        cfg_one = QueueConfig(preset="vultrscale", queue="default")
        s = read_signals(conn, cfg_all)
        row = conn.execute(
            "SELECT count(*) FROM jobs_naive WHERE state = 'ready' AND run_at <= now()"
        ).fetchone()
        assert row is not None and s.ready == row[0] == ready, (s, row)
        assert (s.in_flight, s.expired_leases) == (leased, expired), s
        print(
            f"signals: ready={s.ready} in_flight={s.in_flight} expired={s.expired_leases} "
            f"oldest={s.oldest_ready_seconds:.0f}s workers={len(s.leases_by_worker)}"
        )

        def naive() -> None:
            conn.execute(
                "SELECT count(*) FROM jobs_naive WHERE state = 'ready' AND run_at <= now()"
            ).fetchone()

        for fn in (lambda: read_signals(conn, cfg_all), naive):  # warm the caches
            _median_ms(fn, 3)
        # Interleave the three so that they see the same cache and machine load.
        t_all: list[float] = []
        t_one: list[float] = []
        t_naive: list[float] = []
        for _ in range(runs):
            t_all.append(_median_ms(lambda: read_signals(conn, cfg_all), 1))
            t_one.append(_median_ms(lambda: read_signals(conn, cfg_one), 1))
            t_naive.append(_median_ms(naive, 1))
    m_all, m_one, m_naive = (statistics.median(x) for x in (t_all, t_one, t_naive))
    print(f"read_signals, all queues (4 signals, 1 txn)   median {m_all:8.2f} ms  ({runs} runs)")
    print(f"read_signals, queue='default'                 median {m_one:8.2f} ms")
    print(f"naive count(*) of ready, no partial indexes   median {m_naive:8.2f} ms")
    print(f"ratio naive / read_signals (all queues): {m_naive / m_all:.1f}x")


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


def bench_throughput(
    url: str,
    jobs: int,
    concurrency: int,
    handlers: list[str],
    rounds: int,
    logdir: Path,
    plog: str = "warning",
) -> None:
    import psycopg

    from vultrscale.db import queue, schema

    schema.migrate(url)
    # Build the App from the imported module, as the worker does (not from __main__).
    sys.path.insert(0, str(HERE))
    import bench_queue

    papp = bench_queue._procrastinate_app(url)
    with papp.open():
        papp.schema_manager.apply_schema()

    env = dict(os.environ, DATABASE_URL=url, BENCH_DATABASE_URL=url)
    env.pop("WORKER_DATABASE_URL", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH", "")]))
    conn = psycopg.connect(url, autocommit=True)

    def ours_enqueue(n: int) -> None:
        queue.enqueue(conn, [{}] * n, queue=BENCH_QUEUE)

    def ours_done() -> int:
        row = conn.execute(
            "SELECT count(*) FROM jobs WHERE queue = %s AND state = 'succeeded'", (BENCH_QUEUE,)
        ).fetchone()
        return int(row[0]) if row else 0

    def p_done() -> int:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()
        return int(row[0]) if row else 0

    # name -> (label, command, enqueue, done)
    systems: dict[str, tuple[str, list[str], Callable[[int], None], Callable[[], int]]] = {}
    for handler in handlers:
        func = "noop" if handler == "sync" else "noop_async"
        systems[f"vultrscale-{handler}"] = (
            f"vultrscale worker ({handler} no-op, c={concurrency})",
            [
                sys.executable, "-m", "vultrscale.cli", "worker",
                "--app", f"vultrscale.worker.examples:{func}",
                "--concurrency", str(concurrency), "--queue", BENCH_QUEUE,
            ],
            ours_enqueue,
            ours_done,
        )  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in [*systems, "procrastinate"]}
    try:
        with papp.open():
            task = papp.tasks["noop"]

            def p_enqueue(n: int) -> None:
                task.batch_defer(*([{}] * n))

            systems["procrastinate"] = (
                f"procrastinate worker (async no-op, c={concurrency})",
                [
                    sys.executable, "-m", "procrastinate",
                    "--app", "bench_queue.procrastinate_app",
                    # Default warning: no log line per job, as our worker writes none.
                    "--log-level", plog,
                    "worker", "--queues", BENCH_QUEUE, "--concurrency", str(concurrency),
                ],
                p_enqueue,
                p_done,
            )  # fmt: skip
            names = list(systems)
            for r in range(rounds):
                # Rotate the order each round: the machine's load drifts.
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    label, cmd, enqueue, done = systems[name]
                    rates[name].append(
                        _run_rate(
                            f"[{r + 1}/{rounds}] {label}",
                            cmd,
                            env,
                            enqueue,
                            done,
                            jobs,
                            logdir / f"bench-{name}-{r + 1}.log",
                        )
                    )
    finally:
        conn.close()
    medians = {name: statistics.median(v) for name, v in rates.items()}
    print(f"median over {rounds} round(s), {jobs} no-op jobs each, concurrency {concurrency}:")
    for name, m in medians.items():
        print(f"  {systems[name][0]:<44} {m:8.0f} jobs/s")
    base = medians["procrastinate"]
    for name, m in medians.items():
        if name != "procrastinate":
            print(f"ratio {name} / procrastinate: {m / base:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Postgres: $DATABASE_URL (scratch database created and dropped) or a throwaway.",
    )
    ap.add_argument("--signals", action="store_true", help="signal query vs naive count(*)")
    ap.add_argument("--throughput", action="store_true", help="jobs/s: ours vs Procrastinate")
    ap.add_argument("--finished", type=int, default=2_000_000, help="finished jobs (--signals)")
    ap.add_argument("--ready", type=int, default=20_000, help="ready jobs (--signals)")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per query (--signals)")
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
    with throwaway.given_or_throwaway(os.environ.get("DATABASE_URL")) as admin:
        # One database per benchmark: the throughput run must not see the 2M finished rows.
        if args.signals:
            with throwaway.scratch_database(admin, prefix="vs_bench_") as url:
                bench_signals(url, args.finished, args.ready, args.runs)
        if args.throughput:
            logdir = args.logdir or Path(tempfile.mkdtemp(prefix="vultrscale-bench-"))
            with throwaway.scratch_database(admin, prefix="vs_bench_") as url:
                bench_throughput(
                    url,
                    args.jobs,
                    args.concurrency,
                    handlers,
                    args.rounds,
                    logdir,
                    args.procrastinate_log_level,
                )
            print(f"worker logs: {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
