"""The cached offering checks (price, listed in the region) and the refusals remembered, in
Postgres: fresh within their TTL, shared by every pass of every process."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from vultrscale.config import Config
from vultrscale.core.model import OfferingMark, PlanPrice
from vultrscale.db import plan_checks
from vultrscale.db.store import PgLedger, PgStore
from vultrscale.rules.offerings import OfferingCheck

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


def test_a_plan_its_region_does_not_list_is_kept_as_not_listed_for_every_offering(
    db_url: str,
) -> None:
    other = PlanPrice("vc2-2c-4gb", 20.0, 0.03)
    with psycopg.connect(db_url, autocommit=True) as conn:
        plan_checks.put(conn, PRICE, "ewr", NOW, listed=False)
        plan_checks.put(conn, other, "fra", NOW - TTL)  # too old by now
        plan_checks.put(conn, other, "ams", NOW)
        keys = [("ewr", PRICE.plan), ("fra", other.plan), ("ams", other.plan), ("sgp", "x")]
        got = plan_checks.get_many(conn, keys, NOW, TTL)
    assert got == {("ewr", PRICE.plan): (PRICE, False), ("ams", other.plan): (other, True)}


def test_a_refusal_is_remembered_counted_and_read_with_the_pass_in_one_round_trip(
    db_url: str, tmp_path: Path
) -> None:
    cfg = Config()
    until = NOW + timedelta(minutes=3)
    store = PgStore(db_url, keep=True)
    try:
        with store.session(cfg) as (ledger, _signals):
            ledger.mark_unavailable("ewr", PRICE.plan, NOW, "Plan is not available")
            ledger.mark_unavailable("ewr", PRICE.plan, until, "sold out")
            ledger.save_offering_check(OfferingCheck.of("ewr", PRICE.plan, PRICE, False), NOW)
        with store.session(cfg) as (ledger, signals):  # the next pass, another connection's view
            assert isinstance(ledger, PgLedger)
            with (tmp_path / "trace").open("w+") as trace:
                ledger.conn.pgconn.trace(trace.fileno())
                got = ledger.reads(NOW.replace(day=1), timedelta(seconds=90), signals)
                ledger.conn.pgconn.untrace()
                trace.seek(0)
                sides = [line.split("\t")[1] for line in trace if line.count("\t") >= 2]
            checks = ledger.offering_checks([("ewr", PRICE.plan)], NOW, TTL)
    finally:
        store.close()
    assert got.marks == (OfferingMark("ewr", PRICE.plan, until, "sold out", 2),)
    assert sum(1 for a, b in zip(sides, sides[1:], strict=False) if (a, b) == ("F", "B")) == 1
    (check,) = checks.values()
    assert (check.listed, check.usable) == (False, False)
    assert check.problem == "plan 'vc2-1c-2gb' is not offered in region 'ewr'"
    with psycopg.connect(db_url, autocommit=True) as conn:  # another fleet's are its own
        assert plan_checks.marks(conn.execute(plan_checks.MARKS, ("other",)).fetchall()) == ()
