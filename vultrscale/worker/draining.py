"""Draining (docs/worker.md): on SIGTERM or SIGINT claim nothing more, give the running
jobs up to the drain time, then give back what is unfinished (state ``ready``, attempt
refunded, steps kept) and mark the worker stopped. A second signal skips the wait.

The drain's writes are retried through an outage within the budget, without waiting at the
gate (every write it makes is fenced by the lease), and given up at the drain deadline plus
``DRAIN_WRITES_SECONDS``: then the jobs return when their leases expire.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg_pool import PoolTimeout

from vultrscale.db import queue
from vultrscale.redaction import first_line
from vultrscale.worker.running import Runner
from vultrscale.worker.state import WorkerState

T = TypeVar("T")

# The drain's last writes (results, give-backs, the stopped mark) get this long past the drain
# deadline, through an outage too: the unit's TimeoutStopSec leaves at least 10 s past it
# (cloud-init/worker.service), so the worker ends before systemd's SIGKILL. A database away
# longer gets none of them; the jobs return when their leases expire.
DRAIN_WRITES_SECONDS = 5.0


class Drainer:
    """The drain, run by the main thread once a stop was requested (``drain``), and the
    give-back after a fatal error (``give_back_after_fatal``). ``check_health`` raises when the
    worker cannot go on; ``stop_threads`` ends the slots, the heartbeat and the listener."""

    def __init__(
        self,
        state: WorkerState,
        runner: Runner,
        check_health: Callable[[], None],
        stop_threads: Callable[[], None],
    ) -> None:
        self.state = state
        self.runner = runner
        self.check_health = check_health
        self.stop_threads = stop_threads

    def drain(self) -> None:
        st, s = self.state, self.state.settings
        running = st.running()
        st.say(
            f"Stopping: no new jobs; {len(running)} running job(s) get up to "
            f"{s.drain_seconds:g} s to finish."
        )
        for job in running:
            job.run.mark_stopping()
        st.mark_draining()  # our own mark: the heartbeat need not announce it
        deadline = (st.stop_requested or time.monotonic()) + s.drain_seconds
        writes_until = deadline + DRAIN_WRITES_SECONDS
        # The database's mark only tells others; our own already stops claims. Sent aside, so
        # a database that is slow or away now does not eat the drain time.
        announce = threading.Thread(
            target=self._announce_draining, name="vultrscale-draining", daemon=True
        )
        announce.start()
        self._wait(deadline, writes_until)
        self.give_back_unfinished(writes_until)
        self.stop_threads()
        if not st.fast.is_set():
            announce.join(max(0.0, deadline - time.monotonic()))  # the mark, then the stop
        self._with_db(lambda c: queue.mark_stopped(c, st.worker_id), writes_until)
        st.pool.close(timeout=2)

    def _wait(self, deadline: float, writes_until: float) -> None:
        """Until every running job ended, the deadline, or a second stop; completing the
        successes as they come."""
        st = self.state
        while not st.fast.is_set():
            self.check_health()
            if not st.done.empty():
                self._with_db(self.runner.flush_done, writes_until)
            if not st.running():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            st.wake.wait(min(left, 0.5))
            st.wake.clear()

    def _with_db(self, fn: Callable[[psycopg.Connection], T], until: float | None = None) -> T:
        return self.state.database.run(fn, gate=False, until=until)

    def give_back_unfinished(self, until: float | None = None) -> None:
        """Complete what finished, give back the rest in one fenced statement (the writes
        given up at ``until``: then the jobs return when their leases expire)."""
        st = self.state
        self._with_db(self.runner.flush_done, until)
        finished, leftover = st.give_back_rest()
        if finished:
            self._with_db(lambda conn: self.runner.complete(conn, finished), until)
        if leftover:
            # Fenced by token: a run whose lease is gone (an earlier run of a job claimed
            # again) gives nothing back; each job is said once.
            pairs = [(j.id, j.token) for j in leftover]
            back = self._with_db(
                lambda conn: queue.give_back_many(conn, st.worker_id, pairs), until
            )
            st.summary.add("given_back", len(back))
            for job_id in sorted(back):
                st.say(f"job {job_id}: given back to the queue (the worker is stopping).")
        for fut in st.futures_of(leftover):
            fut.cancel()

    def _announce_draining(self) -> None:
        # Best effort, whatever the database does: the pool may even be closed under it.
        with contextlib.suppress(Exception):
            self._with_db(lambda c: queue.set_draining(c, self.state.worker_id))

    def give_back_after_fatal(self) -> None:
        try:
            self.give_back_unfinished()
        except (psycopg.Error, PoolTimeout) as exc:
            self.state.say(
                f"could not give jobs back ({first_line(exc, [self.state.conninfo])}); "
                "they return to the queue when their lease expires."
            )
