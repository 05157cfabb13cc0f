"""Boot only when it helps: how long the queue waits with the fleet there is, and whether a
create now would shorten it. Pure: no I/O, ``now`` is an argument.

On Vultr a new instance is ready 10-15 minutes after its create and is billed a whole started
hour. The depth rule (one instance per ``jobs_per_instance`` jobs of demand) boots for a
backlog that the running workers clear in four minutes, and the instance arrives in twelve to
an empty queue. Here the policy estimates, for the jobs queued now (ready and expired leases),
when each would start:

- every job runs for the queue's recent mean run time ``d`` (the ``RECENT_JOBS`` newest
  finished within ``RECENT_WINDOW``, read with the signals);
- a running instance has ``jobs_per_instance`` slots; those holding a job in flight free up
  ``d / 2`` from now (its start is not known: half a run on average), the others now;
- an instance still booting adds its slots when it is expected ready: its create plus the
  boot time (learned, ``vultrscale.boottime``), or now if that has passed;
- the queued jobs start in order, each in the slot that frees first.

The wait that matters is the longest: the oldest ready job's (its age, read every pass, plus
when it starts) or the newest's (when the last queued job starts). A create is made only when
that wait passes ``policy.target_wait`` AND a new instance, ready one boot time from now,
would still find queued jobs; then as few as clear the queue within one boot time plus the
target (never more than the depth rule asks). Without ``MIN_JOBS`` recent finished jobs (a new
queue, or a preset that does not report them) the depth rule decides alone.

Not modelled: jobs that arrive after this pass (a later pass sees them; the forecast of the
queue's history raises the floor ahead of a known surge).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from vultrscale.config import format_duration
from vultrscale.model import CAPACITY_STATES, Instance, InstanceState, Signals

#: The finished jobs the mean run time rests on: the newest ones...
RECENT_JOBS = 100
#: ...that finished within this long (a release may change run times; a day is enough).
RECENT_WINDOW = timedelta(hours=24)
#: Fewer recent finished jobs than this: no estimate, the depth rule decides.
MIN_JOBS = 10


@dataclass(frozen=True)
class WaitCall:
    """The wait rule's answer: the instances the queue wants (at most the depth rule's), and
    why, in numbers. ``applied`` False: not enough history, the depth rule's number stands."""

    wanted: int
    reason: str
    applied: bool


def _t(seconds: float) -> str:
    """``45s``, ``12m``, ``7m30s``, ``2h05m``: whole seconds, as the reasons show them."""
    if math.isinf(seconds):
        return "never"
    s = max(0, round(seconds))
    if s < 120:
        return f"{s}s"
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 60}m" + (f"{s % 60:02d}s" if s % 60 else "")


