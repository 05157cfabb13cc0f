"""Observe: one read of everything a pass decides on, through the ports, as one frozen
``decision.Readings`` value. Observing writes nothing; what it could not read is in the value
(an API error, a signal error), never guessed.

The reads: the fleet's ledger rows, workers and fleet state; the queue's signals; the cloud's
tagged instances (all pages; with ``Parts.overlap_reads`` in a thread while Postgres is read),
a GET for each instance the list missed whose row needs one, the prices of instances to adopt
on another plan; and `systemctl is-active` on every draining instance that can be reached.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from vultrscale import budget, lifecycle, offerings
from vultrscale.config import Config
from vultrscale.decision import Readings, priced, target
from vultrscale.errors import EXIT_USAGE, UsageError
from vultrscale.model import InstanceState, LedgerRow, PlanPrice, ServiceState, WorkerView
from vultrscale.offerings import OfferingCheck
from vultrscale.ports import Cloud, DrainTransport, FleetLedger, Parts, QueueSignals
from vultrscale.ssh import fan_out_bound_s
from vultrscale.vultr.errors import AuthError, NotFound, VultrError

if TYPE_CHECKING:
    from vultrscale.vultr.models import VInstance


def observe(
    cfg: Config,
    parts: Parts,
    ledger: FleetLedger,
    signals_port: QueueSignals,
    now: datetime,
    checks: Mapping[tuple[str, str], OfferingCheck],
    api_error: str | None,
    refused: UsageError | None = None,
    *,
    probe: bool,
) -> Readings:
    """Read the cloud, the ledger, the queue and (with ``probe``) the draining hosts.
    ``checks``: the offerings' prices and availability (``reconcile._offering_checks``);
    ``api_error``: they could not be read, so the cloud is not asked again; ``refused``: no
    offering passes, nothing may be created (the decision's to weigh)."""
    listing = _listing(parts, cfg.fleet.tag, skip=api_error is not None)
    # The rows, the workers, the fleet state and the queue's signals: one round trip to Postgres.
    stored = ledger.reads(
        budget.month_bounds(now)[0],
        lifecycle.WORKER_SEEN_WITHIN,
        signals_port,
        forecast=cfg.policy.forecast.mode != "off",
    )
    signals, signal_error = stored.signals, None
    misconfigured = False
    if stored.signal_error is not None:
        signal_error = f"queue signals: {stored.signal_error}"
        misconfigured = stored.signal_error.exit_code == EXIT_USAGE  # the wrong preset
    rows: dict[str, LedgerRow] = {}
    gone: list[LedgerRow] = []
    for r in stored.rows:
        if r.state is InstanceState.GONE:
            gone.append(r)
        else:
            rows[r.label] = r
    workers, state = stored.workers, stored.state
    # Each offering usable or skipped (its check, a refusal remembered); the price of the
    # first usable one is the one new instances are weighed at (the budget, the policy).
    views = offerings.views(cfg, checks, stored.marks, now) if checks else ()
    price = _fleet_price(views)
    listed: dict[str, VInstance] = {}
    try:
        listed = lifecycle.by_label(listing(), rows)
    except AuthError:
        raise
    except VultrError as exc:
        api_error = f"Vultr API: {exc}"
    if api_error is None:
        try:
            listed.update(_looked_up(parts.cloud, rows.values(), listed, now))
        except AuthError:
            raise
        except VultrError as exc:  # a GET that would confirm a missing instance failed
            api_error = f"Vultr API: {exc}"
    unknown = set(listed) - rows.keys()  # tagged, not in the ledger: adopted
    # One tracked under a name of the ledger's (``<label>@<id>``: its label empty or shared,
    # see ``lifecycle.by_label``) has its worker report under its own label: those workers'
    # heartbeats and live leases are its too (never deleted while they hold one).
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
            api_error = f"Vultr API: {exc}"
    probes: dict[str, ServiceState | str] = {}
    if probe and api_error is None:
        probes = _probe_drains(cfg, parts.drain, ledger, rows.values(), listed)
    return Readings(
        now=now,
        rows=rows,
        gone=tuple(gone),
        listed=listed,
        workers=workers,
        signals=signals,
        price=price,
        state=state,
        probes=probes,
        signal_error=signal_error,
        signal_misconfigured=misconfigured,
        api_error=api_error,
        prices=prices,
        price_error=price_error,
        refused=refused,
        offerings=views,
        forecast=stored.forecast,
        boots=tuple(stored.boots),
    )


def _fleet_price(views: tuple[offerings.OfferingView, ...]) -> PlanPrice | None:
    """The price creates are weighed at: the first usable offering's; while none is usable
    (every one refused a moment ago), the first priced one's, so the budget is still shown."""
    for v in views:
        if v.usable:
            return v.price
    return next((v.price for v in views if v.price is not None and v.checked), None)


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
            price = priced(cloud.get_plan(plan))
        except NotFound:
            price = None
        if price is not None:
            found[plan] = price
    return found, plans - found.keys()


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
    cloud: Cloud, rows: Any, listed: Mapping[str, VInstance], now: datetime
) -> dict[str, VInstance]:
    """GET each instance the list missed whose row needs it. Only "not found" means gone;
    another error is an API error (the pass holds), never a reason to forget a paid instance."""
    ids = {v.id for v in listed.values()}
    found: dict[str, VInstance] = {}
    for row in rows:
        if row.instance_id in ids or not lifecycle.needs_lookup(row, now):
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


def _probe_drains(
    cfg: Config,
    drain: DrainTransport,
    ledger: FleetLedger,
    rows: Any,
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
        # SSH is not under the pass's deadline: say how long it may take (see reconcile._stop).
        ledger.extend_lock(fan_out_bound_s(len(targets)))
        for label, st in drain.is_active_many(targets).items():
            out[label] = st if isinstance(st, ServiceState) else str(st)
    return out
