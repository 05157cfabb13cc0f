"""A hypothesis state machine over the real queue: claim / heartbeat / expire / reap /
complete / fail / give back, from two workers, with stale tokens replayed.

A model tracks what each job's state, attempts and lease must be; after every step the
database must agree, a job is never held by two live leases (nor has a lease unless leased),
and at the end every job is driven to exactly one terminal state, having succeeded at most once.
Time moves by setting ``expires_at`` in the past in SQL, never by sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from uuid import UUID

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from vultrscale.db import queue as q

JOBS = 3
MAX_ATTEMPTS = 3
WORKERS = ("a", "b")
TERMINAL = {"succeeded", "failed", "dead"}


@dataclass
class Lease:
    worker: str
    token: UUID
    live: bool = True


@dataclass
class ModelJob:
    state: str = "ready"
    attempts: int = 0
    lease: Lease | None = None
    issued: list[tuple[str, UUID]] = field(default_factory=list)
    successes: int = 0


def make_machine(conn: psycopg.Connection) -> type[RuleBasedStateMachine]:
    class QueueMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            conn.execute("DELETE FROM jobs")  # cascades to leases and steps
            self.ids = q.enqueue(conn, [{"n": i} for i in range(JOBS)], max_attempts=MAX_ATTEMPTS)
            self.model = {i: ModelJob() for i in self.ids}

        # --- helpers ---------------------------------------------------------------------------

        def _pick(self, index: int) -> tuple[int, ModelJob]:
            job_id = self.ids[index % JOBS]
            return job_id, self.model[job_id]

        def _credential(self, m: ModelJob, which: int) -> tuple[str, UUID] | None:
            """A current or stale (worker, token) pair for this job, if any was issued."""
            if not m.issued:
                return None
            return m.issued[which % len(m.issued)]

        def _current(self, m: ModelJob, cred: tuple[str, UUID]) -> bool:
            return m.lease is not None and m.lease.live and (m.lease.worker, m.lease.token) == cred

        # --- rules -----------------------------------------------------------------------------

        @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3))
        def claim(self, worker: str, limit: int) -> None:
            claimed = q.claim(conn, worker, "default", limit, 300)
            ready = {i for i in self.ids if self.model[i].state == "ready"}
            # Order is (run_at, id), and a given-back job queues behind: check which and how many.
            assert {c.id for c in claimed} <= ready
            assert len(claimed) == min(limit, len(ready))
            for c in claimed:
                m = self.model[c.id]
                m.state = "leased"
                m.attempts += 1
                assert c.attempt == m.attempts
                m.lease = Lease(worker, c.token)
                m.issued.append((worker, c.token))

        @rule(index=st.integers(0, JOBS - 1), which=st.integers(0, 5))
        def heartbeat(self, index: int, which: int) -> None:
            job_id, m = self._pick(index)
            cred = self._credential(m, which)
            if cred is None:
                return
            assert q.heartbeat(conn, job_id, cred[0], cred[1], 300) == self._current(m, cred)

        @rule(index=st.integers(0, JOBS - 1))
        def expire(self, index: int) -> None:
            job_id, m = self._pick(index)
            conn.execute(
                "UPDATE job_leases SET expires_at = now() - interval '1 second' WHERE job_id = %s",
                (job_id,),
            )
            if m.lease is not None:
                m.lease.live = False

        @rule()
        def reap(self) -> None:
            expected = 0
            for m in self.model.values():
                if m.lease is not None and not m.lease.live:
                    expected += 1
                    m.state = "dead" if m.attempts >= MAX_ATTEMPTS else "ready"
                    m.lease = None
            assert q.reap_expired(conn) == expected

        @rule(index=st.integers(0, JOBS - 1), which=st.integers(0, 5))
        def complete(self, index: int, which: int) -> None:
            job_id, m = self._pick(index)
            cred = self._credential(m, which)
            if cred is None:
                return
            ok = q.complete(conn, job_id, *cred)
            assert ok == self._current(m, cred)
            if ok:
                m.state, m.lease = "succeeded", None
                m.successes += 1

        @rule(index=st.integers(0, JOBS - 1), which=st.integers(0, 5), permanent=st.booleans())
        def fail(self, index: int, which: int, permanent: bool) -> None:
            job_id, m = self._pick(index)
            cred = self._credential(m, which)
            if cred is None:
                return
            current = self._current(m, cred)
            state = q.fail(conn, job_id, *cred, "boom", permanent=permanent, backoff_seconds=0)
            if not current:
                assert state is None
                return
            expected = "failed" if permanent else "dead" if m.attempts >= MAX_ATTEMPTS else "ready"
            assert state == expected
            m.state, m.lease = expected, None

        @rule(index=st.integers(0, JOBS - 1), which=st.integers(0, 5))
        def give_back(self, index: int, which: int) -> None:
            job_id, m = self._pick(index)
            cred = self._credential(m, which)
            if cred is None:
                return
            ok = q.give_back(conn, job_id, *cred)
            assert ok == self._current(m, cred)
            if ok:
                m.state, m.lease = "ready", None
                m.attempts -= 1

        # --- invariants ------------------------------------------------------------------------

        @invariant()
        def database_matches_model(self) -> None:
            rows = conn.execute(
                "SELECT j.id, j.state, j.attempts, count(l.job_id),"
                " count(l.job_id) FILTER (WHERE l.expires_at > now())"
                " FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.id"
                " GROUP BY j.id ORDER BY j.id"
            ).fetchall()
            for job_id, state, attempts, leases, live in rows:
                m = self.model[job_id]
                assert (state, attempts) == (m.state, m.attempts)
                assert live <= 1  # never two live leases
                assert leases == (1 if state == "leased" else 0)
                assert live == (1 if m.lease is not None and m.lease.live else 0)
                assert 0 <= attempts <= MAX_ATTEMPTS
                assert m.successes <= 1

        def teardown(self) -> None:
            # Drive every job to the end the way workers would: expiry + reaper, then finish.
            for _ in range(MAX_ATTEMPTS + 1):
                conn.execute("UPDATE job_leases SET expires_at = now() - interval '1 second'")
                q.reap_expired(conn)
                for c in q.claim(conn, "closer", "default", JOBS, 300):
                    assert q.complete(conn, c.id, "closer", c.token)
                    self.model[c.id].successes += 1
            rows = conn.execute("SELECT id, state FROM jobs ORDER BY id").fetchall()
            assert all(state in TERMINAL for _, state in rows), rows
            assert conn.execute("SELECT count(*) FROM job_leases").fetchone() == (0,)
            for job_id, state in rows:
                assert self.model[job_id].successes == (1 if state == "succeeded" else 0)

    return QueueMachine


def test_queue_state_machine(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        run_state_machine_as_test(
            make_machine(conn),
            settings=settings(
                max_examples=40,
                stateful_step_count=25,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
