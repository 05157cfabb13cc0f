"""policy.decide(): tables with ids for each rule, floors across DST, a runaway producer over
many passes, and hypothesis invariants over random observations. Time is an argument."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from vultrscale.config import BudgetConfig, Config, FloorConfig, PolicyConfig, QueueConfig
from vultrscale.core.limits import Limit
from vultrscale.core.model import (
    CAPACITY_STATES,
    ActionKind,
    Instance,
    InstanceState,
    Observation,
    Plan,
    PlanPrice,
    Signals,
)
from vultrscale.rules import budget, policy
from vultrscale.rules.policy import decide

S = InstanceState
PRICE = PlanPrice("vc2-1c-2gb", monthly=10.0)
NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)  # a Tuesday, mid-month


def t(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC)


def cfg(
    *,
    ceiling: float = 1000.0,
    jobs: int = 4,
    floors: tuple[FloorConfig, ...] = (),
    **pol: Any,
) -> Config:
    return Config(
        policy=PolicyConfig(floor=floors, **pol),
        queue=QueueConfig(jobs_per_instance=jobs),
        budget=BudgetConfig(monthly_ceiling_usd=ceiling),
    )


def vm(
    label: str,
    minutes_ago: float,
    *,
    state: InstanceState = S.RUNNING,
    leases: int = 0,
    now: datetime = NOW,
) -> Instance:
    return Instance(
        label=label,
        state=state,
        id=None if state is S.CREATING else f"id-{label}",
        created_at=now - timedelta(minutes=minutes_ago),
        state_since=now - timedelta(minutes=minutes_ago),
        live_leases=leases,
    )


def observe(
    *instances: Instance,
    ready: int = 0,
    in_flight: int = 0,
    expired: int = 0,
    ago: dict[str, float] | None = None,
    **kw: Any,
) -> Observation:
    """An observation at NOW; ``ago`` gives last_scale_up/last_scale_down/idle_since in seconds."""
    times = {k: NOW - timedelta(seconds=v) for k, v in (ago or {}).items()}
    fields: dict[str, Any] = {"signals": Signals(ready, in_flight, expired), "price": PRICE}
    fields.update(times)
    fields.update(kw)
    return Observation(instances=tuple(instances), **fields)


def labels(plan: Plan, kind: ActionKind) -> list[str]:
    return sorted(a.label or "" for a in plan.actions if a.kind is kind)


SEC = timedelta(seconds=1)
# A limit that must have held: its kind, and the numbers it held by.
Held = tuple[Limit, dict[str, Any]]


def held(kind: Limit, **numbers: Any) -> Held:
    return kind, numbers


IDLE_LONG: dict[str, float] = {"idle_since": 600.0}  # queue empty for 10 minutes
NO_BILLING: dict[str, Any] = {"billing_hour_aware": False}


CASES = [
    # --- scale-up -------------------------------------------------------------------------
    pytest.param(observe(ready=9), cfg(), 3, [], [], None, id="burst-from-zero"),
    pytest.param(
        observe(
            vm("p1", 2, state=S.PENDING),
            vm("b1", 3, state=S.BOOTING),
            vm("r1", 30),
            ready=9,
        ),
        cfg(),
        0,
        [],
        [],
        None,
        id="pending-and-booting-count-as-capacity",
    ),
    pytest.param(
        observe(*(vm(f"c{i}", 0.2, state=S.CREATING) for i in range(3)), ready=9),
        cfg(),
        0,
        [],
        [],
        None,
        id="create-intents-count-as-capacity",
    ),
    pytest.param(
        observe(
            vm("r1", 30),
            vm("d1", 50, state=S.DRAINING),
            vm("x1", 50, state=S.DELETING),
            ready=9,
        ),
        cfg(),
        2,
        [],
        [],
        None,
        id="draining-and-deleting-do-not-count",
    ),
    pytest.param(observe(expired=5), cfg(), 2, [], [], None, id="expired-leases-are-demand"),
    pytest.param(
        observe(vm("r1", 30, leases=4), vm("r2", 30, leases=4), in_flight=8),
        cfg(),
        0,
        [],
        [],
        None,
        id="in-flight-is-demand-nothing-drained",
    ),
    pytest.param(
        observe(ready=40),
        cfg(),
        5,
        [],
        [],
        held(Limit.CAP, asked=10, allowed=5, limit=5),
        id="cap",
    ),
    pytest.param(
        observe(ready=40),
        cfg(ceiling=25.0),
        2,
        [],
        [],
        held(Limit.BUDGET_MONTHLY, asked=5, allowed=2, limit=25.0),
        id="budget-rule-a-limits",
    ),
    pytest.param(
        observe(ready=24),
        cfg(ceiling=50.0, max_instances=10),
        5,
        [],
        [],
        held(Limit.BUDGET_MONTHLY, asked=6, allowed=5, limit=50.0),
        id="budget-one-instance-too-many",
    ),
    pytest.param(
        observe(ready=40, month_to_date_usd=45.0),
        cfg(ceiling=50.0),
        0,
        [],
        [],
        held(Limit.BUDGET_MONTH_BILL, asked=5, allowed=0, limit=50.0),
        id="budget-rule-b-most-spent",
    ),
    pytest.param(
        observe(ready=40),
        cfg(max_step_up=2),
        2,
        [],
        [],
        held(Limit.STEP, asked=5, allowed=2, limit=2),
        id="max-step-up",
    ),
    pytest.param(
        observe(ready=9, ago={"last_scale_up": 18}),
        cfg(),
        0,
        [],
        [],
        held(Limit.COOLDOWN_UP, since=NOW - 18 * SEC, window=60 * SEC, wait=42 * SEC),
        id="up-cool-down-holds",
    ),
    pytest.param(
        observe(ready=9, ago={"last_scale_up": 61}), cfg(), 3, [], [], None, id="up-cool-down-over"
    ),
    pytest.param(
        observe(ready=9, ago={"last_scale_down": 10}),
        cfg(),
        3,
        [],
        [],
        None,
        id="a-recent-scale-in-does-not-delay-scale-up",
    ),
    pytest.param(observe(), cfg(min_instances=2), 2, [], [], None, id="min-instances-floor"),
    pytest.param(
        observe(ready=9, price=None),
        cfg(),
        0,
        [],
        [],
        held(Limit.PRICE_UNKNOWN, asked=3, allowed=0),
        id="price-unknown-no-create",
    ),
    # --- errors hold ------------------------------------------------------------------------
    pytest.param(
        observe(signals=None, signal_error="connection refused"),
        cfg(min_instances=1),
        0,
        [],
        [],
        held(Limit.ERROR_HOLD, asked=1, allowed=0),
        id="signals-unreadable-hold",
    ),
    pytest.param(
        observe(vm("r1", 30), signals=None, signal_error="timeout"),
        cfg(min_instances=2, on_signal_error="floor"),
        1,
        [],
        [],
        None,
        id="signals-unreadable-floor",
    ),
    pytest.param(
        observe(vm("r1", 56), vm("r2", 56), signal_error="timeout", ago=IDLE_LONG),
        cfg(on_signal_error="floor", **NO_BILLING),
        0,
        [],
        [],
        None,
        id="signal-error-never-scales-in",
    ),
    pytest.param(
        observe(ready=9, api_error="500 from /v2/instances"),
        cfg(),
        0,
        [],
        [],
        None,
        id="api-error-hold",
    ),
    pytest.param(
        observe(vm("r1", 56), vm("r2", 56), api_error="429", ago=IDLE_LONG),
        cfg(**NO_BILLING),
        0,
        [],
        [],
        None,
        id="api-error-never-scales-in",
    ),
    pytest.param(
        observe(vm("p1", 20, state=S.PENDING), api_error="429", ready=4),
        cfg(),
        0,
        [],
        [],
        None,
        id="api-error-never-replaces",
    ),
    # --- scale-in ---------------------------------------------------------------------------
    pytest.param(
        observe(vm("old", 180), vm("mid", 120), vm("young", 60), ago=IDLE_LONG),
        cfg(**NO_BILLING),
        0,
        ["mid", "old", "young"],
        [],
        None,
        id="idle-scale-to-zero",
    ),
    pytest.param(
        observe(vm("old", 180), vm("mid", 120), vm("young", 60), ago=IDLE_LONG),
        cfg(min_instances=1, **NO_BILLING),
        0,
        ["mid", "young"],
        [],
        None,
        id="floor-stops-scale-in-youngest-go-first",
    ),
    pytest.param(
        observe(vm("r1", 60), ago={"idle_since": 60}),
        cfg(**NO_BILLING),
        0,
        [],
        [],
        held(Limit.IDLE_WINDOW, since=NOW - 60 * SEC, window=90 * SEC, wait=30 * SEC),
        id="idle-window-not-over",
    ),
    pytest.param(
        observe(vm("r1", 60), ago={"idle_since": 600, "last_scale_up": 120}),
        cfg(**NO_BILLING),
        0,
        [],
        [],
        held(Limit.COOLDOWN_DOWN_AFTER_UP, since=NOW - 120 * SEC, wait=180 * SEC),
        id="down-cool-down-after-scale-up",
    ),
    pytest.param(
        observe(vm("r1", 60), ago={"idle_since": 180, "last_scale_down": 240}),
        cfg(**NO_BILLING),
        0,
        [],
        [],
        held(Limit.COOLDOWN_DOWN_AFTER_DOWN, since=NOW - 240 * SEC, wait=60 * SEC),
        id="down-cool-down-after-earlier-scale-in",
    ),
    pytest.param(
        observe(vm("r1", 60), ago={"idle_since": 600, "last_scale_down": 60}),
        cfg(**NO_BILLING),
        0,
        ["r1"],
        [],
        None,
        id="scale-in-continues-within-one-idle-period",
    ),
    pytest.param(
        observe(vm("r1", 60), vm("r2", 60, leases=1), ago=IDLE_LONG),
        cfg(**NO_BILLING),
        0,
        [],
        [],
        None,
        id="a-live-lease-in-the-ledger-means-not-idle",
    ),
    pytest.param(
        observe(
            *(vm(f"busy{i}", 60 + i, leases=2) for i in range(5)),
            vm("idle1", 30),
            vm("idle2", 20),
            in_flight=10,
        ),
        cfg(),
        0,
        ["idle1", "idle2"],
        [],
        held(Limit.OVER_CAP, asked=7, allowed=5, limit=5, count=2),
        id="over-cap-drains-idle-ones-first",
    ),
    pytest.param(
        observe(
            *(vm(f"b{i}", 60, leases=3) for i in range(5)),
            vm("light", 60, leases=1),
            in_flight=16,
        ),
        cfg(),
        0,
        ["light"],
        [],
        None,
        id="over-cap-all-busy-drains-the-least-busy",
    ),
    pytest.param(
        observe(vm("r1", 90), ago=IDLE_LONG),
        cfg(),
        0,
        [],
        [],
        held(Limit.BILLING_HOUR, count=1, until=t(2026, 11, 10, 12, 25)),
        id="billing-hour-keeps-a-paid-instance",
    ),
    pytest.param(
        observe(vm("r1", 56), vm("r2", 116), vm("r3", 125), ago=IDLE_LONG),
        cfg(),
        0,
        ["r1", "r2"],
        [],
        held(Limit.BILLING_HOUR, count=1),
        id="billing-hour-drains-near-the-end",
    ),
    # --- replace ----------------------------------------------------------------------------
    pytest.param(
        observe(vm("p1", 16, state=S.PENDING), ready=4),
        cfg(),
        1,
        [],
        ["p1"],
        None,
        id="stuck-pending-replaced",
    ),
    pytest.param(
        observe(vm("b1", 16, state=S.BOOTING), ready=4, ago={"last_scale_up": 30}),
        cfg(),
        0,
        [],
        ["b1"],
        held(Limit.COOLDOWN_UP, wait=30 * SEC),
        id="stuck-booting-replaced-create-waits-cool-down",
    ),
    pytest.param(
        observe(vm("b1", 14, state=S.BOOTING), ready=4),
        cfg(),
        0,
        [],
        [],
        None,
        id="booting-within-boot-timeout-kept",
    ),
]


@pytest.mark.parametrize(("observation", "config", "creates", "drains", "replaces", "clamp"), CASES)
def test_decide_table(
    observation: Observation,
    config: Config,
    creates: int,
    drains: list[str],
    replaces: list[str],
    clamp: Held | None,
) -> None:
    plan = decide(observation, config, NOW)
    assert plan.creates == creates, plan
    assert labels(plan, ActionKind.DRAIN) == drains, plan
    assert labels(plan, ActionKind.REPLACE) == replaces, plan
    if clamp is not None:
        kind, numbers = clamp
        assert any(
            c.kind is kind and all(getattr(c, k) == v for k, v in numbers.items())
            for c in plan.clamps
        ), plan.clamps
    staying = sum(1 for i in observation.instances if i.state in CAPACITY_STATES) - len(replaces)
    assert plan.target == staying + creates - len(drains)
    assert all(a.reason.strip() for a in plan.actions)


def test_billing_hour_counts_from_the_month_start_for_an_instance_from_last_month() -> None:
    now = t(2026, 11, 1, 0, 56)
    r = vm("r1", 86, now=now)  # created Oct 31 23:30: 26 min into its own hour, 56 into Nov's
    o = Observation(
        instances=(r,), signals=Signals(0, 0), price=PRICE, idle_since=now - timedelta(minutes=10)
    )
    assert labels(decide(o, cfg(), now), ActionKind.DRAIN) == ["r1"]


def test_billing_hour_ends_at_the_month_end_where_the_bill_starts_afresh() -> None:
    """Created May 31 23:40, idle at 23:56: its paid hour ends at midnight, where June bills a
    new one, not at 00:40; kept for 00:35, the promise moved to 00:55 at midnight and it paid
    that hour too."""
    now = t(2026, 5, 31, 23, 56)
    r = vm("r1", 16, now=now)
    o = Observation(
        instances=(r,), signals=Signals(0, 0), price=PRICE, idle_since=now - timedelta(minutes=10)
    )
    plan = decide(o, cfg(), now)
    assert labels(plan, ActionKind.DRAIN) == ["r1"]
    assert "its paid hour ends at 00:00:00 UTC" in plan.drains[0].reason
    early = now - timedelta(minutes=6)  # 23:50: the window opens at 23:55, not at 00:35
    assert policy.drain_window_opens(r, early) == t(2026, 5, 31, 23, 55)


@pytest.mark.parametrize(
    ("signals", "previous", "expected"),
    [
        pytest.param(Signals(0, 0), None, NOW, id="just-went-idle"),
        pytest.param(
            Signals(0, 0), NOW - timedelta(minutes=7), NOW - timedelta(minutes=7), id="still-idle"
        ),
        pytest.param(Signals(1, 0), NOW - timedelta(minutes=7), None, id="work-arrived"),
        pytest.param(Signals(0, 2), NOW - timedelta(minutes=7), None, id="leases-live"),
        pytest.param(None, NOW - timedelta(minutes=7), None, id="unknown-is-not-idle"),
    ],
)
def test_idle_since(
    signals: Signals | None, previous: datetime | None, expected: datetime | None
) -> None:
    o = Observation(instances=(), signals=signals, price=PRICE, idle_since=previous)
    assert decide(o, cfg(), NOW).idle_since == expected


@pytest.mark.parametrize(
    ("observation", "config", "expected"),
    [
        pytest.param(
            observe(vm("r1", 60), ago={"idle_since": 30}),
            cfg(**NO_BILLING),
            NOW + timedelta(seconds=60),
            id="after-the-idle-window",
        ),
        pytest.param(
            observe(vm("r1", 60), ago={"idle_since": 30, "last_scale_up": 60}),
            cfg(**NO_BILLING),
            NOW + timedelta(minutes=4),
            id="after-the-down-cool-down",
        ),
        pytest.param(
            observe(vm("r1", 90), vm("r2", 100), ago={"idle_since": 600}),
            cfg(),
            NOW + timedelta(minutes=15),
            id="at-the-first-billing-window",
        ),
        pytest.param(observe(vm("r1", 60), ready=3), cfg(), None, id="busy-not-computable"),
        pytest.param(
            observe(vm("r1", 60), ago=IDLE_LONG), cfg(min_instances=1), None, id="at-floor"
        ),
    ],
)
def test_next_scale_in_at(
    observation: Observation, config: Config, expected: datetime | None
) -> None:
    assert decide(observation, config, NOW).next_scale_in_at == expected


def test_plan_explains_demand_floor_and_budget() -> None:
    plan = decide(observe(vm("r1", 10), ready=9), cfg(min_instances=1), NOW)
    text = " | ".join(plan.reasons)
    assert "demand 9 job(s)" in text and "-> 3 instance(s)" in text
    assert "floor 1 from policy.min_instances" in text
    assert plan.demand == 9 and plan.desired == 3 and plan.floor == 1
    assert plan.month_to_date_usd is not None and plan.committed_usd is not None
    assert plan.creates == 2 and "creating 2" in plan.actions[0].reason


def test_over_budget_warns_and_removes_nothing() -> None:
    fleet = [vm(f"r{i}", 60) for i in range(3)]
    o = observe(*fleet, ready=40, month_to_date_usd=45.0)
    plan = decide(o, cfg(ceiling=50.0), NOW)
    assert plan.creates == 0 and not plan.drains
    assert any("over budget" in w for w in plan.warnings)


# --- floors in their time zone, across daylight-saving changes ------------------------------

BUSINESS = FloorConfig(cron="* 8-18 * * mon-fri", timezone="Europe/Berlin", min_instances=2)
NIGHT = FloorConfig(cron="* 2 * * *", timezone="Europe/Berlin", min_instances=3)
TOKYO = FloorConfig(cron="0-29 9 * * *", timezone="Asia/Tokyo", min_instances=1)


@pytest.mark.parametrize(
    ("floor", "at", "on"),
    [
        # Winter (CET = UTC+1), Friday 27 March 2026.
        pytest.param(BUSINESS, t(2026, 3, 27, 6, 59), False, id="cet-07:59-off"),
        pytest.param(BUSINESS, t(2026, 3, 27, 7, 0), True, id="cet-08:00-on"),
        pytest.param(BUSINESS, t(2026, 3, 27, 17, 59, 59), True, id="cet-18:59:59-on"),
        pytest.param(BUSINESS, t(2026, 3, 27, 18, 0), False, id="cet-19:00-off"),
        pytest.param(BUSINESS, t(2026, 3, 28, 10, 0), False, id="saturday-off"),
        # Summer time from Sunday 29 March 2026 (CEST = UTC+2): Monday 30 March.
        pytest.param(BUSINESS, t(2026, 3, 30, 5, 59), False, id="cest-07:59-off"),
        pytest.param(BUSINESS, t(2026, 3, 30, 6, 0), True, id="cest-08:00-on"),
        pytest.param(BUSINESS, t(2026, 3, 30, 16, 59), True, id="cest-18:59-on"),
        pytest.param(BUSINESS, t(2026, 3, 30, 17, 0), False, id="cest-19:00-off"),
        # The skipped hour 02:00-03:00 local on 29 March never happens.
        pytest.param(NIGHT, t(2026, 3, 29, 0, 59), False, id="spring-01:59-cet-off"),
        pytest.param(NIGHT, t(2026, 3, 29, 1, 0), False, id="spring-03:00-cest-off"),
        pytest.param(NIGHT, t(2026, 3, 28, 1, 30), True, id="day-before-02:30-on"),
        # Back to winter time on Sunday 25 October 2026: 02:00-03:00 local happens twice.
        pytest.param(NIGHT, t(2026, 10, 25, 0, 30), True, id="autumn-02:30-cest-on"),
        pytest.param(NIGHT, t(2026, 10, 25, 1, 30), True, id="autumn-02:30-cet-on"),
        pytest.param(NIGHT, t(2026, 10, 25, 2, 0), False, id="autumn-03:00-cet-off"),
        pytest.param(BUSINESS, t(2026, 10, 23, 6, 0), True, id="fri-before-08:00-cest-on"),
        pytest.param(BUSINESS, t(2026, 10, 26, 6, 59), False, id="mon-after-07:59-cet-off"),
        pytest.param(BUSINESS, t(2026, 10, 26, 7, 0), True, id="mon-after-08:00-cet-on"),
        # Another zone, window across the UTC date line (09:00-09:29 Tokyo = 00:00-00:29 UTC).
        pytest.param(TOKYO, t(2026, 7, 1, 0, 29), True, id="tokyo-09:29-on"),
        pytest.param(TOKYO, t(2026, 7, 1, 0, 30), False, id="tokyo-09:30-off"),
        pytest.param(TOKYO, t(2026, 6, 30, 23, 59), False, id="tokyo-08:59-off"),
    ],
)
def test_floor_window_edges(floor: FloorConfig, at: datetime, on: bool) -> None:
    assert policy.floor_matches(floor, at) is on
    config = cfg(floors=(floor,), max_instances=5)
    plan = decide(Observation(instances=(), signals=Signals(0, 0), price=PRICE), config, at)
    assert plan.floor == (floor.min_instances if on else 0)
    assert plan.creates == plan.floor


def test_the_largest_matching_floor_wins_and_a_closed_window_lets_the_fleet_drain() -> None:
    floors = (BUSINESS, FloorConfig(cron="* 12 * * *", timezone="UTC", min_instances=4))
    config = cfg(floors=floors, min_instances=1, max_instances=5, billing_hour_aware=False)
    at_noon = t(2026, 3, 30, 12, 5)  # Monday 14:05 in Berlin: both windows open
    plan = decide(Observation(instances=(), signals=Signals(0, 0), price=PRICE), config, at_noon)
    assert plan.floor == 4 and "policy.floor[1]" in " ".join(plan.reasons)
    # 19:00 Berlin: only min_instances=1 is left; four idle instances drain to one.
    evening = t(2026, 3, 30, 17, 0)
    fleet = tuple(vm(f"r{i}", 300, now=evening) for i in range(4))
    o = Observation(
        instances=fleet,
        signals=Signals(0, 0),
        price=PRICE,
        idle_since=evening - timedelta(minutes=30),
    )
    plan = decide(o, config, evening)
    assert plan.floor == 1 and len(plan.drains) == 3 and plan.target == 1


# --- a runaway producer over many passes ----------------------------------------------------


def _simulate(
    start: datetime, passes: int, month_to_date: float, config: Config, ready: int = 1000
) -> list[tuple[datetime, Plan, tuple[Instance, ...], float]]:
    """Run decide() every 30 s as the reconcile pass would: creates become pending, then
    running after 4 minutes; nothing is ever finished (the producer outruns the fleet)."""
    now = start
    instances: list[Instance] = []
    last_up: datetime | None = None
    seen: list[tuple[datetime, Plan, tuple[Instance, ...], float]] = []
    n = 0
    for _ in range(passes):
        if budget.month_bounds(now) != budget.month_bounds(start):
            month_to_date = 0.0  # a new month: the ledger's total starts again
        instances = [
            replace(i, state=S.RUNNING)
            if i.state is S.PENDING and i.created_at and now - i.created_at >= timedelta(minutes=4)
            else i
            for i in instances
        ]
        o = Observation(
            instances=tuple(instances),
            signals=Signals(ready=ready, in_flight=4 * len(instances)),
            price=PRICE,
            month_to_date_usd=month_to_date,
            last_scale_up=last_up,
        )
        plan = decide(o, config, now)
        seen.append((now, plan, o.instances, month_to_date))
        for _ in range(plan.creates):
            n += 1
            instances.append(Instance(f"w{n}", S.PENDING, id=f"i{n}", created_at=now))
        if plan.creates:
            last_up = now
        now += timedelta(seconds=30)
    return seen


@pytest.mark.parametrize(
    ("start", "spent", "limit"),
    [
        pytest.param(t(2026, 11, 1), 0.0, 5, id="fresh-month-rule-a-holds-5"),
        # 11 days left: one instance adds 264 h x 10/672 = $3.93; $10 of room fits two.
        pytest.param(t(2026, 11, 20), 40.0, 2, id="40-spent-rule-b-holds-2"),
        pytest.param(t(2026, 11, 30, 23), 49.0, 5, id="month-end-rule-a-holds-5"),
    ],
)
def test_runaway_producer_never_passes_the_budget_rule(
    start: datetime, spent: float, limit: int
) -> None:
    config = cfg(ceiling=50.0, max_instances=20, jobs=4)
    history = _simulate(start, passes=240, month_to_date=spent, config=config)
    peak = 0
    for now, plan, before, mtd in history:
        after = sum(1 for i in before if i.state in CAPACITY_STATES) + plan.creates
        peak = max(peak, after)
        assert after * PRICE.monthly <= 50.0  # rule (a), pending included
        o = Observation(instances=before, signals=None, price=PRICE, month_to_date_usd=mtd)
        assert _oracle_rule_b(o, now, 50.0, plan.creates)
    assert peak == limit


def _oracle_rule_b(
    o: Observation, now: datetime, ceiling: float, new: int, price: PlanPrice = PRICE
) -> bool:
    """Rule (b) from its definition, computed apart from vultrscale.rules.budget."""
    ms = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    me = (ms + timedelta(days=32)).replace(day=1)

    def cost(since: datetime, until: datetime, hourly: float, monthly: float) -> float:
        secs = (min(until, me) - max(since, ms)).total_seconds()
        return min(math.ceil(max(secs, 0) / 3600) * hourly, monthly)

    so_far = 0.0
    ahead = 0.0
    listed = 0.0
    gone_listed = 0.0
    for i in o.instances:
        if i.state is S.GONE:
            gone_listed += i.billed_usd
            continue
        hourly = i.hourly_rate or price.hourly
        monthly = i.monthly_cost or price.monthly
        created = i.created_at or ms
        now_cost = max(cost(created, now, hourly, monthly), i.billed_usd)
        so_far += now_cost
        listed += i.billed_usd
        if i.state in CAPACITY_STATES:
            ahead += max(cost(created, me, hourly, monthly) - now_cost, 0.0)
    gone = max(o.month_to_date_usd - listed, gone_listed, 0.0)
    ahead += new * cost(now, me, price.hourly, price.monthly)
    return gone + so_far + ahead <= ceiling + 1e-6


# --- hypothesis invariants ------------------------------------------------------------------

BASE = t(2026, 1, 1)
moments = st.integers(min_value=0, max_value=365 * 24 * 60).map(
    lambda m: BASE + timedelta(minutes=m)
)
# Mostly within the cool-downs and idle windows, sometimes hours back.
offsets = st.one_of(
    st.integers(min_value=0, max_value=900), st.integers(min_value=0, max_value=4 * 3600)
).map(lambda s: timedelta(seconds=s))


prices = st.builds(
    PlanPrice,
    st.just("vc2"),
    st.sampled_from([2.5, 5.0, 10.0, 20.0]),
    st.sampled_from([None, None, 0.01]),
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Observation, Config, datetime]:
    now = draw(
        st.one_of(
            moments,
            # month ends and starts, where the budget's arithmetic changes
            st.sampled_from([t(2026, 1, 31, 23, 30), t(2026, 2, 1, 0, 10), t(2026, 12, 31, 23)]),
        )
    )
    error = draw(st.sampled_from(["none", "none", "none", "signals-none", "signal-error", "api"]))
    ready = draw(st.sampled_from([0, 0, 0, 1, 5, 20, 60]))
    in_flight = draw(st.sampled_from([0, 0, 0, 2, 8, 30]))
    # Usually the ledger agrees with the signals (no lease when none is in flight); not always.
    consistent = in_flight == 0 and draw(st.integers(min_value=0, max_value=3)) > 0
    leases = st.just(0) if consistent else st.sampled_from([0, 0, 1, 3])
    instances = []
    for n in range(draw(st.sampled_from([0, 0, 1, 2, 3, 5, 9]))):
        state = draw(st.sampled_from(list(InstanceState)))
        created = draw(st.one_of(st.none(), offsets.map(lambda d: now - d)))
        instances.append(
            Instance(
                label=f"w{n}",
                state=state,
                id=None if state is S.CREATING else f"i{n}",
                created_at=created,
                state_since=created,
                live_leases=draw(leases),
                billed_usd=draw(st.sampled_from([0.0, 0.0, 0.5, 4.0])),
                hourly_rate=draw(st.sampled_from([0.0, 0.0, 0.02])),
                monthly_cost=draw(st.sampled_from([0.0, 0.0, 12.0])),
            )
        )
    signals = None
    if error != "signals-none":
        signals = Signals(ready, in_flight, draw(st.sampled_from([0, 0, 0, 2])))
    maybe_ago = st.one_of(st.none(), offsets.map(lambda d: now - d))
    observation = Observation(
        instances=tuple(instances),
        signals=signals,
        price=None if draw(st.integers(min_value=0, max_value=7)) == 0 else draw(prices),
        signal_error="timeout" if error == "signal-error" else None,
        api_error="HTTP 500" if error == "api" else None,
        month_to_date_usd=draw(st.sampled_from([0.0, 0.0, 10.0, 35.0, 49.0, 80.0])),
        last_scale_up=draw(maybe_ago),
        last_scale_down=draw(maybe_ago),
        idle_since=draw(maybe_ago),
    )
    max_i = draw(st.sampled_from([0, 1, 3, 5, 8, 12]))
    floors = draw(
        st.lists(
            st.builds(
                FloorConfig,
                st.sampled_from(["* 8-18 * * mon-fri", "* * * * *", "0-29 * * * *", "* 2 * * *"]),
                st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
                st.integers(min_value=0, max_value=max_i),
            ),
            max_size=2,
        )
    )
    config = cfg(
        ceiling=draw(st.sampled_from([5.0, 20.0, 50.0, 200.0, 1000.0])),
        jobs=draw(st.integers(min_value=1, max_value=8)),
        floors=tuple(floors),
        min_instances=draw(st.integers(min_value=0, max_value=max_i)),
        max_instances=max_i,
        max_step_up=draw(st.integers(min_value=0, max_value=3)),
        billing_hour_aware=draw(st.booleans()),
        on_signal_error=draw(st.sampled_from(["hold", "floor"])),
        scale_up_cooldown=timedelta(seconds=draw(st.sampled_from([0, 60, 600]))),
        scale_down_cooldown=timedelta(seconds=draw(st.sampled_from([0, 300, 1800]))),
        idle_before_scale_down=timedelta(seconds=draw(st.sampled_from([0, 90, 900]))),
    )
    return observation, config, now


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants(scenario: tuple[Observation, Config, datetime]) -> None:
    o, c, now = scenario
    pol = c.policy
    plan = decide(o, c, now)
    replaced = set(labels(plan, ActionKind.REPLACE))
    drained = set(labels(plan, ActionKind.DRAIN))
    capacity = [i for i in o.instances if i.state in CAPACITY_STATES]
    staying = [i for i in capacity if i.label not in replaced]
    after = len(staying) + plan.creates - len(drained)
    holding = o.signals is None or o.signal_error is not None or o.api_error is not None

    for kind in ActionKind:
        if any(a.kind is kind for a in plan.actions):
            event(f"{kind.value}{' while holding' if holding else ''}")
    for clamp in plan.clamps:
        event(f"clamp {clamp.kind.value}")

    assert plan.target == after
    assert plan.capacity == len(capacity)
    assert all(a.reason.strip() for a in plan.actions)
    assert drained <= {i.label for i in staying}
    assert not (plan.creates and drained), "never grow and shrink in one pass"

    # Never above the cap or past the budget rule, pending instances counted, and instances
    # still on their way out (draining, deleting, replaced) counted against the cap too.
    n_leaving = len(replaced) + sum(1 for i in o.instances if i.state in (S.DRAINING, S.DELETING))
    if plan.creates:
        assert o.price is not None
        assert after + n_leaving <= pol.max_instances
        assert budget.check(o, o.price, c.budget.monthly_ceiling_usd, now, leaving=replaced).allows(
            after + n_leaving
        )
        ceiling = c.budget.monthly_ceiling_usd
        assert budget.check(o, o.price, ceiling, now, leaving=replaced).allows(after)
        assert _oracle_rule_a(staying, o.price, plan.creates, ceiling)
        # A replaced instance keeps its cost so far but is not run on to the month's end.
        leaving = tuple(
            replace(i, state=S.DELETING) if i.label in replaced else i for i in o.instances
        )
        assert _oracle_rule_b(replace(o, instances=leaving), now, ceiling, plan.creates, o.price)
        # Cool-down honoured.
        if o.last_scale_up is not None:
            assert now >= o.last_scale_up + pol.scale_up_cooldown
        if pol.max_step_up:
            assert plan.creates <= pol.max_step_up

    # Never a scale-in (or a replacement) on a signal or API error; at most up to the floor.
    if holding:
        assert not drained and not replaced
        if plan.creates:
            assert pol.on_signal_error == "floor"
            assert after <= plan.floor

    # Never below a reachable floor; a floor is reachable when nothing else holds it back.
    if drained:
        assert after >= min(plan.floor, pol.max_instances)
    reachable = (
        not holding
        and o.price is not None
        and plan.floor + n_leaving <= pol.max_instances
        and pol.max_step_up == 0
        and (o.last_scale_up is None or now >= o.last_scale_up + pol.scale_up_cooldown)
        and budget.check(o, o.price, c.budget.monthly_ceiling_usd, now, leaving=replaced).allows(
            plan.floor + n_leaving
        )
    )
    if reachable:
        assert after >= plan.floor

    # Never a busy instance while an idle one is left.
    busy_chosen = [i for i in staying if i.label in drained and i.live_leases]
    if busy_chosen:
        idle_left = [
            i
            for i in staying
            if i.label not in drained and not i.live_leases and i.state is not S.CREATING
        ]
        assert not idle_left

    # Scale-in below the cap only when idle long enough and past the down cool-down.
    if drained and len(staying) <= pol.max_instances:
        assert plan.idle_since is not None
        assert now >= plan.idle_since + pol.idle_before_scale_down
        if o.last_scale_up is not None:
            assert now >= o.last_scale_up + pol.scale_down_cooldown
        if o.last_scale_down is not None and o.last_scale_down < plan.idle_since:
            assert now >= o.last_scale_down + pol.scale_down_cooldown
        assert all(i.live_leases == 0 for i in staying if i.label in drained)
        if pol.billing_hour_aware:
            for i in staying:
                if i.label in drained:
                    assert policy.drain_window_opens(i, now) == now

    # "No data" is never read as zero.
    if o.signals is None or o.signal_error:
        assert plan.idle_since is None and plan.demand is None


def _oracle_rule_a(staying: list[Instance], price: PlanPrice, new: int, ceiling: float) -> bool:
    monthly = sum(i.monthly_cost or price.monthly for i in staying) + new * price.monthly
    return monthly <= ceiling + 1e-6


@pytest.mark.parametrize(
    ("minutes_ago", "drained"),
    [
        pytest.param(54 + 59 / 60, False, id="54m59s-into-the-hour-kept"),
        pytest.param(55, True, id="55m-into-the-hour-drained"),
        pytest.param(59.99, True, id="last-second-of-the-hour-drained"),
        pytest.param(60, False, id="a-new-hour-just-paid-kept"),
        pytest.param(60 * 5 + 57, True, id="fifth-hour-57m-drained"),
    ],
)
def test_billing_hour_margin_edges(minutes_ago: float, drained: bool) -> None:
    o = observe(vm("r1", minutes_ago), ago=IDLE_LONG)
    plan = decide(o, cfg(), NOW)
    assert bool(plan.drains) is drained
    if drained:
        assert "its paid hour ends at" in plan.drains[0].reason
    else:
        assert plan.next_scale_in_at == policy.drain_window_opens(o.instances[0], NOW)
        assert plan.next_scale_in_at is not None and plan.next_scale_in_at > NOW


def test_burst_scales_up_once_holds_while_booting_and_drains_each_before_its_hour_ends() -> None:
    """12 jobs from zero, passes every 30 s: three creates in the first pass and none while
    they boot; the jobs run for 20 minutes; then every instance is drained inside the last
    five minutes of its first paid hour, never while it holds a lease."""
    config = cfg(jobs=4, billing_hour_aware=True)
    now = t(2026, 11, 10, 9, 0)
    instances: dict[str, Instance] = {}
    last_up: datetime | None = None
    last_down: datetime | None = None
    idle_since: datetime | None = None
    creates = 0
    drained_at: dict[str, datetime] = {}
    jobs_done_at = now + timedelta(minutes=25)
    for _ in range(160):  # 80 minutes
        for label, i in list(instances.items()):
            if i.state is S.PENDING and now - (i.created_at or now) >= timedelta(minutes=4):
                instances[label] = replace(i, state=S.RUNNING)
        running = [i for i in instances.values() if i.state is S.RUNNING]
        busy = now < jobs_done_at
        # The 12 jobs wait until workers are up, then hold 4 leases per running instance.
        in_flight = min(12, 4 * len(running)) if busy else 0
        ready = 12 - in_flight if busy else 0
        per = iter([4] * (in_flight // 4))
        view = tuple(
            replace(i, live_leases=next(per, 0)) if i.state is S.RUNNING else i
            for i in instances.values()
        )
        o = Observation(
            instances=view,
            signals=Signals(ready, in_flight),
            price=PRICE,
            last_scale_up=last_up,
            last_scale_down=last_down,
            idle_since=idle_since,
        )
        plan = decide(o, config, now)
        idle_since = plan.idle_since
        for _ in range(plan.creates):
            creates += 1
            label = f"w{creates}"
            instances[label] = Instance(label, S.PENDING, id=label, created_at=now)
        if plan.creates:
            last_up = now
        for action in plan.drains:
            assert action.label is not None
            victim = next(i for i in view if i.label == action.label)
            assert victim.live_leases == 0
            drained_at[action.label] = now
            instances[action.label] = replace(instances[action.label], state=S.DRAINING)
            last_down = now
        now += timedelta(seconds=30)
    assert creates == 3
    assert sorted(drained_at) == ["w1", "w2", "w3"]
    for when in drained_at.values():
        into = when - t(2026, 11, 10, 9, 0)
        assert timedelta(minutes=55) <= into < timedelta(minutes=60)


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[arg-type,misc]


@pytest.mark.parametrize(
    ("cron", "zone", "now", "flip"),
    [
        pytest.param(
            "30 2 * * *",
            "Europe/Berlin",
            _utc(2026, 10, 25, 0, 45),
            _utc(2026, 10, 25, 1, 30),
            id="clocks-back-the-repeated-02:30-comes-again",
        ),
        pytest.param(
            "30 2 * * *",
            "Europe/Berlin",
            _utc(2026, 10, 25, 1, 30, 20),
            _utc(2026, 10, 25, 1, 31),
            id="clocks-back-the-repeated-minute-ends",
        ),
        pytest.param(
            "* 2 * * *",
            "Europe/Berlin",
            _utc(2026, 10, 25, 0, 30),
            _utc(2026, 10, 25, 2, 0),
            id="clocks-back-a-run-lasts-both-02-hours",
        ),
        pytest.param(
            "30 2 * * *",
            "Europe/Berlin",
            _utc(2026, 3, 29, 0, 45),
            _utc(2026, 3, 30, 0, 30),
            id="clocks-forward-a-skipped-02:30-never-matches",
        ),
        pytest.param(
            "*/20 1 * * *",
            "America/New_York",
            _utc(2026, 11, 1, 5, 45),
            _utc(2026, 11, 1, 6, 0),
            id="new-york-clocks-back-01:00-again",
        ),
        pytest.param(
            "* 8-18 * * mon-fri",
            "Europe/Berlin",
            _utc(2026, 10, 23, 15, 59),
            _utc(2026, 10, 23, 17, 0),
            id="business-hours-end-on-the-wall-clock",
        ),
    ],
)
def test_next_floor_change_is_the_first_minute_the_floor_flips(
    cron: str, zone: str, now: datetime, flip: datetime
) -> None:
    floor = FloorConfig(cron=cron, timezone=zone, min_instances=1)
    pol = replace(Config().policy, floor=(floor,))
    assert policy.next_floor_change(pol, now) == flip
    # ... which is what matching minute by minute finds: nothing flips before it.
    assert policy.floor_matches(floor, flip) != policy.floor_matches(floor, now)
    assert policy.floor_matches(floor, flip - timedelta(minutes=1)) == policy.floor_matches(
        floor, now
    )


def test_the_budget_is_named_only_where_it_lowered_the_scale_up() -> None:
    """Five running and one draining under a cap of 5 and a $50 ceiling (five $10 instances):
    the cap holds the fleet at 5 and the budget lowers nothing (5 -> 5). A clamp "budget ...
    limits 5 -> 5" made simulate's frontier report name the budget among the limits that bound
    the row, although a larger ceiling changes nothing while the cap stays."""
    running = [vm(f"r{i}", 30) for i in range(5)]
    o = observe(*running, vm("d1", 50, state=S.DRAINING), ready=40)
    plan = decide(o, cfg(ceiling=50.0), NOW)
    assert plan.creates == 0
    assert any(c.kind.rule == "cap" for c in plan.clamps)
    assert not any(c.kind.rule == "budget" for c in plan.clamps), plan.clamps
