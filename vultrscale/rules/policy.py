"""The policy: ``decide(observation, config, now) -> Plan``. Pure: no I/O, ``now`` is an argument.

Order of the decision (docs/policy.md, "How each rule decides"):

1. Errors first. Signals that could not be read, or an API error, hold the fleet: no scale-in,
   no replacement, no scale-up, except that ``on_signal_error = "floor"`` may still bring the
   fleet up to its floor. "No data" is never read as an empty queue.
2. Instances stuck in pending or booting past ``boot_timeout`` are replaced: they stop
   counting as capacity, so the ordinary arithmetic below creates their successor.
3. desired = ceil((ready + in flight + expired leases) / jobs_per_instance); the fleet wants
   max(desired, floor), clamped by ``max_instances`` and the budget rule (pending counted), by
   the up cool-down and by ``max_step_up``. Every clamp that applied is listed in the plan.
4. Scale-in only after the queue has been empty, with no live lease, for
   ``idle_before_scale_down``, once the down cool-down has passed, and never below the floor.
   Victims hold no lease; the youngest go first. With ``billing_hour_aware`` an idle instance
   is kept until its paid hour is nearly over.
5. Revive before you boot (``policy.revive``): when the fleet wants more instances and one is
   draining with its delete not sent, its worker is started again and counted before any
   create (``_revive``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from vultrscale.config import Config, FloorConfig, PolicyConfig, format_duration
from vultrscale.core import forecast
from vultrscale.core.limits import Clamp, Limit, span
from vultrscale.core.model import (
    CAPACITY_STATES,
    Action,
    ActionKind,
    Instance,
    InstanceState,
    Observation,
    Plan,
    ServiceState,
    Signals,
)
from vultrscale.rules import budget, offerings, waits

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

# An idle instance is drained once it is this close to the end of its paid hour. The drain of
# an idle worker takes seconds, but the DELETE lands one or two passes later (cron runs every
# 30 s; a locked DELETE is retried on the next pass), and it must land before the next hour
# starts or that hour is billed too. Five minutes is ten passes of slack; an instance that
# misses the window keeps running until the next one, which costs nothing extra.
BILLING_HOUR_MARGIN = timedelta(minutes=5)

_BOOT_STATES = (InstanceState.PENDING, InstanceState.BOOTING)
# On their way out: still at Vultr and billed, no longer capacity.
_LEAVING = frozenset({InstanceState.DRAINING, InstanceState.DELETING})
# Drainable: the instance exists at Vultr. A CREATING row is only an intent the reconcile pass
# has not confirmed yet; it is settled there, not drained here.
_DRAINABLE = (InstanceState.PENDING, InstanceState.BOOTING, InstanceState.RUNNING)


@dataclass(frozen=True)
class ActiveFloor:
    """A floor that applies at ``now``: where it comes from and how many instances it asks."""

    source: str
    min_instances: int


def active_floors(policy: PolicyConfig, now: datetime) -> list[ActiveFloor]:
    """``policy.min_instances`` and every ``[[policy.floor]]`` whose cron matches ``now``."""
    out = [ActiveFloor("policy.min_instances", policy.min_instances)]
    for i, fl in enumerate(policy.floor):
        if floor_matches(fl, now):
            out.append(
                ActiveFloor(f"policy.floor[{i}] ({fl.cron}, {fl.timezone})", fl.min_instances)
            )
    return out


def forecast_lead(observation: Observation | None, config: Config) -> timedelta:
    """How far ahead the floor forecast looks: the time a new instance takes to be ready, the
    boot time learned from the fleet's ledger (``observation.boot_time``, the wait rule's
    too), ``policy.boot_time`` until enough boots are seen; the one place that choice is
    made."""
    boot = observation.boot_time if observation is not None else None
    return boot.estimate if boot is not None else config.policy.boot_time


def forecast_floor(
    observation: Observation, config: Config, now: datetime
) -> forecast.FloorForecast | None:
    """What the floor forecast asks at ``now`` (None: ``policy.forecast.mode = "off"``)."""
    if config.policy.forecast.mode == "off":
        return None
    return forecast.floor_at(
        observation.forecast,
        now,
        forecast_lead(observation, config),
        jobs_per_instance=offerings.new_jobs_per_instance(
            config, observation.price.plan if observation.price else None
        ),
        max_instances=config.policy.max_instances,
        round_up_from=config.policy.forecast.round_up_from,
        clear_within=config.policy.forecast.clear_within,
    )


def forecast_changes(observation: Observation, config: Config, now: datetime) -> list[datetime]:
    """When the forecast floor may change: a slot boundary now or one lead ahead, and when
    the profile is due to be recomputed (``decision.next_change``). Only in mode "scale": in
    "observe" the floor changes a reason, never a step."""
    fc, profile = config.policy.forecast, observation.forecast
    if fc.mode != "scale" or profile is None:
        return []
    times = [profile.computed_at + fc.refresh]
    nxt = forecast.next_change(profile, now, forecast_lead(observation, config))
    return times if nxt is None else [*times, nxt]


def floor_matches(floor: FloorConfig, now: datetime) -> bool:
    """Does the floor's cron match ``now`` on the wall clock of its time zone (per minute)?

    Matching the naive local wall time makes daylight-saving changes behave as a person reads
    the cron: ``* 8-18 * * *`` starts at 08:00 local in summer and in winter; a local time that
    does not exist (spring forward) never matches, one that happens twice matches both times.
    """
    from zoneinfo import ZoneInfo  # only a fleet with floors: croniter costs 25 ms to import

    from croniter import croniter

    local = budget.utc(now).astimezone(ZoneInfo(floor.timezone))
    wall = local.replace(tzinfo=None, second=0, microsecond=0)
    return bool(croniter.match(floor.cron, wall))


# How far ahead a floor's next start or end is looked for; one past it is found by a later
# pass (the answer is then the horizon: earlier is always safe, later never).
FLOOR_HORIZON = timedelta(days=8)
_MINUTE = timedelta(minutes=1)
# A floor's next flip, once found, holds for every ``now`` before it: (cron, zone) -> (found
# at, flip). A memo of a pure function, so the passes of a long floor do not search again.
_flips: dict[tuple[str, str], tuple[datetime, datetime]] = {}


def next_floor_change(policy: PolicyConfig, now: datetime) -> datetime | None:
    """The first minute after ``now`` at which a floor with instances starts or stops matching
    (``floor_matches``, on its own wall clock, repeated and skipped hours included); the
    horizon when none does within ``FLOOR_HORIZON``; None without such floors."""
    flips = [_next_flip(fl, budget.utc(now)) for fl in policy.floor if fl.min_instances > 0]
    return min(flips) if flips else None


def _next_flip(floor: FloorConfig, now: datetime) -> datetime:
    key = (floor.cron, floor.timezone)
    memo = _flips.get(key)
    if memo is not None and memo[0] <= now < memo[1]:
        return memo[1]
    from zoneinfo import ZoneInfo  # only a fleet with floors (see floor_matches)

    from croniter import croniter

    tz = ZoneInfo(floor.timezone)
    matching = floor_matches(floor, now)
    # Every minute of a matching hour matches too: a run is walked an hour at a time.
    whole_hours = croniter(floor.cron).expanded[0] == ["*"]
    t = now.replace(second=0, microsecond=0) + _MINUTE
    end = t + FLOOR_HORIZON
    while t < end and floor_matches(floor, t) == matching:
        if matching:
            # A run of matching minutes ends where one does not: the next minute, or (whole
            # hours) the next wall-clock hour, or where the zone's offset changes first.
            step = t + _MINUTE
            if whole_hours:
                wall = t.astimezone(tz)
                step = max(step, t + timedelta(minutes=60 - wall.minute))
            t = min(step, _offset_change(tz, t, step))
            continue
        # Not matching: jump to the next wall time the cron matches, taken as the earliest
        # instant with that wall time; but stop at a change of the zone's offset first, where
        # the wall clock jumps (back: an hour already passed comes again).
        wall = t.astimezone(tz).replace(tzinfo=None)
        nxt = croniter(floor.cron, wall - _MINUTE).get_next(datetime)
        instants = [nxt.replace(tzinfo=tz, fold=f).astimezone(t.tzinfo) for f in (0, 1)]
        jump = min((i for i in instants if i > t), default=t + _MINUTE)
        t = min(max(jump, t + _MINUTE), end, _offset_change(tz, t, jump))
    _flips[key] = (now, min(t, end))
    return min(t, end)


def _offset_change(tz: ZoneInfo, start: datetime, end: datetime) -> datetime:
    """The first minute in (start, end] whose UTC offset in ``tz`` differs from start's; end
    when none does (searched by halves: zones change offset on whole minutes)."""
    offset = start.astimezone(tz).utcoffset()
    if end.astimezone(tz).utcoffset() == offset:
        return end
    lo, hi = 0, math.ceil((end - start) / _MINUTE)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (start + mid * _MINUTE).astimezone(tz).utcoffset() == offset:
            lo = mid
        else:
            hi = mid
    return start + hi * _MINUTE


def _minutes_into_paid_hour(instance: Instance, now: datetime) -> timedelta:
    """How far ``now`` is into the instance's current billed hour."""
    month_start, _ = budget.month_bounds(now)
    anchor = max(budget.utc(instance.created_at or month_start), month_start)
    return (budget.utc(now) - anchor) % budget.HOUR


