"""Boot only when it helps: how long the queue waits with the fleet there is, and whether a
create now would shorten it. Pure: no I/O, ``now`` is an argument.

On Vultr a new instance is ready 10-15 minutes after its create and is billed a whole started
hour. The depth rule (one instance per ``jobs_per_instance`` jobs of demand) boots for a
backlog that the running workers clear in four minutes, and the instance arrives in twelve to
an empty queue. Here the policy estimates when each job will start, for the jobs queued now
(ready and expired leases) and for those that will arrive meanwhile:

- every job runs for the queue's recent mean run time ``d`` (the ``RECENT_JOBS`` newest
  finished within ``RECENT_WINDOW``, read with the signals);
- jobs arrive at the queue's recent rate (those that arrived within ``ARRIVAL_WINDOW``,
  read with the signals), or at the rate the floor forecast expects over the next boot where
  that is higher and the forecast acts (``expected_rate``);
- a running instance has ``jobs_per_instance`` slots; those holding a job in flight free up
  ``d / 2`` from now (its start is not known: half a run on average), the others now;
- an instance still booting adds its slots when it is expected ready: its create plus the
  boot time (learned, ``vultrscale.core.boottime``), or now if that has passed;
- the jobs start in order, each in the slot that frees first, never before it arrives.

The wait that matters is the longest: the oldest ready job's (its age, read every pass, plus
when it starts), the newest queued job's, or that of a job arriving before a new instance
could be ready (one boot time from now). A create is made only when that wait passes the
target AND a new instance, ready one boot time from now, would still find jobs waiting; then
as few as start every job, queued or arriving until one target after that boot, within the
target of its arrival or of the boot, whichever is later (never more than the depth rule
asks). So a job waits longer than the target plus a boot only when the fleet is at a limit
(the cap, the budget, a cool-down) or more work came than the recent rate said.

The target is ``policy.target_wait``: a duration, or "auto" (the default), ``AUTO_SHARE`` of
the learned boot time and at most ``AUTO_MAX``: 30 s for a one-minute boot, a minute for
Vultr's 10-15 minute snapshot boots (the workload suite chose them, docs/policy.md). Without
``MIN_JOBS`` recent finished jobs, or without the arrival count (a new queue, a preset that
does not report them) the depth rule decides alone.

An approximation: a slot free now is counted as starting jobs from now on, every ``d``, though
it waits for its first job to arrive; when the arrivals later outrun the fleet, the waits are
under-estimated by up to the time such a slot stood idle.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from vultrscale.config import WaitTarget, format_duration
from vultrscale.core.model import CAPACITY_STATES, Instance, InstanceState, Signals

#: The finished jobs the mean run time rests on: the newest ones...
RECENT_JOBS = 100
#: ...that finished within this long (a release may change run times; a day is enough).
RECENT_WINDOW = timedelta(hours=24)
#: Fewer recent finished jobs than this: no estimate, the depth rule decides.
MIN_JOBS = 10
#: The jobs that arrived within this long give the recent arrival rate.
ARRIVAL_WINDOW = timedelta(minutes=10)
#: ``target_wait = "auto"``: this share of the boot time, at most ``AUTO_MAX``
#: (docs/policy.md, the workload suite).
AUTO_SHARE = 0.5
AUTO_MAX: timedelta | None = timedelta(minutes=1)


def target(setting: WaitTarget, boot: timedelta) -> timedelta:
    """The wait the rule aims for: ``policy.target_wait`` as set, or "auto": ``AUTO_SHARE``
    of the boot time the policy plans with, at most ``AUTO_MAX``."""
    if setting.fixed is not None:
        return setting.fixed
    auto = boot * AUTO_SHARE
    return auto if AUTO_MAX is None else min(auto, AUTO_MAX)


def arrival_rate(signals: Signals) -> float | None:
    """Jobs a second that arrived within ``ARRIVAL_WINDOW``; None: the preset does not tell."""
    n = signals.recent_arrivals
    if n is None:
        return None
    return max(0, n) / ARRIVAL_WINDOW.total_seconds()


@dataclass(frozen=True)
class WaitCall:
    """The wait rule's answer: the instances the queue wants (at most the depth rule's), and
    why, in numbers. ``applied`` False: not enough history, the depth rule's number stands."""

    wanted: int
    reason: str
    applied: bool
    # The longest wait estimated (seconds) and the arrival rate it counted (jobs a second);
    # None when the rule did not apply.
    wait: float | None = None
    rate: float | None = None


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


