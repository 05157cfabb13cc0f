"""The policies vultrscale is compared with, written against the simulated world directly.

Each is what its name says, kept as simple as its real counterpart is:

- ``always-on``: a fixed fleet, already running when the trace begins (sized for the trace's
  peak, capped by ``max_instances``; and a single instance).
- ``naive``: scale-to-zero as simple scalers do it: enough instances for the queue while jobs
  are ready, and every instance deleted as soon as none is ready (running jobs die with it).
- ``keda``: KEDA's ScaledObject with a queue-length trigger: desired = ceil(demand / jobs per
  instance), scale-up at once, scale-down stabilised over 300 s (the HPA's window), to zero
  only after ``cooldownPeriod`` = 300 s without demand; victims chosen without regard to the
  jobs they run (not-ready first, then the newest, as a ReplicaSet does); no drain.
- ``hindsight``: knows the whole workload. For each clock hour it runs the instances that
  hour's work needs (the job time arriving in the hour over an instance-hour of slots, rounded
  up), each started one boot time ahead, within ``max_instances``; and never fewer than the
  work queued or running needs, nor than the jobs queued, running, or arriving within one boot
  time still need when an instance created now is up, so a burst inside an hour finds its
  instances up as it lands (sized by the hour alone, it met every burst a boot late). An
  instance not needed the next hour is drained just before its paid hour ends, unless a job
  on it runs on (it knows when each ends). It answers "what would a perfect forecast cost
  here".

In a world that fails (``[simulate]`` faults) a baseline meets the same faults: a pass inside a
429 burst does nothing, a create inside a stock-out is refused.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

from vultrscale.replay.world import World

# Stop an instance the next hour does not need this long before its paid hour ends: its drain
# and its delete then fall inside the hour already paid (Vultr bills per started hour).
HINDSIGHT_MARGIN = 120.0

# KEDA's defaults: cooldownPeriod (to zero) and the HPA's scale-down stabilisation window.
KEDA_COOLDOWN = 300.0
KEDA_STABILIZATION = 300.0


class Baseline:
    """A policy that drives the world directly; ``tick`` is one polling pass."""

    name = "baseline"

    def __init__(self, max_instances: int, jobs_per_instance: int) -> None:
        self.max = max_instances
        self.per = jobs_per_instance
        self._n = 0
        self.bound: set[str] = set()  # the limits that held the fleet below its wish

    def label(self) -> str:
        self._n += 1
        return f"{self.name}-{self._n}"

    def start(self, world: World) -> None:
        """Set the fleet up at second 0."""

    def tick(self, world: World) -> None:
        """One pass at ``world.now``; nothing inside a 429 burst."""
        if not world.throttled():
            self.act(world)

    def act(self, world: World) -> None:
        """What the pass does."""

    def capped(self, want: int) -> int:
        """``want`` within ``max_instances``, noting when the cap binds."""
        if want > self.max:
            self.bound.add("cap")
            return self.max
        return want

    def quiet_until(self, world: World) -> float:
        """A time before which passes on an idle world (no instance, no job) change nothing."""
        return math.inf

    def unchanged(self, world: World) -> bool:
        """True when this pass provably changes nothing (the baselines are cheap: never)."""
        return False


class AlwaysOn(Baseline):
    def __init__(self, size: int, jobs_per_instance: int, name: str) -> None:
        super().__init__(size, jobs_per_instance)
        self.size = size
        self.name = name

    def start(self, world: World) -> None:
        for _ in range(self.size):
            world.warm(self.label())

    def tick(self, world: World) -> None:
        """Nothing to do: the fleet is fixed (and calls no API)."""

    def quiet_until(self, world: World) -> float:
        return math.inf  # never idle: it has instances


class Naive(Baseline):
    name = "naive"

    def act(self, world: World) -> None:
        ready = world.ready_count
        if ready == 0:
            for label in list(world.live):
                world.delete(label)  # no drain: running jobs are killed
            return
        want = self.capped(math.ceil((ready + world.in_flight) / self.per))
        for _ in range(want - len(world.live)):
            if world.try_create(self.label()) is None:
                break


class Keda(Baseline):
    name = "keda"

    def __init__(self, max_instances: int, jobs_per_instance: int) -> None:
        super().__init__(max_instances, jobs_per_instance)
        self.last_active = -math.inf
        self.history: deque[tuple[float, int]] = deque()

    def act(self, world: World) -> None:
        now = world.now
        demand = world.ready_count + world.in_flight
        desired = self.capped(math.ceil(demand / self.per))
        if demand:
            self.last_active = now
        # The HPA runs at 1..N while the trigger is active or within the cool-down; it keeps the
        # highest recommendation of the stabilisation window when scaling down.
        self.history.append((now, min(self.max, max(1, desired))))  # maxReplicaCount, 0 too
        while self.history and self.history[0][0] < now - KEDA_STABILIZATION:
            self.history.popleft()
        if not demand and now - self.last_active >= KEDA_COOLDOWN:
            target = 0
            self.history.clear()
        else:
            target = max(n for _, n in self.history)
        current = list(world.live.values())
        if target > len(current):
            for _ in range(target - len(current)):
                if world.try_create(self.label()) is None:
                    break
        elif target < len(current):
            # Not yet ready first, then the newest: the jobs they hold play no part.
            victims = sorted(reversed(current), key=lambda i: (i.worker_up(now), -i.created))
            for inst in victims[: len(current) - target]:
                world.delete(inst.label)


def hourly_need(
    arrivals: tuple[float, ...], durations: tuple[float, ...], jobs_per_instance: int
) -> list[int]:
    """Per clock hour of the trace: the instances its work needs, the job time arriving in it
    over one instance-hour of slots, rounded up."""
    work: dict[int, float] = {}
    for a, d in zip(arrivals, durations, strict=True):
        h = int(a // 3600)
        work[h] = work.get(h, 0.0) + d
    hours = max(work, default=-1) + 1
    return [math.ceil(work.get(h, 0.0) / (3600.0 * jobs_per_instance) - 1e-9) for h in range(hours)]


class Hindsight(Baseline):
    name = "hindsight"

    def __init__(self, max_instances: int, jobs_per_instance: int, lead: float) -> None:
        super().__init__(max_instances, jobs_per_instance)
        self.lead = lead  # one boot time: how far ahead of its hour an instance is started
        self.need: list[int] = []
        # The jobs it foresees, by arrival: when each arrives, and when it would end if it
        # started at once.
        self.arrivals: list[float] = []
        self.ends: list[float] = []

    def start(self, world: World) -> None:
        self.need = hourly_need(world.arrival, world.duration, self.per)
        order = sorted(range(len(world.arrival)), key=lambda j: world.arrival[j])
        self.arrivals = [world.arrival[j] for j in order]
        self.ends = [world.arrival[j] + world.duration[j] for j in order]

    def _foreseen(self, now: float) -> int:
        """Jobs arriving after ``now`` that would still run one boot time later, when an
        instance created now is up, had each started as it arrived."""
        up = now + self.lead
        lo = bisect.bisect_right(self.arrivals, now)
        hi = bisect.bisect_right(self.arrivals, up)
        return sum(1 for k in range(lo, hi) if self.ends[k] > up)

    def quiet_until(self, world: World) -> float:
        """Idle until one boot time before the next hour with work."""
        first = max(0, math.floor((world.now + self.lead) / 3600.0))
        for h in range(first, len(self.need)):
            if self.need[h] > 0:
                return h * 3600.0 - self.lead
        return math.inf

    def _need(self, hour: int) -> int:
        return self.need[hour] if 0 <= hour < len(self.need) else 0

    def act(self, world: World) -> None:
        now = world.now
        # The hour whose instances should be up (or booting) now: one boot time ahead.
        hour = math.floor((now + self.lead) / 3600.0)
        # Never fewer than the work queued or running now needs, nor than the jobs it knows
        # will be there when an instance created now is up: those queued, those running still
        # then, and those arriving within one boot time that run still then (the hour's
        # average alone leaves a burst inside the hour to be met a boot late, as a reactive
        # scaler meets it; every arrival within the boot time, or every job running now, would
        # size a steady stream of short jobs many times over).
        up = now + self.lead
        running_then = sum(1 for i in world.live.values() for end in i.running.values() if end > up)
        ahead = world.ready_count + world.limbo + running_then + self._foreseen(now)
        now_need = math.ceil((world.ready_count + world.in_flight) / self.per)
        backlog = max(now_need, math.ceil(ahead / self.per))
        live = list(world.live.values())
        for inst in live:  # drained: delete it, inside its paid hour
            if inst.stop_at is not None and not inst.worker_up(now):
                world.delete(inst.label)
        serving = [i for i in world.live.values() if i.stop_at is None]
        # In the last minutes before the next hour's instances are due, the instances whose
        # paid hour ends are stopped if that hour does not need them: none is created for
        # this hour then (it would pay a new hour to be judged against the next at once).
        closing = (hour + 1) * 3600.0 - self.lead - now <= HINDSIGHT_MARGIN
        want = self.capped(max(0 if closing else self._need(hour), backlog))
        for _ in range(want - len(serving)):
            if world.try_create(self.label()) is None:
                break
        # Near the end of each paid hour: keep it only if the next hour needs it.
        keep_next = max(self._need(hour + 1), now_need)
        ending = [
            i
            for i in serving
            if 3600.0 - (now - i.created) % 3600.0 <= HINDSIGHT_MARGIN and now > i.created
        ]
        extra = len(serving) - keep_next
        # Only an instance whose jobs all end within the drain (it knows when they end): one
        # stopped mid-job gives the job back to run again from the start, later.
        done = [
            i for i in ending if max(i.running.values(), default=now) <= now + world.drain_seconds
        ]
        for inst in sorted(done, key=lambda i: len(i.running))[: max(0, extra)]:
            world.stop(inst.label)
