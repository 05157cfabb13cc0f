"""Renewing leases: one thread renews every held lease in one statement every ``lease/3``
seconds, on a connection of its own (a pool emptied by handlers cannot starve it).

After a failure it retries quickly, and a job whose lease it could not renew in time (lease
minus a margin, by the local clock since the last renewal) is marked lost before the lease runs
out. It is the one that ends an outage (``outage.py``): once it has renewed the held leases on
the database again, it opens the gate the other writers wait at.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from vultrscale.db import queue
from vultrscale.worker import database
from vultrscale.worker.job import Job
from vultrscale.worker.outage import RETRY_MAX_SECONDS
from vultrscale.worker.state import WorkerState


class Heartbeat:
    """The lease-renewing thread (``thread``: created here, started by the worker)."""

    def __init__(
        self, state: WorkerState, guard: Callable[[Callable[[], None]], Callable[[], None]]
    ) -> None:
        self.state = state
        self.thread = threading.Thread(target=guard(self._run), name="vs-heartbeat", daemon=True)
        self._conn: psycopg.Connection[Any] | None = None

    def stop(self) -> None:
        self.state.outage.poke.set()  # it waits on the poke (threads_stop is already set)
        self.thread.join(timeout=5)

    def _run(self) -> None:
        st, s = self.state, self.state.settings
        failures = 0
        wait = s.heartbeat_seconds
        try:
            while True:
                # Poked when any thread sees the database fail: re-check the leases at once.
                st.outage.poke.wait(wait)
                st.outage.poke.clear()
                if st.threads_stop.is_set():
                    return
                held = st.held()
                sent = time.monotonic()
                try:
                    kept, draining = self._renew(held)
                except Exception as exc:  # noqa: BLE001 - the heartbeat outlives any error; the outage budget bounds how long
                    failures += 1
                    self._close()
                    st.database_failed(exc)
                    st.expire_locally()
                    # Retry soon, and often enough to mark jobs lost before their leases end.
                    wait = min(
                        0.1 * 2 ** min(failures - 1, 10),
                        RETRY_MAX_SECONDS,
                        s.lost_margin_seconds / 2,
                    )
                    continue
                failures = 0
                wait = s.heartbeat_seconds
                st.heartbeat_ok = sent
                lost, abandoned = st.renewed(held, kept, sent)
                if not st.outage.checked.is_set():
                    self._recovered(held, lost, abandoned)
                if draining:
                    st.mark_draining("Marked draining in the database: claiming no more jobs.")
        finally:
            self._close()

    def _renew(self, held: list[Job]) -> tuple[set[int], bool]:
        """Renew the leases of ``held`` and read the worker's draining mark, in one
        transaction; return the ids still held and the mark."""
        st, s = self.state, self.state.settings
        if self._conn is None or self._conn.closed:
            self._conn = database.connect(
                st.conninfo, s.lease_seconds, s.statement_timeout_seconds, "vultrscale-heartbeat"
            )
        with self._conn.transaction():
            pairs = [(j.id, j.token) for j in held]
            kept = queue.renew(self._conn, st.worker_id, pairs, s.lease_seconds)
            draining = queue.worker_heartbeat(self._conn, st.worker_id)
        return kept, draining

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _recovered(self, held: list[Job], lost: list[Job], abandoned: int) -> None:
        """The database answered the heartbeat after an outage and the leases were re-checked
        (``lost``: the held jobs whose lease is gone, now marked; ``abandoned``: every job marked
        lost since the last renewal that succeeded, those included): drop dead pooled
        connections, open the gate. A held job marked lost locally while the renewal was on its
        way counts as lost, not kept: the worker has given it up (its lease runs out)."""
        st = self.state
        st.pool.check()
        kept = sum(1 for j in held if not j.lost)
        took = st.outage.end()
        st.say(
            f"database back after {took:.1f} s: {kept} lease(s) kept, {abandoned} lost; "
            "claiming again."
        )
        for job in lost:
            st.say(f"job {job.id}: lease lost during the outage; abandoning it.")