def _per_minute(rate: float) -> str:
    per_min = rate * 60
    return f"{per_min:.2g}" if per_min < 10 else f"{per_min:.0f}"


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
    expected_rate: float | None = None,
) -> WaitCall:
    """How many of the capacity ``instances`` (staying; pending and booting included) plus new
    ones the queue wants, given that the depth rule wants ``depth`` (more than there are).
    ``jobs_per_instance``: a new instance's; ``slots_of``: an instance's own (its offering's,
    docs/offerings.md), ``jobs_per_instance`` when not given. ``expected_rate``: the jobs a
    second the forecast expects over the next boot (None: no forecast acts)."""
    n_now = len(instances)
    jobs, mean = signals.recent_jobs, signals.recent_job_seconds
    if jobs is None or mean is None or jobs < MIN_JOBS or mean <= 0 or not math.isfinite(mean):
        seen = "not reported by this queue preset" if jobs is None else f"{jobs} recent"
        return WaitCall(
            depth,
            f"wait rule: not enough job history ({seen} finished job(s); {MIN_JOBS} needed "
            f"within {format_duration(RECENT_WINDOW)}): the depth rule decides",
            applied=False,
        )
    recent = arrival_rate(signals)
    if recent is None:
        return WaitCall(
            depth,
            "wait rule: the queue preset does not report its arrivals: the depth rule decides",
            applied=False,
        )
    rate = recent
    arrivals = f"{_per_minute(recent)} job(s)/min arriving (last {format_duration(ARRIVAL_WINDOW)})"
    if expected_rate is not None and math.isfinite(expected_rate) and expected_rate > recent:
        rate = expected_rate
        arrivals += f", {_per_minute(expected_rate)}/min expected by the forecast"
    queued = signals.ready + signals.expired_leases
    boot_s = boot.total_seconds()
    groups = _slots(
        signals, instances, slots_of or (lambda _: jobs_per_instance), boot_s, mean, now
    )
    first = _start_of(1, groups, mean) if queued else 0.0
    oldest = signals.oldest_ready_seconds + first if queued else 0.0
    newest = _worst(queued, rate, groups, mean, boot_s)
    wait = max(oldest, newest)
    facts = (
        f"wait rule: {queued} queued job(s), the oldest waiting "
        f"{_t(signals.oldest_ready_seconds)}; {arrivals}; mean run {_t(mean)} over {jobs} "
        f"recent job(s); {n_now} instance(s) (booting ones ready {_t(boot_s)} after their "
        f"create) start the oldest in {_t(first)}; longest wait {_t(wait)}"
    )
    target_s = target_wait.total_seconds()
    if wait <= target_s or depth <= n_now:
        within = "within" if wait <= target_s else "past"
        return WaitCall(
            n_now,
            f"{facts}, {within} target_wait {_t(target_s)}: no create (the depth rule asked "
            f"{max(depth - n_now, 0)})",
            applied=True,
            wait=wait,
            rate=rate,
        )
    left = queued + rate * boot_s - _starts_by(boot_s, groups, mean)
    if left < 1:
        return WaitCall(
            n_now,
            f"{facts}, past target_wait {_t(target_s)}, but every job queued or arriving has "
            f"started before a new instance would be ready in {_t(boot_s)}: no create (the "
            f"depth rule asked {depth - n_now})",
            applied=True,
            wait=wait,
            rate=rate,
        )
    most = max(1, depth - n_now)
    horizon = boot_s + target_s

    def late(extra: int) -> float:
        more = [*groups, (boot_s, extra * jobs_per_instance)]
        return _worst(queued, rate, more, mean, horizon, ready_at=boot_s)

    # The fewest new instances (ready one boot from now) that start every job queued or
    # arriving until a target after that boot within the target of the later of its arrival
    # and the boot; the wait falls as their number grows: bisect.
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi) // 2
        if late(mid) <= target_s:
            hi = mid
        else:
            lo = mid + 1
    return WaitCall(
        n_now + lo,
        f"{facts}, past target_wait {_t(target_s)}; {left:.0f} job(s) still waiting when a new "
        f"instance is ready in {_t(boot_s)}: {lo} new instance(s) start each within "
        f"{_t(late(lo))} of that or of its arrival (the depth rule asked {most})",
        applied=True,
        wait=wait,
        rate=rate,
    )


