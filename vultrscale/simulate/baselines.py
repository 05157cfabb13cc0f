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
"""

from __future__ import annotations

import math
from collections import deque

from vultrscale.simulate.world import World

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

    def label(self) -> str:
        self._n += 1
        return f"{self.name}-{self._n}"

    def start(self, world: World) -> None:
        """Set the fleet up at second 0."""

    def tick(self, world: World) -> None:
        """One pass at ``world.now``."""

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

    def quiet_until(self, world: World) -> float:
        return math.inf  # never idle: it has instances


class Naive(Baseline):
    name = "naive"

    def tick(self, world: World) -> None:
        ready = world.ready_count
        if ready == 0:
            for label in list(world.live):
                world.delete(label)  # no drain: running jobs are killed
            return
        want = min(self.max, math.ceil((ready + world.in_flight) / self.per))
        for _ in range(want - len(world.live)):
            world.create(self.label())


class Keda(Baseline):
    name = "keda"

    def __init__(self, max_instances: int, jobs_per_instance: int) -> None:
        super().__init__(max_instances, jobs_per_instance)
        self.last_active = -math.inf
        self.history: deque[tuple[float, int]] = deque()

    def tick(self, world: World) -> None:
        now = world.now
        demand = world.ready_count + world.in_flight
        desired = min(self.max, math.ceil(demand / self.per))
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
                world.create(self.label())
        elif target < len(current):
            # Not yet ready first, then the newest: the jobs they hold play no part.
            victims = sorted(reversed(current), key=lambda i: (i.worker_up(now), -i.created))
            for inst in victims[: len(current) - target]:
                world.delete(inst.label)
