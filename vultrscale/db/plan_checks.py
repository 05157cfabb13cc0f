"""The plan's price and region check, cached in Postgres for every pass of every process.

A pass needs the plan's price and the knowledge that the plan is offered in the fleet's region
(two Vultr requests). Both change rarely, so a check that passed is stored with the time it was
made and reused while it is younger than a time-to-live: a steady one-shot pass (cron) then
makes one request, the instance list. Only passed checks are stored; a refused plan is asked
again every pass, so a fixed config takes effect at once.

Times are the caller's ``now`` (the pass's clock), not the database's: the TTL is the pass's
policy. A check stored with a time later than ``now`` (written while some clock ran ahead) is
not fresh: it is asked again.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from vultrscale.model import PlanPrice


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


def put(conn: psycopg.Connection[Any], price: PlanPrice, region: str, now: datetime) -> None:
    """Store a check that passed: ``price.plan`` is offered in ``region`` at ``price``."""
    conn.execute(
        "INSERT INTO plan_checks (plan, region, monthly_cost, hourly_cost, checked_at)"
        " VALUES (%s, %s, %s, %s, %s)"
        " ON CONFLICT (plan, region) DO UPDATE SET monthly_cost = excluded.monthly_cost,"
        " hourly_cost = excluded.hourly_cost, checked_at = excluded.checked_at",
        (price.plan, region, price.monthly, price.hourly_cost, now),
    )
