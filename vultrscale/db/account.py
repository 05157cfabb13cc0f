"""The account's records across fleets (``ports.AccountLedger``): the other fleets' ledger
rows, the account's lock, and the fleets the database holds that no config file describes.

Every fleet of one Vultr account shares the database (docs/fleets.md), so
the account's spend is the sum of every fleet's ledger, and two scaler processes on two hosts
coordinate through it as two fleets in one process do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from vultrscale.core.model import LedgerRow
from vultrscale.db import pg
from vultrscale.db.rows import COLUMNS, ledger_rows

# The account's lock: a namespace of its own (the pass lock's is "VSL", the snapshot's "VSN"),
# one key for the whole database.
_NAMESPACE = 0x56534D  # "VSM"
_KEY = 0

# Served by fleet_instances_live_idx and fleet_instances_gone_idx (schema v11): the live rows
# and those gone this month, whatever the ledger's length.
_OTHERS = (
    f"SELECT {COLUMNS} FROM fleet_instances WHERE fleet <> %(fleet)s AND state <> 'gone' "
    f"UNION ALL SELECT {COLUMNS} FROM fleet_instances WHERE fleet <> %(fleet)s "
    "AND state = 'gone' AND gone_at >= %(since)s"
)


def others(conn: psycopg.Connection[Any], fleet: str, since: datetime) -> list[LedgerRow]:
    """Every fleet's rows but ``fleet``'s: those not gone, and those gone since ``since``."""
    with conn.cursor(binary=True) as cur:
        return ledger_rows(cur.execute(_OTHERS, {"fleet": fleet, "since": since}))


def lock(conn: psycopg.Connection[Any], wait_s: float) -> bool:
    """Take the account's session lock on ``conn``, waiting at most ``wait_s``."""
    try:
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = {max(1, int(wait_s * 1000))}")
            conn.execute("SELECT pg_advisory_lock(%s, %s)", (_NAMESPACE, _KEY))
    except psycopg.errors.LockNotAvailable:
        return False
    return True  # a session lock: it outlives the transaction that took it


def unlock(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pg_advisory_unlock(%s, %s)", (_NAMESPACE, _KEY))


@dataclass(frozen=True)
class Orphans:
    """Instances the ledger holds (not gone) for a fleet no config file describes: left
    running when its file was removed; nothing deletes them."""

    fleet: str
    instances: int
    labels: tuple[str, ...]
    oldest: datetime | None
    month_to_date_usd: float = 0.0


def orphans(conn: psycopg.Connection[Any], known: Sequence[str]) -> list[Orphans]:
    """By fleet, the instances not gone of every fleet not in ``known``."""
    rows = conn.execute(
        "SELECT fleet, count(*), array_agg(label ORDER BY created_at), min(created_at) "
        "FROM fleet_instances WHERE state <> 'gone' AND NOT (fleet = ANY(%s)) "
        "GROUP BY fleet ORDER BY fleet",
        (list(known),),
    ).fetchall()
    return [Orphans(r[0], int(r[1]), tuple(r[2]), r[3]) for r in rows]


class PgAccount:
    """The AccountLedger port on the pass's own connection (its lock goes with the session:
    a scaler killed mid-pass frees it with its connection)."""

    def __init__(self, conn: psycopg.Connection[Any], fleet: str, url: str = "") -> None:
        self.conn, self.fleet, self.url = conn, fleet, url

    def others(self, since: datetime) -> list[LedgerRow]:
        with pg.translated("account: reading the other fleets' instances", self.url):
            return others(self.conn, self.fleet, since)

    def lock(self, wait_s: float) -> bool:
        with pg.translated("account: taking the account's lock", self.url):
            return lock(self.conn, wait_s)

    def unlock(self) -> None:
        with pg.translated("account: releasing the account's lock", self.url):
            unlock(self.conn)
