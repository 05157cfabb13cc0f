"""The queue operations against a real Postgres: claim, fencing, retries, reaper, steps.

Time moves by editing ``expires_at``/``run_at`` in SQL, never by sleeping.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import psycopg
import pytest

from tests.db.steps import load_steps
from tests.e2e.worker_procs import wait_for
from vultrscale.db import queue as q
from vultrscale.db import schema


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


def _job(conn: psycopg.Connection, job_id: int) -> dict[str, object]:
    cur = conn.execute("SELECT * FROM jobs WHERE id = %s", (job_id,))
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return {d.name: v for d, v in zip(cur.description, row, strict=True)}


def _expire(conn: psycopg.Connection, job_id: int) -> None:
    conn.execute(
        "UPDATE job_leases SET expires_at = now() - interval '1 second' WHERE job_id = %s",
        (job_id,),
    )


def test_migrate_is_idempotent_and_versioned(pg_url: str) -> None:
    assert schema.migrate(pg_url) == schema.LATEST
    assert schema.migrate(pg_url) == schema.LATEST
    with psycopg.connect(pg_url) as c:
        assert schema.current_version(c) == schema.LATEST
        versions = [r[0] for r in c.execute("SELECT version FROM vultrscale_schema")]
        assert versions == [v for v, _ in schema.MIGRATIONS]
        tables = {
            r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
    assert tables == {
        "jobs",
        "job_leases",
        "job_steps",
        "workers",
        "fleet_instances",
        "fleet_events",
        "fleet_state",
        "fleet_snapshots",
        "plan_checks",
        "offering_marks",
        "forecast_profiles",
        "vultrscale_schema",
    }


def test_concurrent_migrations_serialise_on_the_advisory_lock(pg_url: str) -> None:
    results: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(schema.migrate(pg_url))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert results == [schema.LATEST] * 4


def test_ready_queries_use_the_partial_index(conn: psycopg.Connection) -> None:
    conn.execute(
        "INSERT INTO jobs (state, attempts, payload, finished_at)"
        " SELECT 'succeeded', 1, '{}', now() FROM generate_series(1, 20000)"
    )
    q.enqueue(conn, [{}] * 10)
    conn.execute("ANALYZE jobs")
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            "EXPLAIN SELECT count(*) FROM jobs WHERE state = 'ready' AND queue = 'default'"
            " AND run_at <= now()"
        )
    )
    assert "jobs_ready_idx" in plan or "jobs_ready_run_at_idx" in plan, plan


def test_claim_counts_the_attempt_and_writes_a_db_time_lease(conn: psycopg.Connection) -> None:
    ids = q.enqueue(conn, [{"n": i} for i in range(3)], max_attempts=5)
    claimed = q.claim(conn, "w1", "default", 2, 30)
    assert [c.id for c in claimed] == ids[:2]
    assert [c.payload for c in claimed] == [{"n": 0}, {"n": 1}]
    assert all(c.attempt == 1 for c in claimed)
    rows = conn.execute(
        "SELECT j.state, j.attempts, l.worker_id, l.token, l.expires_at - l.leased_at,"
        " abs(extract(epoch FROM l.leased_at - now()))"
        " FROM jobs j JOIN job_leases l ON l.job_id = j.id ORDER BY j.id"
    ).fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("leased", 1, "w1", c.token) for c in claimed
    ]
    assert all(r[4] == timedelta(seconds=30) for r in rows)
    assert all(r[5] < 5 for r in rows)
    assert _job(conn, ids[2])["state"] == "ready"


def test_claim_skips_other_queues_future_jobs_and_a_draining_worker(
    conn: psycopg.Connection,
) -> None:
    q.enqueue(conn, [{}], queue="other")
    later = conn.execute("SELECT now() + interval '1 hour'").fetchone()
    assert later is not None
    q.enqueue(conn, [{}], run_at=later[0])
    assert q.claim(conn, "w1", "default", 10, 30) == []
    now_id = q.enqueue(conn, [{}])[0]
    q.register_worker(conn, "w1", "label-1")
    q.set_draining(conn, "w1")
    assert q.claim(conn, "w1", "default", 10, 30) == []
    assert q.worker_heartbeat(conn, "w1") is True
    assert [c.id for c in q.claim(conn, "w2", "default", 10, 30)] == [now_id]


def test_parallel_claims_never_hand_out_a_job_twice(db_url: str, conn: psycopg.Connection) -> None:
    q.enqueue(conn, [{}] * 300)
    taken: dict[str, list[int]] = {}

    def worker(name: str) -> None:
        mine: list[int] = []
        with psycopg.connect(db_url, autocommit=True) as c:
            while batch := q.claim(c, name, "default", 7, 30):
                mine.extend(j.id for j in batch)
        taken[name] = mine

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    all_ids = [i for ids in taken.values() for i in ids]
    assert len(all_ids) == 300
    assert len(set(all_ids)) == 300


def test_writes_are_fenced_by_worker_token_and_a_live_lease(conn: psycopg.Connection) -> None:
    q.enqueue(conn, [{}])
    (job,) = q.claim(conn, "w1", "default", 1, 30)
    wrong = uuid.uuid4()
    assert q.heartbeat(conn, job.id, "w1", wrong, 30) is False
    assert q.heartbeat(conn, job.id, "w2", job.token, 30) is False
    assert q.complete(conn, job.id, "w2", job.token) is False
    assert q.give_back(conn, job.id, "w1", wrong) is False
    assert q.fail(conn, job.id, "w1", wrong, "x") is None
    assert q.save_step(conn, job.id, "w1", wrong, "s", 1) is False
    assert _job(conn, job.id)["state"] == "leased"
    assert q.heartbeat(conn, job.id, "w1", job.token, 30) is True
    _expire(conn, job.id)
    # Expired but not yet reaped: still refused (a live lease is expires_at > now()).
    assert q.heartbeat(conn, job.id, "w1", job.token, 30) is False
    assert q.save_step(conn, job.id, "w1", job.token, "s", 1) is False
    assert q.complete(conn, job.id, "w1", job.token) is False
    assert load_steps(conn, job.id) == {}


def test_complete_once(conn: psycopg.Connection) -> None:
    q.enqueue(conn, [{}])
    (job,) = q.claim(conn, "w1", "default", 1, 30)
    assert q.complete(conn, job.id, "w1", job.token) is True
    assert q.complete(conn, job.id, "w1", job.token) is False
    row = _job(conn, job.id)
    assert (row["state"], row["attempts"]) == ("succeeded", 1)
    assert row["finished_at"] is not None
    assert conn.execute("SELECT count(*) FROM job_leases").fetchone() == (0,)


def test_give_back_refunds_the_attempt_and_keeps_steps(conn: psycopg.Connection) -> None:
    q.enqueue(conn, [{}])
    (job,) = q.claim(conn, "w1", "default", 1, 30)
    assert q.save_step(conn, job.id, "w1", job.token, "classify", {"label": "a"})
    assert q.give_back(conn, job.id, "w1", job.token) is True
    row = _job(conn, job.id)
    assert (row["state"], row["attempts"]) == ("ready", 0)
    assert load_steps(conn, job.id) == {"classify": {"label": "a"}}
    (again,) = q.claim(conn, "w2", "default", 1, 30)
    assert (again.id, again.attempt) == (job.id, 1)
    # A step saved by an earlier attempt keeps its first result.
    assert q.save_step(conn, job.id, "w2", again.token, "classify", {"label": "b"})
    assert q.load_step(conn, job.id, "classify") == (True, {"label": "a"})


def test_fail_backs_off_exponentially_then_dies(conn: psycopg.Connection) -> None:
    (job_id,) = q.enqueue(conn, [{}], max_attempts=3)
    delays = []
    for attempt in (1, 2):
        conn.execute("UPDATE jobs SET run_at = now() WHERE id = %s", (job_id,))
        (job,) = q.claim(conn, "w1", "default", 1, 30)
        assert job.attempt == attempt
        state = q.fail(conn, job.id, "w1", job.token, "boom", backoff_seconds=10)
        assert state == "ready"
        delay = conn.execute(
            "SELECT extract(epoch FROM run_at - now()) FROM jobs WHERE id = %s", (job_id,)
        ).fetchone()
        assert delay is not None
        delays.append(float(delay[0]))
        assert q.claim(conn, "w1", "default", 1, 30) == []  # not due yet
    assert delays[0] == pytest.approx(10, abs=1)
    assert delays[1] == pytest.approx(20, abs=1)
    conn.execute("UPDATE jobs SET run_at = now() WHERE id = %s", (job_id,))
    (job,) = q.claim(conn, "w1", "default", 1, 30)
    assert q.fail(conn, job.id, "w1", job.token, "boom") == "dead"
    row = _job(conn, job_id)
    assert (row["state"], row["attempts"], row["last_error"]) == ("dead", 3, "boom")


def test_backoff_is_capped(conn: psycopg.Connection) -> None:
    (job_id,) = q.enqueue(conn, [{}], max_attempts=50)
    conn.execute("UPDATE jobs SET attempts = 30 WHERE id = %s", (job_id,))
    (job,) = q.claim(conn, "w1", "default", 1, 30)
    q.fail(conn, job.id, "w1", job.token, "x", backoff_seconds=1, backoff_cap_seconds=60)
    delay = conn.execute(
        "SELECT extract(epoch FROM run_at - now()) FROM jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert delay is not None and float(delay[0]) == pytest.approx(60, abs=1)


def test_backoff_stays_capped_past_the_thousandth_attempt(conn: psycopg.Connection) -> None:
    """2**1024 is past a double: the delay of attempt 1025 and later was an overflow error, the
    failure was never written, and the job waited out its lease with no backoff."""
    (job_id,) = q.enqueue(conn, [{}], max_attempts=5000)
    conn.execute("UPDATE jobs SET attempts = 1500 WHERE id = %s", (job_id,))
    (job,) = q.claim(conn, "w1", "default", 1, 30)
    assert q.fail(conn, job.id, "w1", job.token, "x", backoff_seconds=2) == "ready"
    delay = conn.execute(
        "SELECT extract(epoch FROM run_at - now()) FROM jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert delay is not None and float(delay[0]) == pytest.approx(600, abs=1)


def test_permanent_error_fails_at_once(conn: psycopg.Connection) -> None:
    q.enqueue(conn, [{}], max_attempts=5)
    (job,) = q.claim(conn, "w1", "default", 1, 30)
    assert q.fail(conn, job.id, "w1", job.token, "bad input", permanent=True) == "failed"
    row = _job(conn, job.id)
    assert (row["state"], row["attempts"]) == ("failed", 1)


def test_reaper_returns_expired_jobs_with_the_attempt_spent(conn: psycopg.Connection) -> None:
    a, b, c = q.enqueue(conn, [{}] * 3, max_attempts=2)
    claimed = {j.id: j for j in q.claim(conn, "w1", "default", 3, 30)}
    conn.execute("UPDATE jobs SET attempts = 2 WHERE id = %s", (b,))
    _expire(conn, a)
    _expire(conn, b)
    assert q.reap_expired(conn) == 2
    assert q.reap_expired(conn) == 0
    assert (_job(conn, a)["state"], _job(conn, a)["attempts"]) == ("ready", 1)
    assert (_job(conn, b)["state"], _job(conn, b)["attempts"]) == ("dead", 2)
    assert _job(conn, c)["state"] == "leased"
    assert q.heartbeat(conn, c, "w1", claimed[c].token, 30) is True


def test_lease_lost_first_worker_is_refused_and_the_job_completes_once(
    conn: psycopg.Connection,
) -> None:
    """Worker A stalls (no heartbeat) past expiry; B reaps and takes the job; A wakes up."""
    (job_id,) = q.enqueue(conn, [{}])
    (a,) = q.claim(conn, "A", "default", 1, 30)
    assert q.save_step(conn, job_id, "A", a.token, "classify", "from A")
    _expire(conn, job_id)  # A's heartbeat stalled past expiry
    assert q.reap_expired(conn) == 1
    (b,) = q.claim(conn, "B", "default", 1, 30)
    assert (b.id, b.attempt) == (job_id, 2)
    # A comes back: every write refused, and it learns it lost the lease.
    assert q.heartbeat(conn, job_id, "A", a.token, 30) is False
    assert q.save_step(conn, job_id, "A", a.token, "draft", "from A") is False
    assert q.complete(conn, job_id, "A", a.token) is False
    assert q.give_back(conn, job_id, "A", a.token) is False
    assert _job(conn, job_id)["state"] == "leased"
    assert q.save_step(conn, job_id, "B", b.token, "draft", "from B")
    assert q.complete(conn, job_id, "B", b.token) is True
    row = _job(conn, job_id)
    assert (row["state"], row["attempts"]) == ("succeeded", 2)
    assert load_steps(conn, job_id) == {"classify": "from A", "draft": "from B"}


def test_enqueue_notifies_listeners(db_url: str, conn: psycopg.Connection) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {q.NOTIFY_CHANNEL}")
        q.enqueue(conn, [{}], queue="emails")
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in notes] == ["emails"]


def test_a_handler_still_running_after_give_back_is_fenced_out(conn: psycopg.Connection) -> None:
    """A sync handler thread cannot be killed at the drain deadline: its writes must bounce."""
    q.enqueue(conn, [{}])
    (job,) = q.claim(conn, "w1", "default", 1, 30)
    assert q.give_back(conn, job.id, "w1", job.token)
    assert q.save_step(conn, job.id, "w1", job.token, "late", 1) is False
    assert q.complete(conn, job.id, "w1", job.token) is False
    assert q.fail(conn, job.id, "w1", job.token, "late") is None
    assert (_job(conn, job.id)["state"], load_steps(conn, job.id)) == ("ready", {})


def test_complete_many_writes_only_the_leases_still_held(conn: psycopg.Connection) -> None:
    q.enqueue(conn, [{}] * 3)
    a, b, c = q.claim(conn, "w1", "default", 3, 30)
    _expire(conn, b.id)
    written = q.complete_many(conn, "w1", [(a.id, a.token), (b.id, b.token), (c.id, uuid.uuid4())])
    assert written == {a.id}
    assert [_job(conn, j.id)["state"] for j in (a, b, c)] == ["succeeded", "leased", "leased"]


def test_a_reaped_job_keeps_its_place_ahead_of_jobs_enqueued_after_it(
    conn: psycopg.Connection,
) -> None:
    (first,) = q.enqueue(conn, [{}])
    q.claim(conn, "w1", "default", 1, 30)  # w1 dies holding it
    later = q.enqueue(conn, [{}] * 3)
    _expire(conn, first)
    assert q.reap_expired(conn) == 1
    # No backoff for a worker's death: it is due at once, in its original order.
    assert [c.id for c in q.claim(conn, "w2", "default", 4, 30)] == [first, *later]
    assert _job(conn, first)["attempts"] == 2


def test_a_renewal_and_a_batch_completion_of_the_same_leases_never_deadlock(
    db_url: str, conn: psycopg.Connection
) -> None:
    """The heartbeat renews the held leases while the main thread completes some of them, each
    listing the jobs in its own order: both must lock the lease rows in one order, or each holds
    a row the other waits for and Postgres kills one (a retry, and a false "database
    unreachable" line in the worker's log)."""
    q.enqueue(conn, [{}, {}, {}])
    held = [(c.id, c.token) for c in q.claim(conn, "w", "default", 3, 60)]
    assert len(held) == 3
    conn.execute("ANALYZE job_leases")  # the plan a live table has: rows locked as listed
    middle = sorted(held)[1][0]

    def waiting() -> int:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
        return int(row[0]) if row else 0

    errors: list[BaseException] = []
    results: dict[str, set[int]] = {}

    def run(name: str, fn: Callable[[psycopg.Connection], set[int]]) -> threading.Thread:
        def target() -> None:
            with psycopg.connect(db_url, autocommit=True) as c:
                try:
                    results[name] = fn(c)
                except psycopg.Error as exc:
                    errors.append(exc)

        t = threading.Thread(target=target, daemon=True)
        t.start()
        return t

    with psycopg.connect(db_url) as blocker:
        # Holds the middle row, so each statement has locked one end before it waits.
        blocker.execute("SELECT 1 FROM job_leases WHERE job_id = %s FOR UPDATE", (middle,))
        threads = [run("renew", lambda c: q.renew(c, "w", sorted(held), 60))]
        wait_for(lambda: waiting() == 1, "the renewal to wait on the middle row", 10)
        threads.append(run("complete", lambda c: q.complete_many(c, "w", sorted(held)[::-1])))
        wait_for(lambda: waiting() == 2, "the completion to wait too", 10)
    for t in threads:
        t.join(30)
    assert errors == []
    assert results["complete"] == {job_id for job_id, _ in held}
    states = conn.execute("SELECT DISTINCT state FROM jobs").fetchall()
    assert states == [("succeeded",)]


_BATCHES: dict[str, Callable[[psycopg.Connection, list[tuple[int, uuid.UUID]]], set[int]]] = {
    "renew": lambda c, held: q.renew(c, "w", held, 60),
    "complete_many": lambda c, held: q.complete_many(c, "w", held),
    "give_back_many": lambda c, held: q.give_back_many(c, "w", held),
}


@pytest.mark.parametrize("batch", sorted(_BATCHES))
@pytest.mark.parametrize(
    "change",
    [
        "DELETE FROM job_leases WHERE job_id = %s",
        "UPDATE job_leases SET token = gen_random_uuid() WHERE job_id = %s",
        "UPDATE job_leases SET worker_id = 'other' WHERE job_id = %s",
        "UPDATE job_leases SET expires_at = now() - interval '1 second' WHERE job_id = %s",
    ],
    ids=["completed", "claimed-again", "other-worker", "expired"],
)
def test_a_batch_write_that_waited_for_a_lease_still_fences_it_by_worker_token_and_expiry(
    db_url: str, conn: psycopg.Connection, batch: str, change: str
) -> None:
    """The batch locks its lease rows first (in job id order) and writes only the rows it
    locked: a lease another session changed while the batch waited for it must be re-checked
    on the row it finally locks, so the batch reports it lost and writes nothing to that job."""
    q.enqueue(conn, [{}, {}, {}])
    held = sorted((c.id, c.token) for c in q.claim(conn, "w", "default", 3, 60))
    middle = held[1][0]
    before = _job(conn, middle)
    result: list[set[int]] = []

    def run() -> None:
        with psycopg.connect(db_url, autocommit=True) as c:
            result.append(_BATCHES[batch](c, held))

    with psycopg.connect(db_url) as blocker:
        blocker.execute(change, (middle,))  # holds the row until the commit below
        t = threading.Thread(target=run, daemon=True)
        t.start()
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ).fetchone()
                == (1,)
            ),
            "the batch to wait on the middle lease",
            10,
        )
    t.join(30)
    assert result == [{held[0][0], held[2][0]}]
    after = _job(conn, middle)
    assert (after["state"], after["attempts"]) == (before["state"], before["attempts"])
