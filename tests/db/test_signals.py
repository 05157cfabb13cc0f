"""Queue signals against real Postgres: our schema, the real Procrastinate and PgQueuer, custom SQL.

The foreign presets are checked against the libraries themselves: they create their own schema,
jobs are deferred/enqueued and run (or dequeued) with their own APIs, and our numbers are
compared with what their own APIs report.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from vultrscale.config import BudgetConfig, Config, PolicyConfig, QueueConfig, WaitTarget
from vultrscale.core.model import Instance, InstanceState, Observation, PlanPrice, Signals
from vultrscale.db import history
from vultrscale.db import queue as queue_mod
from vultrscale.db import signals as signals_mod
from vultrscale.db.presets import builtin
from vultrscale.db.signals import explain_ready_count, read_signals
from vultrscale.errors import ConfigError, DatabaseError, QueueSchemaError
from vultrscale.rules import waits
from vultrscale.rules.policy import decide

# --- vultrscale preset ---------------------------------------------------------------------------


def _job(conn: psycopg.Connection, queue: str, state: str, run_at: str = "now()") -> int:
    row = conn.execute(
        f"INSERT INTO jobs (queue, state, run_at, attempts, finished_at) VALUES (%s, %s, {run_at},"
        " CASE WHEN %s = 'ready' THEN 0 ELSE 1 END,"
        " CASE WHEN %s IN ('succeeded', 'failed', 'dead') THEN now() END) RETURNING id",
        (queue, state, state, state),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _lease(conn: psycopg.Connection, job_id: int, worker: str, expires: str) -> None:
    conn.execute(
        "INSERT INTO job_leases (job_id, worker_id, expires_at, token)"
        f" VALUES (%s, %s, {expires}, %s)",
        (job_id, worker, uuid.uuid4()),
    )


@pytest.fixture
def populated(db_url: str) -> str:
    """Rows of every kind, in two queues (see the comments for what each should count as)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        # ready and due: 3 in 'default' (oldest 120 s), 1 in 'other' (300 s)
        _job(conn, "default", "ready", "now() - interval '120 seconds'")
        _job(conn, "default", "ready", "now() - interval '5 seconds'")
        _job(conn, "default", "ready")
        _job(conn, "other", "ready", "now() - interval '300 seconds'")
        # ready but not due (backoff or scheduled): not demand yet
        _job(conn, "default", "ready", "now() + interval '1 hour'")
        _job(conn, "other", "ready", "now() + interval '10 minutes'")
        # live leases: w1 holds 2, w2 holds 1 in 'default'; w3 holds 1 in 'other'
        for worker in ("w1", "w1", "w2"):
            _lease(conn, _job(conn, "default", "leased"), worker, "now() + interval '60 seconds'")
        _lease(conn, _job(conn, "other", "leased"), "w3", "now() + interval '60 seconds'")
        # expired, not reaped: 2 in 'default' (w1 and a dead w9), 1 in 'other'
        _lease(conn, _job(conn, "default", "leased"), "w1", "now() - interval '1 second'")
        _lease(conn, _job(conn, "default", "leased"), "w9", "now() - interval '10 minutes'")
        _lease(conn, _job(conn, "other", "leased"), "w9", "now() - interval '2 seconds'")
        # finished: never counted
        for state in ("succeeded", "succeeded", "failed", "dead"):
            _job(conn, "default", state, "now() - interval '1 day'")
        _job(conn, "other", "succeeded", "now() - interval '2 days'")
    return db_url


def test_vultrscale_all_queues(populated: str) -> None:
    s = read_signals(populated, QueueConfig(preset="vultrscale"))
    assert s.ready == 4
    assert s.in_flight == 4
    assert s.expired_leases == 3
    assert s.leases_by_worker == {"w1": 2, "w2": 1, "w3": 1}
    assert 300 <= s.oldest_ready_seconds < 330
    assert s.demand == 11


def test_vultrscale_one_queue(populated: str) -> None:
    s = read_signals(populated, QueueConfig(preset="vultrscale", queue="default"))
    assert s.ready == 3
    assert s.in_flight == 3
    assert s.expired_leases == 2
    assert s.leases_by_worker == {"w1": 2, "w2": 1}
    assert 120 <= s.oldest_ready_seconds < 150


