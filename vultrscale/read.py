"""The read stage of a pass: every read, through the ports, into one complete ``Readings``.

``read`` asks, in this order: the offerings' checks (each plan's price and its region's
availability, asked of Vultr at most every ``PRICE_TTL`` and shared through the ledger); the
cloud's tagged instances (all pages; with ``Parts.overlap_reads`` in a thread while Postgres
is read); in one round trip to Postgres the ledger's rows, the workers, the fleet state, the
queue's signals, the refusals remembered, the cached forecast profile and the newest boots; a
GET for each instance the list missed whose row needs one; the prices of instances to adopt on
another plan; `systemctl is-active` on every draining instance that can be reached; and the
queue's history when the forecast's profile is due. ``snapshot`` is the one read made after
deciding, and only by a pass that creates: the snapshot to boot from.

Reading changes nothing outside this process: what it learnt that the ledger does not hold yet
(checks asked of Vultr, a new profile) is in the value for the write stage to remember
(``apply.remember``). What could not be read is in the value as its error, never guessed: the
cloud's (the pass holds), the queue's; an error of the API key ends the pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from vultrscale.config import Config
from vultrscale.core import forecast
from vultrscale.core.model import (
    AccountSpend,
    InstanceState,
    LedgerRow,
    PlanPrice,
    ServiceState,
    WorkerView,
)
from vultrscale.errors import DatabaseError, UsageError
from vultrscale.ports import Cloud, DrainTransport, FleetLedger, JobHistory, Parts, Session
from vultrscale.rules import budget, lifecycle, offerings
from vultrscale.rules.decision import target
from vultrscale.rules.offerings import OfferingCheck
from vultrscale.rules.readings import Readings
from vultrscale.ssh import fan_out_bound_s
from vultrscale.vultr.errors import AuthError, NotFound, VultrError, unknown_region

if TYPE_CHECKING:
    from vultrscale.vultr.models import VInstance

log = logging.getLogger("vultrscale.read")

# How long a plan check (its price, and that the fleet's region offers it) is trusted before
# Vultr is asked again. Shared through the ledger by every pass of every process, so a steady
# one-shot pass (cron) makes one request, the list; a price change is seen within it.
PRICE_TTL = timedelta(minutes=10)


def read(cfg: Config, parts: Parts, session: Session, now: datetime, *, probe: bool) -> Readings:
    """Everything the pass decides on, read at ``now``. ``probe``: ask the draining hosts
    `systemctl is-active` (a dry run asks no host). Raises ``AuthError`` (the API key) and
    ``DatabaseError`` (the ledger); every other error is in the value."""
    ledger = session.ledger
    checks: dict[tuple[str, str], OfferingCheck] = {}
    asked: list[OfferingCheck] = []
    api_error: VultrError | None = None
    refused: UsageError | None = None
    try:
        checks = _offering_checks(cfg, parts, ledger, now, asked)
        refused = offerings.refusal(cfg, checks)  # no offering passes: nothing may be created
    except AuthError:
        raise
    except VultrError as exc:
        api_error = exc
    listing = _listing(parts, cfg.fleet.tag, skip=api_error is not None)
    # The rows, the workers, the fleet state and the queue's signals: one round trip to Postgres.
    stored = ledger.reads(
        budget.month_bounds(now)[0],
        lifecycle.WORKER_SEEN_WITHIN,
        session.signals,
        forecast=cfg.policy.forecast.mode != "off",
    )
    rows: dict[str, LedgerRow] = {}
    gone: list[LedgerRow] = []
    for r in stored.rows:
        if r.state is InstanceState.GONE:
            gone.append(r)
        else:
            rows[r.label] = r
    workers = stored.workers
    # Each offering usable or skipped (its check, a refusal remembered); the price of the
    # first usable one is the one new instances are weighed at (the budget, the policy).
    views = offerings.views(cfg, checks, stored.marks, now) if checks else ()
    price = _fleet_price(views)
    listed: dict[str, VInstance] = {}
    try:
        listed = lifecycle.by_label(listing(), rows)
        if api_error is None:
            listed.update(_looked_up(parts.cloud, rows.values(), listed, now))
    except AuthError:
        raise
    except VultrError as exc:  # the list, or a GET that would confirm a missing instance
        api_error = exc
    unknown = set(listed) - rows.keys()  # tagged, not in the ledger: adopted
    _add_workers(ledger, workers, listed, unknown)
    # Every offering's price is known: an adopted instance on one is billed at it, unasked.
    prices = {v.price.plan: v.price for v in views if v.price is not None}
    if price is not None:
        prices[price.plan] = price
    price_error = None
    if unknown and api_error is None:
        try:
            price_error = _adopted_prices(price, parts.cloud, listed, unknown, prices)
        except AuthError:
            raise
        except VultrError as exc:  # adopted at a guessed price, never: the pass holds
            api_error = exc
    probes: dict[str, ServiceState | str] = {}
    if probe and api_error is None:
        probes = _probe_drains(cfg, parts.drain, ledger, rows.values(), listed)
    profile, new_profile = _forecast(cfg, parts, stored.forecast, now)
    return Readings(
        account=account(cfg, session, now),
        now=now,
        rows=rows,
        gone=tuple(gone),
        listed=listed,
        workers=workers,
        signals=stored.signals,
        price=price,
        state=stored.state,
        probes=probes,
        signal_error=stored.signal_error,
        api_error=api_error,
        prices=prices,
        price_error=price_error,
        refused=refused,
        offerings=views,
        forecast=profile,
        boots=tuple(stored.boots),
        new_checks=tuple(asked),
        new_profile=new_profile,
    )


def account(cfg: Config, session: Session, now: datetime) -> AccountSpend | None:
    """The other fleets' spend this month, with ``account.monthly_ceiling_usd`` set and a
    store that holds the account's fleets (None otherwise: no account rule). Read again, under
    the account's lock, by a pass about to create (``reconcile``)."""
    ceiling, account = cfg.account.monthly_ceiling_usd, session.ledger.account
    if not ceiling or account is None:
        return None
    rows = account.others(budget.month_bounds(now)[0])
    return budget.account_spend(rows, ceiling, now)


