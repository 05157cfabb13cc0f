"""The cached plan check (price + region) in Postgres: fresh within its TTL, shared by passes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg

from vultrscale.db import plan_checks
from vultrscale.model import PlanPrice

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
TTL = timedelta(minutes=10)
PRICE = PlanPrice("vc2-1c-2gb", 10.0, 0.015)


def test_a_stored_check_is_read_back_within_its_ttl_only(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert plan_checks.get(conn, PRICE.plan, "ewr", NOW, TTL) is None
        plan_checks.put(conn, PRICE, "ewr", NOW)
        assert plan_checks.get(conn, PRICE.plan, "ewr", NOW, TTL) == PRICE
        almost = NOW + TTL - timedelta(seconds=1)
        assert plan_checks.get(conn, PRICE.plan, "ewr", almost, TTL) == PRICE
        assert plan_checks.get(conn, PRICE.plan, "ewr", NOW + TTL, TTL) is None


def test_another_region_or_plan_is_not_the_same_check(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        plan_checks.put(conn, PRICE, "ewr", NOW)
        assert plan_checks.get(conn, PRICE.plan, "ams", NOW, TTL) is None
        assert plan_checks.get(conn, "vc2-2c-4gb", "ewr", NOW, TTL) is None


def test_a_check_dated_after_now_is_asked_again(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        plan_checks.put(conn, PRICE, "ewr", NOW + timedelta(hours=1))  # a clock ran ahead
        assert plan_checks.get(conn, PRICE.plan, "ewr", NOW, TTL) is None


def test_a_new_check_replaces_the_old_price_and_is_seen_by_another_connection(
    db_url: str,
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        plan_checks.put(conn, PRICE, "ewr", NOW)
        plan_checks.put(conn, PlanPrice(PRICE.plan, 12.0, None), "ewr", NOW + timedelta(minutes=20))
    with psycopg.connect(db_url, autocommit=True) as other:  # another pass, another process
        later = NOW + timedelta(minutes=21)
        assert plan_checks.get(other, PRICE.plan, "ewr", later, TTL) == PlanPrice(
            PRICE.plan, 12.0, None
        )
