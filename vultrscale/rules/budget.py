"""The monthly budget: what the fleet has cost this month and what a scale-up may add. Pure.

Billing model (Vultr's): every started hour is billed at the plan's hourly rate, and one
instance never costs more than its monthly price in one calendar month (UTC). An instance that
spans two months is billed in each separately, its hours counted from the later of its creation
and the month's start.

The rule of docs/policy.md ("The budget"), checked before every create with pending instances
counted. A fleet of N instances is allowed only if both hold:

(a) N x monthly cost <= ceiling: a fleet stuck at N all month stays within the ceiling;
(b) month-to-date cost + for each instance that keeps running and each new one
    min(hourly x its hours left in the month, monthly - its cost so far this month) <= ceiling:
    this month's bill stays within the ceiling even if the fleet never scales down again.

Draining and deleting instances count with their cost so far (the current started hour
included) but are not projected to the month's end: they are on their way out.

With ``account.monthly_ceiling_usd`` both rules hold for the account too: the fleet's figures
plus the other fleets' (``account_spend``, from their ledger rows, create intents counted as
instances) within the account's ceiling.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple, Protocol

from vultrscale.core.model import (
    CAPACITY_STATES,
    HOURS_PER_MONTH,
    AccountSpend,
    Instance,
    InstanceState,
    LedgerRow,
    Observation,
    PlanPrice,
)

HOUR = timedelta(hours=1)
# The first instant past a moment (datetime's resolution): where a rule that compares ``>``
# first answers otherwise (a deadline passed, a boot timed out).
PAST = timedelta(microseconds=1)
# Float sums of cents: 5 x 10.0 must compare equal to 50.0 without a rounding surprise.
_EPS = 1e-9


def next_hour(now: datetime) -> datetime:
    """The next UTC hour: bills, paid hours and the budget's hours left in the month move."""
    return utc(now).replace(minute=0, second=0, microsecond=0) + HOUR