def snapshot(cfg: Config, parts: Parts, ledger: FleetLedger) -> str:
    """The snapshot to boot from: fleet.snapshot_id, else the recorded one; must be complete.
    Read only by a pass that creates, after deciding, before its first change."""
    sid = cfg.fleet.snapshot_id or ledger.recorded_snapshot() or ""
    if sid and parts.cache.snapshot == sid:
        return sid  # checked complete before; a newly baked one is picked up next pass
    if not sid:
        raise UsageError(
            "no snapshot to create instances from",
            hint="Run `vultrscale snapshot --from-instance ID` or set fleet.snapshot_id.",
        )
    try:
        snap = parts.cloud.get_snapshot(sid)
    except NotFound:
        raise UsageError(
            f"snapshot {sid} does not exist at Vultr",
            hint="Bake one with `vultrscale snapshot` or fix fleet.snapshot_id.",
        ) from None
    if snap.status != "complete":
        raise UsageError(
            f"snapshot {sid} is {snap.status}, not complete",
            hint="Wait for it (`vultrscale snapshot` shows progress) or use another one.",
        )
    parts.cache.snapshot = sid
    return sid


def forecast_profile(
    cfg: Config, history: JobHistory, cached: forecast.Profile | None, now: datetime
) -> forecast.Profile:
    """The forecast profile at ``now``: ``cached`` while it is fresh, else computed from
    ``history`` over the weeks ``policy.forecast`` looks back (``DatabaseError`` when it
    cannot be read). The pass and `vultrscale forecast` both take it from here."""
    fc = cfg.policy.forecast
    if cached is not None and cached.fresh(fc, now):
        return cached
    return forecast.compute(
        history.buckets(now - fc.weeks * forecast.WEEK, now, fc.slot),
        now,
        slot=fc.slot,
        weeks=fc.weeks,
        quantile=fc.quantile,
        min_history=fc.min_history,
        pool=fc.pool,
    )


# --- the offerings ------------------------------------------------------------------------------


def _offering_checks(
    cfg: Config,
    parts: Parts,
    ledger: FleetLedger,
    now: datetime,
    asked: list[OfferingCheck],
) -> dict[tuple[str, str], OfferingCheck]:
    """By (region, plan), what Vultr says of each offering of the fleet: its plan's price and
    whether its region's availability lists it. Asked at most every PRICE_TTL (the checks are
    shared through the ledger by every pass of every process), so a steady pass asks nothing.
    Each check asked of Vultr is added to ``asked`` as it is made (kept when a later one
    fails)."""
    keys = [(o.region, o.plan) for o in offerings.of(cfg)]
    mine = parts.cache.price_check  # checks this process made and saved
    if mine is not None and mine.at <= now < mine.at + PRICE_TTL:
        cached = {(c.region, c.plan): c for c in mine.checks}
        if all(k in cached for k in keys):  # as fresh as their copy in the ledger
            return cached
    checks = ledger.offering_checks(keys, now, PRICE_TTL)
    for region, plan in [k for k in keys if k not in checks]:
        check = _check_offering(parts.cloud, region, plan, listed=bool(cfg.fleet.offerings))
        checks[(region, plan)] = check
        asked.append(check)
    return checks


