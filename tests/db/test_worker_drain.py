"""The drain's give-back against a real Postgres, with the worker's real threads in-process.

A test widens the one window it is about (the give-back after the last flush) by wrapping one
step of a part of the worker to wait on a condition there; nothing else of it is replaced.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.db.steps import load_steps
from tests.e2e.worker_procs import jobs, wait_for
from vultrscale.db import queue as q
from vultrscale.errors import RuntimeFailure
from vultrscale.worker import Job, LeaseLost, PermanentError
from vultrscale.worker.runtime import Worker, WorkerSettings


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


def _start(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, name="test-worker", daemon=True)
    t.start()
    wait_for(worker.state.running, "the worker to take the job", 10)
    return t


def _settings(drain: float) -> WorkerSettings:
    return WorkerSettings(
        app="test:handle", concurrency=1, lease_seconds=10, drain_seconds=drain, worker_id="w-t"
    )


def test_a_job_finishing_during_the_give_back_is_completed_not_run_again(
    db_url: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    (job_id,) = q.enqueue(conn, [{}])
    release = threading.Event()
    returned: list[int] = []

    def handle(job: Job) -> None:
        wait_for(release.is_set, "the drain's last flush", 10)
        returned.append(job.id)  # side effect done, then a normal return: a success

    lines: list[str] = []
    w = Worker(_settings(0.2), db_url, handle, say=lines.append)
    flush = w.runner.flush_done

    def late_finish(conn: psycopg.Connection) -> None:
        flush(conn)
        running = w.state.running()
        if running and running[0].stopping and not release.is_set():
            # The drain deadline passed and its last flush ran: now the handler returns.
            release.set()
            wait_for(lambda: not w.state.done.empty(), "the success to be queued", 5)

    monkeypatch.setattr(w.runner, "flush_done", late_finish)
    t = _start(w)
    w.request_stop()
    t.join(15)
    assert not t.is_alive()
    assert returned == [job_id]
    assert jobs(conn) == {job_id: ("succeeded", 1)}, lines  # not given back to run twice
    assert w.summary.succeeded == 1 and w.summary.given_back == 0


def test_a_given_back_sync_handler_cannot_run_another_step(
    db_url: str, conn: psycopg.Connection
) -> None:
    (job_id,) = q.enqueue(conn, [{}])
    ran: list[str] = []
    outcome: list[Any] = []

    def handle(job: Job) -> None:
        wait_for(lambda: job.stopping, "the drain", 10)
        with psycopg.connect(db_url, autocommit=True) as mine:
            wait_for(lambda: jobs(mine)[job.id] == ("ready", 0), "the give-back", 10)
        try:
            job.step("after", lambda: ran.append("side effect"))
        except LeaseLost as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    w = Worker(_settings(0.1), db_url, handle, say=lambda _: None)
    t = _start(w)
    w.request_stop()
    t.join(15)
    assert not t.is_alive()
    wait_for(lambda: outcome, "the handler to try its step", 10)
    assert ran == [], "a given-back job ran a step's side effect"
    assert isinstance(outcome[0], LeaseLost)
    assert jobs(conn) == {job_id: ("ready", 0)}
    assert load_steps(conn, job_id) == {}


def test_a_job_claimed_again_while_its_lost_run_still_runs_keeps_its_new_lease(
    db_url: str, conn: psycopg.Connection
) -> None:
    """The lease of a long job runs out (as in a database outage longer than the lease); the same
    worker reaps the job and claims it again while the first run still executes. The first run's
    end must not drop the second from the heartbeat, or the job is reaped and run again until it
    is dead."""
    (job_id,) = q.enqueue(conn, [{}], max_attempts=5)
    lease = 3.0  # renewed every second; a busy machine may delay a renewal by 2.5 s
    runs: list[int] = []
    release = {1: threading.Event(), 2: threading.Event()}

    def handle(job: Job) -> None:
        runs.append(job.attempt)
        release[job.attempt].wait(30)  # no steps: a plain long side effect

    lines: list[str] = []
    settings = WorkerSettings(
        app="test:handle", concurrency=2, lease_seconds=lease, drain_seconds=1, worker_id="w-t"
    )
    w = Worker(settings, db_url, handle, say=lines.append)
    t = _start(w)
    try:
        wait_for(lambda: runs == [1], "the first run", 10)
        conn.execute("UPDATE job_leases SET expires_at = now() - interval '1 second'")
        wait_for(lambda: runs == [1, 2], "the same worker to claim the job again", 15)
        release[1].set()
        wait_for(lambda: any("lease lost" in line for line in lines), "the first run's end", 10)

        def expiry() -> datetime | None:
            row = conn.execute(
                "SELECT expires_at FROM job_leases WHERE job_id = %s", (job_id,)
            ).fetchone()
            return row[0] if row else None

        first = expiry()
        assert first is not None
        later = first + timedelta(seconds=lease)  # renewed for a whole lease after that
        wait_for(lambda: (e := expiry()) is not None and e >= later, "renewals", 3 * lease)
        assert jobs(conn) == {job_id: ("leased", 2)}, lines
        release[2].set()
        wait_for(lambda: jobs(conn)[job_id] == ("succeeded", 2), "the second run to succeed", 10)
        assert runs == [1, 2]
    finally:
        release[1].set()
        release[2].set()
        w.request_stop()
        t.join(15)
    assert not t.is_alive()


def test_the_drain_time_counts_from_the_stop_even_when_the_draining_mark_is_slow(
    db_url: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """systemd's TimeoutStopSec counts from SIGTERM: a database slow to take the worker's
    draining mark must not push the give-back past it (the SIGKILL would come first)."""
    (job_id,) = q.enqueue(conn, [{}])
    real = q.set_draining
    answered = threading.Event()  # the database takes the mark only once the test says so

    def slow_mark(c: psycopg.Connection, worker_id: str) -> None:
        answered.wait(30)
        real(c, worker_id)

    monkeypatch.setattr(q, "set_draining", slow_mark)

    def handle(job: Job) -> None:
        wait_for(lambda: job.lost, "the give-back", 30)

    w = Worker(_settings(1.0), db_url, handle, say=lambda _: None)
    t = _start(w)
    started = time.monotonic()
    w.request_stop()
    try:
        wait_for(lambda: jobs(conn)[job_id] == ("ready", 0), "the give-back", 10)
        assert time.monotonic() - started < 3.5, "the drain waited for the draining mark first"
    finally:
        answered.set()
    t.join(15)
    assert not t.is_alive()


def _cancelled_sync(job: Job) -> None:
    cancelled: concurrent.futures.Future[None] = concurrent.futures.Future()
    cancelled.cancel()
    cancelled.result()  # a Future someone else cancelled: CancelledError out of the handler


async def _cancelled_async(job: Job) -> None:
    task = asyncio.get_running_loop().create_task(asyncio.sleep(10))
    task.cancel()
    await task  # asyncio.CancelledError out of the handler


@pytest.mark.parametrize("handler", [_cancelled_sync, _cancelled_async], ids=["sync", "async"])
def test_a_handler_that_raises_a_cancellation_of_its_own_fails_its_attempt(
    db_url: str, conn: psycopg.Connection, handler: Any
) -> None:
    """Taken for the drain's cancel (or a lost lease), its failure was never written: the job
    sat leased until its lease ran out, counted as a lost lease, and went dead with 'lease
    expired' as its error."""
    (job_id,) = q.enqueue(conn, [{}], max_attempts=3)
    lines: list[str] = []
    w = Worker(_settings(1.0), db_url, handler, say=lines.append)
    t = threading.Thread(target=w.run, name="test-worker", daemon=True)
    t.start()
    try:

        def failed() -> bool:
            row = conn.execute(
                "SELECT state, attempts, last_error FROM jobs WHERE id = %s", (job_id,)
            ).fetchone()
            return row is not None and row[1] >= 1 and "CancelledError" in (row[2] or "")

        wait_for(failed, "the attempt's failure to be written (the lease is 10 s)", 5)
    finally:
        w.request_stop()
        t.join(15)
    assert not t.is_alive()
    assert w.summary.lost == 0 and w.summary.retried >= 1, lines


