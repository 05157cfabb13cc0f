"""The budget: per-started-hour billing capped monthly per UTC month, and both parts of the rule."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from vultrscale.core.model import Instance, InstanceState, Observation, PlanPrice, Signals
from vultrscale.rules import budget

PLAN10 = PlanPrice("vc2-1c-2gb", monthly=10.0)  # no hourly_cost: 10 / 672 per hour
H10 = 10.0 / 672


def t(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC)


def inst(label: str, state: InstanceState, created_at: datetime | None, **kw: Any) -> Instance:
    return Instance(label=label, state=state, id=f"id-{label}", created_at=created_at, **kw)


def obs(*instances: Instance, mtd: float = 0.0) -> Observation:
    return Observation(
        instances=tuple(instances),
        signals=Signals(ready=0, in_flight=0),
        price=PLAN10,
        month_to_date_usd=mtd,
    )


@pytest.mark.parametrize(
    ("price", "hourly"),
    [
        pytest.param(PlanPrice("p", 10.0, hourly_cost=0.015), 0.015, id="api-hourly-cost"),
        pytest.param(PlanPrice("p", 10.0), 10.0 / 672, id="monthly-over-672"),
        pytest.param(PlanPrice("p", 6.72, hourly_cost=None), 0.01, id="monthly-6.72"),
    ],
)
def test_hourly_rate(price: PlanPrice, hourly: float) -> None:
    assert price.hourly == pytest.approx(hourly)


@pytest.mark.parametrize(
    ("start", "end", "hours"),
    [
        pytest.param(t(2026, 5, 1), t(2026, 5, 1), 0, id="no-time-no-hour"),
        pytest.param(t(2026, 5, 1), t(2026, 5, 1, 0, 0, 1), 1, id="one-second-bills-an-hour"),
        pytest.param(t(2026, 5, 1), t(2026, 5, 1, 1), 1, id="exactly-one-hour"),
        pytest.param(t(2026, 5, 1), t(2026, 5, 1, 1, 0, 1), 2, id="a-second-into-hour-two"),
        pytest.param(t(2026, 5, 1, 1), t(2026, 5, 1), 0, id="end-before-start"),
    ],
)
def test_started_hours(start: datetime, end: datetime, hours: int) -> None:
    assert budget.started_hours(start, end) == hours


@pytest.mark.parametrize(
    ("now", "start", "end"),
    [
        pytest.param(t(2026, 5, 17, 9, 30), t(2026, 5, 1), t(2026, 6, 1), id="mid-may"),
        pytest.param(t(2026, 12, 31, 23, 59), t(2026, 12, 1), t(2027, 1, 1), id="december"),
        pytest.param(
            t(2026, 3, 1, 0, 30).astimezone(ZoneInfo("America/New_York")),
            t(2026, 3, 1),
            t(2026, 4, 1),
            id="local-time-is-converted-to-utc",
        ),
    ],
)
def test_month_bounds(now: datetime, start: datetime, end: datetime) -> None:
    assert budget.month_bounds(now) == (start, end)


MAY = (t(2026, 5, 1), t(2026, 6, 1))


@pytest.mark.parametrize(
    ("created", "until", "month", "cost"),
    [
        pytest.param(
            t(2026, 5, 3, 10), t(2026, 5, 3, 12, 30), MAY, 3 * H10, id="three-started-hours"
        ),
        pytest.param(t(2026, 5, 3, 10), t(2026, 5, 31, 23), MAY, 10.0, id="capped-at-monthly"),
        pytest.param(
            t(2026, 4, 30, 23, 30), t(2026, 5, 1, 0, 10), MAY, H10, id="hours-from-month-start"
        ),
        pytest.param(
            t(2026, 4, 30, 23, 30),
            t(2026, 5, 1, 0, 10),
            (t(2026, 4, 1), t(2026, 5, 1)),
            H10,
            id="april-part-of-a-span",
        ),
        pytest.param(
            t(2026, 4, 2), t(2026, 5, 31), (t(2026, 4, 1), t(2026, 5, 1)), 10.0, id="april-capped"
        ),
        pytest.param(t(2026, 6, 2), t(2026, 6, 3), MAY, 0.0, id="not-in-this-month"),
    ],
)
def test_billed(
    created: datetime, until: datetime, month: tuple[datetime, datetime], cost: float
) -> None:
    assert budget.billed(created, until, PLAN10, *month) == pytest.approx(cost)


def test_an_instance_spanning_two_months_is_billed_in_each_month_separately() -> None:
    created, gone = t(2026, 3, 10), t(2026, 5, 20)
    march = budget.billed(created, gone, PLAN10, t(2026, 3, 1), t(2026, 4, 1))
    april = budget.billed(created, gone, PLAN10, t(2026, 4, 1), t(2026, 5, 1))
    may = budget.billed(created, gone, PLAN10, t(2026, 5, 1), t(2026, 6, 1))
    assert march == pytest.approx(22 * 24 * H10)  # March 10 to April 1: 528 h = $7.86
    assert april == pytest.approx(10.0)  # 720 h: capped at the monthly price
    assert may == pytest.approx(19 * 24 * H10)  # May 1 to May 20: 456 h = $6.79


def test_month_to_date_replaces_stale_ledger_shares_and_keeps_gone_cost() -> None:
    now = t(2026, 5, 10, 12, 30)
    live = inst("a", InstanceState.RUNNING, t(2026, 5, 10, 9, 0), billed_usd=2 * H10)  # stale
    # Ledger total: $7 from gone instances plus the stale share of the live one.
    total = budget.check(obs(live, mtd=7.0 + 2 * H10), PLAN10, 1000.0, now).month_to_date_usd
    assert total == pytest.approx(7.0 + 4 * H10)  # 09:00-12:30 is 4 started hours


def test_month_to_date_counts_listed_gone_instances_when_the_ledger_total_is_absent() -> None:
    now = t(2026, 5, 10, 12, 30)
    gone = inst("g", InstanceState.GONE, t(2026, 5, 2), billed_usd=3.0)
    assert budget.check(obs(gone), PLAN10, 1000.0, now).month_to_date_usd == pytest.approx(3.0)


def test_instance_without_creation_time_is_assumed_to_run_since_month_start() -> None:
    now = t(2026, 5, 2, 0, 30)
    i = inst("a", InstanceState.RUNNING, None)
    assert budget.check(obs(i), PLAN10, 1000.0, now).month_to_date_usd == pytest.approx(25 * H10)


def test_instance_price_from_the_ledger_beats_the_current_plan_price() -> None:
    now = t(2026, 5, 2, 0, 30)
    i = inst("a", InstanceState.RUNNING, t(2026, 5, 2), hourly_rate=0.5, monthly_cost=100.0)
    c = budget.check(obs(i), PLAN10, 1000.0, now)
    assert c.month_to_date_usd == pytest.approx(0.5)  # its own hourly rate, not the plan's
    assert c.committed_usd - c.month_to_date_usd == pytest.approx(100.0 - 0.5)  # its monthly cap


# --- the rule -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("observation", "now", "ceiling", "by_a", "by_b"),
    [
        pytest.param(obs(), t(2026, 5, 1), 50.0, 5, 5, id="empty-fleet-month-start"),
        pytest.param(obs(), t(2026, 5, 1), 49.99, 4, 4, id="a-cent-short"),
        # Mid-month a new instance costs only the hours left: (b) lets more in than (a).
        pytest.param(obs(), t(2026, 5, 16, 12), 50.0, 5, 9, id="mid-month-a-binds"),
        # $45 already spent, 15.5 days left: one more instance adds 372 h x 10/672 = $5.54.
        pytest.param(obs(mtd=45.0), t(2026, 5, 16, 12), 50.0, 5, 0, id="mtd-45-b-binds"),
        pytest.param(obs(mtd=40.0), t(2026, 5, 16, 12), 50.0, 5, 1, id="mtd-40-room-for-one"),
        pytest.param(
            obs(
                inst("a", InstanceState.RUNNING, t(2026, 5, 1)),
                inst("b", InstanceState.PENDING, t(2026, 5, 16, 11, 50)),
                mtd=0.0,
            ),
            t(2026, 5, 16, 12),
            50.0,
            5,
            # a: $10 capped for the month; b: 373 started hours; one more: 372 h = $5.54 each.
            2 + int((50 - 10.0 - 373 * H10) // (372 * H10)),
            id="pending-instance-counts",
        ),
        pytest.param(
            obs(inst("d", InstanceState.DRAINING, t(2026, 5, 1)), mtd=0.0),
            t(2026, 5, 16, 12),
            50.0,
            5,
            # Draining: its cost so far (372 started hours -> $5.54) stays; no projection.
            int((50 - 372 * H10) // (372 * H10)),
            id="draining-cost-so-far-only",
        ),
        # Last hours of May: (b) is almost free, (a) still caps a fleet stuck at N all June.
        pytest.param(obs(mtd=48.0), t(2026, 5, 31, 23, 30), 50.0, 5, 134, id="month-end-a-binds"),
    ],
)
def test_rule_a_and_b(
    observation: Observation, now: datetime, ceiling: float, by_a: int, by_b: int
) -> None:
    c = budget.check(observation, PLAN10, ceiling, now)
    assert (c.by_monthly, c.by_month_end) == (by_a, by_b)
    assert c.max_total == min(by_a, by_b)
    assert c.allows(min(by_a, by_b))
    assert not c.allows(min(by_a, by_b) + 1)


def test_rule_b_across_the_month_boundary() -> None:
    """Four instances started on May 31 23:10: in May they cost one hour each; on June 1 their
    hours count afresh from midnight and May's spend no longer weighs on June's bill."""
    started = t(2026, 5, 31, 23, 10)
    fleet = [inst(f"w{i}", InstanceState.RUNNING, started) for i in range(4)]
    before = budget.check(obs(*fleet, mtd=46.0), PLAN10, 50.0, t(2026, 5, 31, 23, 40))
    # May: $46 from earlier + 4 x 1 hour; the fleet adds nothing more before midnight.
    assert before.month_to_date_usd == pytest.approx(46.0 + 4 * H10, rel=1e-6)
    assert before.committed_usd == pytest.approx(46.0 + 4 * H10, rel=1e-6)
    assert before.by_monthly == 5  # (a) is what holds the fleet at 5
    after = budget.check(obs(*fleet, mtd=0.0), PLAN10, 50.0, t(2026, 6, 1, 0, 20))
    assert after.month_to_date_usd == pytest.approx(4 * H10)  # hour one of June, each
    # June run to its end: 720 h x 10/672 > $10, so each instance is capped at $10.
    assert after.committed_usd == pytest.approx(40.0)
    assert (after.by_monthly, after.by_month_end, after.max_total) == (5, 5, 5)


def test_most_of_the_budget_spent_blocks_a_scale_up_but_removes_nothing() -> None:
    fleet = [inst(f"w{i}", InstanceState.RUNNING, t(2026, 5, 16)) for i in range(2)]
    c = budget.check(obs(*fleet, mtd=44.0), PLAN10, 50.0, t(2026, 5, 16, 12))
    # 44 + 2 x (372 h x 10/672 = 5.54) = 55.07 > 50: over budget with the fleet it has.
    assert c.committed_usd > 50.0
    assert c.over_budget
    assert not c.allows(3)
    assert c.headroom_usd < 0


def test_a_price_rise_puts_the_fleet_over_rule_a() -> None:
    old = [
        inst(f"w{i}", InstanceState.RUNNING, t(2026, 5, 16), monthly_cost=10.0) for i in range(5)
    ]
    dearer = PlanPrice("vc2-1c-2gb", monthly=12.0)
    c = budget.check(obs(*old), dearer, 50.0, t(2026, 5, 16, 1))
    assert c.by_monthly == 5  # the old instances keep their price: no room for a dearer one
    c2 = budget.check(obs(*old[:4]), dearer, 50.0, t(2026, 5, 16, 1))
    assert c2.by_monthly == 4  # $40 + $12 > $50
    assert not c2.allows(5)


# --- ledger_bills: every ledger row's bill this month, in one sweep ---------------------------


@dataclass(frozen=True)
class Row:
    label: str
    created_at: datetime
    gone_at: datetime | None = None
    hourly_rate: float | None = None
    monthly_cost: float | None = None


def test_ledger_bills_bills_each_row_at_its_own_price_from_the_month_start() -> None:
    now = t(2026, 3, 2, 12, 0, 30)  # 36 h and 30 s into March
    rows = [
        Row("fresh", t(2026, 3, 1, 10), hourly_rate=0.015, monthly_cost=10.0),  # 27 started h
        Row("gone", t(2026, 2, 27), gone_at=t(2026, 3, 1, 5, 10), monthly_cost=6.72),  # 6 h
        Row("current-price", t(2026, 2, 1)),  # 37 h at the plan's 13.44 / 672 = 0.02
        Row("capped", t(2026, 3, 1), hourly_rate=1.0, monthly_cost=5.0),  # 37 h > the cap
        Row("went-last-month", t(2026, 2, 1), gone_at=t(2026, 2, 28), monthly_cost=10.0),
    ]
    bills = budget.ledger_bills(rows, PlanPrice("p", 13.44), now)
    assert bills == pytest.approx(
        {"fresh": 0.405, "gone": 0.06, "current-price": 0.74, "capped": 5.0, "went-last-month": 0}
    )


def test_ledger_bills_without_any_price_bills_rows_without_one_nothing() -> None:
    rows = [Row("unpriced", t(2026, 3, 1)), Row("priced", t(2026, 3, 1), monthly_cost=6.72)]
    assert budget.ledger_bills(rows, None, t(2026, 3, 1, 1)) == pytest.approx(
        {"unpriced": 0.0, "priced": 0.01}
    )


def test_ledger_bills_agrees_with_billed_row_by_row_and_reads_naive_times_as_utc() -> None:
    now = t(2026, 3, 31, 23, 59)
    naive = Row("naive", datetime(2026, 3, 30, 1, 0), monthly_cost=10.0)
    aware = Row("aware", t(2026, 3, 30, 1, 0), monthly_cost=10.0)
    start, end = budget.month_bounds(now)
    expected = budget.billed(aware.created_at, now, PLAN10, start, end)
    assert budget.ledger_bills([naive, aware], PLAN10, now) == pytest.approx(
        {"naive": expected, "aware": expected}
    )
