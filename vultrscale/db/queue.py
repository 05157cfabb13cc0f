"""The built-in queue's operations, each one SQL statement against the schema of ``schema.py``.

The contract (docs/worker.md):

- ``claim`` locks ready rows with ``FOR UPDATE SKIP LOCKED``, counts the attempt and writes the
  lease in the same statement; the lease carries a fresh fencing ``token``.
- Every later write (heartbeat, step result, complete, fail, give back) is fenced by
  ``(job_id, worker_id, token)`` and a live lease (``expires_at > now()``). Zero rows means the
  lease was lost: the caller drops its result.
- ``reap_expired`` returns jobs whose lease ran out; the attempt stays spent, so a job that kills
  its worker reaches ``dead`` at ``max_attempts``; its ``run_at`` stays, so it runs again before
  jobs that arrived after it (backoff is for the job's own failures, not its worker's death).
- Every time is the database's ``now()``; no Python clock is ever written.

Functions take an open psycopg connection and run in a transaction of their own (a savepoint
if the caller already has one open).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from vultrscale.core.model import DEFAULT_MAX_ATTEMPTS
from vultrscale.errors import RuntimeFailure

NOTIFY_CHANNEL = "vultrscale_jobs"
"""Channel ``enqueue`` notifies (payload: the queue name) so idle workers wake at once."""

DEFAULT_BACKOFF_SECONDS = 2.0
DEFAULT_BACKOFF_CAP_SECONDS = 600.0


class LeaseLost(RuntimeFailure):
    """The job's lease expired or was taken over; this worker's writes for it are refused."""


class Claimed(NamedTuple):
    """A job this worker now holds: the attempt counts from 1, ``token`` fences every write.

    ``payload_error`` says why the payload could not be decoded (JSON that Postgres stores but
    Python refuses: an integer of more than 4300 digits, nesting past the recursion limit);
    ``payload`` is then None.
    """

    id: int
    payload: Any
    attempt: int
    token: UUID
    payload_error: str | None = None


def enqueue(
    conn: psycopg.Connection,
    payloads: Sequence[Any],
    queue: str = "default",
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    run_at: datetime | None = None,
) -> list[int]:
    """Insert one ready job per payload (in order) and wake idle workers; return their ids."""
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    if not payloads:
        return []
    docs = [json.dumps(p) for p in payloads]
    with conn.transaction():
        rows = conn.execute(
            """
            INSERT INTO jobs (queue, max_attempts, run_at, payload)
            SELECT %(queue)s, %(max_attempts)s, coalesce(%(run_at)s::timestamptz, now()), p
            FROM unnest(%(docs)s::jsonb[]) WITH ORDINALITY AS t(p, n)
            ORDER BY n
            RETURNING id
            """,
            {"queue": queue, "max_attempts": max_attempts, "run_at": run_at, "docs": docs},
        ).fetchall()
        conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, queue))
    return sorted(int(r[0]) for r in rows)


_CLAIM = """
WITH picked AS (
    SELECT id FROM jobs
    WHERE state = 'ready' AND queue = %(queue)s AND run_at <= now()
      AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = %(worker)s AND w.draining)
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE jobs j SET state = 'leased', attempts = j.attempts + 1, started_at = now()
    FROM picked WHERE j.id = picked.id
    RETURNING j.id, j.attempts, j.payload
), leased AS (
    INSERT INTO job_leases (job_id, worker_id, token, expires_at)
    SELECT id, %(worker)s, gen_random_uuid(), now() + make_interval(secs => %(lease)s)
    FROM claimed
    -- a lease row can only outlive its job's 'leased' state if someone edited by hand
    ON CONFLICT (job_id) DO UPDATE SET worker_id = excluded.worker_id, token = excluded.token,
        leased_at = now(), expires_at = excluded.expires_at
    RETURNING job_id, token
)
SELECT c.id, c.payload::text, c.attempts, l.token FROM claimed c JOIN leased l ON l.job_id = c.id
ORDER BY c.id
"""


def claim(
    conn: psycopg.Connection, worker_id: str, queue: str, limit: int, lease_seconds: float
) -> list[Claimed]:
    """Take up to ``limit`` due jobs in one statement; nothing if this worker is draining.

    Payloads are decoded one by one: one that Python cannot read is that job's
    ``payload_error``, not an error of the claim (which would roll back, and every claim after
    it would take the same job first: one bad payload would stop the queue)."""
    if limit <= 0:
        return []
    with conn.transaction():
        rows = conn.execute(
            _CLAIM,
            {"queue": queue, "worker": worker_id, "limit": limit, "lease": float(lease_seconds)},
        ).fetchall()
    return [_claimed(int(r[0]), r[1], int(r[2]), r[3]) for r in rows]


def _claimed(job_id: int, payload: str, attempt: int, token: UUID) -> Claimed:
    try:
        return Claimed(job_id, json.loads(payload), attempt, token)
    except (ValueError, RecursionError) as exc:
        return Claimed(job_id, None, attempt, token, f"{type(exc).__name__}: {exc}")


def heartbeat(
    conn: psycopg.Connection, job_id: int, worker_id: str, token: UUID, lease_seconds: float
) -> bool:
    """Renew one lease; False if it was lost (expired or taken over)."""
    return job_id in renew(conn, worker_id, [(job_id, token)], lease_seconds)


# The batch fence, locking its rows in job id order first: the heartbeat's renewal and the
# main thread's completions (or the drain's give-back) hold leases of the same jobs, each listed
# in its own order; locked as listed, each could hold a row the other waits for, and Postgres
# would end one of them as a deadlock (a retry, and a false "database unreachable" line).
_LOCKED_MANY = """
locked AS MATERIALIZED (
    SELECT l.job_id FROM job_leases l
    JOIN unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS h(job_id, token)
      ON l.job_id = h.job_id AND l.token = h.token
    WHERE l.worker_id = %(worker)s AND l.expires_at > now()
    ORDER BY l.job_id
    FOR UPDATE OF l
)"""


def renew(
    conn: psycopg.Connection,
    worker_id: str,
    held: Iterable[tuple[int, UUID]],
    lease_seconds: float,
) -> set[int]:
    """Renew every live lease in ``held`` in one statement; return the job ids still held."""
    pairs = list(held)
    if not pairs:
        return set()
    with conn.transaction():
        rows = conn.execute(
            "WITH"
            + _LOCKED_MANY
            + """
            UPDATE job_leases l SET expires_at = now() + make_interval(secs => %(lease)s)
            FROM locked WHERE l.job_id = locked.job_id
            RETURNING l.job_id
            """,
            {
                "lease": float(lease_seconds),
                "ids": [p[0] for p in pairs],
                "tokens": [p[1] for p in pairs],
                "worker": worker_id,
            },
        ).fetchall()
    return {int(r[0]) for r in rows}


# The fenced delete every finishing write starts with: the lease must be ours and still live.
_GONE = """
gone AS (
    DELETE FROM job_leases
    WHERE job_id = %(id)s AND worker_id = %(worker)s AND token = %(token)s
      AND expires_at > now()
    RETURNING job_id
)"""


# The same fence for a batch: each (job id, token) pair must be ours and still live.
_GONE_MANY = (
    _LOCKED_MANY
    + """,