def size(
    signals: Signals,
    instances: Sequence[Instance],
    *,
    jobs_per_instance: int,
    boot: timedelta,
    target_wait: timedelta,
    depth: int,
    now: datetime,
    slots_of: Callable[[Instance], int] | None = None,
) -> WaitCall:
    """How many of the capacity ``instances`` (staying; pending and booting included) plus new
    ones the queue wants, given that the depth rule wants ``depth`` (more than there are).
    ``jobs_per_instance``: a new instance's; ``slots_of``: an instance's own (its offering's,
    README "Offerings"), ``jobs_per_instance`` when not given."""
    n_now = len(instances)
    jobs, mean = signals.recent_jobs, signals.recent_job_seconds
    if jobs is None or mean is None or jobs < MIN_JOBS or mean <= 0:
        seen = "not reported by this queue preset" if jobs is None else f"{jobs} recent"
        return WaitCall(
            depth,
            f"wait rule: not enough job history ({seen} finished job(s); {MIN_JOBS} needed "
            f"within {format_duration(RECENT_WINDOW)}): the depth rule decides",
            applied=False,
        )
    queued = signals.ready + signals.expired_leases
    boot_s = boot.total_seconds()
    groups = _slots(
        signals, instances, slots_of or (lambda _: jobs_per_instance), boot_s, mean, now
    )
    first = _start_of(1, groups, mean) if queued else 0.0
    last = _start_of(queued, groups, mean) if queued else 0.0
    oldest = signals.oldest_ready_seconds + first
    wait = max(oldest, last)
    facts = (
        f"wait rule: {queued} queued job(s), the oldest waiting "
        f"{_t(signals.oldest_ready_seconds)}; "
        f"mean run {_t(mean)} over {jobs} recent job(s); {n_now} instance(s) (booting ones "
        f"ready {_t(boot_s)} after their create) start the oldest in {_t(first)}, the last in "
        f"{_t(last)}: longest wait {_t(wait)}"
    )
    target = target_wait.total_seconds()
    if wait <= target:
        return WaitCall(
            n_now,
            f"{facts}, within target_wait {_t(target)}: no create (the depth rule asked "
            f"{depth - n_now})",
            applied=True,
        )
    left = queued - _starts_by(boot_s, groups, mean)
    if left <= 0:
        return WaitCall(
            n_now,
            f"{facts}, past target_wait {_t(target)}, but every queued job has started before a "
            f"new instance would be ready in {_t(boot_s)}: no create (the depth rule asked "
            f"{depth - n_now})",
            applied=True,
        )
    most = max(1, depth - n_now)
    clear_by = boot_s + target
    # The fewest new instances (ready one boot from now) that start the last queued job within
    # a boot time plus the target; the start is monotone in their number: bisect.
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi) // 2
        extra = [*groups, (boot_s, mid * jobs_per_instance)]
        if _start_of(queued, extra, mean) <= clear_by:
            hi = mid
        else:
            lo = mid + 1
    extra = [*groups, (boot_s, lo * jobs_per_instance)]
    return WaitCall(
        n_now + lo,
        f"{facts}, past target_wait {_t(target)}; {left} job(s) still queued when a new "
        f"instance is ready in {_t(boot_s)}: {lo} new instance(s) start the last by "
        f"{_t(_start_of(queued, extra, mean))} (the depth rule asked {most})",
        applied=True,
    )


def _slots(
    signals: Signals,
    instances: Sequence[Instance],
    per: Callable[[Instance], int],
    boot_s: float,
    mean: float,
    now: datetime,
) -> list[tuple[float, int]]:
    """(seconds from now when free, how many slots) of the fleet's capacity; ``per``: the
    jobs an instance runs at once."""
    running = sum(per(i) for i in instances if i.state is InstanceState.RUNNING)
    busy = min(signals.in_flight, running)
    groups = [(0.0, running - busy), (mean / 2, busy)]
    for i in instances:
        if i.state is InstanceState.RUNNING or i.state not in CAPACITY_STATES:
            continue
        since = i.created_at or now
        groups.append((max(0.0, (since - now).total_seconds() + boot_s), per(i)))
    return [(t, n) for t, n in groups if n > 0]


def _starts_by(t: float, groups: Sequence[tuple[float, int]], mean: float) -> int:
    """How many queued jobs have started by ``t`` (each slot starts one every ``mean``)."""
    return sum(n * (math.floor((t - free) / mean) + 1) for free, n in groups if free <= t)


def _start_of(k: int, groups: Sequence[tuple[float, int]], mean: float) -> float:
    """Seconds from now until the ``k``-th queued job starts; inf without any slot."""
    if not groups:
        return math.inf
    lo, hi = 0.0, max(f for f, _ in groups) + math.ceil(k / sum(n for _, n in groups)) * mean
    if _starts_by(lo, groups, mean) >= k:
        return 0.0
    while hi - lo > 1.0:  # to a second: the reasons show whole seconds
        mid = (lo + hi) / 2
        if _starts_by(mid, groups, mean) >= k:
            hi = mid
        else:
            lo = mid
    # The start itself: the latest slot start at or before hi (within that second).
    return max(free + math.floor((hi - free) / mean) * mean for free, _ in groups if free <= hi)
