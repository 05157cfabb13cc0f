"""The Store's kept connection (``PgStore(keep=True)``, used by `reconcile --loop` and
`status --watch`): reused pass after pass, never carrying a lock or a transaction across,
replaced when it broke in between."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from vultrscale.config import Config, Offering
from vultrscale.core.clock import Deadline
from vultrscale.core.model import PlanPrice, StoredReads
from vultrscale.db import pg, queue
from vultrscale.db import signals as signals_mod
from vultrscale.db.ledger import (
    extend_pass_lock,
    lock_holder,
    lock_key,
    take_pass_lock,
    try_lock,
)
from vultrscale.db.store import PgLedger, PgStore
from vultrscale.errors import DatabaseError, PassStuck
from vultrscale.rules.offerings import Choice
from vultrscale.ssh import fan_out_bound_s

MONTH = datetime(2026, 3, 1, tzinfo=UTC)
WORKERS_SEEN = timedelta(seconds=90)


@pytest.fixture
def cfg() -> Config:
    return Config()


@pytest.fixture
def store(db_url: str) -> Iterator[PgStore]:
    store = PgStore(db_url, keep=True)
    yield store
    store.close()


def _backend(ledger: Any) -> int:
    assert isinstance(ledger, PgLedger)
    row = ledger.conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def test_a_kept_connection_serves_the_next_pass_and_holds_no_lock_between(
    store: PgStore, cfg: Config, db_url: str
) -> None:
    with store.session(cfg) as (ledger, _signals):
        assert ledger.lock()
        first = _backend(ledger)
        with psycopg.connect(db_url, autocommit=True) as other:
            assert not try_lock(other, cfg.fleet.name)  # held while the pass runs
    with psycopg.connect(db_url, autocommit=True) as other:
        held = other.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s",
            (lock_key(cfg.fleet.name),),
        ).fetchone()
        assert held == (0,)  # released when the session ended, though the connection lives on
    with store.session(cfg) as (ledger, _signals):
        assert _backend(ledger) == first
        assert ledger.lock()


def test_a_kept_connection_killed_between_passes_is_replaced_before_the_pass_uses_it(
    store: PgStore, cfg: Config, db_url: str
) -> None:
    with store.session(cfg) as (ledger, _signals):
        first = _backend(ledger)
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (first,))
    with store.session(cfg) as (ledger, _signals):
        assert ledger.lock()
        assert _backend(ledger) != first


def test_a_session_left_inside_a_transaction_is_closed_not_kept(
    store: PgStore, cfg: Config
) -> None:
    with store.session(cfg) as (ledger, _signals):
        first = _backend(ledger)
        assert isinstance(ledger, PgLedger)
        ledger.conn.execute("BEGIN")  # as if a pass died inside one
        kept = ledger.conn
    assert kept.closed
    with store.session(cfg) as (ledger, _signals):
        assert _backend(ledger) != first


def test_without_keep_every_session_has_its_own_connection(db_url: str, cfg: Config) -> None:
    store = PgStore(db_url)
    with store.session(cfg) as (ledger, _signals):
        assert isinstance(ledger, PgLedger)
        conn = ledger.conn
    assert conn.closed


def test_the_pass_connection_bounds_statements_and_ends_a_silent_network(
    store: PgStore, cfg: Config
) -> None:
    with store.session(cfg) as (ledger, _signals):
        assert isinstance(ledger, PgLedger)
        assert ledger.conn.execute("SHOW statement_timeout").fetchone() == ("30s",)
        params = dict(ledger.conn.info.get_parameters())
    assert params.get("keepalives") == "1" and params.get("tcp_user_timeout") == "10000"


def test_a_pass_stuck_behind_a_lock_fails_within_the_bound_and_frees_the_fleet_lock(
    db_url: str, cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session holding the ledger's table (a migration, a hand-run LOCK): the pass's read
    ends in a DatabaseError saying why, not a wait as long as the lock, and the fleet's lock is
    free for the next pass (`--loop` goes on)."""
    monkeypatch.setattr(pg, "PASS_STALL_S", 1.0)
    store = PgStore(db_url, keep=True)
    with psycopg.connect(db_url) as blocker:  # not autocommit: the lock lasts until rollback
        blocker.execute("LOCK TABLE fleet_instances IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(DatabaseError) as caught, store.session(cfg) as (ledger, _signals):
            assert ledger.lock()
            ledger.reads(MONTH, WORKERS_SEEN, _signals)  # the pass's read: in pipeline mode
        assert "statement timeout" in caught.value.message
        assert caught.value.hint == pg.HINT_STALLED
        with psycopg.connect(db_url, autocommit=True) as other:
            assert try_lock(other, cfg.fleet.name)  # the pass's lock went with its session
            # Released here, not by the close: a closed session's backend lets go of its locks
            # a moment later, and the pass below took the lock first 1 time in 6.
            other.execute("SELECT pg_advisory_unlock_all()")
        blocker.rollback()
    with store.session(cfg) as (ledger, _signals):
        assert ledger.lock() and ledger.reads(MONTH, WORKERS_SEEN, _signals).rows == []
    store.close()


def _two_instances_one_worker(ledger: Any, at: datetime) -> None:
    assert isinstance(ledger, PgLedger)
    choice = Choice(Offering("ewr", "vc2-1c-1gb"), PlanPrice("vc2-1c-1gb", 5.0, 0.007), 2)
    for label in ("w-1", "w-2"):
        ledger.insert_intent(label, choice, "", at)
    queue.register_worker(ledger.conn, "w-1:1", "w-1")
    queue.enqueue(ledger.conn, [{}] * 3)
    ledger.save_fleet_state(at, last_scale_up=at, last_scale_down=None, idle_since=None)


def test_a_pass_reads_the_ledger_and_the_signals_together_as_one_by_one(
    store: PgStore, cfg: Config
) -> None:
    at = datetime(2026, 3, 2, tzinfo=UTC)
    with store.session(cfg) as (ledger, signals):
        _two_instances_one_worker(ledger, at)
        together = ledger.reads(MONTH, WORKERS_SEEN, signals)
        assert [r.label for r in together.rows] == ["w-1", "w-2"]
        assert set(together.workers) == {"w-1"} and together.state.last_scale_up == at
        assert together.signals is not None and together.signals.ready == 3
        apart = StoredReads(
            ledger.rows(MONTH), ledger.workers(WORKERS_SEEN), ledger.fleet_state(), signals.read()
        )
        assert _same(together, apart)
    with store.session(cfg) as (ledger, signals):  # the kept connection left idle, usable
        assert ledger.lock() and _same(ledger.reads(MONTH, WORKERS_SEEN, signals), together)


def test_a_pass_reads_the_fleets_newest_boots_of_earlier_months_too(
    store: PgStore, cfg: Config
) -> None:
    at = datetime(2026, 3, 2, tzinfo=UTC)
    with store.session(cfg) as (ledger, signals):
        _two_instances_one_worker(ledger, at)
        assert isinstance(ledger, PgLedger)
        # Booted in 5 and 7 minutes, long gone (last month: not among the month's rows); one
        # never came up, one was adopted (never POSTed here), one is older than the window.
        for label, days_ago, posted, boot_min in [
            ("b-5", 20, True, 5), ("b-7", 10, True, 7), ("never", 9, True, None),
            ("adopted", 9, False, 1), ("ancient", 60, True, 1),
        ]:  # fmt: skip
            ledger.conn.execute(
                "INSERT INTO fleet_instances (label, fleet, state, created_at, posted_at,"
                " running_at, state_since, gone_at) VALUES (%(l)s, %(f)s, 'gone',"
                " now() - make_interval(days => %(d)s), CASE WHEN %(p)s THEN now() END,"
                " now() - make_interval(days => %(d)s) + make_interval(mins => %(b)s),"
                " now(), now() - make_interval(days => %(d)s - 1))",
                {"l": label, "f": cfg.fleet.name, "d": days_ago, "p": posted, "b": boot_min},
            )
        got = ledger.reads(datetime.now(UTC), WORKERS_SEEN, signals)
    assert [r.label for r in got.boots] == ["b-7", "b-5"]  # newest first
    assert not any(r.label in ("b-5", "b-7") for r in got.rows)


def _same(a: StoredReads, b: StoredReads) -> bool:
    """Equal, but for the oldest ready job's age: it grows between two reads."""
    assert a.signals is not None and b.signals is not None
    age = b.signals.oldest_ready_seconds
    assert abs(a.signals.oldest_ready_seconds - age) < 60
    return replace(a, signals=replace(a.signals, oldest_ready_seconds=age)) == b


def test_a_pass_reads_the_ledger_and_the_signals_in_one_round_trip(
    store: PgStore, cfg: Config, tmp_path: Path
) -> None:
    """Counted in libpq's own trace of the protocol: the client's messages, then the server's,
    once. Read one by one they took seven (BEGIN, SET, the signals, COMMIT, rows, workers,
    state): each a wait on a busy database server."""
    with store.session(cfg) as (ledger, signals):
        _two_instances_one_worker(ledger, datetime(2026, 3, 2, tzinfo=UTC))
        assert isinstance(ledger, PgLedger)
        with (tmp_path / "trace").open("w+") as trace:
            ledger.conn.pgconn.trace(trace.fileno())
            got = ledger.reads(MONTH, WORKERS_SEEN, signals)
            ledger.conn.pgconn.untrace()
            trace.seek(0)
            sides = [line.split("\t")[1] for line in trace if line.count("\t") >= 2]
    assert got.signals is not None and len(got.rows) == 2
    assert sides and {"F", "B"} == set(sides)
    assert sum(1 for a, b in zip(sides, sides[1:], strict=False) if (a, b) == ("F", "B")) == 1


def test_a_pass_cut_short_by_ctrl_c_inside_its_read_still_records_itself(
    cfg: Config, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36: a Ctrl-C (a real SIGINT) in the pass's one round trip left the signals'
    read-only transaction open; the pass's row was then refused ("cannot execute INSERT in a
    read-only transaction") and the pass went unrecorded, the process exiting 130 all the same."""
    import signal

    from vultrscale.core.clock import FakeClock
    from vultrscale.memory import MemoryCloud, MemoryDrain, host_keys
    from vultrscale.ports import Parts
    from vultrscale.reconcile import run_pass

    send = signals_mod._send

    def ctrl_c_mid_read(conn: Any, statement: Any) -> Any:
        signal.raise_signal(signal.SIGINT)  # after the read's BEGIN ... READ ONLY, before COMMIT
        return send(conn, statement)

    monkeypatch.setattr(signals_mod, "_send", ctrl_c_mid_read)
    clock = FakeClock(datetime(2026, 3, 2, tzinfo=UTC))
    parts = Parts(
        cloud=MemoryCloud(clock),
        store=PgStore(db_url),
        drain=MemoryDrain(),
        clock=clock,
        keygen=host_keys(),
        render_user_data=lambda label, private, public: "#cloud-config\n",
    )
    with pytest.raises(KeyboardInterrupt):
        run_pass(cfg, parts)
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute("SELECT exit_code, errors FROM fleet_events").fetchall()
    assert rows == [(130, ["interrupted (SIGINT) before the pass finished"])]


def test_signals_that_cannot_be_read_leave_the_ledger_read_and_the_connection_usable(
    store: PgStore, cfg: Config, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signals fail in the pipeline (here: cancelled behind a lock on the jobs table), which
    skips the statements after them: the ledger is read all the same, the signals' error says
    why, and the connection is out of the failed transaction."""
    monkeypatch.setattr(signals_mod, "STATEMENT_TIMEOUT_MS", 200)
    at = datetime(2026, 3, 2, tzinfo=UTC)
    with store.session(cfg) as (ledger, signals):
        _two_instances_one_worker(ledger, at)
        with psycopg.connect(db_url) as blocker:  # not autocommit: held until rollback
            blocker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            got = ledger.reads(MONTH, WORKERS_SEEN, signals)
            blocker.rollback()
        assert [r.label for r in got.rows] == ["w-1", "w-2"] and set(got.workers) == {"w-1"}
        assert got.signals is None and got.signal_error is not None
        assert "cancelled" in got.signal_error.message
        assert isinstance(ledger, PgLedger)
        assert ledger.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        again = ledger.reads(MONTH, WORKERS_SEEN, signals)
        assert again.signal_error is None and again.signals is not None
        assert again.signals.ready == signals.read().ready == 3


def test_a_pass_whose_queue_preset_finds_no_tables_holds_and_exits_2(db_url: str) -> None:
    """queue.preset = "procrastinate" on a database without Procrastinate's tables: the fleet
    holds (nothing created, even below the floor), the pass says which table and which
    versions, and ends as a configuration error."""
    from dataclasses import replace

    from vultrscale.config import PolicyConfig, QueueConfig
    from vultrscale.core.clock import FakeClock
    from vultrscale.memory import MemoryCloud, MemoryDrain, host_keys
    from vultrscale.ports import Parts
    from vultrscale.reconcile import run_pass

    clock = FakeClock(datetime(2026, 3, 2, tzinfo=UTC))
    parts = Parts(
        cloud=MemoryCloud(clock),
        store=PgStore(db_url),
        drain=MemoryDrain(),
        clock=clock,
        keygen=host_keys(),
        render_user_data=lambda label, private, public: "#cloud-config\n",
    )
    cfg = replace(
        Config(), queue=QueueConfig(preset="procrastinate"), policy=PolicyConfig(min_instances=1)
    )
    result = run_pass(cfg, parts)
    assert result.exit_code == 2
    assert result.plan is not None and result.plan.creates == 0
    (error,) = result.errors
    assert "procrastinate_" in error and "Procrastinate 3.1 to 3.10" in error, error


# --- a lock held too long ----------------------------------------------------------------------


def _hold(conn: psycopg.Connection[Any], fleet: str, *, ago_s: int, deadline_s: float) -> int:
    """Take the fleet's lock as a pass that took it ``ago_s`` seconds ago; its backend pid."""
    assert take_pass_lock(conn, fleet, deadline_s)
    row = conn.execute(
        "SELECT set_config('application_name', "
        "%s || (extract(epoch FROM now())::bigint - %s), false), pg_backend_pid()",
        (f"vultrscale pass: deadline {deadline_s:g}s, since ", ago_s),
    ).fetchone()
    assert row is not None
    return int(row[1])


def test_a_lock_held_past_the_holders_deadline_is_reported_as_stuck(
    store: PgStore, cfg: Config, db_url: str
) -> None:
    # Before: a pass frozen while holding the lock made every later pass say "another pass
    # holds the lock; nothing to do" and exit 0, for as long as it lasted.
    with psycopg.connect(db_url, autocommit=True) as holder:
        pid = _hold(holder, cfg.fleet.name, ago_s=200, deadline_s=30)
        with store.session(cfg) as (ledger, _signals), pytest.raises(PassStuck) as info:
            ledger.lock()
    assert info.value.exit_code == 1
    assert re.search(r"held the lock of fleet 'workers' for (199|200|201)s", info.value.message)
    assert "past the 90s a pass may take" in info.value.message  # its 30 s and the margin
    assert f"pg_terminate_backend({pid})" in info.value.hint


@pytest.mark.parametrize(
    ("ago_s", "deadline_s"),
    [(5, 30), (85, 30), (200, 300)],
    ids=["just-taken", "within-deadline-and-margin", "its-own-longer-deadline"],
)
def test_a_lock_held_by_a_pass_that_may_still_be_working_is_left_alone(
    store: PgStore, cfg: Config, db_url: str, ago_s: int, deadline_s: float
) -> None:
    with psycopg.connect(db_url, autocommit=True) as holder:
        _hold(holder, cfg.fleet.name, ago_s=ago_s, deadline_s=deadline_s)
        with store.session(cfg) as (ledger, _signals):
            assert not ledger.lock()


def test_a_pass_shows_its_deadline_while_it_holds_the_lock_and_not_after(
    store: PgStore, cfg: Config, db_url: str
) -> None:
    with store.session(cfg) as (ledger, _signals):
        assert ledger.lock()
        with psycopg.connect(db_url, autocommit=True) as other:
            holder = lock_holder(other, cfg.fleet.name)
        assert holder is not None and holder.deadline_s == 30.0
        assert holder.held_s is not None and 0 <= holder.held_s < 5
        pid = _backend(ledger)
    with psycopg.connect(db_url, autocommit=True) as other:
        row = other.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
    assert row is not None and not row[0].startswith("vultrscale pass")  # the kept one, reset


def test_a_pass_draining_many_hosts_past_its_deadline_is_not_taken_for_stuck(
    store: PgStore, cfg: Config, db_url: str
) -> None:
    # Before: the holder showed only its 30 s deadline, so a healthy pass still in the SSH of
    # a 100-host scale-in (SSH is not under the deadline) was reported stuck after 90 s, exit 1
    # and its session named for pg_terminate_backend.
    with psycopg.connect(db_url, autocommit=True) as holder:
        _hold(holder, cfg.fleet.name, ago_s=150, deadline_s=30)
        PgLedger(holder, cfg.fleet.name).extend_lock(fan_out_bound_s(100))
        with store.session(cfg) as (ledger, _signals):
            assert not ledger.lock()
        with psycopg.connect(db_url, autocommit=True) as other:
            shown = lock_holder(other, cfg.fleet.name)
    assert shown is not None and shown.deadline_s is not None
    assert shown.deadline_s >= 150 + fan_out_bound_s(100)


def test_extending_the_lock_never_shortens_it_and_needs_the_lock(cfg: Config, db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        extend_pass_lock(conn, 500)  # holds no lock: its own application_name is left alone
        row = conn.execute("SELECT current_setting('application_name')").fetchone()
        assert row is not None and not row[0].startswith("vultrscale pass")
        _hold(conn, cfg.fleet.name, ago_s=10, deadline_s=300)
        extend_pass_lock(conn, 5)
        with psycopg.connect(db_url, autocommit=True) as other:
            shown = lock_holder(other, cfg.fleet.name)
    assert shown is not None and shown.deadline_s == 300


def test_a_lock_held_in_another_database_of_the_server_is_not_this_fleets(
    store: PgStore, cfg: Config, db_url: str, pg_url: str
) -> None:
    # Before: pg_locks is the whole server's, and the holder was looked up by key alone: a
    # fleet of the same name in another database (staging beside production, another
    # checkout's tests) was taken for this one's holder, its age judged and its pid named.
    with psycopg.connect(pg_url, autocommit=True) as elsewhere:
        _hold(elsewhere, cfg.fleet.name, ago_s=600, deadline_s=30)
        with psycopg.connect(db_url, autocommit=True) as here:
            assert lock_holder(here, cfg.fleet.name) is None
        with store.session(cfg) as (ledger, _signals):
            assert ledger.lock()  # the lock of this database is free


def test_each_pass_of_a_loop_gets_its_own_deadline_not_the_last_ones_expired_one(
    cfg: Config, db_url: str
) -> None:
    now = [1000.0]
    deadline = Deadline(30.0, monotonic=lambda: now[0])
    store = PgStore(db_url, keep=True, deadline=deadline)
    try:
        with store.session(cfg) as (ledger, _signals):
            assert ledger.lock()
            now[0] += 45.0  # the first pass ran out of its time
            assert (deadline.remaining() or 0) < 0
        assert deadline.remaining() is None  # between passes: no pass runs
        with store.session(cfg) as (ledger, _signals):
            assert ledger.lock()
            assert deadline.remaining() == 30.0
    finally:
        store.close()


@pytest.mark.parametrize("keep", [False, True], ids=["one-shot", "kept"])
def test_the_fleet_lock_is_free_the_moment_a_session_ends(
    db_url: str, cfg: Config, keep: bool
) -> None:
    """The next pass (cron's, the loop's, a test's) must not find the lock of one that has
    returned. Closing a connection only asks its server process to end; the lock went with it
    some milliseconds later, and a pass run right after found "lock held" and did nothing."""
    store = PgStore(db_url, keep=keep)
    with psycopg.connect(db_url, autocommit=True) as other:
        for attempt in range(30):
            with store.session(cfg) as (ledger, _signals):
                assert ledger.lock()
            assert try_lock(other, cfg.fleet.name), f"still held after session {attempt + 1}"
            other.execute("SELECT pg_advisory_unlock_all()")
    store.close()
