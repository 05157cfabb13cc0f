"""Worker processes against handlers that exit, a database that blips or blocks, and an
address libpq echoes: the worker records an attempt, keeps going, or exits 1 in time."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import psycopg
import pytest

from tests.e2e.worker_procs import WorkerProcess, jobs, states, wait_for
from vultrscale.db import queue as q
from vultrscale.errors import DatabaseError
from vultrscale.worker.runtime import Worker, WorkerSettings

pytestmark = pytest.mark.e2e

HANDLERS = """
import asyncio


def exits(job):
    raise SystemExit(3)


async def interrupts(job):
    await asyncio.sleep(0)
    raise KeyboardInterrupt


async def stops_the_loop(job):
    asyncio.get_running_loop().stop()  # a handler that ends the worker's event-loop thread
    await asyncio.sleep(60)
"""


@pytest.mark.parametrize(("func", "error"), [("exits", "SystemExit"), ("interrupts", "Keyboard")])
def test_a_handler_raising_systemexit_is_a_failed_attempt_until_dead(
    db_url: str,
    conn: psycopg.Connection,
    procs: list[WorkerProcess],
    tmp_path: Path,
    func: str,
    error: str,
) -> None:
    (tmp_path / "exiting_handlers.py").write_text(HANDLERS)
    ids = q.enqueue(conn, [{}] * 2, max_attempts=3)
    args = ("--concurrency", "2", "--lease-seconds", "3", "--backoff-seconds", "0.05")
    w = WorkerProcess(db_url, f"exiting_handlers:{func}", *args, env={"PYTHONPATH": str(tmp_path)})
    procs.append(w)
    wait_for(lambda: states(conn) == {"dead": 2}, "both poison jobs to die", 15)
    assert w.proc.poll() is None, w.text()  # the worker itself did not exit
    last = conn.execute("SELECT DISTINCT last_error FROM jobs").fetchall()
    assert len(last) == 1 and last[0][0].startswith(error), last
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()
    assert jobs(conn) == {i: ("dead", 3) for i in ids}


def test_a_dead_event_loop_thread_gives_the_job_back_and_exits_1(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess], tmp_path: Path
) -> None:
    (tmp_path / "exiting_handlers.py").write_text(HANDLERS)
    (job_id,) = q.enqueue(conn, [{}])
    args = ("--concurrency", "1", "--lease-seconds", "3")
    w = WorkerProcess(
        db_url, "exiting_handlers:stops_the_loop", *args, env={"PYTHONPATH": str(tmp_path)}
    )
    procs.append(w)
    assert w.wait(timeout=15) == 1, w.text()
    err = "\n".join(w.err)
    assert "thread vs-asyncio died" in err and "Traceback" not in err, w.text()
    assert f"job {job_id}: given back to the queue (the worker is stopping)." in w.out
    assert jobs(conn) == {job_id: ("ready", 0)}


def test_the_drain_gives_back_on_a_fresh_connection_after_a_blip(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess]
) -> None:
    ids = q.enqueue(conn, [{"step_seconds": 5}] * 2)
    args = ("--concurrency", "2", "--lease-seconds", "3", "--drain-seconds", "1")
    w = WorkerProcess(db_url, "vultrscale.worker.examples:three_steps", *args)
    procs.append(w)
    wait_for(lambda: states(conn) == {"leased": 2}, "2 running jobs")
    w.signal(signal.SIGTERM)
    wait_for(lambda: any(line.startswith("Stopping:") for line in w.out), "the drain")
    # Every connection the worker has breaks (a Postgres restart, a failover).
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    assert w.wait(timeout=20) == 0, w.text()
    assert any("2 given back" in line for line in w.out), w.text()
    assert jobs(conn) == {i: ("ready", 0) for i in ids}


def test_an_outcome_write_cut_off_by_a_blip_is_retried_and_lands(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess]
) -> None:
    (job_id,) = q.enqueue(conn, [{"step_seconds": 0.2, "fail": True}], max_attempts=3)
    args = ("--concurrency", "1", "--lease-seconds", "3", "--backoff-seconds", "0")
    w = WorkerProcess(db_url, "vultrscale.worker.examples:three_steps", *args)
    procs.append(w)
    wait_for(lambda: jobs(conn)[job_id][0] == "leased", "the job to be taken")
    with psycopg.connect(db_url) as locker:
        # Hold the job row: the handler's fail() waits on it; then kill that backend (a blip).
        locker.execute("SELECT 1 FROM jobs WHERE id = %s FOR NO KEY UPDATE", (job_id,))

        def blocked_fail() -> list[tuple[int]]:
            return conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                ("%last_error%",),
            ).fetchall()

        def blocked_or_timed_out() -> list[tuple[int]] | bool:
            # On a slow machine the statement timeout may cancel the write first: same blip.
            return blocked_fail() or any("database unreachable" in line for line in w.out)

        pids = wait_for(blocked_or_timed_out, "the outcome write to wait on the row lock", 10)
        if isinstance(pids, list):
            conn.execute("SELECT pg_terminate_backend(%s)", (pids[0][0],))
        locker.rollback()
    # The write is retried (after the heartbeat re-checked the lease) and every attempt counts.
    wait_for(lambda: jobs(conn)[job_id] == ("dead", 3), "the job to spend its attempts", 20)
    assert w.proc.poll() is None, w.text()  # a blip is not fatal
    assert any("database unreachable" in line for line in w.out), w.text()
    assert any(line.startswith("database back after") for line in w.out), w.text()
    assert not any("result dropped" in line for line in w.out), w.text()
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()


def test_a_heartbeat_stuck_behind_a_lock_marks_the_job_lost_and_the_worker_goes_on(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess]
) -> None:
    """Without statement timeouts the renewal would wait forever and the worker work on as a
    zombie; with them it retries, marks its job lost before the lease ends, and goes on: the
    database itself answers, so this is no outage to exit for. The job runs again later."""
    (job_id,) = q.enqueue(conn, [{"step_seconds": 1.5}])
    args = ("--concurrency", "1", "--lease-seconds", "3")
    w = WorkerProcess(db_url, "vultrscale.worker.examples:three_steps", *args)
    procs.append(w)
    wait_for(lambda: jobs(conn)[job_id][0] == "leased", "the job to be taken")
    wait_for(  # its own connection, not the pool's
        lambda: conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'vultrscale-heartbeat'"
        ).fetchone(),
        "the heartbeat's connection",
        10,
    )
    lost = f"job {job_id}: lease not renewed in time; treating it as lost."
    with psycopg.connect(db_url) as locker:
        locker.execute("SET idle_in_transaction_session_timeout = '30s'")
        locker.execute("SELECT 1 FROM job_leases WHERE job_id = %s FOR UPDATE", (job_id,))
        try:
            wait_for(lambda: lost in w.out, "the job to be marked lost", 10)
        finally:
            locker.rollback()
    assert any("statement timeout" in line for line in w.out), w.text()
    wait_for(lambda: jobs(conn)[job_id] == ("succeeded", 2), "the job to run again", 20)
    # The line that ends the outage counts the job marked lost during it.
    back = [line for line in w.out if line.startswith("database back after")]
    assert back and "0 lease(s) kept, 1 lost" in back[0], w.text()
    assert w.proc.poll() is None, w.text()
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()


def test_a_password_libpq_echoes_is_redacted_where_the_message_is_built() -> None:
    """The worker's own error (before the CLI's last-line redaction) holds no password."""
    url = "postgresql://u:pw-sec%ZZret@127.0.0.1:9/none"
    lines: list[str] = []
    raised: list[DatabaseError] = []

    def run() -> None:  # off the main thread: the worker installs no signal handlers here
        try:
            Worker(WorkerSettings(app="x:y"), url, lambda job: None, say=lines.append).run()
        except DatabaseError as exc:
            raised.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert len(raised) == 1
    exc = raised[0]
    assert "invalid percent-encoded token" in exc.message, exc.message
    assert "pw-sec" not in f"{exc.message} {exc.hint} {lines}"


def test_a_password_libpq_echoes_never_reaches_the_output(procs: list[WorkerProcess]) -> None:
    # A bad percent-escape: libpq quotes the password in its error message.
    w = WorkerProcess(
        "postgresql://u:pw-sec%ZZret@127.0.0.1:9/none", "vultrscale.worker.examples:noop"
    )
    procs.append(w)
    # Refused before connecting (exit 2, the form expected), never echoed back.
    assert w.wait(timeout=30) == 2, w.text()
    assert "not a Postgres connection string libpq can read" in "\n".join(w.err), w.text()
    assert "pw-sec" not in w.text()


def test_a_payload_python_cannot_read_fails_that_job_and_the_worker_goes_on(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess]
) -> None:
    """Postgres stores JSON that Python's json module refuses (an integer of more than 4300
    digits, arrays nested deeper than the recursion limit). Such a job ends failed with the
    reason; the worker neither dies on the claim (which every worker would retry, blocking the
    queue behind it) nor leaves the jobs claimed with it unrun."""
    huge = "{" + '"n": ' + "9" * 5000 + "}"
    deep = "[" * 5000 + "]" * 5000
    bad = [
        conn.execute(
            "INSERT INTO jobs (payload) VALUES (%s::jsonb) RETURNING id", (doc,)
        ).fetchone()[0]  # type: ignore[index]
        for doc in (huge, deep)
    ]
    good = q.enqueue(conn, [{"step_seconds": 0}] * 2)
    args = ("--concurrency", "4", "--lease-seconds", "3")
    w = WorkerProcess(db_url, "vultrscale.worker.examples:three_steps", *args)
    procs.append(w)
    wait_for(
        lambda: states(conn) == {"failed": 2, "succeeded": 2} or w.proc.poll() is not None,
        "every job to end",
        15,
    )
    assert w.proc.poll() is None, w.text()
    assert jobs(conn) == {**{i: ("failed", 1) for i in bad}, **{i: ("succeeded", 1) for i in good}}
    errors = dict(
        conn.execute("SELECT id, last_error FROM jobs WHERE id = ANY(%s)", (bad,)).fetchall()
    )
    assert all(
        e.startswith("PermanentError: payload cannot be decoded") for e in errors.values()
    ), errors
    said = f"job {bad[0]} attempt 1 raised PermanentError: payload cannot be decoded"
    assert any(line.startswith(said) for line in w.out), w.text()
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()
    assert any("4 taken" in line and "2 failed" in line for line in w.out), w.text()


ODD_ERRORS = """
from vultrscale.worker import PermanentError