def _check_offering(cloud: Cloud, region: str, plan: str, *, listed: bool) -> OfferingCheck:
    """Ask Vultr for the plan's price and whether the region's availability lists it.
    ``listed``: the offering is one of ``[[fleet.offerings]]`` (else fleet.region/plan)."""
    try:
        vplan = cloud.get_plan(plan)
    except NotFound:
        return OfferingCheck(
            region,
            plan,
            None,
            False,
            f"{'plan' if listed else 'fleet.plan'} {plan!r} is not a Vultr plan",
            "Pick a plan id from https://api.vultr.com/v2/plans (e.g. vc2-1c-2gb).",
        )
    try:
        available = cloud.region_availability(region)
    except NotFound:
        unknown = unknown_region(region)
        problem = f"region {region!r} is not a Vultr region" if listed else unknown.message
        return OfferingCheck(region, plan, None, False, problem, unknown.hint or "")
    price = vplan.price
    if price is None:
        return OfferingCheck(
            region,
            plan,
            None,
            plan in available,
            f"Vultr lists plan {plan!r} without a usable price (monthly_cost read as "
            f"{vplan.monthly_cost!r}, hourly_cost {vplan.hourly_cost!r}): the budget cannot be "
            "held, so nothing is created",
            "Check GET /v2/plans for the plan; pick another plan if it has no price.",
        )
    return OfferingCheck.of(region, plan, price, plan in available)


def _fleet_price(views: tuple[offerings.OfferingView, ...]) -> PlanPrice | None:
    """The price creates are weighed at: the first usable offering's; while none is usable
    (every one refused a moment ago), the first priced one's, so the budget is still shown."""
    for v in views:
        if v.usable:
            return v.price
    return next((v.price for v in views if v.price is not None and v.checked), None)


# --- the cloud ----------------------------------------------------------------------------------


def _listing(parts: Parts, tag: str, *, skip: bool) -> Callable[[], list[VInstance]]:
    """The cloud's tagged instances, asked now: with ``parts.overlap_reads`` in a thread, so
    the caller reads the ledger meanwhile. Calling the result waits for the answer (or raises
    what the list raised). ``skip``: the cloud already failed this pass, ask it nothing."""
    if skip:
        return list
    if not parts.overlap_reads:
        return lambda: parts.cloud.list_instances(tag=tag)
    answer: list[list[VInstance] | BaseException] = []

    def run() -> None:
        try:
            answer.append(parts.cloud.list_instances(tag=tag))
        except BaseException as exc:  # handed to the caller, who decides what it means
            answer.append(exc)

    # A daemon thread: an interrupted pass exits at once, not after the list's timeout.
    thread = threading.Thread(target=run, name="vultrscale-list", daemon=True)
    thread.start()

    def wait() -> list[VInstance]:
        thread.join()
        got = answer[0]
        if isinstance(got, BaseException):
            raise got
        return got

    return wait


def _looked_up(
    cloud: Cloud, rows: Iterable[LedgerRow], listed: Mapping[str, VInstance], now: datetime
) -> dict[str, VInstance]:
    """GET each instance the list missed whose row needs it. Only "not found" means gone;
    another error is an API error (the pass holds), never a reason to forget a paid instance."""
    ids = {v.id for v in listed.values()}
    found: dict[str, VInstance] = {}
    for row in rows:
        if not row.instance_id or row.instance_id in ids or not lifecycle.needs_lookup(row, now):
            continue
        try:
            v = cloud.get_instance(row.instance_id)
        except NotFound:
            continue
        # Keyed by the row's label, the name the ledger tracks it by (``<label>@<id>`` for a
        # label empty or shared, see ``lifecycle.by_label``), which the list gives no other
        # instance: keyed by its Vultr label, an aliased instance lost its workers' heartbeats
        # and leases for the pass, and a drain past its deadline deleted it with leases live.
        found[row.label] = v
    return found


