"""Real worker processes, real signals, real Postgres: drain, give back, kill, recover."""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from tests.e2e.worker_procs import (
    EXAMPLES,
    WorkerProcess,
    jobs,
    leases,
    states,
    steps,
    wait_for,
)
from vultrscale.db import queue as q
from vultrscale.worker.examples import STEPS

pytestmark = pytest.mark.e2e


def _leased(conn: psycopg.Connection) -> int:
    return states(conn).get("leased", 0)


def test_sigterm_mid_run_finishes_running_jobs_and_leaves_the_rest_ready(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess]
) -> None:
    q.enqueue(conn, [{"step_seconds": 0.3}] * 12)
    args = ("--concurrency", "4", "--lease-seconds", "3", "--drain-seconds", "10")
    w = WorkerProcess(db_url, f"{EXAMPLES}:three_steps", *args)
    procs.append(w)
    w.wait_started()
    wait_for(lambda: _leased(conn) == 4, "4 running jobs")
    running = {i for i, (s, _) in jobs(conn).items() if s == "leased"}
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()

    assert "Stopping: no new jobs; 4 running job(s) get up to 10 s to finish." in w.out
    summary = [line for line in w.out if line.startswith("Done in")]
    assert len(summary) == 1 and "0 given back" in summary[0], w.text()
    assert leases(conn) == 0
    after = jobs(conn)
    saved = steps(conn)
    assert {s for s, _ in after.values()} <= {"succeeded", "ready"}
    assert all(after[i] == ("succeeded", 1) for i in running)  # the running ones finished
    for job_id, (state, attempts) in after.items():
        if state == "succeeded":
            assert attempts == 1 and set(saved[job_id]) == set(STEPS)
        else:
            assert attempts == 0 and job_id not in saved
    assert states(conn).get("ready", 0) > 0  # the stop really came mid-run

    w2 = WorkerProcess(db_url, f"{EXAMPLES}:three_steps", *args)
    procs.append(w2)
    wait_for(lambda: states(conn) == {"succeeded": 12}, "the new worker to finish", 30)
    w2.signal(signal.SIGTERM)
    assert w2.wait() == 0, w2.text()
    assert {a for _, a in jobs(conn).values()} == {1}


@pytest.mark.parametrize("app", ["three_steps", "three_steps_async"])
def test_sigterm_with_short_drain_gives_jobs_back_at_their_old_attempt(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess], app: str
) -> None:
    """Sync: the handler threads cannot be killed, their leases are given back (fenced out).
    Async: the unfinished coroutines are also cancelled after the give back."""
    ids = q.enqueue(conn, [{"step_seconds": 0.6}] * 4)
    args = ("--concurrency", "4", "--lease-seconds", "3", "--drain-seconds", "0.3")
    w = WorkerProcess(db_url, f"{EXAMPLES}:{app}", *args)
    procs.append(w)
    w.wait_started()
    wait_for(lambda: len(steps(conn)) == 4, "every job to save its first step")
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()

    assert "Stopping: no new jobs; 4 running job(s) get up to 0.3 s to finish." in w.out
    assert any("4 taken" in line and "4 given back" in line for line in w.out), w.text()
    assert leases(conn) == 0
    assert jobs(conn) == {i: ("ready", 0) for i in ids}  # attempt refunded
    kept = steps(conn)
    assert all(STEPS[0] in kept[i] for i in ids)  # saved steps stay saved

    w2 = WorkerProcess(db_url, f"{EXAMPLES}:{app}", *args)
    procs.append(w2)
    wait_for(lambda: states(conn) == {"succeeded": 4}, "the new worker to finish", 30)
    w2.signal(signal.SIGINT)
    assert w2.wait() == 0, w2.text()
    assert jobs(conn) == {i: ("succeeded", 1) for i in ids}
    final = steps(conn)
    for i in ids:
        assert set(final[i]) == set(STEPS)
        assert final[i][STEPS[0]] == kept[i][STEPS[0]]  # not redone


