"""What the worker's parts share: its settings, its summary, and ``WorkerState``, the one value
every thread reads and writes, with the lock that guards it.

The parts (``claiming``, ``running``, ``heartbeat``, ``draining``) hold no state of their own
beyond their thread and connection: each takes the ``WorkerState`` and changes it only through
its methods, so every rule about the lock sits here, once.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue as queue_mod
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vultrscale.db import queue
from vultrscale.db.queue import DEFAULT_BACKOFF_CAP_SECONDS, DEFAULT_BACKOFF_SECONDS
from vultrscale.redaction import first_line, mask_url
from vultrscale.worker.job import Job, Run
from vultrscale.worker.outage import Outage, WorkerDatabase
from vultrscale.workerunit import outage_budget

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker process needs besides the database address."""

    app: str
    concurrency: int = 4
    drain_seconds: float = 20.0
    lease_seconds: float = 60.0
    queue: str = "default"
    worker_id: str = ""
    instance_label: str = ""
    backoff_seconds: float = DEFAULT_BACKOFF_SECONDS
    backoff_cap_seconds: float = DEFAULT_BACKOFF_CAP_SECONDS
    outage_seconds: float = 0.0  # 0: the lease time

    @property
    def outage_budget_seconds(self) -> float:
        """How long the database may stay unreachable before the worker exits 1."""
        return outage_budget(self.outage_seconds, self.lease_seconds)

    @property
    def heartbeat_seconds(self) -> float:
        return self.lease_seconds / 3

    @property
    def lost_margin_seconds(self) -> float:
        """A job is marked lost this long before its lease would run out unrenewed."""
        return max(0.5, self.lease_seconds / 6)

    @property
    def statement_timeout_seconds(self) -> float:
        """The heartbeat's statement timeout (pooled connections get twice as long)."""
        return max(1.0, self.lease_seconds / 6)

    @property
    def reap_seconds(self) -> float:
        # Cheap (an index range scan on live leases), and it bounds how long after expiry a
        # killed worker's job waits.
        return min(1.0, self.lease_seconds / 3)


@dataclass
class Summary:
    """What one worker process did; ``line()`` is the one summary line it prints."""

    taken: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    dead: int = 0
    given_back: int = 0
    lost: int = 0
    elapsed: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def line(self) -> str:
        return (
            f"Done in {self.elapsed:.1f} s: {self.taken} taken, {self.succeeded} succeeded, "
            f"{self.retried} to retry later, {self.failed} failed, {self.dead} dead, "
            f"{self.given_back} given back, {self.lost} lost lease."
        )


