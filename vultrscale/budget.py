"""The monthly budget: what the fleet has cost this month and what a scale-up may add. Pure.

Billing model (Vultr's): every started hour is billed at the plan's hourly rate, and one
instance never costs more than its monthly price in one calendar month (UTC). An instance that
spans two months is billed in each separately, its hours counted from the later of its creation
and the month's start.

The rule of DESIGN §6, checked before every create with pending instances counted. A fleet of
N instances is allowed only if both hold:

(a) N x monthly cost <= ceiling: a fleet stuck at N all month stays within the ceiling;
(b) month-to-date cost + for each instance that keeps running and each new one
    min(hourly x its hours left in the month, monthly - its cost so far this month) <= ceiling:
    this month's bill stays within the ceiling even if the fleet never scales down again.

Draining and deleting instances count with their cost so far (the current started hour
included) but are not projected to the month's end: they are on their way out.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from vultrscale.model import Instance, InstanceState, LedgerRow, Observation, PlanPrice

HOUR = timedelta(hours=1)
# Float sums of cents: 5 x 10.0 must compare equal to 50.0 without a rounding surprise.
_EPS = 1e-9


def utc(dt: datetime) -> datetime:
    """``dt`` in UTC; a naive datetime is taken to be UTC already."""
    if dt.tzinfo is UTC:
        return dt  # the common case, kept cheap: a pass calls this per instance many times
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


@functools.lru_cache(maxsize=64)  # a pass asks for the same month many times
def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    """Start of the UTC calendar month holding ``now``, and start of the next one."""
    now = utc(now)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return start, end


def started_hours(start: datetime, end: datetime) -> int:
    """Hours begun between ``start`` and ``end`` (a second into an hour bills the hour)."""
    if end <= start:
        return 0
    whole, rest = divmod(end - start, HOUR)
    return whole + (1 if rest else 0)


def billed(
    created_at: datetime,
    gone_at_or_now: datetime,
    price: PlanPrice,
    month_start: datetime,
    month_end: datetime,
) -> float:
    """Cost of one instance within one calendar month: per started hour, capped at monthly."""
    start = max(utc(created_at), utc(month_start))
    stop = min(utc(gone_at_or_now), utc(month_end))
    return min(started_hours(start, stop) * price.hourly, price.monthly)


def ledger_bills(
    rows: Iterable[LedgerRow], price: PlanPrice | None, now: datetime
) -> dict[str, float]:
    """This UTC month's bill of each ledger row at ``now`` (gone rows too), by label, in one
    sweep. A row is billed at the price it was created at, else the plan's current price (0
    when unknown); a live row up to ``now``, a gone one up to when it went. The sum of the
    values is ``Observation.month_to_date_usd``; each value is that instance's ``billed_usd``."""
    start, end = month_bounds(now)
    current = price.monthly if price else 0.0
    bills: dict[str, float] = {}
    for row in rows:
        monthly = row.monthly_cost if row.monthly_cost is not None else current
        p = PlanPrice(row.plan or "", monthly, row.hourly_rate or None)
        bills[row.label] = billed(row.created_at, row.gone_at or now, p, start, end)
    return bills


def instance_price(instance: Instance, price: PlanPrice) -> PlanPrice:
    """The price an instance was created at (ledger), else the plan's current price."""
    return PlanPrice(
        plan=price.plan,
        monthly=instance.monthly_cost or price.monthly,
        hourly_cost=instance.hourly_rate or price.hourly,
    )


def _live(instance: Instance) -> bool:
    return instance.state is not InstanceState.GONE


def cost_so_far(instance: Instance, price: PlanPrice, now: datetime) -> float:
    """This month's cost of a live instance at ``now``; never below what the ledger says.

    An instance without a creation time is taken to have run since the month began (the
    most it can have cost).
    """
    start, end = month_bounds(now)
    p = instance_price(instance, price)
    computed = billed(instance.created_at or start, now, p, start, end)
    return max(computed, instance.billed_usd)


def month_to_date(
    instances: Iterable[Instance], now: datetime, price: PlanPrice, ledger_total: float = 0.0
) -> float:
    """This UTC month's bill so far for the fleet, gone instances included.

    ``ledger_total`` is ``Observation.month_to_date_usd``: the whole fleet's bill as the ledger
    knows it, live and gone instances alike, where each live one's share is its ``billed_usd``.
    The live shares are recomputed at ``now`` (the ledger may be a pass behind); the rest of the
    ledger total is what gone instances cost. Gone instances listed with their ``billed_usd``
    count too, should the ledger total leave them out.
    """
    items = list(instances)
    live = [i for i in items if _live(i)]
    gone_listed = sum(i.billed_usd for i in items if not _live(i))
    gone = max(ledger_total - sum(i.billed_usd for i in live), gone_listed, 0.0)
    return gone + sum(cost_so_far(i, price, now) for i in live)