def _adopted_prices(
    fleet_price: PlanPrice | None,
    cloud: Cloud,
    listed: Mapping[str, VInstance],
    unknown: set[str],
    prices: dict[str, PlanPrice],
) -> str | None:
    """Add to ``prices`` those of the plans of the instances to adopt; the error to report
    for the plans Vultr lists without a usable price (billed at the fleet plan's)."""
    found, unpriced = _plan_prices(cloud, {listed[t].plan for t in unknown} - prices.keys())
    prices.update(found)
    if not unpriced:
        return None
    who = sorted(t for t in unknown if listed[t].plan in unpriced)
    return (
        f"{', '.join(who)}: adopted on plan(s) {', '.join(sorted(unpriced))}, which "
        f"Vultr lists without a usable price; billed at "
        f"{fleet_price.plan if fleet_price else 'the fleet plan'}'s price"
    )


def _plan_prices(cloud: Cloud, plans: set[str]) -> tuple[dict[str, PlanPrice], set[str]]:
    """The prices of ``plans`` (those of instances to adopt, other than the fleet's), and the
    plans Vultr does not list with a usable price."""
    found: dict[str, PlanPrice] = {}
    for plan in sorted(plans):
        try:
            price = cloud.get_plan(plan).price
        except NotFound:
            price = None
        if price is not None:
            found[plan] = price
    return found, plans - found.keys()


# --- Postgres and the hosts ---------------------------------------------------------------------


def _add_workers(
    ledger: FleetLedger,
    workers: dict[str, WorkerView],
    listed: Mapping[str, VInstance],
    unknown: set[str],
) -> None:
    """Add the workers of the instances to adopt, and of those tracked under a name of the
    ledger's (``<label>@<id>``: a label empty or shared, see ``lifecycle.by_label``), whose
    worker reports under the instance's own label: those workers' heartbeats and live leases
    are its too (never deleted while they hold one)."""
    aliased = {t: v.label for t, v in listed.items() if t != v.label and t not in workers}
    if not (unknown or aliased):
        return
    found = ledger.workers(lifecycle.WORKER_SEEN_WITHIN, sorted(unknown | set(aliased.values())))
    workers.update((label, found[label]) for label in unknown if label in found)
    for label, own in aliased.items():
        if own in found:
            workers[label] = replace(found[own], instance_label=label)


def _probe_drains(
    cfg: Config,
    drain: DrainTransport,
    ledger: FleetLedger,
    rows: Iterable[LedgerRow],
    listed: Mapping[str, VInstance],
) -> dict[str, ServiceState | str]:
    """`systemctl is-active` on every draining instance that can be reached (read-only)."""
    out: dict[str, ServiceState | str] = {}
    targets = []
    for row in rows:
        if row.state is InstanceState.DRAINING:
            t = target(cfg, row, listed.get(row.label))
            out[row.label] = lifecycle.NO_TARGET
            if t is not None:
                targets.append(t)
    if targets:
        # SSH is not under the pass's deadline: say how long it may take (apply.stop, too).
        ledger.extend_lock(fan_out_bound_s(len(targets)))
        for label, st in drain.is_active_many(targets).items():
            out[label] = st if isinstance(st, ServiceState) else str(st)
    return out


def _forecast(
    cfg: Config, parts: Parts, cached: forecast.Profile | None, now: datetime
) -> tuple[forecast.Profile | None, forecast.Profile | None]:
    """The forecast profile the pass decides on, and that profile again when the ledger's is
    older (for the pass to save if it succeeds; else None): the ledger's while it is fresh,
    else this process's, else one computed from the queue's history. The history is scanned
    once per ``policy.forecast.refresh``, not every pass. A history that cannot be read keeps
    the cached profile, if any, and never fails the pass: the forecast only ever raises a
    floor."""
    fc = cfg.policy.forecast
    if fc.mode == "off" or parts.history is None or (cached and cached.fresh(fc, now)):
        return cached, None
    mine = parts.cache.profile
    if mine is not None and mine.fresh(fc, now):
        return mine, mine
    try:
        profile = forecast_profile(cfg, parts.history, cached, now)
    except DatabaseError as exc:
        log.warning("the floor forecast keeps its last profile: %s", exc)
        return (cached if cached is not None and cached.fits(fc) else None), None
    parts.cache.profile = profile  # this process's: a dry run saves none in the ledger
    return profile, profile