def default_worker_id() -> str:
    """``hostname-pid``: unique per process, readable in the workers table."""
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerState:
    """The one value the worker's threads share (see the module docstring).

    Every run in hand is kept by identity: this worker may claim a job again (its lease lost)
    while the earlier run of it still executes; each run leaves only itself. A run is in
    ``running`` from its claim until its outcome is written or it is given back; a success
    waits on ``done`` for the main thread's batch completion, a failure sits in ``failing``
    while it is written. The drain picks what it gives back under the same lock, so a run is
    completed, failed or given back, never two.
    """

    def __init__(
        self,
        settings: WorkerSettings,
        conninfo: str,
        say: Callable[[str], None],
        pool: ConnectionPool,
    ) -> None:
        self.settings = settings
        self.worker_id = settings.worker_id or default_worker_id()
        self.label = settings.instance_label or self.worker_id
        self.conninfo = conninfo
        self.say = say
        self.summary = Summary()
        self.outage = Outage(settings.outage_budget_seconds)
        self.pool = pool  # opened by the worker once it is registered
        # Where the slots, the jobs' steps and the main loop write, through an outage too.
        self.database = WorkerDatabase(pool, self.outage, self.announce_outage)
        self.wake = threading.Event()  # the main thread's: a job arrived, a slot freed up
        self.stop = threading.Event()  # a drain was asked for: claim nothing more
        self.fast = threading.Event()  # a second stop: skip the drain's wait
        self.threads_stop = threading.Event()  # the heartbeat and the listener end
        self.stop_requested: float | None = None  # monotonic time of the first stop request
        self.work: queue_mod.SimpleQueue[Job | None] = queue_mod.SimpleQueue()
        self.done: queue_mod.SimpleQueue[Job] = queue_mod.SimpleQueue()
        self.thread_errors: dict[str, BaseException] = {}
        self.heartbeat_ok = time.monotonic()  # send time of the last successful renewal
        self._lock = threading.Lock()
        self._running: set[Job] = set()
        self._failing: set[Job] = set()
        self._futures: dict[Job, concurrent.futures.Future[Any]] = {}
        self._marked_draining = False
        # Jobs marked lost locally (by the heartbeat or the health check) since the last
        # renewal that succeeded: the count said when an outage ends.
        self._lost_since_renewal = 0

    # --- stopping ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Begin the drain; a second call skips the wait (what SIGTERM/SIGINT do)."""
        if self.stop.is_set():
            self.fast.set()
        else:  # the drain time counts from here, as systemd's TimeoutStopSec does
            self.stop_requested = time.monotonic()
        self.stop.set()
        self.wake.set()

    @property
    def marked_draining(self) -> bool:
        return self._marked_draining

    def mark_draining(self, why: str | None = None) -> None:
        """Claim nothing more; ``why`` is said once, the first time."""
        first = not self._marked_draining
        self._marked_draining = True
        if first and why:
            self.say(why)

    # --- the outage ----------------------------------------------------------------------------

    def announce_outage(self, exc: BaseException) -> None:
        self.say(
            f"database unreachable ({first_line(exc, [self.conninfo])}): claiming nothing, "
            f"running jobs go on; waiting up to {self.settings.outage_budget_seconds:g} s "
            "for it to return."
        )

    def database_failed(self, exc: BaseException) -> None:
        """A transient failure seen outside ``retrying`` (the main loop, the heartbeat)."""
        if self.outage.begin(exc):
            self.announce_outage(exc)

    def waiting_for(self, exc: BaseException) -> None:
        """Said once when the database is away at start."""
        self.say(
            f"Waiting up to {self.settings.outage_budget_seconds:g} s for the database at "
            f"{mask_url(self.conninfo)} ({first_line(exc, [self.conninfo])})."
        )

    # --- runs ----------------------------------------------------------------------------------

    def take(self, claimed: list[queue.Claimed], sent: float) -> None:
        """Hand the jobs of a claim sent at ``sent`` (monotonic) to the slots."""
        for c in claimed:
            job = Job(
                c.id,
                c.payload,
                c.attempt,
                c.token,
                worker_id=self.worker_id,
                database=self.database,
                run=Run(renewed_at=sent),
                payload_error=c.payload_error,
            )
            with self._lock:
                self._running.add(job)
            self.work.put(job)
        self.summary.add("taken", len(claimed))

    def running(self) -> list[Job]:
        with self._lock:
            return list(self._running)

    def free_slots(self) -> int:
        with self._lock:
            return self.settings.concurrency - len(self._running)

    def held(self) -> list[Job]:
        """The runs whose leases the heartbeat renews."""
        with self._lock:
            return [j for j in self._running if not j.given_back and not j.lost]

    def started(self, job: Job, future: concurrent.futures.Future[Any]) -> None:
        """An async handler's run is on the event loop (the drain cancels it if given back)."""
        with self._lock:
            self._futures[job] = future

    def finished(self, job: Job, succeeded: bool) -> bool:
        """The handler returned (``succeeded``) or raised; False if the run was given back
        meanwhile (whatever it did is dropped). A success waits on ``done``; a failure is
        ``failing`` until ``failure_written``."""
        with self._lock:
            if job.given_back:
                return False
            if succeeded:
                self.done.put(job)
            else:
                self._failing.add(job)
            return True

    def failure_written(self, job: Job) -> None:
        with self._lock:
            self._failing.discard(job)

    def slot_ended(self, job: Job, handed_on: bool) -> None:
        """The slot is done with the run; ``handed_on``: it waits on ``done``, still running."""
        with self._lock:
            self._futures.pop(job, None)
            if not handed_on:
                self._running.discard(job)

    def completed(self, jobs: list[Job]) -> None:
        with self._lock:
            for job in jobs:
                self._running.discard(job)

    def take_done(self) -> list[Job]:
        """The successes waiting for completion (a given-back one is dropped)."""
        done: list[Job] = []
        while True:
            try:
                job = self.done.get_nowait()
            except queue_mod.Empty:
                return done
            if not job.given_back:
                done.append(job)

    def give_back_rest(self) -> tuple[list[Job], list[Job]]:
        """At the drain's end: the successes still to complete, and every other run, now
        marked given back (the slot writes nothing more, steps refuse)."""
        with self._lock:
            # Slots put a success on done under this lock, after checking given_back: what is
            # on done now finished, everything else running is given back and stays so.
            finished = self.take_done()
            finished_runs = set(finished)
            # A job whose handler failed is finished too: its failure is being written (a
            # PermanentError given back would run again, its attempt refunded).
            leftover = [
                j for j in self._running if j not in finished_runs and j not in self._failing
            ]
            for job in leftover:
                job.run.mark_given_back()
        return finished, leftover

    def futures_of(self, jobs: list[Job]) -> list[concurrent.futures.Future[Any]]:
        with self._lock:
            return [f for j in jobs if (f := self._futures.get(j)) is not None]

    # --- leases --------------------------------------------------------------------------------

    def renewed(self, held: list[Job], kept: set[int], sent: float) -> tuple[list[Job], int]:
        """A renewal sent at ``sent`` kept the leases of ``kept``: mark the rest of ``held``
        lost. Return those, and every job marked lost since the last renewal that succeeded."""
        with self._lock:
            lost = [j for j in held if j.id not in kept and not j.lost]
            for job in held:
                if job.id in kept:
                    job.run.renewed(sent)
            for job in lost:
                job.run.mark_lost()
            abandoned, self._lost_since_renewal = self._lost_since_renewal + len(lost), 0
        return lost, abandoned

    def expire_locally(self) -> None:
        """Mark held jobs lost once their lease is nearly out without a renewal we know of."""
        s = self.settings
        limit = time.monotonic() - (s.lease_seconds - s.lost_margin_seconds)
        with self._lock:
            late = [
                j
                for j in self._running
                if not j.lost and not j.given_back and j.run.renewed_at < limit
            ]
            for job in late:
                job.run.mark_lost()
            self._lost_since_renewal += len(late)
        for job in late:
            self.say(f"job {job.id}: lease not renewed in time; treating it as lost.")
