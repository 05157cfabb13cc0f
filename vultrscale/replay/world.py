"""The simulated world: a queue, Vultr instances that boot, bill and die, and their workers.

Workers behave as the reference runtime does (docs/worker.md): a job holds one slot for its
duration; a stopped worker (SIGTERM, a drain) claims nothing more, lets running jobs finish up
to its drain time, then gives the rest back without spending an attempt and exits; a worker
started again (a revive) claims again once the stopped process has exited and the new one has
registered; an instance deleted under a running worker kills its jobs, which return to the
queue when their lease expires, their attempt spent. Time is a float: seconds since the
trace's epoch.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import math
import random
from dataclasses import dataclass, field

from vultrscale.core.model import DEFAULT_MAX_ATTEMPTS
from vultrscale.replay.workload import Trace
from vultrscale.rules import waits

# The built-in queue's default max_attempts: a job killed this many times is dead, and counts
# as lost.
MAX_ATTEMPTS = DEFAULT_MAX_ATTEMPTS
# Vultr shows a new instance `active` (deletable, with an IP) about a minute before cloud-init
# has started the worker; before that a DELETE answers 500 "Server is currently locked".
ACTIVE_BEFORE_WORKER = 60.0
# `systemctl start` to the worker claiming: a Python process starts, connects and registers.
RESTART_SECONDS = 5.0

# Event kinds, in the order they are handled when they fall on the same second.
JOB_END, WORKER_UP, DRAIN_DEADLINE, LEASE_EXPIRED = range(4)


@dataclass(eq=False)
class SimInstance:
    """One instance: its Vultr life, its worker, the jobs it runs."""

    label: str
    created: float
    active_at: float  # Vultr status active; deletable
    worker_at: float  # the worker registers and starts claiming
    slots: int
    running: dict[int, float] = field(default_factory=dict)  # job -> its end time
    # Its plan's (monthly, hourly) price when it is not the replay's one plan: an instance
    # of another offering (``[[fleet.offerings]]``) is billed at its own; None: the replay's.
    price: tuple[float, float | None] | None = None
    stop_at: float | None = None  # SIGTERM (drain) sent
    exited_at: float | None = None  # the worker process ended (drained)
    gone_at: float | None = None
    # `systemctl start` while the worker still drains: systemd runs it once the old process
    # has exited (the start job waits while the unit is deactivating).
    start_queued: bool = False
    # Which worker process: a drain deadline belongs to the process that was stopped, never to
    # one started again after it.
    generation: int = 0

    @property
    def gone(self) -> bool:
        return self.gone_at is not None

    def worker_up(self, now: float) -> bool:
        return now >= self.worker_at and self.exited_at is None and not self.gone

    def claiming(self, now: float) -> bool:
        return self.worker_up(now) and self.stop_at is None

    def stopping(self, now: float) -> bool:
        """Stopped and still draining (`systemctl is-active`: deactivating)."""
        return self.worker_up(now) and self.stop_at is not None


@dataclass(frozen=True)
class Faults:
    """When the world fails like Vultr does (``[simulate]`` in the config): windows in which
    creates are refused (the plan out of stock in the region) or every API call answers 429,
    and the share of instances that never boot (their worker never starts). The windows are
    drawn from the seed alone, so every policy in a comparison meets the same ones. A
    stock-out hits one ``offering``: a create of another is not refused."""

    stockouts: tuple[tuple[float, float], ...] = ()  # (start, end) seconds, sorted, disjoint
    throttles: tuple[tuple[float, float], ...] = ()
    dead_boot_share: float = 0.0
    # The (region, plan) the stock-outs hit; None: any create (a baseline's, which has one).
    offering: tuple[str, str] | None = None

    @classmethod
    def draw(
        cls,
        *,
        until: float,
        seed: int,
        stockout_every: float = 0.0,
        stockout_for: float = 0.0,
        throttle_every: float = 0.0,
        throttle_for: float = 0.0,
        dead_boot_share: float = 0.0,
        stockout_offering: tuple[str, str] | None = None,
    ) -> Faults:
        return cls(
            _windows(random.Random(f"stockout:{seed}"), until, stockout_every, stockout_for),
            _windows(random.Random(f"throttle:{seed}"), until, throttle_every, throttle_for),
            dead_boot_share,
            stockout_offering,
        )


def _windows(
    rng: random.Random, until: float, every: float, length: float
) -> tuple[tuple[float, float], ...]:
    """Windows of ``length`` starting as a Poisson process with mean gap ``every`` (none at 0)."""
    out: list[tuple[float, float]] = []
    if every <= 0 or length <= 0:
        return ()
    t = rng.expovariate(1.0 / every)
    while t < until:
        out.append((t, t + length))
        t += length + rng.expovariate(1.0 / every)
    return tuple(out)


def _inside(windows: tuple[tuple[float, float], ...], starts: list[float], t: float) -> bool:
    k = bisect.bisect_right(starts, t) - 1
    return k >= 0 and t < windows[k][1]


@dataclass
class Counters:
    starts: int = 0  # attempts started
    finished: int = 0
    killed: int = 0  # attempts killed mid-run (instance deleted under them)
    given_back: int = 0  # attempts handed back by a drain, attempt refunded
    dead: int = 0  # killed MAX_ATTEMPTS times
    creates: int = 0
    deletes: int = 0
    drains: int = 0
    revives: int = 0  # workers of draining instances started again (`systemctl start`)
    refused_creates: int = 0  # creates refused by a stock-out
    throttled: int = 0  # API calls (or baseline passes) answered 429
    dead_boots: int = 0  # instances whose worker never started


class World:
    """Queue, jobs, instances and workers at one moment; events move it forward."""

    def __init__(
        self,
        trace: Trace,
        *,
        jobs_per_instance: int,
        drain_seconds: float,
        lease_seconds: float,
        boot_time: tuple[float, float],
        seed: int,
        duration_scale: float = 1.0,
        faults: Faults | None = None,
    ) -> None:
        self.trace = trace
        self.arrival = trace.arrivals
        self.duration = (
            trace.durations
            if duration_scale == 1.0
            else tuple(d * duration_scale for d in trace.durations)
        )
        self.faults = faults or Faults()
        self._stockout_starts = [a for a, _ in self.faults.stockouts]
        self._throttle_starts = [a for a, _ in self.faults.throttles]
        self.dead_rng = random.Random(f"dead:{seed}")
        n = len(trace)
        self.attempts = [0] * n
        self.finished_at: list[float | None] = [None] * n
        self.first_start: list[float | None] = [None] * n
        self.slots = jobs_per_instance
        self.drain_seconds = drain_seconds
        self.lease_seconds = lease_seconds
        self.boot_time = boot_time
        self.rng = random.Random(f"boot:{seed}")
        self.ready: list[tuple[float, int]] = []  # heap of (due, job)
        self.limbo = 0  # killed jobs whose lease has not expired yet (still "in flight")
        self.running = 0
        self.instances: list[SimInstance] = []  # every instance ever, in creation order
        self.live: dict[str, SimInstance] = {}  # not gone, by label
        self.events: list[tuple[float, int, int, object, int]] = []
        self._seq = 0
        self.c = Counters()
        self.now = 0.0
        self._full = False  # jobs are ready and no claiming worker has a free slot
        # The newest finished jobs (end, run time), as the queue's signals read them: the
        # past only, never a job's future.
        self._recent: collections.deque[tuple[float, float]] = collections.deque()
        self._recent_sum = 0.0

    def _finished(self, now: float, ran: float) -> None:
        recent = self._recent
        recent.append((now, ran))
        self._recent_sum += ran
        if len(recent) > waits.RECENT_JOBS:
            self._recent_sum -= recent.popleft()[1]

    def recent_jobs(self) -> tuple[int, float | None]:
        """How many of the newest finished jobs (``waits.RECENT_JOBS`` within
        ``waits.RECENT_WINDOW``) and their mean run time, as the presets read them."""
        recent, since = self._recent, self.now - waits.RECENT_WINDOW.total_seconds()
        while recent and recent[0][0] < since:
            self._recent_sum -= recent.popleft()[1]
        if not recent:
            self._recent_sum = 0.0  # no float drift left behind
            return 0, None
        return len(recent), self._recent_sum / len(recent)

    def recent_arrivals(self) -> int:
        """The jobs that arrived within ``waits.ARRIVAL_WINDOW`` up to now, as the vultrscale
        preset counts them (enqueued in the window; a job run again is not a new arrival)."""
        since = self.now - waits.ARRIVAL_WINDOW.total_seconds()
        arrivals = self.arrival
        return bisect.bisect_right(arrivals, self.now) - bisect.bisect_right(arrivals, since)

    def oldest_ready_seconds(self) -> float:
        """The oldest ready job's age (its due time: a killed job keeps its arrival)."""
        return max(0.0, self.now - self.ready[0][0]) if self.ready else 0.0

    # --- events ---------------------------------------------------------------------------
    def push(self, t: float, kind: int, obj: object, tok: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, obj, tok))

    def handle(self, kind: int, obj: object, tok: int) -> None:
        now = self.now
        if kind == JOB_END:
            inst = obj
            assert isinstance(inst, SimInstance)
            job = tok
            if inst.running.get(job) == now and not inst.gone:
                del inst.running[job]
                self.running -= 1
                self.finished_at[job] = now
                self.c.finished += 1
                self._finished(now, self.duration[job])
                if inst.stop_at is not None and not inst.running:
                    self._exited(inst)  # drained: the last job finished within drain time
                elif self.ready and inst.claiming(now):
                    # With jobs ready every other claiming worker is full (dispatch filled
                    # them), so the worker whose slot just freed takes the next one.
                    self._start(inst, heapq.heappop(self.ready)[1])
                else:
                    self._full = False
        elif kind == DRAIN_DEADLINE:
            inst = obj
            assert isinstance(inst, SimInstance)
            if not inst.gone and inst.exited_at is None and tok == inst.generation:
                self._give_back_all(inst)
                self._exited(inst)
        elif kind == LEASE_EXPIRED:
            self.limbo -= 1
            job = tok
            if self.attempts[job] >= MAX_ATTEMPTS:
                self.c.dead += 1
            else:
                heapq.heappush(self.ready, (self.arrival[job], job))
        elif kind == WORKER_UP:
            self._full = False  # claiming() reads the clock; the dispatch that follows fills it

    def arrive(self, job: int) -> None:
        heapq.heappush(self.ready, (self.arrival[job], job))

    def dispatch(self) -> None:
        """Claiming workers take ready jobs, the least busy worker first (workers that poll
        at the same rate spread the queue between them)."""
        if not self.ready or self._full:
            return
        now = self.now
        workers = [i for i in self.live.values() if i.claiming(now) and len(i.running) < i.slots]
        while self.ready and workers:
            inst = min(workers, key=lambda i: len(i.running))
            self._start(inst, heapq.heappop(self.ready)[1])
            if len(inst.running) >= inst.slots:
                workers.remove(inst)
        # Jobs left over: every claiming slot is taken until a slot frees or a worker starts.
        self._full = bool(self.ready)

    def _start(self, inst: SimInstance, job: int) -> None:
        now = self.now
        end = now + self.duration[job]
        inst.running[job] = end
        self.running += 1
        self.attempts[job] += 1
        if self.first_start[job] is None:
            self.first_start[job] = now
        self.c.starts += 1
        self.push(end, JOB_END, inst, job)

    # --- what the outside world can do ----------------------------------------------------
    def throttled(self) -> bool:
        """Inside a 429 burst: an API call now is refused (and counted)."""
        if self.faults.throttles and _inside(
            self.faults.throttles, self._throttle_starts, self.now
        ):
            self.c.throttled += 1
            return True
        return False

    def skipped_passes(self, first: int, stop: int, interval: float) -> None:
        """Passes ``first`` to ``stop - 1`` of the grid (at ``k * interval``) were skipped:
        each one inside a 429 burst would have had its first API call refused and stopped
        there (counted as a pass that ran would be), so the count does not hang on skipping."""
        for start, end in self.faults.throttles:
            lo = max(first, math.ceil(start / interval))
            hi = min(stop, math.ceil(end / interval))
            if hi > lo:
                self.c.throttled += hi - lo

    def stocked_out(self, offering: tuple[str, str] | None = None) -> bool:
        """Inside a stock-out of ``offering`` (region, plan): a create of it now is refused
        (and counted). None: the create of a baseline, which knows one offering only."""
        hit = self.faults.offering
        if offering is not None and hit is not None and offering != hit:
            return False
        if self.faults.stockouts and _inside(
            self.faults.stockouts, self._stockout_starts, self.now
        ):
            self.c.refused_creates += 1
            return True
        return False

    def try_create(self, label: str) -> SimInstance | None:
        """A create as a scaler that calls the API sees it: None when refused (a 429 or a
        stock-out)."""
        if self.throttled() or self.stocked_out():
            return None
        return self.create(label)

    def create(
        self,
        label: str,
        *,
        slots: int | None = None,
        price: tuple[float, float | None] | None = None,
    ) -> SimInstance:
        """A new instance that boots; ``slots`` (jobs its worker runs at once) and ``price``
        when it is of an offering other than the replay's one plan."""
        lo, hi = self.boot_time
        boot = lo if hi <= lo else self.rng.uniform(lo, hi)
        now = self.now
        dead = bool(self.faults.dead_boot_share) and (
            self.dead_rng.random() < self.faults.dead_boot_share
        )
        inst = SimInstance(
            label=label,
            created=now,
            active_at=now + max(0.0, boot - ACTIVE_BEFORE_WORKER),
            # A dead boot: Vultr shows it active, cloud-init never starts the worker.
            worker_at=math.inf if dead else now + boot,
            slots=self.slots if slots is None else slots,
            price=price,
        )
        self.instances.append(inst)
        self.live[label] = inst
        self.c.creates += 1
        if dead:
            self.c.dead_boots += 1
        else:
            self.push(inst.worker_at, WORKER_UP, inst)
        return inst

    def warm(self, label: str) -> SimInstance:
        """An instance that was already running when the trace began (always-on fleets)."""
        inst = SimInstance(label, self.now, self.now, self.now, self.slots)
        self.instances.append(inst)
        self.live[label] = inst
        self._full = False
        return inst

    def stop(self, label: str) -> bool:
        """`systemctl stop` the worker: a drain. False when the host cannot be reached yet."""
        inst = self.live.get(label)
        now = self.now
        if inst is None or now < inst.active_at:
            return False
        if inst.stop_at is None:
            inst.stop_at = now
            self.c.drains += 1
            if not inst.running:
                self._exited(inst)
            else:
                self.push(now + self.drain_seconds, DRAIN_DEADLINE, inst, inst.generation)
        return True

    def start(self, label: str) -> bool:
        """`systemctl start` the worker again (a revive). False when the host cannot be
        reached. A worker still draining finishes its drain first (systemd keeps the start job
        waiting while the unit stops); an exited one starts after RESTART_SECONDS."""
        inst = self.live.get(label)
        now = self.now
        if inst is None or now < inst.active_at:
            return False
        if inst.stop_at is None:
            return True  # running (or still booting): start does nothing
        self.c.revives += 1
        if inst.exited_at is None:
            inst.start_queued = True
        else:
            self._restart(inst)
        return True

    def _exited(self, inst: SimInstance) -> None:
        inst.exited_at = self.now
        if inst.start_queued:
            self._restart(inst)

    def _restart(self, inst: SimInstance) -> None:
        """A new worker process on the instance: it registers and claims RESTART_SECONDS on."""
        inst.start_queued = False
        inst.generation += 1
        inst.stop_at = inst.exited_at = None
        inst.worker_at = self.now + RESTART_SECONDS
        self.push(inst.worker_at, WORKER_UP, inst)

    def service_active(self, label: str) -> bool | None:
        """`systemctl is-active`: True, False (stopped or never started), None (unreachable)."""
        inst = self.live.get(label)
        if inst is None or self.now < inst.active_at:
            return None
        return inst.worker_up(self.now)

    def service_stopping(self, label: str) -> bool:
        """The worker got its stop and still drains (`systemctl is-active`: deactivating)."""
        inst = self.live.get(label)
        return inst is not None and inst.stopping(self.now)

    def delete(self, label: str) -> bool:
        """DELETE the instance; its running jobs are killed. False while Vultr has it locked."""
        inst = self.live.get(label)
        now = self.now
        if inst is None:
            return True
        if now < inst.active_at:
            return False
        for job in list(inst.running):
            self.c.killed += 1
            self.running -= 1
            self.limbo += 1
            # The lease was renewed up to the kill; it lapses lease_seconds later, and the next
            # claim (any worker reaps expired leases) returns the job to the queue.
            self.push(now + self.lease_seconds, LEASE_EXPIRED, None, job)
        inst.running.clear()
        inst.gone_at = now
        if inst.exited_at is None:
            inst.exited_at = now
        del self.live[label]
        self.c.deletes += 1
        return True

    def _give_back_all(self, inst: SimInstance) -> None:
        for job in inst.running:
            self.c.given_back += 1
            self.running -= 1
            self.attempts[job] -= 1  # a give-back refunds the attempt
            heapq.heappush(self.ready, (self.arrival[job], job))
        inst.running.clear()

    # --- what a scaler can observe --------------------------------------------------------
    @property
    def ready_count(self) -> int:
        return len(self.ready)

    @property
    def in_flight(self) -> int:
        """Live leases: running jobs plus killed ones whose lease has not lapsed yet."""
        return self.running + self.limbo

    def idle(self) -> bool:
        """Nothing queued, running or waiting on a lease, and no instance at all."""
        return not self.ready and not self.running and not self.limbo and not self.live
