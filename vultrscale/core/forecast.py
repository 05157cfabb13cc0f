"""A floor forecast from the queue's own history. Pure: no I/O, ``now`` is an argument.

The week has a rhythm (the weekday 09:00 surge comes every weekday), and a fleet that only
reacts boots into a surge after it has begun: on Vultr a boot from a snapshot takes 10-15
minutes. From the jobs of the last weeks, bucketed into slots of the 168-hour week (UTC), the
forecast learns how many jobs run at once in each slot (Little's law: the work that arrived in
the slot, arrivals times their mean run time, over the slot's length), keeps a high value across
the weeks seen (a quantile, so one odd week does not set it), and asks for the instances that
load needs one lead time (the boot time) ahead, so the instances are up when the slot begins.

It only ever raises the floor: the policy takes the largest of its floors, and the forecast is
one of them (``policy``); the cap and the budget clamp it as they clamp every floor. It needs a
minimum of history, and says when it has too little.

The per-slot profile is costly to compute (weeks of jobs) and changes slowly: the pass caches it
(``ports.FleetLedger.forecast_profile``, a Postgres row shared by every pass and process) and
recomputes it from ``ports.JobHistory`` once it is older than ``policy.forecast.refresh``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

WEEK = timedelta(days=7)
DAY = timedelta(days=1)
# How the slots' samples are pooled: "week", each slot of the 168-hour week its own (Tuesday
# 09:00 learns from Tuesdays); "weekday", the slots of a day shared by Monday to Friday and,
# apart, by Saturday and Sunday (Tuesday 09:00 learns from every weekday's 09:00: five samples
# a week, and usable after one day of history, not one week).
POOLS = ("week", "weekday")
# Slots of the week count from a Monday 00:00 UTC (2001-01-01 was a Monday). The Postgres
# adapter bins with the same origin (date_bin), so both adapters give the same buckets.
WEEK_ORIGIN = datetime(2001, 1, 1, tzinfo=UTC)
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# A load this small is no load: float sums of run times must not ask for an instance.
_EPSILON = 1e-9
# The backtest: a profile computed as it stood up to this long ago (at most; whole days of the
# history past min_history) is held to what came since. It is trusted when at least
# ``MIN_SKILL`` of the load it predicted over that time came.
BACKTEST = timedelta(days=7)
MIN_SKILL = 0.5


class Settings(Protocol):
    """What a profile is computed with (``config.ForecastConfig``; this module sits below the
    config in the layers, so it names the fields it reads)."""

    @property
    def slot(self) -> timedelta: ...
    @property
    def weeks(self) -> int: ...
    @property
    def quantile(self) -> float: ...
    @property
    def min_history(self) -> timedelta: ...
    @property
    def refresh(self) -> timedelta: ...
    @property
    def pool(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Bucket:
    """The jobs that became due in one slot-long bucket starting at ``start``: how many, how
    many of them have finished, and the run time of those (finished - started)."""

    start: datetime
    arrivals: int
    finished: int
    run_seconds: float


@dataclass(frozen=True)
class Profile:
    """The forecast's per-slot load: for each slot of the week (from ``WEEK_ORIGIN``), the jobs
    running at once in it, a high value over the weeks seen; and what it rests on."""

    computed_at: datetime
    slot: timedelta
    loads: tuple[float, ...]  # one per slot of the week; empty when history is too short
    history: timedelta  # from the first job seen (within the weeks looked back) to computed_at
    min_history: timedelta
    weeks: int  # weeks looked back
    quantile: float
    jobs: int  # jobs seen
    mean_run_seconds: float | None  # None: no job has finished yet
    pool: str = "week"  # POOLS: which slot of the pool a moment reads (slot_key)
    # The backtest (``backtest``): the days it covered (0: too little history past
    # min_history to check the profile yet), and the share of the load the profile of then
    # predicted over them that came (None: it predicted none).
    checked_days: int = 0
    skill: float | None = None
    # Per slot of the pool, the jobs a second that arrived in it (the same quantile across
    # the weeks as ``loads``): the wait rule's expected arrivals (``arrival_rate``). Empty: a
    # profile cached before they were kept.
    arrivals: tuple[float, ...] = ()

    @property
    def enough(self) -> bool:
        return self.history >= self.min_history and bool(self.loads)

    @property
    def trusted(self) -> bool:
        """Enough history, and the backtest says the profile predicts: it may raise a floor."""
        return (
            self.enough
            and self.checked_days > 0
            and (self.skill is None or self.skill >= MIN_SKILL)
        )

    def distrust(self) -> str:
        """Why a profile with enough history does not act; "" when it does."""
        if self.trusted or not self.enough:
            return ""
        if not self.checked_days:
            return (
                f"its profile cannot be checked yet: a day of history past "
                f"{_dur(self.min_history)} (policy.forecast.min_history) is needed"
            )
        return (
            f"its profile would not have predicted the last {self.checked_days} day(s): "
            f"{self.skill or 0:.0%} of the load it predicted came, {MIN_SKILL:.0%} needed "
            "(nothing weekly to learn)"
        )

    def shortfall(self) -> str:
        """Why the profile is not used; "" when it is."""
        if self.enough:
            return ""
        if self.mean_run_seconds is None and self.history >= self.min_history:
            return f"no finished job in the last {self.weeks} week(s): no run time to forecast"
        return (
            f"too little history: {_dur(self.history)} of jobs, {_dur(self.min_history)} needed "
            "(policy.forecast.min_history)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "computed_at": self.computed_at.isoformat(),
            "slot_seconds": self.slot.total_seconds(),
            "loads": list(self.loads),
            "history_seconds": self.history.total_seconds(),
            "min_history_seconds": self.min_history.total_seconds(),
            "weeks": self.weeks,
            "quantile": self.quantile,
            "jobs": self.jobs,
            "mean_run_seconds": self.mean_run_seconds,
            "pool": self.pool,
            "checked_days": self.checked_days,
            "skill": self.skill,
            "arrivals": list(self.arrivals),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        return cls(
            computed_at=datetime.fromisoformat(data["computed_at"]),
            slot=timedelta(seconds=data["slot_seconds"]),
            loads=tuple(float(x) for x in data["loads"]),
            history=timedelta(seconds=data["history_seconds"]),
            min_history=timedelta(seconds=data["min_history_seconds"]),
            weeks=int(data["weeks"]),
            quantile=float(data["quantile"]),
            jobs=int(data["jobs"]),
            mean_run_seconds=data["mean_run_seconds"],
            # a profile cached before pools existed is a "week" profile
            pool=str(data.get("pool", "week")),
            checked_days=int(data.get("checked_days", 0)),
            skill=None if data.get("skill") is None else float(data["skill"]),
            arrivals=tuple(float(x) for x in data.get("arrivals", ())),
        )

    def fits(self, cfg: Settings) -> bool:
        """Computed with the settings ``cfg`` asks for (a changed setting recomputes it)."""
        return (self.slot, self.weeks, self.quantile, self.min_history, self.pool) == (
            cfg.slot,
            cfg.weeks,
            cfg.quantile,
            cfg.min_history,
            cfg.pool,
        )

    def fresh(self, cfg: Settings, now: datetime) -> bool:
        """Usable at ``now`` without recomputing: fits ``cfg`` and computed within
        ``cfg.refresh`` before ``now`` (one computed "in the future", while some clock ran
        ahead, is not fresh)."""
        return self.fits(cfg) and now - cfg.refresh < self.computed_at <= now


def slot_start(t: datetime, width: timedelta) -> datetime:
    """The start of the slot-long bucket holding ``t`` (buckets aligned on ``WEEK_ORIGIN``)."""
    return WEEK_ORIGIN + ((t - WEEK_ORIGIN) // width) * width


def slot_index(t: datetime, width: timedelta) -> int:
    """Which slot of the week ``t`` falls in (0: Monday 00:00 UTC)."""
    return ((t - WEEK_ORIGIN) // width) % (WEEK // width)


def slot_key(t: datetime, width: timedelta, pool: str = "week") -> int:
    """Which slot of the ``pool`` ``t`` falls in: its slot of the week ("week"), or its slot
    of the day, counted apart for Saturday and Sunday ("weekday": the weekdays' slots first)."""
    if pool == "week":
        return slot_index(t, width)
    per_day = DAY // width
    weekend = slot_start(t, width).weekday() >= 5
    return int(weekend) * per_day + ((t - WEEK_ORIGIN) // width) % per_day


def pool_slots(width: timedelta, pool: str = "week") -> int:
    """How many slots a profile of ``pool`` holds."""
    return WEEK // width if pool == "week" else 2 * (DAY // width)


def slot_name(t: datetime, width: timedelta) -> str:
    """The slot holding ``t`` as a person reads it: ``Tue 09:00-10:00 UTC``."""
    start = slot_start(t, width)
    end = start + width
    return f"{_DAYS[start.weekday()]} {start:%H:%M}-{end:%H:%M} UTC"


class Tally:
    """Buckets of ``width`` built one job at a time: a job counted when it comes due, its run
    time added when it finishes. The memory adapters' aggregation (``buckets``; the replay's
    history keeps one across a whole replay); the Postgres adapter does the same in SQL
    (``db.history.forecast_buckets``), and a test holds both to the same answer."""

    def __init__(self, width: timedelta) -> None:
        self.width = width
        self._acc: dict[datetime, list[float]] = {}

    def due(self, at: datetime) -> datetime:
        """Count a job due ``at``; the start of its bucket (to name when it finishes)."""
        key = slot_start(at, self.width)
        b = self._acc.get(key)
        if b is None:
            self._acc[key] = [1, 0, 0.0]
        else:
            b[0] += 1
        return key

    def finished(self, bucket: datetime, run_seconds: float) -> None:
        """A job of ``bucket`` finished after running ``run_seconds``."""
        b = self._acc[bucket]
        b[1] += 1
        b[2] += run_seconds

    def buckets(self, since: datetime | None = None) -> list[Bucket]:
        """The buckets so far, oldest first; with ``since``, those that start at or after the
        start of the bucket holding it."""
        lo = None if since is None else slot_start(since, self.width)
        return [
            Bucket(s, int(a), int(f), r)
            for s, (a, f, r) in sorted(self._acc.items())
            if lo is None or s >= lo
        ]


def buckets(
    jobs: Iterable[tuple[datetime, float | None]],
    since: datetime,
    until: datetime,
    width: timedelta,
) -> list[Bucket]:
    """(due at, run seconds or None if unfinished) jobs due in [since, until), in buckets of
    ``width`` (``Tally``)."""
    tally = Tally(width)
    for due, run in jobs:
        if since <= due < until:
            key = tally.due(due)
            if run is not None:
                tally.finished(key, run)
    return tally.buckets()


def compute(
    found: Sequence[Bucket],
    now: datetime,
    *,
    slot: timedelta,
    weeks: int,
    quantile: float,
    min_history: timedelta,
    pool: str = "week",
    check: bool = True,
) -> Profile:
    """The profile of the buckets ``found`` over the ``weeks`` before ``now``, and (``check``)
    its ``backtest``.

    Each slot's load in one week is the work that became due in it (arrivals times their mean
    run time: the slot's own finished jobs', else the whole history's) over the slot's length:
    the jobs running at once on average (Little's law). A slot of a week in which no job came
    counts as 0, once the history covers it. The profile keeps, per slot of the ``pool``
    (``slot_key``), the ``quantile`` (nearest rank) of its samples' loads."""
    since = now - weeks * WEEK
    found = [b for b in found if since <= b.start and b.start + slot <= now]
    jobs = sum(b.arrivals for b in found)
    done = sum(b.finished for b in found)
    mean = sum(b.run_seconds for b in found) / done if done else None
    first = min((b.start for b in found if b.arrivals), default=None)
    history = now - first if first is not None else timedelta(0)

    def empty(mean_run: float | None) -> Profile:
        return Profile(now, slot, (), history, min_history, weeks, quantile, jobs, mean_run, pool)

    if first is None or mean is None or history < min_history:
        return empty(mean)
    width = slot.total_seconds()
    # Every whole slot from the first job to now: each one a sample of its slot of the pool.
    samples: list[list[float]] = [[] for _ in range(pool_slots(slot, pool))]
    rates: list[list[float]] = [[] for _ in range(pool_slots(slot, pool))]
    loads_at, rates_at = {}, {}
    for b in found:
        run = b.run_seconds / b.finished if b.finished else mean
        loads_at[b.start] = b.arrivals * run / width
        rates_at[b.start] = b.arrivals / width
    t = slot_start(first, slot)
    while t + slot <= now:
        samples[slot_key(t, slot, pool)].append(loads_at.get(t, 0.0))
        rates[slot_key(t, slot, pool)].append(rates_at.get(t, 0.0))
        t += slot
    loads = tuple(_nearest_rank(s, quantile) for s in samples)
    arrivals = tuple(_nearest_rank(r, quantile) for r in rates)
    profile = Profile(
        now, slot, loads, history, min_history, weeks, quantile, jobs, mean, pool, arrivals=arrivals
    )
    return backtest(profile, found, loads_at) if check else profile


def backtest(profile: Profile, found: Sequence[Bucket], loads_at: dict[datetime, float]) -> Profile:
    """``profile`` with its backtest: the profile as it would have been computed ``BACKTEST``
    ago (or as many whole days ago as its history past ``min_history`` allows) is held to
    the load that came since, slot by slot: the share of the load it predicted that came.
    A profile whose slots hold a weekly rhythm predicts most of it; one of random spikes, or
    of a rhythm that has changed, does not, and stays out of the way (``trusted``)."""
    spare = profile.history - profile.min_history
    days = min(BACKTEST, spare) // DAY
    if days < 1:
        return profile
    start = profile.computed_at - days * DAY
    then = compute(
        found,
        start,
        slot=profile.slot,
        weeks=profile.weeks,
        quantile=profile.quantile,
        min_history=profile.min_history,
        pool=profile.pool,
        check=False,
    )
    if not then.enough:
        return profile
    predicted = came = 0.0
    t = slot_start(start, profile.slot)
    if t < start:
        t += profile.slot
    while t + profile.slot <= profile.computed_at:
        p = then.loads[slot_key(t, profile.slot, profile.pool)]
        predicted += p
        came += min(p, loads_at.get(t, 0.0))
        t += profile.slot
    skill = came / predicted if predicted > _EPSILON else None
    return replace(profile, checked_days=int(days), skill=skill)


def _nearest_rank(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class FloorForecast:
    """What the forecast asks of the floor at one moment, and why."""

    floor: int  # instances, capped at max_instances; 0 when the profile is not usable
    wanted: int  # before the cap
    source: str  # the reason, in words (the plan's reasons, `status`, the ledger)
    usable: bool


def burst_factor(slot: timedelta, clear_within: timedelta) -> float:
    """How much more than its mean load a slot asks for when its work must be done within
    ``clear_within`` (0, or not shorter than the slot: 1, the mean). A burst that brings a
    slot's work in three minutes runs at once far more than the slot's mean: sized by the mean
    it gets one instance and waits a boot for the rest."""
    if clear_within <= timedelta(0) or clear_within >= slot:
        return 1.0
    return slot / clear_within


def need(
    profile: Profile,
    t: datetime,
    jobs_per_instance: int,
    round_up_from: float = 0.0,
    clear_within: timedelta = timedelta(0),
) -> int:
    """Instances the load of ``t``'s slot asks for: load (scaled by ``burst_factor``) /
    jobs_per_instance, its fraction of an instance rounded up once it reaches
    ``round_up_from`` (0: always, 0.5: half an instance's work or more), else down."""
    load = profile.loads[slot_key(t, profile.slot, profile.pool)]
    load *= burst_factor(profile.slot, clear_within)
    instances = load / jobs_per_instance
    whole = math.floor(instances + _EPSILON)
    return whole + (1 if instances - whole > max(round_up_from, _EPSILON) - _EPSILON else 0)


def floor_at(
    profile: Profile | None,
    now: datetime,
    lead: timedelta,
    *,
    jobs_per_instance: int,
    max_instances: int,
    round_up_from: float = 0.0,
    clear_within: timedelta = timedelta(0),
) -> FloorForecast:
    """The floor the forecast asks at ``now``: the larger need of the slot now and of the slot
    one ``lead`` ahead (so an instance created now is up when that slot begins, and is kept
    through its own), never above ``max_instances``."""
    if profile is None:
        return FloorForecast(
            0, 0, "forecast: no profile (none computed from the built-in queue's history)", False
        )
    if not profile.enough:
        return FloorForecast(0, 0, f"forecast: {profile.shortfall()}", False)
    if not profile.trusted:
        return FloorForecast(0, 0, f"forecast: {profile.distrust()}", False)
    ahead = now + lead
    here_n = need(profile, now, jobs_per_instance, round_up_from, clear_within)
    ahead_n = need(profile, ahead, jobs_per_instance, round_up_from, clear_within)
    looks_ahead = ahead_n >= here_n and ahead_n > 0
    at = ahead if looks_ahead else now
    wanted = max(here_n, ahead_n)
    load = profile.loads[slot_key(at, profile.slot, profile.pool)]
    floor = min(wanted, max_instances)
    when = f"{_dur(lead)} ahead" if looks_ahead else "now"
    source = (
        f"forecast: {slot_name(at, profile.slot)} ({when}) runs {load:.2f} job(s) at once "
        f"(p{round(profile.quantile * 100)} of {_weeks_seen(profile)}; mean run "
        f"{profile.mean_run_seconds or 0:.0f}s)"
    )
    if burst_factor(profile.slot, clear_within) > 1:
        source += f", its work done within {_dur(clear_within)}"
    source += f" -> {wanted} instance(s) at {jobs_per_instance} per instance"
    if floor < wanted:
        source += f", capped at max_instances={max_instances}"
    return FloorForecast(floor, wanted, source, True)


def arrival_rate(profile: Profile, now: datetime, lead: timedelta) -> float | None:
    """The jobs a second the profile expects to arrive over the next ``lead``: its slots'
    arrivals (a high value across the weeks, as ``loads``), averaged over the slots the lead
    spans. None when it is not trusted (``Profile.trusted``) or keeps no arrivals (cached
    before it did)."""
    if not profile.trusted or len(profile.arrivals) != len(profile.loads):
        return None
    t, end, rates = now, now + max(lead, timedelta(seconds=1)), []
    while t < end:
        rates.append(profile.arrivals[slot_key(t, profile.slot, profile.pool)])
        t = slot_start(t, profile.slot) + profile.slot
    return sum(rates) / len(rates)


def next_change(profile: Profile | None, now: datetime, lead: timedelta) -> datetime | None:
    """The first moment after ``now`` when ``floor_at`` may answer otherwise: a slot boundary
    at ``now`` or one ``lead`` ahead. None without a trusted profile."""
    if profile is None or not profile.trusted:
        return None
    here = slot_start(now, profile.slot) + profile.slot
    ahead = slot_start(now + lead, profile.slot) + profile.slot - lead
    return min(here, ahead)


@dataclass(frozen=True)
class SlotForecast:
    """One slot of the coming hours, as `vultrscale forecast` shows it."""

    start: datetime
    load: float  # jobs running at once
    need: int  # instances that load asks for
    floor: int  # the highest floor the forecast sets during the slot (one lead ahead, capped)


def horizon(
    profile: Profile,
    start: datetime,
    hours: int,
    lead: timedelta,
    *,
    jobs_per_instance: int,
    max_instances: int,
    round_up_from: float = 0.0,
    clear_within: timedelta = timedelta(0),
) -> list[SlotForecast]:
    """The slots from the one holding ``start`` over the next ``hours``."""
    out: list[SlotForecast] = []
    t = slot_start(start, profile.slot)
    end = start + timedelta(hours=hours)
    last = profile.slot - timedelta(microseconds=1)
    while t < end:
        # floor_at looks at t and t + lead: its first and last moment in the slot see every
        # slot it looks at in between.
        highest = max(
            floor_at(
                profile,
                at,
                lead,
                jobs_per_instance=jobs_per_instance,
                max_instances=max_instances,
                round_up_from=round_up_from,
                clear_within=clear_within,
            ).floor
            for at in (t, t + last)
        )
        load = profile.loads[slot_key(t, profile.slot, profile.pool)]
        n = need(profile, t, jobs_per_instance, round_up_from, clear_within)
        out.append(SlotForecast(t, load, n, highest))
        t += profile.slot
    return out


def _weeks_seen(profile: Profile) -> str:
    n = min(profile.weeks, math.ceil(profile.history / WEEK))
    return f"{n} week(s)"


def _dur(td: timedelta) -> str:
    s = int(td.total_seconds())
    if s >= 86400:
        d, rest = divmod(s, 86400)
        return f"{d}d{rest // 3600}h" if rest >= 3600 else f"{d}d"
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m" if s % 3600 else f"{s // 3600}h"
    return f"{s // 60}m" if s >= 60 else f"{s}s"
