"""The offerings' checks (price, and whether the region lists the plan) and the refusals
remembered on them, in Postgres for every pass of every process.

A pass needs the plan's price and the knowledge that the plan is offered in the fleet's region
(two Vultr requests). Both change rarely, so a check that passed is stored with the time it was
made and reused while it is younger than a time-to-live: a steady one-shot pass (cron) then
makes one request, the instance list. A plan that the region's availability does not list is
stored too (``listed`` false: the offering is skipped until the TTL has passed); an unknown
plan or one without a usable price is not, so a fixed config takes effect at once.

``offering_marks`` holds the creates Vultr refused: the offering is skipped until ``until``
(``fleet.unavailable_for`` after the refusal); the pass reads them with its other reads
(``ledger.reads``), in the same round trip.

Times are the caller's ``now`` (the pass's clock), not the database's: the TTL is the pass's
policy. A check stored with a time later than ``now`` (written while some clock ran ahead) is
not fresh: it is asked again.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from vultrscale.core.model import OfferingMark, PlanPrice


def get(
    conn: psycopg.Connection[Any], plan: str, region: str, now: datetime, ttl: timedelta
) -> PlanPrice | None:
    """The price of ``plan`` as checked (offered in ``region``) within ``ttl`` before ``now``,
    else None (never checked, too old, or checked "in the future")."""
    row = conn.execute(
        "SELECT monthly_cost, hourly_cost FROM plan_checks"
        " WHERE plan = %s AND region = %s AND checked_at > %s AND checked_at <= %s",
        (plan, region, now - ttl, now),
    ).fetchone()
    return None if row is None else PlanPrice(plan, float(row[0]), row[1])


def put(
    conn: psycopg.Connection[Any],
    price: PlanPrice,
    region: str,
    now: datetime,
    *,
    listed: bool = True,
) -> None:
    """Store a check: ``price.plan`` costs ``price``, and ``listed``: the availability of
    ``region`` lists it."""
    conn.execute(
        "INSERT INTO plan_checks (plan, region, monthly_cost, hourly_cost, checked_at, listed)"
        " VALUES (%s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (plan, region) DO UPDATE SET monthly_cost = excluded.monthly_cost,"
        " hourly_cost = excluded.hourly_cost, checked_at = excluded.checked_at,"
        " listed = excluded.listed",
        (price.plan, region, price.monthly, price.hourly_cost, now, listed),
    )


def get_many(
    conn: psycopg.Connection[Any],
    keys: list[tuple[str, str]],
    now: datetime,
    ttl: timedelta,
) -> dict[tuple[str, str], tuple[PlanPrice, bool]]:
    """By (region, plan), for each of ``keys`` checked within ``ttl`` before ``now``: its price
    and whether its region lists it. One statement for every offering."""
    if not keys:
        return {}
    rows = conn.execute(
        "SELECT region, plan, monthly_cost, hourly_cost, listed FROM plan_checks"
        " WHERE (region, plan) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
        " AND checked_at > %s AND checked_at <= %s",
        ([r for r, _ in keys], [p for _, p in keys], now - ttl, now),
    ).fetchall()
    return {(r[0], r[1]): (PlanPrice(r[1], float(r[2]), r[3]), bool(r[4])) for r in rows}


MARKS = "SELECT region, plan, until, reason, refusals FROM offering_marks WHERE fleet = %s"


def marks(rows: list[tuple[Any, ...]]) -> tuple[OfferingMark, ...]:
    """The rows of ``MARKS`` as values."""
    return tuple(OfferingMark(r[0], r[1], r[2], r[3], int(r[4])) for r in rows)


def mark(
    conn: psycopg.Connection[Any],
    fleet: str,
    region: str,
    plan: str,
    until: datetime,
    reason: str,
) -> None:
    """Remember a refused create on ``region``/``plan`` until ``until``; count it."""
    conn.execute(
        "INSERT INTO offering_marks (fleet, region, plan, until, reason)"
        " VALUES (%s, %s, %s, %s, %s)"
        " ON CONFLICT (fleet, region, plan) DO UPDATE SET until = excluded.until,"
        " reason = excluded.reason, refusals = offering_marks.refusals + 1",
        (fleet, region, plan, until, reason),
    )
