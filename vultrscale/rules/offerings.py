"""Offerings: the regions and plans a fleet may create instances on, in order of preference. Pure.

A fleet lists them as ``[[fleet.offerings]]`` (without the list it has one: ``fleet.region``
and ``fleet.plan``). A pass knows of each what Vultr said when it was last checked (its plan's
price, whether its region's availability lists the plan: ``OfferingCheck``, cached in Postgres
for every pass) and whether a create there was refused a short while ago (``OfferingMark``,
remembered for ``fleet.unavailable_for``). From those it makes one ``OfferingView`` per
offering: usable, or skipped with the reason. The creates of a pass go to the usable offerings
in order: a refused create goes on with the next one (``apply.apply``), and each
offering's ``Choice`` bounds how many creates the budget allows at its own plan's price.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from vultrscale.config import Config, Offering
from vultrscale.core.model import (
    CAPACITY_STATES,
    Instance,
    InstanceState,
    Observation,
    OfferingMark,
    PlanPrice,
)
from vultrscale.errors import UsageError
from vultrscale.rules import budget

__all__ = [
    "Choice",
    "Offering",
    "OfferingCheck",
    "OfferingView",
    "choices",
    "desired_instances",
    "jobs_per_instance",
    "of",
    "preference",
    "refusal",
    "views",
]

_LEAVING = (InstanceState.DRAINING, InstanceState.DELETING)


def of(cfg: Config) -> tuple[Offering, ...]:
    """The fleet's offerings in order of preference: ``[[fleet.offerings]]``, else the one of
    ``fleet.region`` and ``fleet.plan``."""
    f = cfg.fleet
    return f.offerings or (Offering(f.region, f.plan),)


def jobs_per_instance(cfg: Config, region: str, plan: str) -> int:
    """Jobs one instance on ``region``/``plan`` runs at once: its offering's own
    ``jobs_per_instance``, else ``queue.jobs_per_instance`` (also for an instance on no
    offering of the fleet, adopted say)."""
    for o in of(cfg):
        if (o.region, o.plan) == (region, plan) and o.jobs_per_instance:
            return o.jobs_per_instance
    return cfg.queue.jobs_per_instance


def new_jobs_per_instance(cfg: Config, plan: str | None) -> int:
    """Jobs a new instance runs at once: those of the first offering on ``plan`` (the plan
    creates are priced at), else of the first offering. The depth rule, the wait rule and the
    floor forecast count new instances at this."""
    listed = of(cfg)
    first = next((o for o in listed if plan is not None and o.plan == plan), listed[0])
    return jobs_per_instance(cfg, first.region, first.plan)


def preference(cfg: Config, instance: Instance) -> int:
    """The rank of the instance's offering (0: the most preferred); an instance on no offering
    of the fleet ranks last."""
    for i, o in enumerate(of(cfg)):
        if (o.region, o.plan) == (instance.region, instance.plan):
            return i
    return len(of(cfg))


def desired_instances(demand: int, running_slots: Sequence[int], new_slots: int) -> int:
    """Instances ``demand`` jobs ask for, given the slots (jobs per instance) of the instances
    that stay and of a new one: the fewest of the staying ones (largest first) that hold the
    demand, else all of them and as many new ones as the rest needs. With every instance
    alike it is ceil(demand / jobs per instance)."""
    if demand <= 0:
        return 0
    held = 0
    for n, slots in enumerate(sorted(running_slots, reverse=True), start=1):
        held += slots
        if held >= demand:
            return n
    return len(running_slots) + math.ceil((demand - held) / max(new_slots, 1))


@dataclass(frozen=True, slots=True)
class OfferingCheck:
    """What Vultr said of one offering when it was checked: its plan's price (None: Vultr has
    no such plan, or lists it without a usable price) and whether its region's availability
    lists the plan. ``problem`` says why it cannot be used ("" when it can)."""

    region: str
    plan: str
    price: PlanPrice | None
    listed: bool
    problem: str = ""
    hint: str = ""  # what the user can do about the problem

    @classmethod
    def of(cls, region: str, plan: str, price: PlanPrice | None, listed: bool) -> OfferingCheck:
        """A check of a priced plan, as stored: not listed in its region is its problem."""
        if listed:
            return cls(region, plan, price, listed)
        return cls(
            region,
            plan,
            price,
            listed,
            f"plan {plan!r} is not offered in region {region!r}",
            "Choose another plan or region; GET /v2/regions/<id>/availability lists them.",
        )

    @property
    def usable(self) -> bool:
        return self.price is not None and self.listed and not self.problem


def refusal(cfg: Config, checks: Mapping[tuple[str, str], OfferingCheck]) -> UsageError | None:
    """The refusal of every create when no offering can be used (exit 2): an unknown plan or
    region, a plan its region does not offer, no usable price, a ceiling below one
    instance-month. Each offering is named with why; None while one can be used."""
    why: list[tuple[Offering, str, str]] = []
    for o in of(cfg):
        check = checks[(o.region, o.plan)]
        if not check.usable:
            why.append((o, check.problem, check.hint))
        elif check.price is not None and (too_dear := unaffordable(cfg, check.price)):
            why.append((o, too_dear, "Raise the ceiling or pick a cheaper plan."))
        else:
            return None
    if len(why) == 1:
        _, problem, hint = why[0]
        return UsageError(problem, hint=hint)
    return UsageError(
        "no offering of the fleet can be created on: "
        + "; ".join(f"{o.name}: {problem}" for o, problem, _ in why),
        hint="Fix or replace the [[fleet.offerings]] named; GET /v2/plans and "
        "GET /v2/regions/<id>/availability list what Vultr offers.",
    )


def unaffordable(cfg: Config, price: PlanPrice) -> str:
    """Why one instance of the plan can never be created within the budget ("" if it can):
    one instance-month costs more than the ceiling (with a fleet that may have instances)."""
    ceiling = cfg.budget.monthly_ceiling_usd
    if cfg.policy.max_instances > 0 and ceiling < price.monthly:
        return (
            f"budget.monthly_ceiling_usd ({ceiling:g}) is lower than one instance-month of "
            f"{price.plan} (${price.monthly:g})"
        )
    return ""


@dataclass(frozen=True, slots=True)
class OfferingView:
    """One offering as a pass sees it: usable (``skip`` empty), or skipped and why; a refusal
    remembered until ``until``; every refusal the fleet has had there."""

    offering: Offering
    price: PlanPrice | None
    skip: str = ""
    until: datetime | None = None
    refusals: int = 0
    checked: bool = False  # its check passes (priced, listed, affordable): only a refusal skips it

    @property
    def usable(self) -> bool:
        return not self.skip and self.price is not None

    def left_s(self, now: datetime) -> int:
        """Seconds left on a remembered refusal (0: none)."""
        return (
            math.ceil((self.until - now).total_seconds()) if self.until and self.until > now else 0
        )

    def row(self, now: datetime) -> dict[str, object]:
        """The view as ``status --json`` and the ledger show it."""
        return {
            "offering": self.offering.name,
            "region": self.offering.region,
            "plan": self.offering.plan,
            "monthly_usd": self.price.monthly if self.price else None,
            "usable": self.usable,
            "skip": self.skip,
            "unavailable_for_s": self.left_s(now),
            "refusals": self.refusals,
        }


def views(
    cfg: Config,
    checks: Mapping[tuple[str, str], OfferingCheck],
    marks: Iterable[OfferingMark],
    now: datetime,
) -> tuple[OfferingView, ...]:
    """Every offering of the fleet, in order: skipped when its check failed (not listed in its
    region, no such plan, no price; not checked: the API failed) or while a refusal of a
    create there is remembered."""
    by_key = {(m.region, m.plan): m for m in marks}
    out = []
    for o in of(cfg):
        key = (o.region, o.plan)
        check, mark = checks.get(key), by_key.get(key)
        refusals = mark.refusals if mark else 0
        until = mark.until if mark is not None and mark.until > now else None
        price = check.price if check else None
        too_dear = unaffordable(cfg, price) if price is not None else ""
        checked = check is not None and check.usable and not too_dear
        if check is None:
            skip = "not checked (the Vultr API did not answer)"
        elif not check.usable:
            skip = check.problem or f"plan {o.plan!r} is not offered in region {o.region!r}"
        elif too_dear:
            skip = too_dear
        elif until is not None and mark is not None:
            skip = f"create refused: {mark.reason}"
        else:
            skip = ""
        out.append(OfferingView(o, price, skip, until, refusals, checked))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Choice:
    """One usable offering of a create step, at its plan's price. ``upto``: the step creates
    on it only while fewer than this many were created in the step (on it and the offerings
    tried before it): the budget at the dearest price tried so far, and the step's count."""

    offering: Offering
    price: PlanPrice
    upto: int