def nul(job):
    raise PermanentError("tool output: a\\x00b")  # Postgres text cannot hold NUL


def surrogate(job):
    raise RuntimeError("no file \\udcff")  # a lone surrogate (os.fsdecode of a bad name)
"""


@pytest.mark.parametrize(
    ("func", "ends", "stored"),
    [
        ("nul", ("failed", 1), "PermanentError: tool output: a\\x00b"),
        ("surrogate", ("dead", 2), "RuntimeError: no file \\udcff"),
    ],
)
def test_an_error_text_postgres_or_utf_8_cannot_hold_is_recorded_escaped(
    db_url: str,
    conn: psycopg.Connection,
    procs: list[WorkerProcess],
    tmp_path: Path,
    func: str,
    ends: tuple[str, int],
    stored: str,
) -> None:
    """A handler's error with a NUL (Postgres text refuses it) or a lone surrogate (not UTF-8)
    is still that attempt's outcome: a PermanentError fails the job at once, another error
    retries it until dead. The worker dropped the outcome (the job waited out its lease and a
    PermanentError was retried) or died of it (exit 1 at every attempt)."""
    (tmp_path / "odd_errors.py").write_text(ODD_ERRORS)
    (job_id,) = q.enqueue(conn, [{}], max_attempts=2)
    args = ("--concurrency", "1", "--lease-seconds", "30", "--backoff-seconds", "0.05")
    w = WorkerProcess(db_url, f"odd_errors:{func}", *args, env={"PYTHONPATH": str(tmp_path)})
    procs.append(w)
    wait_for(lambda: jobs(conn)[job_id] == ends or w.proc.poll() is not None, "the job to end", 10)
    assert w.proc.poll() is None, w.text()
    (last,) = conn.execute("SELECT last_error FROM jobs WHERE id = %s", (job_id,)).fetchone()  # type: ignore[misc]
    assert last == stored
    assert any(stored in line for line in w.out), w.text()
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()


BLOCKING_ASYNC = """
import asyncio
import threading