gone AS (
    DELETE FROM job_leases l USING locked WHERE l.job_id = locked.job_id RETURNING l.job_id
)"""
)

# The writes that follow a fenced delete, on the jobs whose leases it removed.
_SUCCEED = """
UPDATE jobs j SET state = 'succeeded', finished_at = now()
FROM gone WHERE j.id = gone.job_id RETURNING j.id
"""
_GIVE_BACK = """
UPDATE jobs j SET state = 'ready', attempts = greatest(j.attempts - 1, 0), run_at = now()
FROM gone WHERE j.id = gone.job_id RETURNING j.id
"""


def _release_many(
    conn: psycopg.Connection, worker_id: str, held: Iterable[tuple[int, UUID]], update: str
) -> set[int]:
    """Delete the held leases that are still ours and live, run ``update`` (which reads
    ``gone``) on their jobs in the same statement, and return the ids it wrote."""
    pairs = list(held)
    if not pairs:
        return set()
    with conn.transaction():
        rows = conn.execute(
            "WITH" + _GONE_MANY + update,
            {"ids": [p[0] for p in pairs], "tokens": [p[1] for p in pairs], "worker": worker_id},
        ).fetchall()
    return {int(r[0]) for r in rows}


def complete(conn: psycopg.Connection, job_id: int, worker_id: str, token: UUID) -> bool:
    """Mark the job succeeded; False (nothing written) if the lease was lost."""
    return job_id in complete_many(conn, worker_id, [(job_id, token)])


def complete_many(
    conn: psycopg.Connection, worker_id: str, held: Iterable[tuple[int, UUID]]
) -> set[int]:
    """Mark several jobs succeeded in one statement, each fenced by its own lease; return the
    ids that were written (a missing id had lost its lease)."""
    return _release_many(conn, worker_id, held, _SUCCEED)


def fail(
    conn: psycopg.Connection,
    job_id: int,
    worker_id: str,
    token: UUID,
    error: str,
    *,
    permanent: bool = False,
    backoff_seconds: float = DEFAULT_BACKOFF_SECONDS,
    backoff_cap_seconds: float = DEFAULT_BACKOFF_CAP_SECONDS,
) -> str | None:
    """Record a failed attempt; return the new state, or None if the lease was lost.

    ``ready`` again after ``backoff_seconds * 2**(attempt-1)`` (capped), ``dead`` once the
    attempts are spent, ``failed`` at once for a permanent error.
    """
    with conn.transaction():
        row = conn.execute(
            "WITH"
            + _GONE
            + """
            , next AS (
                SELECT j.id, CASE WHEN %(permanent)s THEN 'failed'
                                  WHEN j.attempts >= j.max_attempts THEN 'dead'
                                  ELSE 'ready' END AS state,
                       -- the exponent stops at 60 (any base reaches the cap by then): from
                       -- 2^1024 on a double overflows and the failure would not be written
                       least(%(cap)s, %(base)s * power(2, least(greatest(j.attempts - 1, 0), 60)))
                           AS delay
                FROM jobs j JOIN gone ON gone.job_id = j.id
            )
            UPDATE jobs j SET state = next.state,
                run_at = CASE WHEN next.state = 'ready'
                              THEN now() + make_interval(secs => next.delay) ELSE j.run_at END,
                finished_at = CASE WHEN next.state = 'ready' THEN NULL ELSE now() END,
                last_error = %(error)s
            FROM next WHERE j.id = next.id RETURNING j.state
            """,
            {
                "id": job_id,
                "worker": worker_id,
                "token": token,
                "permanent": permanent,
                "base": float(backoff_seconds),
                "cap": float(backoff_cap_seconds),
                "error": error[:4000],
            },
        ).fetchone()
    return str(row[0]) if row else None


def give_back(conn: psycopg.Connection, job_id: int, worker_id: str, token: UUID) -> bool:
    """Return an unfinished job to ``ready`` now with its attempt refunded; steps stay saved."""
    with conn.transaction():
        row = conn.execute(
            "WITH" + _GONE + _GIVE_BACK, {"id": job_id, "worker": worker_id, "token": token}
        ).fetchone()
    return row is not None


def give_back_many(
    conn: psycopg.Connection, worker_id: str, held: Iterable[tuple[int, UUID]]
) -> set[int]:
    """``give_back`` for several jobs in one statement, each fenced by its own lease; return
    the ids given back (a missing id had lost its lease or was finished)."""
    return _release_many(conn, worker_id, held, _GIVE_BACK)


def reap_expired(conn: psycopg.Connection, batch: int = 1000) -> int:
    """Return jobs whose lease expired: ``ready`` (attempt stays spent, place in the queue kept)
    or ``dead``; count them.

    Safe from any number of workers at once: rows another reaper or a heartbeat holds are
    skipped, and the expiry is checked again on the locked row.
    """
    with conn.transaction():
        rows = conn.execute(
            """
            WITH expired AS (
                DELETE FROM job_leases WHERE job_id IN (
                    SELECT job_id FROM job_leases WHERE expires_at <= now()
                    ORDER BY expires_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
                RETURNING job_id
            )
            -- run_at stays: the job keeps its place ahead of work that arrived after it
            -- (a worker's death is not the job's failure, so no backoff either).
            UPDATE jobs j SET
                state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
                finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
                last_error = 'lease expired (worker stopped heartbeating)'
            FROM expired WHERE j.id = expired.job_id AND j.state = 'leased'
            RETURNING j.id
            """,
            {"batch": batch},
        ).fetchall()
    return len(rows)


def save_step(
    conn: psycopg.Connection,
    job_id: int,
    worker_id: str,
    token: UUID,
    name: str,
    result: Any,
) -> bool:
    """Save a step's JSON result under the live lease; False (nothing written) if it was lost.

    A result saved earlier under the same name is kept (a step runs once per job).
    """
    with conn.transaction():
        row = conn.execute(
            """
            INSERT INTO job_steps (job_id, name, result)
            SELECT l.job_id, %(name)s, %(result)s FROM job_leases l
            WHERE l.job_id = %(id)s AND l.worker_id = %(worker)s AND l.token = %(token)s
              AND l.expires_at > now()
            FOR SHARE
            ON CONFLICT (job_id, name) DO UPDATE SET result = job_steps.result
            RETURNING job_id
            """,
            {
                "id": job_id,
                "worker": worker_id,
                "token": token,
                "name": name,
                "result": Jsonb(result),
            },
        ).fetchone()
    return row is not None


def load_step(conn: psycopg.Connection, job_id: int, name: str) -> tuple[bool, Any]:
    """(True, result) if the step was saved for this job, else (False, None)."""
    row = conn.execute(
        "SELECT result FROM job_steps WHERE job_id = %s AND name = %s", (job_id, name)
    ).fetchone()
    return (True, row[0]) if row else (False, None)


# --- workers -----------------------------------------------------------------------------------


def register_worker(conn: psycopg.Connection, worker_id: str, instance_label: str) -> None:
    """Insert or refresh this worker's row, not stopped.

    It is draining exactly when the scaler is draining or deleting its instance
    (``fleet_instances.state``, read through the ``draining_instance_labels`` view: the
    workers' role may not read the scaler's tables): a worker restarted by systemd on an
    instance being drained claims nothing, and one restarted after its own drain (even one cut
    short by SIGKILL, which leaves its own draining mark behind) works again. The scaler
    re-marks the workers of draining instances on every pass as well.
    """
    with conn.transaction():
        conn.execute(
            """
            INSERT INTO workers (worker_id, instance_label, draining)
            VALUES (%(worker)s, %(label)s, EXISTS (
                SELECT 1 FROM draining_instance_labels WHERE label = %(label)s))
            ON CONFLICT (worker_id) DO UPDATE SET instance_label = excluded.instance_label,
                started_at = now(), last_seen = now(), stopped_at = NULL,
                draining = excluded.draining
            """,
            {"worker": worker_id, "label": instance_label},
        )


def worker_heartbeat(conn: psycopg.Connection, worker_id: str) -> bool:
    """Update ``last_seen``; return whether the worker is marked draining."""
    with conn.transaction():
        row = conn.execute(
            "UPDATE workers SET last_seen = now() WHERE worker_id = %s RETURNING draining",
            (worker_id,),
        ).fetchone()
    return bool(row and row[0])


def set_draining(conn: psycopg.Connection, worker_id: str) -> None:
    """Mark the worker draining: it claims nothing more (the scaler does this too)."""
    with conn.transaction():
        conn.execute("UPDATE workers SET draining = true WHERE worker_id = %s", (worker_id,))


def mark_stopped(conn: psycopg.Connection, worker_id: str) -> None:
    """Record a clean stop."""
    with conn.transaction():
        conn.execute(
            "UPDATE workers SET stopped_at = now(), last_seen = now(), draining = true"
            " WHERE worker_id = %s",
            (worker_id,),
        )
