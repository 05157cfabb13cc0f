"""A limit that held, as a value: ``Clamp``, its kind (``Limit``) and its numbers.

The policy says which limit held a pass back and by how much (the instances asked for and
let through, the rule's own number, when it lets go); the simulator, the metrics and the
tests read those. The sentence ``status``, ``--json`` and the events ledger show is made from
the value only at the edge (``Clamp.describe``). Pure.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from vultrscale.core.values import format_duration


class Limit(enum.Enum):
    """What held: the rule and the case of it."""

    CAP = "cap"  # max_instances lowered the goal
    CAP_LEAVING = "cap_leaving"  # instances on their way out count toward max_instances
    OVER_CAP = "over_cap"  # more instances than max_instances: the excess is drained
    PRICE_UNKNOWN = "price_unknown"  # no price: the budget cannot be checked, nothing created
    BUDGET_MONTHLY = "budget_monthly"  # the budget's rule (a): N x the monthly cost
    BUDGET_MONTH_BILL = "budget_month_bill"  # the budget's rule (b): this month's bill
    BUDGET_ACCOUNT = "budget_account"  # account.monthly_ceiling_usd, over every fleet
    COOLDOWN_UP = "cooldown_up"  # scale_up_cooldown since the last scale-up
    STEP = "max_step_up"  # new instances a pass may create
    ERROR_HOLD = "error_hold"  # an error holds the fleet below its floor
    IDLE_WINDOW = "idle_window"  # idle_before_scale_down since the queue went idle
    COOLDOWN_DOWN_AFTER_UP = "cooldown_down_after_up"  # scale_down_cooldown since a scale-up
    COOLDOWN_DOWN_AFTER_DOWN = "cooldown_down_after_down"  # ... since an earlier scale-in
    BILLING_HOUR = "billing_hour"  # an idle instance kept until its paid hour nearly ends

    @property
    def rule(self) -> str:
        """The rule's name, as its sentence begins."""
        return _RULES[self]

    @property
    def holds_scale_up(self) -> bool:
        """It held back a scale-up (the others hold a scale-in or the floor)."""
        return self in _SCALE_UP


_RULES = {
    Limit.CAP: "cap",
    Limit.CAP_LEAVING: "cap",
    Limit.OVER_CAP: "cap",
    Limit.PRICE_UNKNOWN: "budget",
    Limit.BUDGET_MONTHLY: "budget",
    Limit.BUDGET_MONTH_BILL: "budget",
    Limit.BUDGET_ACCOUNT: "budget",
    Limit.COOLDOWN_UP: "cool-down",
    Limit.STEP: "max_step_up",
    Limit.ERROR_HOLD: "error hold",
    Limit.IDLE_WINDOW: "idle window",
    Limit.COOLDOWN_DOWN_AFTER_UP: "cool-down",
    Limit.COOLDOWN_DOWN_AFTER_DOWN: "cool-down",
    Limit.BILLING_HOUR: "billing hour",
}
_SCALE_UP = frozenset(
    {
        Limit.CAP,
        Limit.CAP_LEAVING,
        Limit.PRICE_UNKNOWN,
        Limit.BUDGET_MONTHLY,
        Limit.BUDGET_MONTH_BILL,
        Limit.BUDGET_ACCOUNT,
        Limit.COOLDOWN_UP,
        Limit.STEP,
    }
)


