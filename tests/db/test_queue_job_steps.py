"""Job.step against a real Postgres: a step runs once per job, and a lost lease stops it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from tests.db.steps import load_steps
from vultrscale.db import queue as q
from vultrscale.worker import Job, LeaseLost
from vultrscale.worker.outage import Outage, WorkerDatabase


@pytest.fixture
def pool(db_url: str) -> Iterator[ConnectionPool]:
    with ConnectionPool(db_url, min_size=1, max_size=2, kwargs={"autocommit": True}) as p:
        yield p


def _claim(pool: ConnectionPool, worker: str) -> Job:
    with pool.connection() as conn:
        (c,) = q.claim(conn, worker, "default", 1, 30)
    database = WorkerDatabase(pool, Outage(5.0), announce=lambda exc: None)
    return Job(c.id, c.payload, c.attempt, c.token, worker_id=worker, database=database)


def test_a_step_runs_once_and_later_attempts_get_its_saved_result(pool: ConnectionPool) -> None:
    with pool.connection() as conn:
        q.enqueue(conn, [{}])
    calls: list[str] = []

    def classify(label: str) -> dict[str, str]:
        calls.append(label)
        return {"label": label}

    job = _claim(pool, "w1")
    assert job.step("classify", lambda: classify("bug")) == {"label": "bug"}
    with pool.connection() as conn:
        assert q.give_back(conn, job.id, "w1", job.token)
    again = _claim(pool, "w2")
    assert again.attempt == 1  # the give back refunded the attempt
    assert again.step("classify", lambda: classify("other")) == {"label": "bug"}
    assert calls == ["bug"]


def test_a_lost_lease_refuses_the_step_result_and_stops_the_handler(
    pool: ConnectionPool, db_url: str
) -> None:
    with pool.connection() as conn:
        q.enqueue(conn, [{}])
    job = _claim(pool, "w1")

    def slow_step() -> str:
        # Meanwhile the lease runs out and the reaper hands the job on.
        with psycopg.connect(db_url, autocommit=True) as other:
            other.execute("UPDATE job_leases SET expires_at = now() - interval '1 second'")
            assert q.reap_expired(other) == 1
        return "late"

    with pytest.raises(LeaseLost):
        job.step("draft", slow_step)
    assert job.lost
    with pytest.raises(LeaseLost):
        job.step("embed", lambda: "never")
    with pool.connection() as conn:
        assert load_steps(conn, job.id) == {}


def test_astep_keeps_the_event_loop_running_while_the_database_waits(
    pool: ConnectionPool, db_url: str
) -> None:
    """The step's save waits behind a row lock; other coroutines keep running meanwhile."""
    with pool.connection() as conn:
        q.enqueue(conn, [{}])
    job = _claim(pool, "w1")
    calls: list[str] = []

    async def work() -> dict[str, int]:
        calls.append("work")
        return {"n": 1}

    with psycopg.connect(db_url) as locker:
        # The server ends this session if the test hangs, so the lock cannot outlive it.
        locker.execute("SET idle_in_transaction_session_timeout = '8s'")
        locker.execute("SELECT 1 FROM job_leases WHERE job_id = %s FOR UPDATE", (job.id,))

        async def main() -> tuple[int, object]:
            task = asyncio.ensure_future(job.astep("s", work))
            ticks = 0
            while ticks < 20:  # 20 turns of the loop while the save is blocked
                await asyncio.sleep(0.01)
                ticks += 1
            assert not task.done()
            locker.commit()
            return ticks, await asyncio.wait_for(task, 5)

        # a blocked loop would never finish the 20 ticks: the commit comes after them
        _, result = asyncio.run(main())
    assert result == {"n": 1} and calls == ["work"]
    with pool.connection() as conn:
        assert q.load_step(conn, job.id, "s") == (True, {"n": 1})

    async def again() -> object:
        return await job.astep("s", work)  # saved: fn is not called again

    assert asyncio.run(again()) == {"n": 1} and calls == ["work"]
