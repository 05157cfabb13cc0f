"""Worker processes riding out a real Postgres stopped and started under them.

A server of this module's own (the shared one serves every other test and must not go away):
``pause`` stops it with its data kept, ``resume`` starts it again on the same port. Step
executions are counted from a side-effect log the handler appends to, not from saved rows, so
a step that ran twice shows up even if only one result was saved.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.worker_procs import WorkerProcess, jobs, leases, states, wait_for
from vultrscale.db import queue as q
from vultrscale.db import schema, throwaway

pytestmark = pytest.mark.e2e

HANDLER = """
import os
import time

LOG = os.environ["OUTAGE_LOG"]


def handle(job):
    for name in ("fetch", "render", "store"):
        def run(name=name):
            # One line per execution, appended atomically (shorter than PIPE_BUF).
            with open(LOG, "a") as f:
                f.write(f"{job.id} {name} {job.attempt} {os.getpid()}\\n")
            time.sleep(job.payload.get("step_seconds", 0.2))
            return name

        job.step(name, run)
"""


@pytest.fixture(scope="module")
def server() -> Iterator[throwaway.ThrowawayPostgres]:
    pg = throwaway.start()
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def url(server: throwaway.ThrowawayPostgres) -> Iterator[str]:
    if not _up(server):
        server.resume()  # a test before this one failed half-way
    with throwaway.scratch_database(server.url) as db:
        schema.migrate(db)
        yield db
        if not _up(server):
            server.resume()  # the scratch database is dropped on a running server


def _up(server: throwaway.ThrowawayPostgres) -> bool:
    try:
        psycopg.connect(server.url, connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


@pytest.fixture
def handler_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    (tmp_path / "outage_handlers.py").write_text(HANDLER)
    log = tmp_path / "executions.log"
    log.touch()
    return {"PYTHONPATH": str(tmp_path), "OUTAGE_LOG": str(log)}, log


def _executions(log: Path) -> Counter[tuple[int, str]]:
    lines = [line.split() for line in log.read_text().splitlines() if line.strip()]
    return Counter((int(parts[0]), parts[1]) for parts in lines)


def _says(w: WorkerProcess, text: str) -> bool:
    return any(text in line for line in w.out)


def test_a_short_outage_costs_no_worker_no_job_and_no_step_run_twice(
    server: throwaway.ThrowawayPostgres,
    url: str,
    procs: list[WorkerProcess],
    handler_env: tuple[dict[str, str], Path],
) -> None:
    """Leases of 12 s, an outage of ~3 s: every lease survives it, so no step may run again."""
    env, log = handler_env
    with psycopg.connect(url, autocommit=True) as conn:
        ids = q.enqueue(conn, [{"step_seconds": 0.2}] * 40)
    args = ("--concurrency", "2", "--lease-seconds", "12", "--drain-seconds", "5")
    pool = [WorkerProcess(url, "outage_handlers:handle", *args, env=env) for _ in range(3)]
    procs.extend(pool)
    for w in pool:
        w.wait_started()
    wait_for(lambda: len(_executions(log)) >= 20, "work under way", 30)

    server.pause()
    try:
        wait_for(
            lambda: all(_says(w, "database unreachable") for w in pool),
            "every worker to notice the outage",
            10,
        )
        time.sleep(2.0)  # the outage itself: the database stays down for a while
        assert all(w.proc.poll() is None for w in pool), "\n".join(w.text() for w in pool)
    finally:
        server.resume()

    with psycopg.connect(url, autocommit=True) as conn:
        wait_for(lambda: states(conn) == {"succeeded": 40}, "every job to finish", 60)
        assert jobs(conn) == {i: ("succeeded", 1) for i in ids}
    assert all(w.proc.poll() is None for w in pool), "\n".join(w.text() for w in pool)
    for w in pool:
        assert _says(w, "database back after") and _says(w, "0 lost"), w.text()
    runs = _executions(log)
    assert set(runs) == {(i, step) for i in ids for step in ("fetch", "render", "store")}
    assert [key for key, n in runs.items() if n > 1] == []  # no lease was lost: no rerun
    for w in pool:
        w.signal(signal.SIGTERM)
    for w in pool:
        assert w.wait() == 0, w.text()
        assert not any("lease lost" in line for line in w.out), w.text()


def test_an_outage_past_the_budget_exits_1_and_a_worker_started_meanwhile_takes_over(
    server: throwaway.ThrowawayPostgres,
    url: str,
    procs: list[WorkerProcess],
    handler_env: tuple[dict[str, str], Path],
) -> None:
    """A: lease and budget 3 s, the database down for longer: one clean line, exit 1. B:
    started while the database is still down (as systemd would restart A), it says it waits,
    and when the database returns it finishes everything, A's jobs too once their leases ran
    out. The steps A saved are not run again; only the ones it was in the middle of may be."""
    env, log = handler_env
    with psycopg.connect(url, autocommit=True) as conn:
        ids = q.enqueue(conn, [{"step_seconds": 0.5}] * 6)
    a = WorkerProcess(
        url, "outage_handlers:handle", "--concurrency", "2", "--lease-seconds", "3", env=env
    )
    procs.append(a)
    a.wait_started()
    with psycopg.connect(url, autocommit=True) as conn:
        wait_for(lambda: leases(conn) == 2, "A to hold two jobs", 20)
    server.pause()
    try:
        assert a.wait(timeout=20) == 1, a.text()
        err = [line for line in a.err if line.strip()]
        assert "unreachable for longer than the outage budget (3 s)" in err[0], a.text()
        assert "Traceback" not in a.text()
        assert len(err) == 2 and err[1].lstrip().startswith("Fix:"), a.text()  # the CLI's form

        b = WorkerProcess(
            url,
            "outage_handlers:handle",
            "--concurrency",
            "2",
            "--lease-seconds",
            "3",
            "--outage-seconds",
            "60",
            env=env,
        )
        procs.append(b)
        wait_for(lambda: _says(b, "Waiting up to 60 s for the database"), "B to wait", 20)
        assert b.proc.poll() is None, b.text()
    finally:
        server.resume()

    b.wait_started()
    with psycopg.connect(url, autocommit=True) as conn:
        wait_for(lambda: states(conn) == {"succeeded": 6}, "B to finish every job", 60)
        done = jobs(conn)
    assert set(done) == set(ids)
    runs = _executions(log)
    assert set(runs) == {(i, step) for i in ids for step in ("fetch", "render", "store")}
    # A step ran again only on a job A held when the database went away (its lease expired).
    rerun = {job for (job, _), n in runs.items() if n > 1}
    assert all(done[job][1] == 2 for job in rerun), (rerun, done)
    b.signal(signal.SIGTERM)
    assert b.wait() == 0, b.text()


def test_a_job_back_from_an_expired_lease_runs_before_jobs_enqueued_after_it(
    url: str, procs: list[WorkerProcess], handler_env: tuple[dict[str, str], Path]
) -> None:
    env, log = handler_env
    args = ("--concurrency", "1", "--lease-seconds", "3")
    with psycopg.connect(url, autocommit=True) as conn:
        (first,) = q.enqueue(conn, [{"step_seconds": 30}])
        killed = WorkerProcess(url, "outage_handlers:handle", *args, env=env)
        procs.append(killed)
        wait_for(lambda: _executions(log)[(first, "fetch")] == 1, "the first job to start")
        killed.signal(signal.SIGKILL)
        killed.wait()
        later = q.enqueue(conn, [{"step_seconds": 0.05}] * 5)
        wait_for(
            lambda: conn.execute("SELECT expires_at < now() FROM job_leases").fetchone() == (True,),
            "the killed worker's lease to run out",
            10,
        )
        conn.execute("UPDATE jobs SET payload = '{\"step_seconds\": 0.05}' WHERE id = %s", (first,))
        w = WorkerProcess(url, "outage_handlers:handle", *args, env=env)
        procs.append(w)
        wait_for(lambda: states(conn) == {"succeeded": 6}, "every job to finish", 30)
    order = [int(line.split()[0]) for line in log.read_text().splitlines()][1:]
    assert order[0] == first, order  # ahead of the five that arrived while it was leased
    assert [job for job in order if job != first][::3] == later
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()


def test_a_drain_while_the_database_is_down_ends_before_systemd_would_kill_it(
    server: throwaway.ThrowawayPostgres,
    url: str,
    procs: list[WorkerProcess],
    handler_env: tuple[dict[str, str], Path],
) -> None:
    """SIGTERM during an outage, with a job that outlasts the drain: the give-back cannot be
    written, and the worker gives up on it DRAIN_WRITES_SECONDS after the drain's deadline,
    inside the unit's TimeoutStopSec (drain + 10 s here). It retried for the whole outage
    budget (60 s), and systemd's SIGKILL would have come first. The job returns by its lease."""
    from vultrscale.config import WorkerConfig, timeout_stop_seconds
    from vultrscale.worker.draining import DRAIN_WRITES_SECONDS

    env, _log = handler_env
    with psycopg.connect(url, autocommit=True) as conn:
        (job,) = q.enqueue(conn, [{"step_seconds": 60}])
    drain = 1.0
    w = WorkerProcess(
        url,
        "outage_handlers:handle",
        *("--lease-seconds", "12", "--drain-seconds", f"{drain:g}", "--outage-seconds", "60"),
        env=env,
    )
    procs.append(w)
    w.wait_started()
    with psycopg.connect(url, autocommit=True) as conn:
        wait_for(lambda: leases(conn) == 1, "the job to be held", 20)
    server.pause()
    try:
        wait_for(lambda: _says(w, "database unreachable"), "the worker to notice", 15)
        stopped = time.monotonic()
        w.signal(signal.SIGTERM)
        limit = timeout_stop_seconds(WorkerConfig(drain_seconds=drain))
        code = w.wait(timeout=limit)  # the test fails here when systemd would have killed it
        took = time.monotonic() - stopped
    finally:
        server.resume()
    assert code == 1, w.text()  # the database was gone: not a clean drain
    assert drain + DRAIN_WRITES_SECONDS - 1 < took < limit, (took, w.text())
    assert "Traceback" not in w.text()
    with psycopg.connect(url, autocommit=True) as conn:
        # still leased, its lease left to run out: any worker's reaper puts it back then
        assert jobs(conn)[job] == ("leased", 1) and leases(conn) == 1