def test_a_job_whose_failure_is_being_written_at_the_drain_deadline_is_not_given_back(
    db_url: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its failure was written outside the lock the drain picks what it gives back under: a
    slow write let the drain give the job back first (attempt refunded), the failure was
    dropped, and a job that failed for good ran again."""
    (job_id,) = q.enqueue(conn, [{}])
    gave_back = threading.Event()
    real_fail = q.fail

    def slow_fail(*args: Any, **kwargs: Any) -> Any:
        gave_back.wait(5)  # the drain's give-back runs while this write is on its way
        return real_fail(*args, **kwargs)

    monkeypatch.setattr(q, "fail", slow_fail)

    def handle(job: Job) -> None:
        wait_for(lambda: job.stopping, "the drain", 10)
        raise PermanentError("bad input")

    w = Worker(_settings(0.2), db_url, handle, say=lambda _: None)
    give_back = w.drainer.give_back_unfinished

    def watched(until: float | None = None) -> None:
        give_back(until)
        gave_back.set()

    monkeypatch.setattr(w.drainer, "give_back_unfinished", watched)
    t = _start(w)
    w.request_stop()
    t.join(15)
    assert not t.is_alive()
    assert gave_back.is_set()
    assert jobs(conn) == {job_id: ("failed", 1)}
    assert w.summary.given_back == 0 and w.summary.failed == 1


def test_a_stop_that_arrives_during_a_claim_turn_claims_nothing_more(
    db_url: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM's handler runs in the main thread between the round trips of one turn (psycopg
    waits in C and runs Python's signal handlers on EINTR): the claim that follows in the same
    turn must not be sent, or jobs start during the drain and are given back half done."""
    (job_id,) = q.enqueue(conn, [{}])
    ran: list[int] = []
    w = Worker(_settings(5), db_url, lambda job: ran.append(job.id), say=lambda _: None)
    flush = w.runner.flush_done

    def stopped_meanwhile(c: psycopg.Connection) -> None:
        flush(c)
        w.request_stop()  # what on_signal does, on the thread that runs the turn

    monkeypatch.setattr(w.runner, "flush_done", stopped_meanwhile)
    t = threading.Thread(target=w.run, name="test-worker", daemon=True)
    t.start()
    t.join(15)
    assert not t.is_alive()
    assert (w.summary.taken, ran) == (0, [])
    assert jobs(conn)[job_id] == ("ready", 0)


def test_a_dead_heartbeat_thread_ends_the_worker_and_gives_its_job_back(
    db_url: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its leases would run out unrenewed while the handler works on: the main loop must see
    the thread dead, give back what it holds and end the worker (exit 1), not go on."""
    (job_id,) = q.enqueue(conn, [{}])
    started = threading.Event()

    def handle(job: Job) -> None:
        started.set()
        wait_for(lambda: job.lost, "the give-back", 20)

    class Bug(BaseException):  # past the heartbeat's own `except Exception`
        pass

    def broken(held: list[Job]) -> tuple[set[int], bool]:
        raise Bug("heartbeat bug")

    w = Worker(_settings(5), db_url, handle, say=lambda _: None)
    monkeypatch.setattr(w.heartbeat, "_renew", broken)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            w.run()
        except RuntimeFailure as exc:
            failed.append(exc)

    t = threading.Thread(target=run, name="test-worker", daemon=True)
    t.start()
    wait_for(started.is_set, "the job to start", 10)
    w.state.outage.poke.set()  # renew now rather than at lease/3
    t.join(20)
    assert not t.is_alive()
    assert len(failed) == 1 and "vs-heartbeat died (Bug: heartbeat bug)" in str(failed[0])
    assert jobs(conn)[job_id] == ("ready", 0)