def paid_hour_ends(instance: Instance, now: datetime) -> datetime:
    """When the instance's billed hour that holds ``now`` ends: an hour on from its creation
    (or from the month's start), at the month's end at the latest, where the bill starts
    afresh (``budget.billed``): kept past midnight on the 1st, an idle instance pays a new hour."""
    return min(
        now + (budget.HOUR - _minutes_into_paid_hour(instance, now)), budget.month_bounds(now)[1]
    )


def drain_window_opens(instance: Instance, now: datetime) -> datetime:
    """The first moment at or after ``now`` when the instance is near the end of a paid hour."""
    return max(now, paid_hour_ends(instance, now) - BILLING_HOUR_MARGIN)


def _boot_since(instance: Instance) -> datetime | None:
    """Since when ``boot_timeout`` has been counting for a pending or booting instance."""
    since = instance.boot_since or instance.created_at or instance.state_since
    return None if since is None else budget.utc(since)


def replaced_from(instance: Instance, policy: PolicyConfig) -> datetime | None:
    """The first moment a pending or booting instance is past ``boot_timeout`` (the rule
    compares ``>``), and is replaced; None: nothing to count from."""
    since = _boot_since(instance)
    return None if since is None else since + policy.boot_timeout + budget.PAST


def up_cooldown_ends(observation: Observation, policy: PolicyConfig) -> datetime | None:
    """When the up cool-down lets a scale-up through again: ``scale_up_cooldown`` after the
    last scale-up; None: none yet."""
    up = observation.last_scale_up
    return None if up is None else budget.utc(up) + policy.scale_up_cooldown


