"""The drain's give-back against a real Postgres, with the worker's real threads in-process.

A subclass widens the one window each test is about (the give-back after the last flush) by
waiting on a condition there; nothing else of the worker is replaced.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.e2e.worker_procs import jobs, wait_for
from vultrscale.db import queue as q
from vultrscale.worker import Job, LeaseLost
from vultrscale.worker.runtime import Worker, WorkerSettings


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


def _start(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, name="test-worker", daemon=True)
    t.start()
    wait_for(lambda: worker._running, "the worker to take the job", 10)
    return t


def _settings(drain: float) -> WorkerSettings:
    return WorkerSettings(
        app="test:handle", concurrency=1, lease_seconds=10, drain_seconds=drain, worker_id="w-t"
    )


def test_a_job_finishing_during_the_give_back_is_completed_not_run_again(
    db_url: str, conn: psycopg.Connection
) -> None:
    (job_id,) = q.enqueue(conn, [{}])
    release = threading.Event()
    returned: list[int] = []

    def handle(job: Job) -> None:
        wait_for(release.is_set, "the drain's last flush", 10)
        returned.append(job.id)  # side effect done, then a normal return: a success

    class LateFinish(Worker):
        def _flush_done(self, conn: psycopg.Connection) -> None:
            super()._flush_done(conn)
            running = list(self._running.values())
            if running and running[0].stopping and not release.is_set():
                # The drain deadline passed and its last flush ran: now the handler returns.
                release.set()
                wait_for(lambda: not self._done.empty(), "the success to be queued", 5)

    lines: list[str] = []
    w = LateFinish(_settings(0.2), db_url, handle, say=lines.append)
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
    assert q.load_steps(conn, job_id) == {}
