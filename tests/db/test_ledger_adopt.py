"""The Postgres ledger's adoption of a tagged stranger under a label a gone row has: the gone
row and its cost stay (under its retired label), the new row starts afresh."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from vultrscale.config import Offering
from vultrscale.core.model import InstanceState, LedgerRow, PlanPrice
from vultrscale.db import ledger, store
from vultrscale.rules import budget
from vultrscale.rules.decision import Adopt, Move
from vultrscale.rules.offerings import Choice

T0 = datetime(2026, 5, 10, 9, 0, tzinfo=UTC)


def _adopt(
    conn: psycopg.Connection,
    iid: str,
    created: datetime,
    fleet: str = "workers",
    label: str = "worker-by-hand",
    state: InstanceState = InstanceState.BOOTING,
    now: datetime | None = None,
) -> None:
    step = _step(label, iid, state, created)
    ledger.adopt(conn, fleet, step, now or created + timedelta(minutes=1))


PRICE = PlanPrice("vc2-1c-2gb", 10.0, 0.015)


def _step(label: str, iid: str, state: InstanceState, created: datetime) -> Adopt:
    return Adopt(label, "adopted", iid, state, "vc2-1c-2gb", "ewr", created, PRICE)


def test_a_label_used_again_after_its_instance_went_keeps_the_gone_row_and_starts_afresh(
    db_url: str,
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        _adopt(conn, "hand-1", T0)
        conn.execute(
            "UPDATE fleet_instances SET host_key = 'ssh-ed25519 AAAAold' WHERE label = %s",
            ("worker-by-hand",),
        )
        ledger.transition(
            conn, "worker-by-hand", InstanceState.RUNNING, T0 + timedelta(hours=1), fleet="workers"
        )
        ledger.transition(
            conn, "worker-by-hand", InstanceState.GONE, T0 + timedelta(hours=3), fleet="workers"
        )
        later = T0 + timedelta(hours=4)
        _adopt(conn, "hand-2", later)

        rows = {r.label: r for r in ledger.rows(conn, "workers", since=budget.month_bounds(T0)[0])}
    assert set(rows) == {"worker-by-hand", "worker-by-hand@hand-1"}
    old, new = rows["worker-by-hand@hand-1"], rows["worker-by-hand"]
    assert (old.state, old.created_at, old.gone_at) == (
        InstanceState.GONE,
        T0,
        T0 + timedelta(hours=3),
    )
    # nothing of the gone instance carries over: its creation, stamps and pinned key
    assert (new.instance_id, new.state, new.created_at) == ("hand-2", InstanceState.BOOTING, later)
    assert (new.running_at, new.gone_at, new.host_key) == (None, None, None)
    bills = budget.ledger_bills([new, old], None, later + timedelta(minutes=30))
    assert bills == {"worker-by-hand": 0.015, "worker-by-hand@hand-1": 3 * 0.015}


def test_adoption_leaves_another_fleets_live_row_alone_and_records_its_own_apart(
    db_url: str,
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        _adopt(conn, "theirs-1", T0, fleet="other")
        _adopt(conn, "ours-1", T0 + timedelta(hours=1))
        (theirs,) = ledger.rows(conn, "other")
        (ours,) = ledger.rows(conn, "workers")
    assert (theirs.label, theirs.instance_id, theirs.created_at) == (
        "worker-by-hand",
        "theirs-1",
        T0,
    )
    # the name lifecycle.by_label gives a label two instances share
    assert (ours.label, ours.instance_id) == ("worker-by-hand@ours-1", "ours-1")


@pytest.mark.parametrize("label", ["worker-by-hand", "worker-renamed"])
def test_an_instance_taken_for_gone_and_listed_again_gets_its_own_row_back(
    db_url: str, label: str
) -> None:
    """The list missed it long enough for the pass to mark it gone; listed again, it is
    adopted: its own row comes back (instance_id is unique: a second row could not be
    written, and every later pass failed on it)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        _adopt(conn, "hand-1", T0)
        conn.execute("UPDATE fleet_instances SET host_key = 'ssh-ed25519 AAAAown'")
        ledger.transition(
            conn, "worker-by-hand", InstanceState.RUNNING, T0 + timedelta(hours=1), fleet="workers"
        )
        ledger.transition(
            conn, "worker-by-hand", InstanceState.GONE, T0 + timedelta(hours=2), fleet="workers"
        )
        # listed again, under Vultr's label now (renamed by hand, or not)
        _adopt(
            conn,
            "hand-1",
            T0,
            label=label,
            state=InstanceState.RUNNING,
            now=T0 + timedelta(hours=3),
        )
        (row,) = ledger.rows(conn, "workers", since=budget.month_bounds(T0)[0])
    assert (row.label, row.instance_id, row.state) == (label, "hand-1", InstanceState.RUNNING)
    assert (row.created_at, row.gone_at, row.host_key) == (T0, None, "ssh-ed25519 AAAAown")