def choices(
    cfg: Config,
    observation: Observation,
    usable: Sequence[OfferingView],
    count: int,
    replaced: Iterable[str],
    demand: int | None,
    floor: int,
    now: datetime,
) -> tuple[Choice, ...]:
    """The create step's offerings, in order, each bounded by the budget rule at its own
    plan's price (docs/policy.md, "The budget"; the instances that run are billed at theirs) and by
    what the demand asks at its own ``jobs_per_instance`` (a bigger plan: fewer instances;
    never fewer than the floor asks). ``count`` is the plan's, sized at the first offering. A
    fallback never creates more in all than the most limiting offering tried so far allows,
    so any mix the step ends with keeps the budget and never overshoots the demand.
    ``replaced``: instances the plan replaces (leaving: not counted, their cost so far kept);
    ``demand`` None: unread (a create to the floor), sized by ``count`` alone."""
    gone_soon = set(replaced)
    leaving = len(gone_soon) + sum(1 for i in observation.instances if i.state in _LEAVING)
    staying = [
        i for i in observation.instances if i.state in CAPACITY_STATES and i.label not in gone_soon
    ]
    slots = [jobs_per_instance(cfg, i.region, i.plan) for i in staying]
    ceiling = cfg.budget.monthly_ceiling_usd
    out = []
    upto = count
    for v in usable:
        if v.price is None:
            continue
        check = budget.check(observation, v.price, ceiling, now, leaving=gone_soon)
        upto = min(upto, max(check.max_total - leaving - len(staying), 0))
        if demand is not None:
            o = v.offering
            wanted = desired_instances(demand, slots, jobs_per_instance(cfg, o.region, o.plan))
            upto = min(upto, max(max(wanted, floor) - len(staying), 0))
        out.append(Choice(v.offering, v.price, upto))
    return tuple(out)