def test_vultrscale_empty_queue_is_zero_not_missing(db_url: str) -> None:
    s = read_signals(db_url, QueueConfig(preset="vultrscale"))
    assert (s.ready, s.in_flight, s.expired_leases, s.oldest_ready_seconds) == (0, 0, 0, 0.0)
    assert s.leases_by_worker == {}


def _finished(conn: psycopg.Connection, queue: str, ran_s: int, ended: str, n: int = 1) -> None:
    conn.execute(
        "INSERT INTO jobs (queue, state, attempts, started_at, finished_at) "
        f"SELECT %s, 'succeeded', 1, {ended} - make_interval(secs => %s), {ended} "
        "FROM generate_series(1, %s)",
        (queue, ran_s, n),
    )


def test_vultrscale_reads_the_newest_finished_jobs_mean_run_time(db_url: str) -> None:
    window_h = int(waits.RECENT_WINDOW.total_seconds() // 3600)
    with psycopg.connect(db_url, autocommit=True) as conn:
        _finished(conn, "default", 60, "now() - interval '1 hour'", n=3)
        _finished(conn, "other", 120, "now() - interval '2 hours'")
        # Older than the window, and the newest beyond RECENT_JOBS: not counted.
        _finished(conn, "default", 600, f"now() - interval '{window_h + 1} hours'")
        _finished(conn, "default", 900, "now() - interval '3 hours'", n=waits.RECENT_JOBS)
        # Before schema v6 no start was written: no run time to tell.
        conn.execute("INSERT INTO jobs (state, finished_at) VALUES ('succeeded', now())")
    one = read_signals(db_url, QueueConfig(preset="vultrscale", queue="other"))
    assert (one.recent_jobs, one.recent_job_seconds) == (1, pytest.approx(120.0))
    every = read_signals(db_url, QueueConfig(preset="vultrscale"))
    assert every.recent_jobs == waits.RECENT_JOBS
    # The 4 newest (3 x 60 s, 1 x 120 s) and 96 of the 900 s ones.
    mean = (3 * 60 + 120 + (waits.RECENT_JOBS - 4) * 900) / waits.RECENT_JOBS
    assert every.recent_job_seconds == pytest.approx(mean)


def test_vultrscale_without_finished_jobs_has_no_mean_run_time(db_url: str) -> None:
    s = read_signals(db_url, QueueConfig(preset="vultrscale"))
    assert (s.recent_jobs, s.recent_job_seconds) == (0, None)


def test_the_newest_finished_jobs_are_read_from_their_index_not_the_table(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        _finished(conn, "default", 30, "now() - interval '1 minute'", n=20_000)
        conn.execute("ANALYZE jobs")
        plan = [
            str(r[0])
            for r in conn.execute(
                b"EXPLAIN " + builtin.recent_query(None).as_bytes(conn)
            ).fetchall()
        ]
    assert any("jobs_finished_at_idx" in line for line in plan), plan
    assert not any("Seq Scan" in line for line in plan), plan


def test_vultrscale_counts_the_jobs_enqueued_within_the_arrival_window(db_url: str) -> None:
    window_s = int(waits.ARRIVAL_WINDOW.total_seconds())
    with psycopg.connect(db_url, autocommit=True) as conn:
        for queue, ago, n in (("default", 30, 4), ("other", window_s - 60, 2)):
            conn.execute(
                "INSERT INTO jobs (queue, created_at) SELECT %s, now() - make_interval(secs => "
                "%s) FROM generate_series(1, %s)",
                (queue, ago, n),
            )
        # Enqueued before the window, finished or not: not arrivals any more.
        conn.execute(
            "INSERT INTO jobs (queue, created_at) VALUES ('default', now() - make_interval(secs "
            "=> %s))",
            (window_s + 60,),
        )
    assert read_signals(db_url, QueueConfig(preset="vultrscale")).recent_arrivals == 6
    other = read_signals(db_url, QueueConfig(preset="vultrscale", queue="other"))
    assert other.recent_arrivals == 2
    with psycopg.connect(db_url, autocommit=True) as conn, conn.pipeline():
        sent = signals_mod.send_signals(conn, QueueConfig(preset="vultrscale"))
        assert sent is not None
    assert sent.result().recent_arrivals == 6


def test_the_arrivals_are_counted_from_the_newest_pages_not_the_whole_table(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (state, created_at, finished_at) SELECT 'succeeded', now() - "
            "interval '30 days' + make_interval(secs => g), now() FROM generate_series(1, 100000) g"
        )
        conn.execute("INSERT INTO jobs (created_at) SELECT now() FROM generate_series(1, 50)")
        conn.execute("ANALYZE jobs")
        plan = [
            str(r[0])
            for r in conn.execute(
                b"EXPLAIN " + builtin.arrivals_query(None).as_bytes(conn)
            ).fetchall()
        ]
    assert any("jobs_created_at_brin" in line for line in plan), plan


def test_vultrscale_on_open_connection_leaves_it_usable(populated: str) -> None:
    with psycopg.connect(populated) as conn:  # not autocommit
        first = read_signals(conn, QueueConfig(preset="vultrscale", queue="other"))
        assert (first.ready, first.in_flight, first.expired_leases) == (1, 1, 1)
        # The read ended its transaction: a write on the same connection works.
        conn.execute(
            "UPDATE jobs SET state = 'succeeded' WHERE queue = 'other' AND state = 'ready'"
        )
        conn.commit()
        again = read_signals(conn, QueueConfig(preset="vultrscale", queue="other"))
        assert again.ready == 0
        assert again.oldest_ready_seconds == 0.0


def test_ready_count_reads_a_ready_index_by_bitmap_not_row_by_row(db_url: str) -> None:
    """20k fresh (unvacuumed) ready jobs among finished ones, with the statistics autovacuum
    would gather: the ready count of one queue, and of all, is a bitmap scan of a partial ready
    index (each heap page visited once), never an index scan (one heap visit per unvacuumed
    row) nor a sequential scan of the finished rows."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (queue, state, attempts, run_at, finished_at)"
            " SELECT 'default', 'succeeded', 1, now() - interval '2 days', now() - interval '1 day'"
            " FROM generate_series(1, 60000)"
        )
        conn.execute("VACUUM ANALYZE jobs")  # the finished rows' pages are all-visible
        conn.execute(
            "INSERT INTO jobs (queue, state, run_at)"
            " SELECT CASE WHEN g % 5 = 0 THEN 'reports' ELSE 'default' END, 'ready',"
            "        now() - (g % 600) * interval '1 second' FROM generate_series(1, 20000) g"
        )
        conn.execute("ANALYZE jobs")
        for queue in ("default", "reports", ""):
            plan = "\n".join(
                explain_ready_count(conn, QueueConfig(preset="vultrscale", queue=queue))
            )
            assert "Bitmap Heap Scan on jobs" in plan, plan
            assert "Index Scan using" not in plan and "Seq Scan" not in plan, plan
            assert "Bitmap Index Scan on jobs_ready_" in plan, plan
        # The queue's own index serves a queue that is a minority of the ready jobs.
        plan = "\n".join(
            explain_ready_count(conn, QueueConfig(preset="vultrscale", queue="reports"))
        )
        assert "Bitmap Index Scan on jobs_ready_idx" in plan, plan
        assert read_signals(conn, QueueConfig(preset="vultrscale", queue="reports")).ready == 4000


def test_closed_connection_is_a_database_error(db_url: str) -> None:
    conn = psycopg.connect(db_url)
    conn.close()
    with pytest.raises(DatabaseError, match="closed connection"):
        read_signals(conn, QueueConfig(preset="vultrscale"))


def test_connection_inside_a_transaction_is_refused(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        conn.execute("SELECT 1")  # opens a transaction
        with pytest.raises(DatabaseError, match="no transaction in progress"):
            read_signals(conn, QueueConfig(preset="vultrscale"))


# --- custom preset -------------------------------------------------------------------------------


def test_custom_preset(populated: str) -> None:
    cfg = QueueConfig(
        preset="custom",
        queue="default",
        ready_sql="SELECT count(*) FROM jobs WHERE state = 'ready' AND run_at <= now()"
        " AND (%(queue)s::text IS NULL OR queue = %(queue)s)",
        in_flight_sql="SELECT count(*) FROM job_leases WHERE expires_at > now()",
        oldest_ready_seconds_sql="SELECT 42.5",
    )
    s = read_signals(populated, cfg)
    assert (s.ready, s.in_flight, s.expired_leases, s.oldest_ready_seconds) == (3, 4, 0, 42.5)
    assert s.leases_by_worker == {}


@pytest.mark.parametrize(
    ("oldest_sql", "message"),
    [
        ("SELECT NULL::float8", "returned NULL"),
        ("SELECT 1 FROM generate_series(1, 2)", "got 2 row"),
        ("SELECT 'soon'::text", "expected a number"),
        ("SELECT 1 FROM jobs WHERE false", "got 0 row"),
        ("SELECT 'Infinity'::float8", "expected a finite number"),
    ],
    ids=["null", "two-rows", "text", "no-row", "infinity"],
)
def test_custom_no_data_is_never_zero(db_url: str, oldest_sql: str, message: str) -> None:
    cfg = QueueConfig(
        preset="custom",
        ready_sql="SELECT 0",
        in_flight_sql="SELECT 0",
        oldest_ready_seconds_sql=oldest_sql,
    )
    with pytest.raises(DatabaseError, match=message):
        read_signals(db_url, cfg)


def test_transaction_is_read_only(db_url: str) -> None:
    cfg = QueueConfig(
        preset="custom",
        ready_sql="SELECT nextval('jobs_id_seq')",  # a write: refused in a read-only transaction
        in_flight_sql="SELECT 0",
        oldest_ready_seconds_sql="SELECT 0",
    )
    with pytest.raises(DatabaseError, match="read-only transaction"):
        read_signals(db_url, cfg)


def test_custom_sql_cannot_end_the_read_only_transaction_and_write(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        queue_mod.enqueue(conn, [{}] * 3)
        before = conn.execute("SELECT count(*) FROM jobs").fetchone()
    assert before == (3,)
    cfg = QueueConfig(
        preset="custom",
        ready_sql="SELECT count(*) FROM jobs; COMMIT; DELETE FROM jobs; SELECT 1",
        in_flight_sql="SELECT 0",
        oldest_ready_seconds_sql="SELECT 0",
    )
    with pytest.raises(DatabaseError, match="multiple commands"):
        read_signals(db_url, cfg)
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == before


def test_transaction_is_repeatable_read_and_read_only(db_url: str) -> None:
    cfg = QueueConfig(
        preset="custom",
        ready_sql="SELECT (current_setting('transaction_isolation') = 'repeatable read'"
        " AND current_setting('transaction_read_only') = 'on')::int",
        in_flight_sql="SELECT 0",
        oldest_ready_seconds_sql="SELECT 0",
    )
    assert read_signals(db_url, cfg).ready == 1


def test_custom_history_queries_feed_the_wait_rule(populated: str) -> None:
    cfg = QueueConfig(
        preset="custom",
        queue="default",
        ready_sql="SELECT 3",
        in_flight_sql="SELECT 0",
        oldest_ready_seconds_sql="SELECT 0",
        recent_jobs_sql="SELECT count(*), avg(extract(epoch FROM finished_at - run_at))"
        " FROM jobs WHERE finished_at IS NOT NULL AND queue = %(queue)s",
        recent_arrivals_sql="SELECT count(*) FROM jobs WHERE created_at > now() - interval '10m'",
    )
    s = read_signals(populated, cfg)
    assert s.recent_jobs == 4 and s.recent_job_seconds == pytest.approx(86400, rel=0.01)
    assert s.recent_arrivals == 18  # every row of `populated`
    # None finished: a count of 0 and no mean is the true answer, not an error.
    empty = read_signals(populated, replace(cfg, recent_jobs_sql="SELECT 0, NULL::float8"))
    assert (empty.recent_jobs, empty.recent_job_seconds) == (0, None)
    with pytest.raises(DatabaseError, match="no mean run time for 4"):
        read_signals(populated, replace(cfg, recent_jobs_sql="SELECT 4, NULL::float8"))
    with pytest.raises(DatabaseError, match="returned NULL"):
        read_signals(populated, replace(cfg, recent_arrivals_sql="SELECT NULL::int"))
    with pytest.raises(ConfigError, match="queue.recent_arrivals_sql: required with"):
        read_signals(populated, replace(cfg, recent_arrivals_sql=""))


def test_custom_without_sql_is_a_config_error(db_url: str) -> None:
    with pytest.raises(ConfigError, match="queue.in_flight_sql"):
        read_signals(db_url, QueueConfig(preset="custom", ready_sql="SELECT 1"))


# --- errors ---------------------------------------------------------------------------------


def test_missing_table_names_it_and_hints_at_the_preset(db_url: str) -> None:
    with pytest.raises(DatabaseError) as info:
        read_signals(db_url, QueueConfig(preset="procrastinate"))
    assert "procrastinate_jobs" in info.value.message
    assert "queue.preset" in info.value.hint
    assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)


def test_a_library_preset_without_its_tables_is_exit_2_naming_table_and_versions(
    db_url: str,
) -> None:
    for preset, table, versions in (
        ("procrastinate", "procrastinate_", "Procrastinate 3.1 to 3.10"),
        ("pgqueuer", "pgqueuer", "PgQueuer 1.0 to 1.6"),
        ("graphile-worker", "graphile_worker", "graphile-worker 0.16 to 0.18"),
        ("pg-boss", "pgboss", "pg-boss 12.19 to 12.38"),
    ):
        with pytest.raises(QueueSchemaError) as info:
            read_signals(db_url, QueueConfig(preset=preset))
        assert info.value.exit_code == 2
        assert f"preset {preset}" in info.value.message and table in info.value.message
        assert versions in info.value.message, info.value.message
        assert "vultrscale queue detect" in info.value.hint


def test_missing_vultrscale_schema_hints_db_init(pg_url: str) -> None:
    with pytest.raises(DatabaseError, match='"job_leases" does not exist') as info:
        read_signals(pg_url, QueueConfig(preset="vultrscale"))
    assert "vultrscale db init" in info.value.hint


def test_unreachable_database_hides_the_password() -> None:
    url = "postgresql://scaler:Sup3rSecretPw@127.0.0.1:1/queue"
    with pytest.raises(DatabaseError) as info:
        read_signals(url, QueueConfig(preset="vultrscale"))
    text = f"{info.value.message} {info.value.hint}"
    assert "Sup3rSecretPw" not in text
    assert "scaler:***@127.0.0.1:1" in text


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # libpq echoes the bad token (urlsplit would end the password at '#');
        # libpq cannot read it at all: it is named as such, never shown
        ("postgresql://scaler:Se#cr%zzetPw@127.0.0.1:1/queue", "libpq cannot read"),
        ("host=127.0.0.1 port=1 user=scaler password=Se#cr%zzetPw", "password=***"),
    ],
    ids=["url-with-hash", "key-value"],
)
def test_a_password_libpq_echoes_is_masked_whatever_its_form(url: str, shown: str) -> None:
    with pytest.raises(DatabaseError) as info:
        read_signals(url, QueueConfig(preset="vultrscale"))
    text = f"{info.value.message} {info.value.hint}"
    assert "Se#cr" not in text and "zzetPw" not in text, text
    assert shown in text


def test_unknown_preset(db_url: str) -> None:
    with pytest.raises(ConfigError, match="unknown preset 'celery'"):
        read_signals(db_url, QueueConfig(preset="celery"))


# --- procrastinate preset (the real library) ------------------------------------------------------


def _wait_for(check, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    """Poll an async predicate until it is true or the deadline passes."""

    async def loop() -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not await check():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError("condition not reached before the deadline")
            await asyncio.sleep(0.05)

    return loop()


def test_procrastinate_preset_reads_a_3_3_schema(pg_url: str) -> None:
    """docs/queues.md promises Procrastinate >= 3.1; the event type 'retried' came in 3.4 (a
    literal of an enum value the schema lacks fails the whole read)."""
    from pathlib import Path

    import procrastinate

    migrations = Path(procrastinate.__file__).parent / "sql" / "migrations"
    upto_3_3 = sorted(p for p in migrations.glob("*.sql") if p.name < "03.04")
    assert upto_3_3 and upto_3_3[-1].name.startswith("03.03")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for path in upto_3_3:
            conn.execute(path.read_bytes())
        conn.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args) VALUES ('q', 't', '{}')"
        )
    s = read_signals(pg_url, QueueConfig(preset="procrastinate"))
    assert (s.ready, s.in_flight) == (1, 0)


def test_procrastinate_preset_matches_procrastinate(pg_url: str) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=pg_url))
    release = asyncio.Event()

    @app.task(name="noop", queue="fast")
    async def noop() -> None:
        await asyncio.sleep(0.02)  # a run time the events can tell from zero

    @app.task(name="block", queue="slow")
    async def block() -> None:
        await release.wait()

    async def scenario() -> None:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            jm = app.job_manager

            for _ in range(FINISHED):
                await noop.defer_async()  # run to completion below: the wait rule's history
            for _ in range(2):
                await block.defer_async()  # held 'doing' by a live worker
            await block.configure(schedule_in={"hours": 1}).defer_async()  # not due
            for _ in range(4):
                await noop.configure(queue="backlog").defer_async()  # ready
            await noop.configure(queue="backlog", schedule_in={"seconds": -90}).defer_async()

            # A worker that died: registered, took one job, then stopped heartbeating.
            dead_worker = await jm.register_worker()
            stalled = await jm.fetch_job(queues=["backlog"], worker_id=dead_worker)
            assert stalled is not None
            await asyncio.to_thread(
                _execute,
                pg_url,
                "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '5 minutes'"
                " WHERE id = %s",
                dead_worker,
            )

            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=["fast", "slow"],
                    concurrency=4,
                    install_signal_handlers=False,
                    fetch_job_polling_interval=0.05,
                )
            )
            try:

                async def settled() -> bool:
                    done = await jm.list_jobs_async(status="succeeded")
                    doing = await jm.list_jobs_async(status="doing", queue="slow")
                    return len(list(done)) == FINISHED and len(list(doing)) == 2

                await _wait_for(settled)

                s = await asyncio.to_thread(
                    read_signals, pg_url, QueueConfig(preset="procrastinate")
                )
                now = await asyncio.to_thread(_db_now, pg_url)
                todo = list(await jm.list_jobs_async(status="todo"))
                due = [j for j in todo if j.scheduled_at is None or j.scheduled_at <= now]
                doing = list(await jm.list_jobs_async(status="doing"))
                stalled_jobs = list(await jm.get_stalled_jobs(seconds_since_heartbeat=30))

                assert s.ready == len(due) == 4  # 4 backlog jobs; 1 more taken by the dead worker
                assert s.expired_leases == len(stalled_jobs) == 1
                assert s.in_flight == len(doing) - len(stalled_jobs) == 2
                # The live worker pruned the dead one's row at start-up (worker_id set NULL).
                stalled_ids = {j.id for j in stalled_jobs}
                assert stalled.id in stalled_ids
                live_worker_ids = {j.worker_id for j in doing if j.id not in stalled_ids}
                assert len(live_worker_ids) == 1
                assert s.leases_by_worker == {str(live_worker_ids.pop()): 2}
                # The -90 s scheduled job is the oldest ready one.
                assert 90 <= s.oldest_ready_seconds < 120

                # Procrastinate's own history: its events, for the wait rule and the replay.
                assert s.recent_jobs == FINISHED
                assert s.recent_job_seconds is not None and 0.02 <= s.recent_job_seconds < 2
                assert s.recent_arrivals == FINISHED + 2 + 1 + 4 + 1  # every deferral
                assert _wait_rule_reason(s).startswith(f"wait rule: {4 + 1} queued job(s)")
                with psycopg.connect(pg_url) as conn:
                    replay = history.finished_jobs_in(conn, timedelta(hours=1), "", PROCR)
                    buckets = history.forecast_buckets(
                        conn, now - timedelta(hours=1), now + timedelta(minutes=1),
                        timedelta(minutes=5), "", PROCR,
                    )  # fmt: skip
                assert len(replay) == FINISHED
                assert all(due <= started <= fin for due, started, fin in replay if started)
                assert sum(b.arrivals for b in buckets) == FINISHED + 2 + 4 + 1  # due by then
                assert sum(b.finished for b in buckets) == FINISHED

                only = await asyncio.to_thread(
                    read_signals, pg_url, QueueConfig(preset="procrastinate", queue="slow")
                )
                assert (only.ready, only.in_flight, only.expired_leases) == (0, 2, 0)
                assert (only.recent_jobs, only.recent_arrivals) == (0, 3)
            finally:
                release.set()
                await _wait_for(
                    lambda: _count_async(jm, "doing", "slow", 0),
                )
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker

            after = await asyncio.to_thread(
                read_signals, pg_url, QueueConfig(preset="procrastinate")
            )
            assert after.in_flight == 0
            assert after.leases_by_worker == {}
            assert after.expired_leases == 1  # still stuck: Procrastinate does not requeue it

    asyncio.run(scenario())


FINISHED = 12  # more than waits.MIN_JOBS: the wait rule acts on them
PROCR = "procrastinate"


def _wait_rule_reason(signals: Signals) -> str:
    """The wait rule's reason in a plan for these signals and one running instance: it acts
    (not "not enough job history", not "does not report its arrivals")."""
    now = datetime.now(UTC)
    cfg = Config(
        policy=PolicyConfig(max_instances=20, target_wait=WaitTarget(timedelta(minutes=10))),
        budget=BudgetConfig(monthly_ceiling_usd=1000.0),
    )
    one = Instance("a", InstanceState.RUNNING, id="a", created_at=now - timedelta(hours=2))
    obs = Observation(instances=(one,), signals=signals, price=PlanPrice("vc2-1c-2gb", 10.0))
    plan = decide(obs, cfg, now)
    reason = next(r for r in plan.reasons if r.startswith("wait rule:"))
    assert "the depth rule decides" not in reason, reason
    return reason


async def _count_async(jm, status: str, queue: str, expected: int) -> bool:  # type: ignore[no-untyped-def]
    return len(list(await jm.list_jobs_async(status=status, queue=queue))) == expected


def _db_now(url: str) -> datetime:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]


def _execute(url: str, query: str, *params: object) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(query, params)  # type: ignore[arg-type]


# --- pgqueuer preset (the real library) ----------------------------------------------------------


def test_pgqueuer_preset_matches_pgqueuer(pg_url: str) -> None:
    from pgqueuer.adapters.persistence.queries import Queries
    from pgqueuer.core.qm import QueueManager
    from pgqueuer.models import Job
    from pgqueuer.ports.repository import EntrypointExecutionParameter
    from pgqueuer.types import QueueEntrypoint, QueueManagerId

    timeout = timedelta(seconds=30)  # PgQueuer's default heartbeat_timeout
    backlog = {QueueEntrypoint("backlog"): EntrypointExecutionParameter(concurrency_limit=0)}

    async def scenario() -> None:
        conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
        worker_conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
        q = Queries.from_psycopg_connection(conn)
        release = asyncio.Event()
        qm = QueueManager(Queries.from_psycopg_connection(worker_conn))

        @qm.entrypoint("report")
        async def report(job: Job) -> None:
            return None

        @qm.entrypoint("email")
        async def email(job: Job) -> None:
            await release.wait()

        worker: asyncio.Task[None] | None = None
        try:
            await q.install()
            await q.enqueue(["report"] * FINISHED, [None] * FINISHED, [0] * FINISHED)  # done
            await q.enqueue(["email"] * 2, [None] * 2, [0] * 2)  # held by the worker
            await q.enqueue("email", None, execute_after=timedelta(hours=1))  # not due
            await q.enqueue(["backlog"] * 5, [None] * 5, [0] * 5)  # nobody runs these
            # A queue manager that died holding one job: picked, then no more heartbeats.
            dead_qm = QueueManagerId(uuid.uuid4())
            (dead_job,) = await q.dequeue(1, backlog, dead_qm, None, timeout)
            await conn.execute(
                "UPDATE pgqueuer SET heartbeat = now() - interval '2 minutes' WHERE id = %s",
                (dead_job.id,),
            )

            worker = asyncio.create_task(
                qm.run(
                    dequeue_timeout=timedelta(seconds=0.2),
                    batch_size=2,
                    heartbeat_timeout=timeout,
                    log_aggregation_interval=timedelta(0),
                )
            )

            async def settled() -> bool:
                stats = await q.queue_size()
                left: dict[tuple[str, str], int] = {
                    (str(x.entrypoint), str(x.status)): x.count for x in stats
                }
                return ("report", "queued") not in left and left.get(("email", "picked")) == 2

            await _wait_for(settled)

            s = await asyncio.to_thread(read_signals, pg_url, QueueConfig(preset="pgqueuer"))
            stats = await q.queue_size()
            queued = sum(x.count for x in stats if x.status == "queued")
            picked = sum(x.count for x in stats if x.status == "picked")
            stale = await q.stale_jobs(timeout)
            workers = {str(w.queue_manager_id): w.active_jobs for w in await q.active_workers()}

            assert queued == 5  # 4 backlog + the email in an hour
            assert s.ready == queued - 1 == 4
            assert s.expired_leases == len(stale) == 1
            assert stale[0].id == dead_job.id
            assert s.in_flight == picked - len(stale) == 2
            assert workers == {str(qm.queue_manager_id): 2, str(dead_qm): 1}
            assert s.leases_by_worker == {str(qm.queue_manager_id): 2}
            assert 0 <= s.oldest_ready_seconds < 30

            # PgQueuer's own history: its log, for the wait rule and the replay.
            assert s.recent_jobs == FINISHED
            assert s.recent_job_seconds is not None and 0 < s.recent_job_seconds < 2
            assert s.recent_arrivals == FINISHED + 2 + 1 + 5  # every enqueue
            assert _wait_rule_reason(s).startswith("wait rule: 5 queued job(s)")
            with psycopg.connect(pg_url) as sync:
                replay = history.finished_jobs_in(sync, timedelta(hours=1), "", "pgqueuer")
            assert len(replay) == FINISHED
            assert all(due <= started <= fin for due, started, fin in replay if started)

            only = await asyncio.to_thread(
                read_signals, pg_url, QueueConfig(preset="pgqueuer", queue="email")
            )
            assert (only.ready, only.in_flight, only.expired_leases) == (0, 2, 0)
            assert (only.recent_jobs, only.recent_arrivals) == (0, 3)
            # A zero liveness window: every heartbeat is in the past, so every pick is stale.
            tight = await asyncio.to_thread(
                lambda: read_signals(
                    pg_url, QueueConfig(preset="pgqueuer"), stale_after=timedelta(0)
                )
            )
            assert (tight.in_flight, tight.expired_leases) == (0, 3)

            release.set()
            await _wait_for(lambda: _pgq_picked(q, "email", 0))
            after = await asyncio.to_thread(
                read_signals, pg_url, QueueConfig(preset="pgqueuer", queue="backlog")
            )
            assert (after.ready, after.in_flight, after.expired_leases) == (4, 0, 1)
            # PgQueuer's own dequeue takes the ready jobs and re-picks the stale one: all demand.
            taken = await q.dequeue(10, backlog, QueueManagerId(uuid.uuid4()), None, timeout)
            assert len(taken) == after.ready + after.expired_leases
        finally:
            release.set()
            qm.shutdown.set()
            if worker is not None:
                # Its jobs are finished; a graceful stop would only wait for its heartbeat
                # buffer's flush timer (heartbeat_timeout / 8).
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
            await worker_conn.close()
            await conn.close()

    asyncio.run(scenario())


async def _pgq_picked(q, entrypoint: str, expected: int) -> bool:  # type: ignore[no-untyped-def]
    stats = await q.queue_size()
    n = sum(x.count for x in stats if x.entrypoint == entrypoint and x.status == "picked")
    return n == expected


def test_a_read_stuck_behind_a_lock_is_cancelled_and_says_so(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(signals_mod, "STATEMENT_TIMEOUT_MS", 300)  # the real one is 10 s
    with psycopg.connect(db_url) as locker:
        locker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")  # held until the block ends
        with pytest.raises(DatabaseError, match="was cancelled") as info:
            read_signals(db_url, QueueConfig(preset="vultrscale"))
    assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
    assert "VACUUM" in info.value.hint
