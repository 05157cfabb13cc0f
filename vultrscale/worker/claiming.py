"""Claiming: the main thread's loop (complete what finished, reap expired leases, claim one
statement's worth of jobs for every free slot) and the listener thread that wakes it.

The listener waits on LISTEN/NOTIFY so an idle worker wakes as soon as a job arrives; polling
backs off from 50 ms to 1 s as a fallback, and covers retries with a later ``run_at``. During an
outage the loop claims nothing and saves nothing until the heartbeat has re-checked the leases;
running jobs go on (their own writes wait at the same gate).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
from psycopg_pool import PoolTimeout

from vultrscale.db import queue
from vultrscale.worker import database
from vultrscale.worker.outage import RETRY_MAX_SECONDS, is_transient
from vultrscale.worker.running import Runner
from vultrscale.worker.state import WorkerState

POLL_MIN_SECONDS = 0.05
POLL_MAX_SECONDS = 1.0


class Claimer:
    """The main loop (``loop``) and its listener (``listener``: created here, started by the
    worker). ``check_health`` raises when the worker cannot go on; it runs every turn."""

    def __init__(self, state: WorkerState, runner: Runner, check_health: Callable[[], None]):
        self.state = state
        self.runner = runner
        self.check_health = check_health
        self.listener = threading.Thread(target=self._listen, name="vs-listen", daemon=True)

    def loop(self) -> None:
        """Claim and complete until a stop is requested."""
        st = self.state
        next_reap = 0.0
        poll = POLL_MIN_SECONDS
        while not st.stop.is_set():
            self.check_health()
            if not st.outage.checked.is_set():
                st.wake.wait(POLL_MIN_SECONDS * 2)
                st.wake.clear()
                continue
            now = time.monotonic()
            reap = now >= next_reap
            try:
                claimed, free, reaped = self._turn(reap)
            except (psycopg.Error, PoolTimeout) as exc:
                if not is_transient(exc):
                    raise
                # A claim whose answer was lost may have leased jobs: they expire and return.
                st.database_failed(exc)
                continue
            if reap:
                next_reap = now + st.settings.reap_seconds
            if reaped or claimed:
                poll = POLL_MIN_SECONDS
            if claimed:
                # Full: a finishing slot wakes us. Not full: the queue is empty for now.
                timeout = POLL_MAX_SECONDS if len(claimed) == free else poll
            else:
                timeout = poll
                poll = min(poll * 2, POLL_MAX_SECONDS)
            if st.wake.wait(min(timeout, max(0.0, next_reap - time.monotonic()) + 0.01)):
                poll = POLL_MIN_SECONDS
            st.wake.clear()

    def _turn(self, reap: bool) -> tuple[list[queue.Claimed], int, int]:
        """One round trip's work on one pooled connection: complete, reap (when due), claim
        for the free slots. Return what was claimed, the free slots, and how many were reaped."""
        st, s = self.state, self.state.settings
        claimed: list[queue.Claimed] = []
        with st.pool.connection() as conn:
            self.runner.flush_done(conn)
            reaped = queue.reap_expired(conn) if reap else 0
            free = st.free_slots()
            sent = time.monotonic()
            # A stop seen here came during this turn's round trips (SIGTERM's handler runs
            # between them): its claim would start jobs the drain then gives back half done.
            if free > 0 and not st.marked_draining and not st.stop.is_set():
                claimed = queue.claim(conn, st.worker_id, s.queue, free, s.lease_seconds)
        st.take(claimed, sent)
        return claimed, free, reaped

    def _listen(self) -> None:
        # A dedicated connection: LISTEN needs one that is not handed around by the pool.
        st, s = self.state, self.state.settings
        while not st.threads_stop.is_set():
            try:
                with database.connect(
                    st.conninfo, s.lease_seconds, s.statement_timeout_seconds, "vultrscale-listen"
                ) as conn:
                    conn.execute(f"LISTEN {queue.NOTIFY_CHANNEL}")
                    st.wake.set()  # a job enqueued while we were not listening
                    while not st.threads_stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.payload == s.queue:
                                st.wake.set()
            except psycopg.Error:
                # Polling finds the jobs meanwhile; the others report an outage. Listen again.
                st.threads_stop.wait(RETRY_MAX_SECONDS)