def utc(dt: datetime) -> datetime:
    """``dt`` in UTC; a naive datetime is taken to be UTC already."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


@functools.lru_cache(maxsize=64)
def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    """Start of the UTC calendar month holding ``now``, and start of the next one.

    Cached: a pass asks it several times for its one ``now`` (observe, bills, the budget rule,
    the policy), and a simulated replay asks it for the same few instants over and over."""
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
    # Integer arithmetic on the difference's parts: a timedelta divmod costs several times
    # more, and this runs a few times per instance per pass.
    d = end - start
    seconds = d.days * 86400 + d.seconds
    return seconds // 3600 + (1 if seconds % 3600 or d.microseconds else 0)


def billed(
    created_at: datetime,
    gone_at_or_now: datetime,
    price: PlanPrice,
    month_start: datetime,
    month_end: datetime,
) -> float:
    """Cost of one instance within one calendar month: per started hour, capped at monthly."""
    return _billed(
        _utc(created_at), _utc(gone_at_or_now), price.hourly, price.monthly, month_start, month_end
    )


def _utc(dt: datetime) -> datetime:
    # Aware datetimes compare and subtract across zones: only a naive one needs converting.
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt


def _billed(
    created: datetime, stop: datetime, hourly: float, monthly: float, start: datetime, end: datetime
) -> float:
    """``billed`` for aware datetimes and plain numbers: the per-instance step of every sweep."""
    cost = started_hours(max(created, start), min(stop, end)) * hourly
    return cost if cost < monthly else monthly


class BillableRow(Protocol):
    """What a bill needs of a ledger row (``db.ledger.LedgerRow`` has it)."""

    @property
    def label(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def gone_at(self) -> datetime | None: ...
    @property
    def hourly_rate(self) -> float | None: ...
    @property
    def monthly_cost(self) -> float | None: ...


def ledger_bills(
    rows: Iterable[BillableRow], price: PlanPrice | None, now: datetime
) -> dict[str, float]:
    """This UTC month's bill of each ledger row at ``now``, by label, in one sweep.

    Each row is billed at the price it was created at (its ``monthly_cost``, else the plan's
    current ``price``, else 0; its ``hourly_rate``, else monthly / 672) from its creation until
    it went (``gone_at``) or ``now``. The sum of the values is the fleet's month to date
    (``Observation.month_to_date_usd``); each value is that instance's ``billed_usd``. Live
    rows come first: a later row with a label already billed (a gone row whose label was
    taken) is summed under a key of its own.
    """
    start, end = month_bounds(now)
    now = utc(now)
    current = price.monthly if price is not None else 0.0
    bills: dict[str, float] = {}
    for r in rows:
        monthly = r.monthly_cost if r.monthly_cost is not None else current
        hourly = r.hourly_rate or monthly / HOURS_PER_MONTH
        stop = _utc(r.gone_at) if r.gone_at is not None else now
        key = r.label
        if key in bills:  # a gone row whose label an instance adopted this pass took: both bill
            key = f"{key}@{len(bills)}"
        bills[key] = _billed(_utc(r.created_at), stop, hourly, monthly, start, end)
    return bills


def account_spend(rows: Iterable[LedgerRow], ceiling: float, now: datetime) -> AccountSpend:
    """The other fleets' spend this UTC month from their ledger rows (every row not gone, and
    those gone this month), each billed at the price it was created at: their bill so far,
    that bill with their capacity (create intents included: an intent is written before its
    POST, so a create another fleet is making counts) run to the month's end, and that
    capacity's monthly prices. A row without a price (adopted on a plan Vultr lists without
    one) counts as an instance at no cost."""
    start, end = month_bounds(now)
    now = utc(now)
    so_far = rest = monthly = 0.0
    count = 0
    fleets: set[str] = set()
    for r in rows:
        fleets.add(r.fleet)
        month = r.monthly_cost or 0.0
        hourly = r.hourly_rate or month / HOURS_PER_MONTH
        created = _utc(r.created_at)
        stop = _utc(r.gone_at) if r.gone_at is not None else now
        billed_now = _billed(created, stop, hourly, month, start, end)
        so_far += billed_now
        if r.state in CAPACITY_STATES:
            count += 1
            monthly += month
            rest += max(_billed(created, end, hourly, month, start, end) - billed_now, 0.0)
    return AccountSpend(
        ceiling=ceiling,
        month_to_date_usd=so_far,
        committed_usd=so_far + rest,
        monthly_usd=monthly,
        instances=count,
        fleets=tuple(sorted(fleets)),
    )


def _live(instance: Instance) -> bool:
    return instance.state is not InstanceState.GONE


def _so_far_and_to_end(
    instance: Instance, price: PlanPrice, now: datetime, start: datetime, end: datetime
) -> tuple[float, float]:
    """A live instance's cost this month at ``now`` (never below what the ledger says) and
    what it adds if it runs until the month ends. ``now`` is aware; bounds from month_bounds."""
    monthly = instance.monthly_cost or price.monthly
    hourly = instance.hourly_rate or price.hourly
    created = start if instance.created_at is None else max(_utc(instance.created_at), start)
    # _billed from ``created`` to now and to the month's end, unrolled: start <= now < end,
    # and this runs for every instance of the fleet on every pass.
    so_far = started_hours(created, now) * hourly
    if so_far > monthly:
        so_far = monthly
    if instance.billed_usd > so_far:
        so_far = instance.billed_usd
    whole_month = started_hours(created, end) * hourly
    if whole_month > monthly:
        whole_month = monthly
    rest = whole_month - so_far
    return so_far, rest if rest > 0.0 else 0.0


class _Swept(NamedTuple):
    month_to_date: float
    kept: int  # live instances counted as capacity and not leaving
    kept_to_end: float  # what the kept instances add if they run until the month ends
    kept_monthly: float  # their monthly prices


def _sweep(
    instances: Iterable[Instance],
    price: PlanPrice,
    now: datetime,
    ledger_total: float,
    leaving: set[str],
) -> _Swept:
    """One pass over the fleet for everything the budget rule needs. The instances kept are
    the live capacity not ``leaving``.

    The month to date includes gone instances. ``ledger_total`` is
    ``Observation.month_to_date_usd``: the whole fleet's bill as the ledger knows it, live and
    gone instances alike, where each live one's share is its ``billed_usd``. The live shares are
    recomputed at ``now`` (the ledger may be a pass behind); the rest of the ledger total is what
    gone instances cost. Gone instances listed with their ``billed_usd`` count too, should the
    ledger total leave them out."""
    start, end = month_bounds(now)
    now = utc(now)
    live_ledger = live_now = gone_listed = to_end = kept_monthly = 0.0
    kept = 0
    for i in instances:
        if not _live(i):
            gone_listed += i.billed_usd
            continue
        so_far, rest = _so_far_and_to_end(i, price, now, start, end)
        live_ledger += i.billed_usd
        live_now += so_far
        if i.state in CAPACITY_STATES and i.label not in leaving:
            kept += 1
            to_end += rest
            kept_monthly += i.monthly_cost or price.monthly
    gone = max(ledger_total - live_ledger, gone_listed, 0.0)
    return _Swept(gone + live_now, kept, to_end, kept_monthly)


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
    monthly_kept_usd: float  # rule (a): the monthly cost of the instances that keep running
    plan_monthly_usd: float  # rule (a): one more instance-month at the plan's price
    # The largest fleet the account's ceiling allows, both rules over every fleet (None: no
    # account ceiling), and the other fleets' figures it was judged on.
    by_account: int | None = None
    account: AccountSpend | None = None

    @property
    def reasons(self) -> tuple[str, str]:
        """Each rule's arithmetic in words (built when a clamp or a warning quotes it)."""
        n = self.current
        return (
            f"(a) {n} instance(s) at ${self.monthly_kept_usd:.2f}/month; room for "
            f"{max(self.by_monthly - n, 0)} more at ${self.plan_monthly_usd:.2f} within "
            f"${self.ceiling:.2f}",
            f"(b) ${self.month_to_date_usd:.2f} billed this month, ${self.committed_usd:.2f} if "
            f"the fleet runs to the month's end; one more instance adds "
            f"${self.new_instance_usd:.2f}: room for {max(self.by_month_end - n, 0)} more",
        )

    @property
    def account_binds(self) -> bool:
        """The account's ceiling, not the fleet's own, sets ``max_total``."""
        return self.by_account is not None and self.by_account < min(
            self.by_monthly, self.by_month_end
        )

    @property
    def account_reason(self) -> str:
        """The account rule's arithmetic in words ("" without an account ceiling)."""
        a = self.account
        if a is None:
            return ""
        if a.unknown:
            return f"the account's spend could not be checked ({a.unknown})"
        others = ", ".join(a.fleets) or "none"
        n = self.current
        return (
            f"other fleets ({others}): ${a.month_to_date_usd:.2f} billed this month, "
            f"${a.committed_usd:.2f} to the month's end, {a.instances} instance(s) at "
            f"${a.monthly_usd:.2f}/month; this fleet ${self.committed_usd:.2f}: room for "
            f"{max((self.by_account or 0) - n, 0)} more within ${a.ceiling:.2f}"
        )

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
    swept = _sweep(
        observation.instances, price, now, observation.month_to_date_usd, leaving=set(leaving)
    )
    n, mtd, monthly_kept = swept.kept, swept.month_to_date, swept.kept_monthly
    committed = mtd + swept.kept_to_end
    per_new = new_instance_to_month_end(price, now)

    room_a = ceiling - monthly_kept
    by_a = n + _whole(room_a, price.monthly)
    room_b = ceiling - committed
    by_b = n + _whole(room_b, per_new)
    account, by_account = observation.account, None
    if account is not None:
        if account.unknown:
            by_account = n  # not grown on a guess; nothing removed either
        else:
            acct_a = account.ceiling - account.monthly_usd - monthly_kept
            acct_b = account.ceiling - account.committed_usd - committed
            by_account = n + min(_whole(acct_a, price.monthly), _whole(acct_b, per_new))
    return BudgetCheck(
        ceiling=ceiling,
        current=n,
        max_total=min(by_a, by_b, by_b if by_account is None else by_account),
        by_monthly=by_a,
        by_month_end=by_b,
        month_to_date_usd=mtd,
        committed_usd=committed,
        new_instance_usd=per_new,
        monthly_kept_usd=monthly_kept,
        plan_monthly_usd=price.monthly,
        by_account=by_account,
        account=account,
    )


def _whole(room: float, each: float) -> int:
    """How many items of cost ``each`` fit in ``room`` (negative when already over)."""
    if each <= 0:
        # A free plan (only in tests or a misconfigured simulator) never limits the count.
        return 1_000_000 if room >= -_EPS else -1
    if room < -_EPS:
        return -1  # already over: even the current fleet does not fit
    return int((room + _EPS) // each)