def test_an_instance_adopted_running_is_stamped_as_having_run(db_url: str) -> None:
    """Adopted already running, it has run: a later fall-back to booting (its worker quiet)
    counts boot_timeout from then (``LedgerRow.boot_since``), not from its creation at Vultr,
    as the in-memory ledger does. Its own gone row coming back running is stamped once too."""
    adopted = T0 + timedelta(hours=2)
    with psycopg.connect(db_url, autocommit=True) as conn:
        _adopt(conn, "hand-1", T0, state=InstanceState.RUNNING, now=adopted)
        _adopt(conn, "hand-2", T0, label="worker-booting", now=adopted)
        _adopt(conn, "hand-3", T0, label="worker-back", now=adopted)
        ledger.transition(conn, "worker-back", InstanceState.GONE, adopted, fleet="workers")
        back = adopted + timedelta(hours=1)
        _adopt(conn, "hand-3", T0, label="worker-back", state=InstanceState.RUNNING, now=back)
        rows = {r.label: r for r in ledger.rows(conn, "workers", since=T0)}
        ledger.transition(conn, "worker-by-hand", InstanceState.BOOTING, back, fleet="workers")
        (quiet,) = [
            r for r in ledger.rows(conn, "workers", since=T0) if r.label == "worker-by-hand"
        ]
    assert rows["worker-by-hand"].running_at == adopted
    assert rows["worker-booting"].running_at is None
    assert rows["worker-back"].running_at == back
    assert quiet.boot_since == back


def test_an_adopted_row_has_no_post_of_ours_and_an_intent_found_booting_has_one(
    db_url: str,
) -> None:
    """boot_timeout counts from the adoption of a stranger, pending or booting at Vultr (no
    ``posted_at``: this scaler never POSTed it), and from the create for an intent whose POST's
    answer was lost and that the list then showed booting (stamped as it left CREATING)."""
    adopted, found = T0 + timedelta(hours=2), T0 + timedelta(minutes=2)
    with psycopg.connect(db_url, autocommit=True) as conn:
        _adopt(conn, "hand-1", T0, state=InstanceState.PENDING, now=adopted)
        choice = Choice(Offering("ewr", "vc2-1c-2gb"), PRICE, 1)
        ledger.insert_intent(
            conn, "workers", "worker-lost-answer", choice, "ssh-ed25519 AAAAours", T0
        )
        ledger.transition(
            conn,
            "worker-lost-answer",
            InstanceState.BOOTING,
            found,
            fleet="workers",
            instance_id="ours-1",
        )
        ledger.transition(conn, "worker-by-hand", InstanceState.BOOTING, adopted, fleet="workers")
        ledger.transition(  # a second transition keeps the first stamp
            conn,
            "worker-lost-answer",
            InstanceState.RUNNING,
            found + timedelta(minutes=1),
            fleet="workers",
        )
        rows = {r.label: r for r in ledger.rows(conn, "workers", since=T0)}
    stranger, ours = rows["worker-by-hand"], rows["worker-lost-answer"]
    assert (stranger.posted_at, stranger.boot_since) == (None, adopted)
    assert (ours.posted_at, ours.created_at) == (found, T0)
    # the in-memory rule (LedgerRow.moved) stamps the same
    intent = LedgerRow.new("w", "workers", InstanceState.CREATING, T0)
    assert intent.moved(InstanceState.BOOTING, found).posted_at == found
    assert intent.moved(InstanceState.BOOTING, found).boot_since == T0


# --- one rule for both ledgers ---------------------------------------------------------------

_H = timedelta(hours=1)
# (what happens, in order): ("adopt", instance id, label, hours in) or ("gone", label, hours in)
_HISTORIES = {
    "a-label-used-again": [
        ("adopt", "hand-1", "w", 0), ("gone", "w", 2), ("adopt", "hand-2", "w", 3)
    ],
    "taken-for-gone-then-listed-again": [
        ("adopt", "hand-1", "w", 0), ("gone", "w", 2), ("adopt", "hand-1", "w-renamed", 3)
    ],
    "listed-again-under-a-label-a-later-one-took": [
        ("adopt", "hand-1", "w", 0), ("gone", "w", 1), ("adopt", "hand-2", "w", 2),
        ("adopt", "hand-1", "w", 3),
    ],
    "listed-again-under-a-label-a-later-gone-one-has": [
        ("adopt", "hand-1", "w", 0), ("gone", "w", 1), ("adopt", "hand-2", "w", 2),
        ("gone", "w", 3), ("adopt", "hand-1", "w", 4),
    ],
}  # fmt: skip


def _rows_after(ledger_port: object, history: list[tuple]) -> list[tuple]:
    for step in history:
        if step[0] == "adopt":
            _, iid, label, hours = step
            step = _step(label, iid, InstanceState.RUNNING, T0)
            ledger_port.adopt(step, T0 + hours * _H)  # type: ignore[attr-defined]
        else:
            _, label, hours = step
            gone = Move(label, "gone", InstanceState.GONE)
            ledger_port.transition(gone, T0 + hours * _H)  # type: ignore[attr-defined]
    rows = ledger_port.rows(since=budget.month_bounds(T0)[0])  # type: ignore[attr-defined]
    return sorted(
        (r.label, r.instance_id, r.state, r.created_at, r.state_since, r.running_at, r.gone_at)
        for r in rows
    )


@pytest.mark.parametrize("history", list(_HISTORIES.values()), ids=list(_HISTORIES))
def test_the_postgres_and_the_in_memory_ledger_adopt_alike(db_url: str, history: list) -> None:
    from vultrscale.memory import MemoryLedger

    with psycopg.connect(db_url, autocommit=True) as conn:
        pg = store.PgLedger(conn, "workers")
        in_pg = _rows_after(pg, history)
    assert in_pg == _rows_after(MemoryLedger("workers"), history)