def scale_in_waits(
    observation: Observation, policy: PolicyConfig, idle_since: datetime
) -> list[Clamp]:
    """What a scale-in waits for on a queue idle since ``idle_since``, each with when it lets
    go (``until``): the idle window, and the down cool-down since the last scale-up and since
    an earlier scale-in. Drains within one unbroken idle period are one scale-in, staggered
    only by billing hours: the cool-down damps flapping, and an empty queue gives nothing to
    flap on, so a scale-in of this idle period does not start it again."""
    idle = budget.utc(idle_since)
    window, cd = policy.idle_before_scale_down, policy.scale_down_cooldown
    waits = [Clamp(Limit.IDLE_WINDOW, since=idle, window=window, until=idle + window)]
    if observation.last_scale_up is not None:
        up = budget.utc(observation.last_scale_up)
        waits.append(Clamp(Limit.COOLDOWN_DOWN_AFTER_UP, since=up, window=cd, until=up + cd))
    if observation.last_scale_down is not None and budget.utc(observation.last_scale_down) < idle:
        down = budget.utc(observation.last_scale_down)
        waits.append(Clamp(Limit.COOLDOWN_DOWN_AFTER_DOWN, since=down, window=cd, until=down + cd))
    return waits


def next_changes(
    observation: Observation, plan: Plan, config: Config, now: datetime
) -> list[datetime]:
    """When the policy's rules may answer otherwise for the same observation, each as the rule
    times itself: a floor starting or ending, the forecast's floor moving, the up cool-down
    ending, the waits of a scale-in ending, the scale-in the billing hour allows
    (``plan.next_scale_in_at``), a boot passing ``boot_timeout``. Asked apart from ``decide``
    (``decision.next_change``): the search for a floor's next flip is not every pass's cost."""
    pol = config.policy
    times = [next_floor_change(pol, now), plan.next_scale_in_at, up_cooldown_ends(observation, pol)]
    if plan.idle_since is not None:
        times += [w.until for w in scale_in_waits(observation, pol, plan.idle_since)]
    times += forecast_changes(observation, config, now)
    times += [replaced_from(i, pol) for i in observation.instances if i.state in _BOOT_STATES]
    return [t for t in times if t is not None]