def _worst(
    queued: int,
    rate: float,
    groups: Sequence[tuple[float, int]],
    mean: float,
    horizon: float,
    ready_at: float = 0.0,
) -> float:
    """The longest any job waits from the later of its arrival and ``ready_at``: the newest
    of the ``queued`` (arrived by now) and the jobs arriving at ``rate`` over ``horizon``.

    Job ``queued + j`` (the ``j``-th arrival, at ``j / rate``) starts at the later of its
    arrival and the ``queued + j``-th slot start (a slot starts a job every ``mean`` from when
    it is free). Of the jobs that start at one slot start, the first arrived waits longest, so
    only the first job of each slot start is looked at. Between two moments at which the
    fleet's slots change (a group freeing, ``ready_at``) the starts repeat every ``mean``, each
    round ``mean`` later and the same number of jobs on, so a round's waits change by the same
    amount each round: the longest is in the first or the last round of such a stretch, and
    only those rounds are walked (a few dozen starts, however many jobs arrive)."""
    if queued == 0 and rate <= 0:
        return 0.0
    if not groups:
        return math.inf
    arriving = rate * horizon if rate > 0 else 0.0
    last = math.floor(min(arriving, _MOST_ARRIVALS))

    def wait(j: int) -> float:
        if queued + j < 1:
            return 0.0
        arrived = j / rate if j else 0.0
        return max(0.0, _start_of(queued + j, groups, mean) - max(arrived, ready_at))

    best = max(wait(0), wait(last))
    if last == 0:
        return best
    end = _start_of(queued + last, groups, mean) + 1.0  # past the last job's start
    # Where the rounds stop repeating alike: a group freeing, ``ready_at``, just after the
    # last queued job's start (the jobs up to it arrived at once, by now), and just after the
    # start of the last job that arrives before ``ready_at`` (a wait counts from the later).
    kinks = {queued, queued + math.ceil(ready_at * rate) - 1}
    starts = {_start_of(k, groups, mean) + _EPS for k in kinks if 0 < k <= queued + last}
    cuts = sorted({0.0, ready_at, *(free for free, _ in groups), *starts, end})
    cuts = [c for c in cuts if c <= end]
    for lo, hi in itertools.pairwise(cuts):
        for a, b in ((lo, min(lo + mean, hi)), (max(hi - mean, lo), hi)):
            for free, _ in groups:
                m = max(0, math.ceil((a - free) / mean - _EPS))
                while (t := free + m * mean) < b:
                    j = _starts_before(t, groups, mean) + 1 - queued
                    if 1 <= j <= last:
                        best = max(best, t - max(j / rate, ready_at))
                    m += 1
    return best


# More arrivals than this over a horizon are no estimate (and would overflow the arithmetic).
_MOST_ARRIVALS = 1e9
_EPS = 1e-9


def _starts_before(t: float, groups: Sequence[tuple[float, int]], mean: float) -> int:
    """How many slot starts come strictly before ``t``."""
    return sum(n * math.ceil((t - free) / mean - _EPS) for free, n in groups if free < t)


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
        since = min(i.created_at or now, now)  # a clock that ran ahead: no later than now
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