@dataclass(frozen=True, slots=True)
class Clamp:
    """One limit that held this pass, with its numbers. Which fields a kind fills:

    - counts: ``asked`` -> ``allowed`` instances (``STEP``: new ones this pass; ``ERROR_HOLD``:
      the floor -> the instances kept; ``OVER_CAP``: the instances there -> those staying);
      ``limit`` is the rule's own number (max_instances, max_step_up, the ceiling in USD);
      ``count`` the instances it concerns (leaving, drained, kept for their paid hour);
    - times (UTC): ``since`` what its clock counts from (the last scale-up or scale-in, the
      queue idle), ``window`` its length, ``until`` when it lets go (``BILLING_HOUR``: the
      first drain), ``wait`` how long that is from the pass;
    - ``detail``: the budget's arithmetic in words."""

    kind: Limit
    asked: int | None = None
    allowed: int | None = None
    limit: float | None = None
    count: int | None = None
    since: datetime | None = None
    window: timedelta | None = None
    until: datetime | None = None
    wait: timedelta | None = None
    detail: str = ""

    def describe(self) -> str:
        """The clamp in words, as status, ``--json`` and the events ledger show it."""
        asked, allowed, count, limit = self.asked, self.allowed, self.count, self.limit
        window = "?" if self.window is None else format_duration(self.window)
        wait = "?" if self.wait is None else span(self.wait)
        match self.kind:
            case Limit.CAP:
                return f"cap: max_instances={limit} limits {asked} -> {allowed}"
            case Limit.CAP_LEAVING:
                return (
                    f"cap: {count} instance(s) still draining or being deleted count toward "
                    f"max_instances={limit}: limits {asked} -> {allowed}"
                )
            case Limit.OVER_CAP:
                return f"cap: {asked} instance(s) above max_instances={limit}; draining {count}"
            case Limit.PRICE_UNKNOWN:
                return f"budget: plan price unknown, holds {asked} -> {allowed}"
            case Limit.BUDGET_MONTHLY | Limit.BUDGET_MONTH_BILL:
                rule = (
                    "(a) monthly cost"
                    if self.kind is Limit.BUDGET_MONTHLY
                    else "(b) this month's bill"
                )
                return (
                    f"budget: rule {rule} within ${limit or 0:.2f} limits {asked} -> {allowed} "
                    f"({self.detail})"
                )
            case Limit.BUDGET_ACCOUNT:
                return (
                    f"budget: the account's ceiling ${limit or 0:.2f} over every fleet limits "
                    f"{asked} -> {allowed} ({self.detail})"
                )
            case Limit.COOLDOWN_UP:
                return (
                    f"cool-down: scale-up waits {wait} more (scale_up_cooldown={window} since the "
                    f"last scale-up at {clock(self.since)})"
                )
            case Limit.STEP:
                return f"max_step_up: {limit} limits {asked} -> {allowed} new instance(s) this pass"
            case Limit.ERROR_HOLD:
                return (
                    f"error hold: on_signal_error=hold keeps {allowed} instance(s) below the "
                    f"floor of {asked}"
                )
            case Limit.IDLE_WINDOW:
                return (
                    f"idle window: the queue has been empty since {clock(self.since)}; "
                    f"idle_before_scale_down={window}: scale-in waits {wait} more"
                )
            case Limit.COOLDOWN_DOWN_AFTER_UP | Limit.COOLDOWN_DOWN_AFTER_DOWN:
                last = "scale-up" if self.kind is Limit.COOLDOWN_DOWN_AFTER_UP else "scale-in"
                return (
                    f"cool-down: scale_down_cooldown={window} since the last {last} at "
                    f"{clock(self.since)}: scale-in waits {wait} more"
                )
            case Limit.BILLING_HOUR:
                return (
                    f"billing hour: {count} idle instance(s) already paid for this hour are "
                    f"kept; the first drain is due at {clock(self.until)} ({window} before its "
                    "hour ends)"
                )
        raise AssertionError(f"no words for {self.kind}")  # pragma: no cover - every kind has


def span(td: timedelta) -> str:
    """A wait as a person reads it: ``42s``, ``3m00s``, ``1h05m``."""
    s = max(0, math.ceil(td.total_seconds()))
    if s < 120:
        return f"{s}s"
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{(s % 3600) // 60:02d}m"


def clock(dt: datetime | None) -> str:
    """A UTC time of day, as the sentences give it."""
    return "?" if dt is None else dt.strftime("%H:%M:%S UTC")