async def to_thread(job):
    # The usual way for an async handler to call blocking code: the loop's default executor.
    await asyncio.to_thread(threading.Event().wait, 60)
"""


def test_an_async_handler_blocked_in_the_default_executor_does_not_hold_the_exit(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess], tmp_path: Path
) -> None:
    """At the drain deadline the job is given back and its coroutine cancelled, but the thread
    running its blocking call cannot be stopped: it must not keep the process alive past the
    drain (Python joins ThreadPoolExecutor threads at exit), or systemd SIGKILLs the worker."""
    (tmp_path / "blocking_async.py").write_text(BLOCKING_ASYNC)
    (job_id,) = q.enqueue(conn, [{}])
    args = ("--concurrency", "1", "--lease-seconds", "3", "--drain-seconds", "0.5")
    w = WorkerProcess(db_url, "blocking_async:to_thread", *args, env={"PYTHONPATH": str(tmp_path)})
    procs.append(w)
    wait_for(lambda: states(conn) == {"leased": 1}, "the job to run")
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=10) == 0, w.text()  # the blocking call had 60 s to go
    assert f"job {job_id}: given back to the queue (the worker is stopping)." in w.out
    assert jobs(conn) == {job_id: ("ready", 0)}


QUOTES_ITS_ADDRESS = """
import os


def handle(job):
    raise RuntimeError(f"cannot reach {os.environ['DATABASE_URL']}")
"""


def test_a_handler_error_quoting_the_database_address_is_stored_and_printed_redacted(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess], tmp_path: Path
) -> None:
    """The worker's messages of its own never showed the password; a handler's error that
    quotes the environment's DATABASE_URL went into jobs.last_error and the log as it was."""
    from vultrscale.redaction import url_password

    url = db_url
    if url_password(url) is None:  # a throwaway server trusts; the password is only carried
        url += ("&" if "?" in url else "?") + "password=handler-quotes-me"
    password = url_password(url)
    assert password
    (tmp_path / "quotes_address.py").write_text(QUOTES_ITS_ADDRESS)
    (job_id,) = q.enqueue(conn, [{}], max_attempts=1)
    w = WorkerProcess(url, "quotes_address:handle", env={"PYTHONPATH": str(tmp_path)})
    procs.append(w)
    wait_for(lambda: jobs(conn)[job_id][0] == "dead", "the job to end", 15)
    (last,) = conn.execute("SELECT last_error FROM jobs WHERE id = %s", (job_id,)).fetchone()  # type: ignore[misc]
    assert last.startswith("RuntimeError: cannot reach ") and password not in last
    assert "***" in last
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()
    assert any("cannot reach" in line for line in w.out), w.text()
    assert password not in w.text()