def _youngest_first(instance: Instance) -> tuple[float, str]:
    created = instance.created_at or instance.state_since
    return (-(budget.utc(created).timestamp()) if created else 0.0, instance.label)


def _hhmm(dt: datetime) -> str:
    return budget.utc(dt).strftime("%H:%M:%S UTC")


def decide(observation: Observation, config: Config, now: datetime) -> Plan:
    """Turn one observation into a plan: actions, each with its reason, and every clamp."""
    return _Sizing(observation, config, budget.utc(now)).run()


class _Sizing:
    """One call of ``decide`` (the fleet's size; the pass's whole decision is
    ``vultrscale.rules.decision``); a class only to share the lists of reasons, clamps, warnings and
    actions its steps add to, nothing else between its methods."""

    def __init__(self, obs: Observation, config: Config, now: datetime) -> None:
        self.obs = obs
        self.cfg = config
        self.pol = config.policy
        self.now = now
        self.actions: list[Action] = []
        self.reasons: list[str] = []
        self.clamps: list[Clamp] = []
        self.warnings: list[str] = []
        self.wait: waits.WaitCall | None = None  # the wait rule's estimate, when it ran

    def run(self) -> Plan:
        obs, pol, now = self.obs, self.pol, self.now
        signals = None if obs.signal_error else obs.signals
        errors = []
        if signals is None:
            errors.append(f"queue signals unavailable ({obs.signal_error or 'not read'})")
        if obs.api_error:
            errors.append(f"Vultr API error ({obs.api_error})")
        holding = bool(errors)

        capacity = [i for i in obs.instances if i.state in CAPACITY_STATES]
        leaving = sum(1 for i in obs.instances if i.state in _LEAVING)
        self.reasons.append(self._describe_capacity(capacity, leaving))

        # Floor.
        floors = active_floors(pol, now)
        predicted = forecast_floor(obs, self.cfg, now)
        if predicted is not None:
            if pol.forecast.mode == "scale" and predicted.floor:
                floors.append(ActiveFloor(predicted.source, predicted.floor))
            elif predicted.floor:
                self.reasons.append(
                    f"forecast floor {predicted.floor} not applied (policy.forecast.mode = "
                    f'"observe"): {predicted.source}'
                )
            elif not predicted.usable:
                self.reasons.append(predicted.source)
        top = max(floors, key=lambda f: f.min_instances)
        floor = top.min_instances
        if floor:
            self.reasons.append(f"floor {floor} from {top.source}")

        # Replacements (never while holding: a stale view may only look stuck).
        replaced: list[Instance] = []
        if not holding:
            replaced = self._replacements(capacity)
        gone_soon = {i.label for i in replaced}
        # Draining, deleting or being replaced: still at Vultr, still billed.
        on_the_way_out = len(replaced) + leaving
        staying = [i for i in capacity if i.label not in gone_soon]
        n_now = len(staying)

        # Demand.
        demand: int | None = None
        if signals is not None:
            demand = signals.demand
            desired = self._desired(demand, staying)
            self.reasons.append(
                f"demand {demand} job(s) (ready {signals.ready}, in flight {signals.in_flight}, "
                f"expired leases {signals.expired_leases}) at {self._per_instance()} "
                f"per instance -> {desired} instance(s)"
            )
        else:
            desired = n_now  # unknown demand: hold what there is

        # Cap: max_instances and the budget rule.
        check = None
        if obs.price is not None:
            check = budget.check(
                obs,
                obs.price,
                self.cfg.budget.monthly_ceiling_usd,
                now,
                leaving=[i.label for i in replaced],
            )
            budget_max = max(check.max_total, 0)
            if check.over_budget and check.account_binds:
                self.warnings.append(
                    f"over the account's budget: {check.account_reason}; no scale-up of this "
                    "fleet until the account fits its ceiling (nothing is removed for it)"
                )
            elif check.over_budget:
                self.warnings.append(
                    f"over budget: {check.current} instance(s) and ${check.month_to_date_usd:.2f} "
                    f"billed this month do not fit the ${check.ceiling:.2f} monthly ceiling "
                    f"({'; '.join(check.reasons)}); no scale-up until they do (nothing is "
                    "removed for it)"
                )
        else:
            budget_max = n_now
            self.warnings.append(
                "plan price unknown: the budget cannot be checked, so no instance is created"
            )
        cap = min(pol.max_instances, budget_max)

        idle_since = self._idle_since()
        creates = 0
        drains: list[Instance] = []

        if holding:
            self.reasons.append("holding the fleet: " + "; ".join(errors))
            if pol.on_signal_error == "floor" and n_now < floor:
                want = floor
                creates = self._scale_up(
                    n_now, want, check, on_the_way_out, why="bring the fleet to its floor"
                )
            elif n_now < floor:
                self.clamps.append(Clamp(Limit.ERROR_HOLD, asked=floor, allowed=n_now))
        else:
            needed = desired  # the depth rule's; the wait rule may ask fewer
            if signals is not None and not pol.target_wait.off:
                # Estimated every pass (the plan and the metrics show the wait); it decides
                # only where the depth rule asks more than there is.
                call = self._wait_rule(signals, staying, desired)
                self.wait = call
                if desired > n_now:
                    self.reasons.append(call.reason)
                    needed = min(desired, call.wanted)
            want = max(needed, floor)
            if want > n_now:
                why = (
                    f"the queue needs {needed} instance(s)"
                    if needed >= floor
                    else f"the floor is {floor} instance(s)"
                )
                # Revive before you boot: a draining instance whose delete is not sent yet
                # is capacity again within its drain time, already paid, where a create
                # takes a boot and a new started hour. Only the rest is created.
                revived = self._revive(n_now, min(want, cap), why=why)
                n_now, on_the_way_out = n_now + revived, on_the_way_out - revived
                creates = self._scale_up(n_now, want, check, on_the_way_out, why=why)
            drains = self._over_cap(staying, pol.max_instances)
            if not drains and signals is not None and want < n_now:
                drains = self._scale_in(staying, floor, desired, idle_since)

        target = n_now + creates - len(drains)
        next_in = self._next_scale_in(staying, floor, desired, idle_since, holding, drains)
        return Plan(
            desired=desired,
            target=target,
            capacity=len(capacity),
            floor=floor,
            cap=cap,
            actions=tuple(self.actions),
            reasons=tuple(self.reasons),
            clamps=tuple(self.clamps),
            warnings=tuple(self.warnings),
            idle_since=idle_since,
            next_scale_in_at=next_in,
            demand=demand,
            month_to_date_usd=check.month_to_date_usd if check else None,
            committed_usd=check.committed_usd if check else None,
            forecast_mode=pol.forecast.mode,
            forecast_floor=predicted.floor if predicted and predicted.usable else None,
            forecast_source="" if predicted is None else predicted.source,
            wait_estimate=self.wait.wait if self.wait else None,
            arrival_rate=self.wait.rate if self.wait else None,
        )

    # --- pieces ---------------------------------------------------------------------------

    def _wait_rule(self, signals: Signals, staying: list[Instance], desired: int) -> waits.WaitCall:
        """The wait rule's answer (``vultrscale.rules.waits``): instances the queue wants by its
        wait, at most ``desired``, and why in numbers. The forecast's expected arrivals count
        where it acts (mode "scale", a profile its backtest trusts)."""
        cfg, obs = self.cfg, self.obs
        boot = forecast_lead(obs, cfg)
        expected = None
        if self.pol.forecast.mode == "scale" and obs.forecast is not None:
            expected = forecast.arrival_rate(obs.forecast, self.now, boot)
        return waits.size(
            signals,
            staying,
            jobs_per_instance=self._new_per_instance(),
            boot=boot,
            target_wait=waits.target(self.pol.target_wait, boot),
            depth=desired,
            now=self.now,
            slots_of=lambda i: offerings.jobs_per_instance(cfg, i.region, i.plan),
            expected_rate=expected,
        )

    def _describe_capacity(self, capacity: list[Instance], leaving: int) -> str:
        counts: dict[InstanceState, int] = {}
        for i in capacity:
            counts[i.state] = counts.get(i.state, 0) + 1
        parts = ", ".join(f"{n} {s.value}" for s, n in counts.items())
        tail = f"; {leaving} draining or deleting, not counted" if leaving else ""
        return f"capacity {len(capacity)}" + (f" ({parts})" if parts else "") + tail

    def _desired(self, demand: int, staying: list[Instance]) -> int:
        """Instances the demand asks for, each offering's instances at its own
        ``jobs_per_instance`` (docs/offerings.md); new ones at that of the plan creates are
        priced at (the first usable offering's). ceil(demand / jobs_per_instance) when every
        offering runs the queue's number."""
        cfg = self.cfg
        slots = [offerings.jobs_per_instance(cfg, i.region, i.plan) for i in staying]
        return offerings.desired_instances(demand, slots, self._new_per_instance())

    def _new_per_instance(self) -> int:
        """Jobs a new instance runs at once: those of the offering creates are priced at (the
        first usable one's)."""
        price = self.obs.price
        return offerings.new_jobs_per_instance(self.cfg, price.plan if price else None)

    def _per_instance(self) -> str:
        """Jobs per instance as the demand's reason says it."""
        if any(o.jobs_per_instance for o in offerings.of(self.cfg)):
            return "each offering's jobs"
        return str(self.cfg.queue.jobs_per_instance)

    def _idle_since(self) -> datetime | None:
        """When the queue went idle; None when busy or when the queue could not be read."""
        obs = self.obs
        if obs.signals is None or obs.signal_error:
            return None  # unknown: an outage must not count towards the idle window
        busy_instances = any(i.live_leases for i in obs.instances)
        if not obs.signals.idle or busy_instances:
            return None
        return obs.idle_since if obs.idle_since is not None else self.now

    def _replacements(self, capacity: list[Instance]) -> list[Instance]:
        out = []
        limit = self.pol.boot_timeout
        for inst in capacity:
            if inst.state not in _BOOT_STATES or inst.live_leases:
                continue
            due, since = replaced_from(inst, self.pol), _boot_since(inst)
            if due is not None and since is not None and self.now >= due:
                age = self.now - since
                out.append(inst)
                self.actions.append(
                    Action(
                        ActionKind.REPLACE,
                        f"still {inst.state.value} {span(age)} into its boot, past boot_timeout "
                        f"{format_duration(limit)}: delete it; a new one is created in its place",
                        inst.label,
                    )
                )
        return out

    def _scale_up(
        self,
        n_now: int,
        want: int,
        check: budget.BudgetCheck | None,
        leaving: int,
        *,
        why: str,
    ) -> int:
        pol, obs, now = self.pol, self.obs, self.now
        goal = want
        cap = pol.max_instances
        if goal > cap:
            self.clamps.append(Clamp(Limit.CAP, asked=goal, allowed=cap, limit=cap))
            goal = cap
        # Instances on their way out still exist at Vultr (a locked delete can take a while)
        # and are billed: they count toward the hard cap and the budget until they are gone.
        if leaving and goal + leaving > pol.max_instances:
            allowed = max(pol.max_instances - leaving, min(goal, n_now))
            if allowed < goal:
                self.clamps.append(
                    Clamp(Limit.CAP_LEAVING, asked=goal, allowed=allowed, limit=cap, count=leaving)
                )
                goal = allowed
        if check is None:
            if goal > n_now:
                self.clamps.append(Clamp(Limit.PRICE_UNKNOWN, asked=goal, allowed=n_now))
            return 0
        if goal + leaving > check.max_total:
            allowed = max(check.max_total - leaving, min(goal, n_now))
            monthly = check.by_monthly <= check.by_month_end  # rule (a), else (b)
            # Named only where it lowers the goal (as the cap's leaving clamp): "limits 5 -> 5"
            # says a larger ceiling would help where only the cap holds the fleet.
            if allowed < goal and check.account_binds:
                self.clamps.append(
                    Clamp(
                        Limit.BUDGET_ACCOUNT,
                        asked=goal,
                        allowed=allowed,
                        limit=check.account.ceiling if check.account else None,
                        detail=check.account_reason,
                    )
                )
            elif allowed < goal:
                self.clamps.append(
                    Clamp(
                        Limit.BUDGET_MONTHLY if monthly else Limit.BUDGET_MONTH_BILL,
                        asked=goal,
                        allowed=allowed,
                        limit=check.ceiling,
                        detail=check.reasons[0] if monthly else check.reasons[1],
                    )
                )
            goal = allowed
        if goal <= n_now:
            return 0
        ready_at = up_cooldown_ends(obs, pol)
        if ready_at is not None and now < ready_at:
            self.clamps.append(
                Clamp(
                    Limit.COOLDOWN_UP,
                    since=ready_at - pol.scale_up_cooldown,
                    window=pol.scale_up_cooldown,
                    until=ready_at,
                    wait=ready_at - now,
                )
            )
            return 0
        n = goal - n_now
        if pol.max_step_up and n > pol.max_step_up:
            step = pol.max_step_up
            self.clamps.append(Clamp(Limit.STEP, asked=n, allowed=step, limit=step))
            n = pol.max_step_up
        reason = (
            f"{why}; {n_now} counted (pending and booting included), creating {n} toward {goal}"
        )
        for _ in range(n):
            self.actions.append(Action(ActionKind.CREATE, reason))
        return n

    def _revive(self, n_now: int, want: int, *, why: str) -> int:
        """Start again the workers of draining instances that can still take jobs
        (``Instance.revivable``), up to ``want`` (already within ``max_instances`` and the
        budget: a revived instance bills on as a new one would, and no more); how many.

        The instance with the most of its paid hour left goes first: every draining instance
        is paid to the end of its current hour, and the one revived runs on into a new hour at
        its end; the later that end, the more already-paid work it gives before the next hour
        is bought, and the others' drains, timed for the end of their hours, still land first.
        Neither the up cool-down nor ``max_step_up`` holds a revive back: both pace boots,
        and a revive boots nothing and adds no instance at Vultr. It counts as a scale-up for
        the down cool-down, so the instance is not drained again at once."""
        pol, now = self.pol, self.now
        if not pol.revive:
            return 0
        room = want - n_now
        candidates = [i for i in self.obs.instances if i.revivable]
        if room <= 0 or not candidates:
            return 0
        candidates.sort(key=lambda i: (-(paid_hour_ends(i, now) - now).total_seconds(), i.label))
        chosen = candidates[:room]
        for inst in chosen:
            ends = paid_hour_ends(inst, now)
            when = {
                ServiceState.DEACTIVATING: "starts once its drain ends",
                ServiceState.ACTIVATING: "already starting",
            }.get(inst.service or ServiceState.INACTIVE, "starts now")
            self.actions.append(
                Action(
                    ActionKind.REVIVE,
                    f"{why}; {n_now} counted: reviving {len(chosen)} of {len(candidates)} "
                    f"draining instance(s) instead of booting new ones (worker {inst.service}, "
                    f"{when}; its delete not sent; {span(ends - now)} of its paid hour left, "
                    f"until {_hhmm(ends)})",
                    inst.label,
                )
            )
        return len(chosen)

    def _over_cap(self, staying: list[Instance], max_instances: int) -> list[Instance]:
        """More instances than max_instances (lowered in the config, or adopted): drain the
        excess now, idle ones first. The budget never forces this; only the hard cap does."""
        excess = len(staying) - max_instances
        if excess <= 0:
            return []
        drainable = [i for i in staying if i.state in _DRAINABLE]
        drainable.sort(key=lambda i: (i.live_leases, self._least_preferred_first(i)))
        chosen = drainable[:excess]
        if len(chosen) < excess:
            # Create intents cannot be drained; the reconcile pass settles them first.
            self.warnings.append(
                f"{len(staying)} instance(s) above max_instances={max_instances}, "
                f"{excess - len(chosen)} of them not created yet: drained once they exist"
            )
        if not chosen:
            return []
        there = len(staying)
        self.clamps.append(
            Clamp(
                Limit.OVER_CAP,
                asked=there,
                allowed=there - len(chosen),
                limit=max_instances,
                count=len(chosen),
            )
        )
        for inst in chosen:
            lease = f", {inst.live_leases} job(s) given back" if inst.live_leases else ", idle"
            self.actions.append(
                Action(
                    ActionKind.DRAIN,
                    f"the fleet is above max_instances={max_instances}{lease}",
                    inst.label,
                )
            )
        return chosen

    def _least_preferred_first(self, instance: Instance) -> tuple[int, float, str]:
        """Scale-in order: the instances of the least preferred offering first (a more
        preferred one that is usable again takes the fleet back), the youngest first within."""
        return (-offerings.preference(self.cfg, instance), *_youngest_first(instance))

    def _scale_in_gate(self, idle_since: datetime | None) -> tuple[datetime | None, list[Clamp]]:
        """The earliest time the idle window and the down cool-down allow a scale-in, and the
        clamps that apply now. None: not idle, so no time can be given."""
        if idle_since is None:
            return None, []
        waits = scale_in_waits(self.obs, self.pol, idle_since)
        gate = max(w.until for w in waits if w.until is not None)
        now = self.now
        held = [replace(w, wait=w.until - now) for w in waits if w.until and w.until > now]
        return gate, held

    def _scale_in(
        self, staying: list[Instance], floor: int, desired: int, idle_since: datetime | None
    ) -> list[Instance]:
        pol, now = self.pol, self.now
        keep = max(floor, desired)
        surplus = len(staying) - keep
        if surplus <= 0:
            return []
        gate, clamps = self._scale_in_gate(idle_since)
        if gate is None:
            return []  # not idle: demand keeps every instance
        if gate > now:
            self.clamps.extend(clamps)
            return []
        # Never a busy instance for scale-in; the idle queue makes busy ones rare (a lease seen
        # in the ledger a moment after the signals were read) and they simply stay.
        idle = [i for i in staying if i.state in _DRAINABLE and not i.live_leases]
        idle.sort(key=self._least_preferred_first)
        chosen: list[Instance] = []
        kept_for_billing: list[tuple[Instance, datetime]] = []
        for inst in idle:
            if len(chosen) >= surplus:
                break
            if pol.billing_hour_aware:
                opens = drain_window_opens(inst, now)
                if opens > now:
                    kept_for_billing.append((inst, opens))
                    continue
            chosen.append(inst)
        if kept_for_billing and len(chosen) < surplus:
            first = budget.utc(min(t for _, t in kept_for_billing))
            self.clamps.append(
                Clamp(
                    Limit.BILLING_HOUR,
                    count=len(kept_for_billing),
                    window=BILLING_HOUR_MARGIN,
                    until=first,
                    wait=first - now,
                )
            )
        if floor and len(staying) - len(chosen) == floor and surplus > 0:
            self.reasons.append(f"scale-in stops at the floor of {floor}")
        for inst in chosen:
            when = ""
            if pol.billing_hour_aware:
                when = f"; its paid hour ends at {_hhmm(paid_hour_ends(inst, now))}"
            self.actions.append(
                Action(
                    ActionKind.DRAIN,
                    f"the queue has been empty since {_hhmm(idle_since or now)} and this instance "
                    f"holds no job; {len(staying)} instance(s) where {keep} are needed{when}",
                    inst.label,
                )
            )
        return chosen

    def _next_scale_in(
        self,
        staying: list[Instance],
        floor: int,
        desired: int,
        idle_since: datetime | None,
        holding: bool,
        drains: list[Instance],
    ) -> datetime | None:
        if holding or idle_since is None:
            return None
        remaining = [i for i in staying if i not in drains]
        if len(remaining) <= max(floor, desired):
            return None
        gate, _ = self._scale_in_gate(idle_since)
        if gate is None:
            return None
        gate = max(gate, self.now)
        idle = [i for i in remaining if i.state in _DRAINABLE and not i.live_leases]
        if not idle:
            return None
        if not self.pol.billing_hour_aware:
            return gate
        return min(drain_window_opens(i, gate) for i in idle)
