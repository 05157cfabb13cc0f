"""The discrete-event loop: arrivals, job ends, boots and drains as events; a pass every
``interval`` seconds on a fixed grid, as cron or ``--loop`` would run it.

A pass is skipped only where it provably changes nothing:

- the world is idle (no instance, no job queued, running or on a lease) and the policy says it
  stays quiet until the next arrival (no floor starts before it): the next pass runs on the
  first grid point at or after the arrival, exactly where it would have run anyway;
- or the policy says, from the world as it is at that pass, that the pass would change
  nothing (``Policy.unchanged``; for vultrscale: what the last pass's decision says, its
  next change and its demand band, see ``fleet.py``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from vultrscale.replay.world import JOB_END, World


class Policy(Protocol):
    name: str
    bound: set[str]  # the limits that held back a scale-up (the report's bound_by)

    def start(self, world: World) -> None: ...
    def tick(self, world: World) -> None: ...
    def quiet_until(self, world: World) -> float: ...
    def unchanged(self, world: World) -> bool: ...


@dataclass
class Sample:
    """The fleet at one moment, for the plot."""

    t: float
    queued: int  # ready + in flight
    fleet: int  # instances at Vultr (billed)


@dataclass
class RunStats:
    passes: int = 0
    skipped: int = 0
    samples: list[Sample] = field(default_factory=list)


def run(
    world: World,
    policy: Policy,
    *,
    interval: float,
    until: float,
    sample_every: float = 0.0,
    progress: Callable[[float], None] | None = None,
) -> RunStats:
    """Play the world forward to ``until`` under ``policy``; the world holds the outcome."""
    arrivals = world.arrival
    n = len(arrivals)
    i = 0
    events = world.events
    stats = RunStats()
    k = 0  # index of the next pass on the grid: passes run at k * interval
    next_pass = 0.0
    next_sample = 0.0
    next_report = 0.0
    report_step = until / 200.0
    policy.start(world)
    while True:
        t_ev = events[0][0] if events else math.inf
        t_arr = arrivals[i] if i < n else math.inf
        t = min(t_ev, t_arr, next_pass)
        if t > until:
            break
        world.now = t
        if t_ev == t:
            _, kind, _, obj, tok = heapq.heappop(events)
            world.handle(kind, obj, tok)
            if kind != JOB_END:  # a job's end refills its own slot (World.handle)
                world.dispatch()
            continue
        if t_arr == t:
            while i < n and arrivals[i] == t:
                world.arrive(i)
                i += 1
            world.dispatch()
            continue
        if policy.unchanged(world):
            stats.skipped += 1
            world.skipped_passes(k, k + 1, interval)
        else:
            policy.tick(world)
            world.dispatch()
            stats.passes += 1
        if sample_every and t >= next_sample:
            stats.samples.append(Sample(t, world.ready_count + world.in_flight, len(world.live)))
            next_sample = t + sample_every
        if progress is not None and t >= next_report:
            progress(min(t / until, 1.0))
            next_report = t + report_step
        k += 1
        next_pass = k * interval
        if world.idle():
            wake = min(t_arr, policy.quiet_until(world))
            if wake > next_pass:
                last = math.floor(until / interval)
                if wake == math.inf:
                    stats.skipped += max(0, last - k + 1)
                    world.skipped_passes(k, last + 1, interval)
                    next_pass = math.inf
                else:
                    skip_to = math.ceil(wake / interval)
                    stats.skipped += min(skip_to, last + 1) - k
                    world.skipped_passes(k, min(skip_to, last + 1), interval)
                    k = skip_to
                    next_pass = k * interval
                if sample_every:
                    stats.samples.append(Sample(t, 0, 0))
    if progress is not None:
        progress(1.0)
    return stats