def to_month_end(instance: Instance, price: PlanPrice, now: datetime) -> float:
    """What a live instance adds to this month's bill if it runs until the month ends."""
    start, end = month_bounds(now)
    p = instance_price(instance, price)
    total = billed(instance.created_at or start, end, p, start, end)
    return max(0.0, total - cost_so_far(instance, price, now))


def new_instance_to_month_end(price: PlanPrice, now: datetime) -> float:
    """What one instance created at ``now`` costs this month if it runs until the month ends."""
    start, end = month_bounds(now)
    return billed(now, end, price, start, end)


@dataclass(frozen=True)
class BudgetCheck:
    """The budget rule applied to one observation: how large the fleet may grow, and why."""

    ceiling: float
    current: int  # instances that keep running (counted as capacity)
    max_total: int  # largest fleet both rules allow; < current means over budget
    by_monthly: int  # the largest fleet rule (a) allows
    by_month_end: int  # the largest fleet rule (b) allows
    month_to_date_usd: float
    committed_usd: float  # month to date + the current fleet run to the month's end
    new_instance_usd: float  # one new instance run to the month's end
    reasons: tuple[str, ...]

    @property
    def over_budget(self) -> bool:
        return self.max_total < self.current

    @property
    def headroom_usd(self) -> float:
        return self.ceiling - self.committed_usd

    def allows(self, n_total_after: int) -> bool:
        """True if a fleet of ``n_total_after`` instances keeps both parts of the rule."""
        return n_total_after <= max(self.max_total, 0)


def check(
    observation: Observation,
    price: PlanPrice,
    ceiling: float,
    now: datetime,
    *,
    leaving: Iterable[str] = (),
) -> BudgetCheck:
    """Apply the budget rule to the fleet as observed.

    ``leaving`` names instances about to be deleted (replaced): their cost so far stays in the
    month's bill but they are neither counted nor projected to the month's end.
    """
    out = set(leaving)
    start, end = month_bounds(now)
    # One sweep over the fleet: each live instance's price and cost so far are computed once
    # and serve month-to-date, the projection to the month's end and rule (a) alike (the same
    # sums as month_to_date, to_month_end and instance_price, without recomputing them).
    n = 0
    live_so_far = live_listed = gone_listed = 0.0
    to_end = monthly_kept = 0.0
    for i in observation.instances:
        if not _live(i):
            gone_listed += i.billed_usd
            continue
        p = instance_price(i, price)
        created = i.created_at or start
        so_far = max(billed(created, now, p, start, end), i.billed_usd)
        live_so_far += so_far
        live_listed += i.billed_usd
        if i.state.counts_as_capacity and i.label not in out:
            n += 1
            monthly_kept += p.monthly
            to_end += max(0.0, billed(created, end, p, start, end) - so_far)
    gone = max(observation.month_to_date_usd - live_listed, gone_listed, 0.0)
    mtd = gone + live_so_far
    committed = mtd + to_end
    per_new = new_instance_to_month_end(price, now)

    room_a = ceiling - monthly_kept
    by_a = n + _whole(room_a, price.monthly)
    room_b = ceiling - committed
    by_b = n + _whole(room_b, per_new)
    reasons = (
        f"(a) {n} instance(s) at ${monthly_kept:.2f}/month; room for "
        f"{max(by_a - n, 0)} more at ${price.monthly:.2f} within ${ceiling:.2f}",
        f"(b) ${mtd:.2f} billed this month, ${committed:.2f} if the fleet runs to the month's "
        f"end; one more instance adds ${per_new:.2f}: room for {max(by_b - n, 0)} more",
    )
    return BudgetCheck(
        ceiling=ceiling,
        current=n,
        max_total=min(by_a, by_b),
        by_monthly=by_a,
        by_month_end=by_b,
        month_to_date_usd=mtd,
        committed_usd=committed,
        new_instance_usd=per_new,
        reasons=reasons,
    )


def _whole(room: float, each: float) -> int:
    """How many items of cost ``each`` fit in ``room`` (negative when already over)."""
    if each <= 0:
        # A free plan (only in tests or a misconfigured simulator) never limits the count.
        return 1_000_000 if room >= -_EPS else -1
    if room < -_EPS:
        return -1  # already over: even the current fleet does not fit
    return int((room + _EPS) // each)