def test_sigkill_leaves_leases_until_expiry_then_attempt_two_without_duplicates(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess]
) -> None:
    ids = q.enqueue(conn, [{"step_seconds": 0.4}] * 8)
    args = ("--concurrency", "4", "--lease-seconds", "3", "--drain-seconds", "5")
    w = WorkerProcess(db_url, f"{EXAMPLES}:three_steps", *args)
    procs.append(w)
    w.wait_started()
    wait_for(
        lambda: _leased(conn) == 4 and len(steps(conn)) >= 1, "4 running jobs with a saved step"
    )
    w.signal(signal.SIGKILL)
    assert w.wait() == -signal.SIGKILL

    # Every lease the dead worker held, live or (on a slow machine) already run out: no worker
    # runs now, so nobody reaps them before w2 starts. Usually 4; a job may have finished
    # between the check above and the kill, so only "some, and exactly the leased jobs".
    killed: dict[int, Any] = dict(
        conn.execute("SELECT job_id, expires_at FROM job_leases ORDER BY job_id").fetchall()
    )
    assert killed and set(killed) == {i for i, (s, _) in jobs(conn).items() if s == "leased"}
    before = steps(conn)

    w2 = WorkerProcess(db_url, f"{EXAMPLES}:three_steps", *args)
    procs.append(w2)
    wait_for(lambda: states(conn) == {"succeeded": 8}, "the new worker to finish", 40)
    w2.signal(signal.SIGTERM)
    assert w2.wait() == 0, w2.text()

    final = jobs(conn)
    for i in ids:
        assert final[i] == ("succeeded", 2 if i in killed else 1)
    after = steps(conn)
    rows = conn.execute("SELECT job_id, name, count(*) FROM job_steps GROUP BY 1, 2").fetchall()
    assert all(n == 1 for _, _, n in rows)
    for i in ids:
        assert set(after[i]) == set(STEPS)  # each step result exactly once
        for name, result in before.get(i, {}).items():
            assert after[i][name] == result  # saved before the kill: not run again
    # The new worker waited for the leases: nothing of attempt 2 was saved before they expired.
    first_attempt_two = conn.execute(
        "SELECT min(created_at) FROM job_steps WHERE (result->>'attempt')::int = 2"
    ).fetchone()
    assert first_attempt_two is not None and first_attempt_two[0] >= min(killed.values())


def test_poison_job_goes_dead_at_max_attempts_without_holding_the_slot(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess]
) -> None:
    (poison,) = q.enqueue(conn, [{"step_seconds": 0, "fail": True}], max_attempts=3)
    good = q.enqueue(conn, [{"step_seconds": 0.05}] * 3)
    args = ("--concurrency", "1", "--lease-seconds", "3", "--backoff-seconds", "0.7")
    w = WorkerProcess(db_url, f"{EXAMPLES}:three_steps", *args)
    procs.append(w)
    wait_for(lambda: jobs(conn)[poison][0] == "dead", "the poison job to die", 30)
    wait_for(lambda: states(conn) == {"succeeded": 3, "dead": 1}, "the good jobs", 10)
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()

    row = conn.execute(
        "SELECT attempts, last_error, finished_at FROM jobs WHERE id = %s", (poison,)
    ).fetchone()
    assert row is not None
    assert row[0] == 3 and "payload asked for a failure" in row[1]
    # One slot: the good jobs ran while the poison job waited out its backoff.
    last_good = conn.execute(
        "SELECT max(finished_at) FROM jobs WHERE id = ANY(%s)", (good,)
    ).fetchone()
    assert last_good is not None and last_good[0] < row[2]
    assert any("2 to retry later" in line and "1 dead" in line for line in w.out), w.text()


def test_a_second_signal_skips_the_drain_wait(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess]
) -> None:
    ids = q.enqueue(conn, [{"step_seconds": 5}] * 2)
    args = ("--concurrency", "2", "--lease-seconds", "3", "--drain-seconds", "60")
    w = WorkerProcess(db_url, f"{EXAMPLES}:three_steps", *args)
    procs.append(w)
    w.wait_started()
    wait_for(lambda: _leased(conn) == 2, "2 running jobs")
    w.signal(signal.SIGTERM)
    wait_for(lambda: any(line.startswith("Stopping:") for line in w.out), "the drain to begin")
    w.signal(signal.SIGINT)
    assert w.wait(timeout=10) == 0, w.text()  # far less than the 60 s drain
    assert any("2 given back" in line for line in w.out), w.text()
    assert jobs(conn) == {i: ("ready", 0) for i in ids}
    assert leases(conn) == 0


def test_a_worker_marked_draining_in_postgres_claims_nothing_more(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess]
) -> None:
    args = ("--concurrency", "2", "--lease-seconds", "3")
    w = WorkerProcess(db_url, f"{EXAMPLES}:noop", *args, env={"VULTRSCALE_WORKER_ID": "w-d"})
    procs.append(w)
    w.wait_started()
    conn.execute("UPDATE workers SET draining = true WHERE worker_id = 'w-d'")  # the scaler
    wait_for(lambda: any("Marked draining" in line for line in w.out), "the worker to notice")
    ids = q.enqueue(conn, [{}] * 2)  # its NOTIFY wakes the worker at once
    mark = conn.execute("SELECT now()").fetchone()
    assert mark is not None
    # Two more heartbeats (1 s apart) prove it is alive and has looked at the queue since.
    wait_for(
        lambda: (
            conn.execute(
                "SELECT last_seen > %s + interval '1.5 seconds'"
                " FROM workers WHERE worker_id = 'w-d'",
                (mark[0],),
            ).fetchone()
            == (True,)
        ),
        "two heartbeats",
    )
    assert jobs(conn) == {i: ("ready", 0) for i in ids}
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()
    row = conn.execute("SELECT stopped_at IS NOT NULL FROM workers WHERE worker_id = 'w-d'")
    assert row.fetchone() == (True,)
