"""`vultrscale simulate --from-db` replays what the real worker left in a real Postgres."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import psycopg
import pytest

from tests.e2e.worker_procs import wait_for
from vultrscale.cli import main
from vultrscale.core import boottime
from vultrscale.db import history, schema
from vultrscale.db import queue as q
from vultrscale.replay import workload
from vultrscale.worker import Job
from vultrscale.worker.runtime import Worker, WorkerSettings

JOB_SECONDS = 0.3


def _run_jobs(db_url: str, n: int) -> None:
    """Enqueue ``n`` jobs and let the reference worker run them all, for real."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        q.enqueue(conn, [{"k": i} for i in range(n)])

    def handle(job: Job) -> None:
        time.sleep(JOB_SECONDS)  # the job's own work

    worker = Worker(
        WorkerSettings(app="test:handle", concurrency=2, lease_seconds=10, worker_id="w-sim"),
        db_url,
        handle,
        lambda line: None,
    )
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()

    def done() -> bool:
        with psycopg.connect(db_url) as conn:
            row = conn.execute("SELECT count(*) FROM jobs WHERE state = 'succeeded'").fetchone()
            return bool(row and row[0] == n)

    try:
        wait_for(done, f"{n} jobs to succeed", 30)
    finally:
        worker.request_stop()
        t.join(20)
    assert not t.is_alive()


def test_from_db_replays_the_jobs_the_real_worker_finished(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_jobs(db_url, 6)
    rows = history.finished_jobs(db_url, timedelta(hours=1))
    assert len(rows) == 6
    # The worker wrote when each job started: its own run time, not its wait too. Six jobs
    # on two slots: the last ones waited two runs before starting (finished - due, what the
    # replay took before the queue recorded a start, counted that wait as work).
    runs = [(fin - started).total_seconds() for _, started, fin in rows if started is not None]
    assert len(runs) == 6 and all(JOB_SECONDS <= r < JOB_SECONDS + 0.25 for r in runs)
    assert max((fin - due).total_seconds() for due, _, fin in rows) >= 2 * JOB_SECONDS

    monkeypatch.setenv("DATABASE_URL", db_url)
    code = main(
        ["simulate", "--from-db", "--since", "1h", "--boot-time", "1m", "--json",
         "--policies", "keda,vultrscale"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["workload"]["jobs"] == 6
    assert "duration = finished - started" in doc["workload"]["note"]
    assert "before the queue recorded a start" not in doc["workload"]["note"]
    replayed = workload.from_history(rows, since=timedelta(hours=1))
    assert replayed.total_job_seconds < 6 * (JOB_SECONDS + 0.25)  # the runs, not the waits
    ours = next(r for r in doc["results"] if r["policy"] == "vultrscale")
    assert ours["finished"] == 6 and ours["lost"] == 0 and ours["killed"] == 0
    assert ours["billed_hours"] == 2  # six jobs at four per instance: two instances, an hour each


def test_from_db_with_no_finished_jobs_exits_2(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert main(["simulate", "--from-db"]) == 2
    assert "no finished jobs" in capsys.readouterr().err


def test_from_db_reads_utc_whatever_the_session_time_zone(db_url: str) -> None:
    from datetime import UTC, datetime

    # A database whose sessions default to Berlin time, and jobs around the end of its summer
    # time (01:00 UTC on 2026-10-25): read in Berlin wall time they reorder and one lasts
    # less than nothing.
    with psycopg.connect(db_url, autocommit=True) as conn:
        dbname = conn.info.dbname
        conn.execute(f"ALTER DATABASE \"{dbname}\" SET TimeZone TO 'Europe/Berlin'")
        conn.execute(
            """
            INSERT INTO jobs (state, created_at, run_at, finished_at)
            SELECT 'succeeded', due, due, fin FROM (VALUES
                ('2026-10-25 00:30Z'::timestamptz, '2026-10-25 00:40Z'::timestamptz),
                ('2026-10-25 00:50Z', '2026-10-25 01:05Z'),
                ('2026-10-25 01:10Z', '2026-10-25 01:20Z')) AS v(due, fin)
            """
        )
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SHOW TimeZone").fetchone() == ("Europe/Berlin",)
    since = abs(datetime.now(UTC) - datetime(2026, 10, 25, tzinfo=UTC)) + timedelta(days=1)
    rows = history.finished_jobs(db_url, since)
    assert [(d.utcoffset(), f.utcoffset()) for d, _, f in rows] == [(timedelta(0),) * 2] * 3
    t = workload.from_history(rows, since=since)
    assert t.arrivals == (1800.0, 3000.0, 4200.0)
    assert t.durations == (600.0, 900.0, 600.0)


@pytest.mark.parametrize(("queue", "jobs"), [("mail", 2), ("", 5)], ids=["one-queue", "all"])
def test_from_db_replays_only_the_configured_queue(
    db_url: str,
    queue: str,
    jobs: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO jobs (queue, state, finished_at)
            SELECT q, 'succeeded', now() FROM unnest(%s::text[]) AS q
            """,
            (["mail", "mail", "reports", "reports", "default"],),
        )
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("VULTRSCALE_QUEUE_QUEUE", queue)  # empty: every queue, as the scaler
    argv = ["simulate", "--from-db", "--since", "1h", "--policies", "keda", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["jobs"] == jobs


def test_from_db_with_more_jobs_than_a_replay_holds_exits_2(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vultrscale import params

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (state, finished_at) SELECT 'succeeded', now() "
            "FROM generate_series(1, 5)"
        )
    monkeypatch.setattr(params, "MAX_REPLAY_JOBS", 2)
    assert len(history.finished_jobs(db_url, timedelta(hours=1))) == 3  # the limit + 1, no more
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert main(["simulate", "--from-db", "--since", "1h"]) == 2
    err = capsys.readouterr().err
    assert "more than 2 finished jobs" in err and "--since" in err and "Traceback" not in err


def test_from_db_learns_the_boot_time_from_the_fleets_ledger(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (state, run_at, created_at, started_at, finished_at) "
            "VALUES ('succeeded', now() - interval '10m', now() - interval '10m', "
            "now() - interval '9m', now() - interval '8m')"
        )
        # Three instances this fleet created, their workers first seen by a pass 100, 200 and
        # 300 s later; one of another fleet, one adopted (never POSTed here) and one whose
        # worker never came up do not count.
        for label, fleet, boot, posted in [
            ("w-1", "workers", 100, True), ("w-2", "workers", 200, True),
            ("w-3", "workers", 300, True), ("o-1", "others", 5, True),
            ("a-1", "workers", 7, False), ("n-1", "workers", None, True),
        ]:  # fmt: skip
            conn.execute(
                "INSERT INTO fleet_instances (label, fleet, state, created_at, posted_at, "
                "running_at, state_since) VALUES (%(l)s, %(f)s, 'gone', now() - interval '1h', "
                "CASE WHEN %(p)s THEN now() - interval '1h' END, "
                "now() - interval '1h' + make_interval(secs => %(b)s), now())",
                {"l": label, "f": fleet, "p": posted, "b": boot},
            )
    rows = history.boot_rows(db_url, "workers", timedelta(days=1))
    assert sorted(boottime.boot_seconds(rows, None)) == pytest.approx(
        [100.0, 200.0, 300.0], abs=0.01
    )
    monkeypatch.setenv("DATABASE_URL", db_url)
    argv = ["simulate", "--from-db", "--since", "1d", "--policies", "vultrscale", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    notes = doc["notes"]
    assert any("learned from the ledger: 3 instance(s)" in n and "median 200s" in n for n in notes)
    # the one job waited for a pass (30 s at most) and a boot drawn from what was learned
    assert 100.0 <= doc["results"][0]["wait_max"] <= 330.0
    assert any("replayed as 100s..300s" in n for n in notes)


def test_v6_upgrades_a_v5_queue_with_jobs_and_an_old_worker_still_claims(pg_url: str) -> None:
    """An upgrade keeps every row (their start unknown: NULL), a worker of the version before
    (its claim does not write started_at) still claims and finishes on v6, and --from-db counts
    what it ran among the jobs without a start."""
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(
            "CREATE TABLE vultrscale_schema ("
            " version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, sql in schema.MIGRATIONS:
            if version <= 5:
                c.execute(sql.encode())
                c.execute("INSERT INTO vultrscale_schema (version) VALUES (%s)", (version,))
        q.enqueue(c, [{"k": i} for i in range(3)])
        c.execute(
            "UPDATE jobs SET state = 'succeeded', finished_at = now() WHERE payload->>'k' = '0'"
        )
    assert schema.migrate(pg_url) == schema.LATEST
    assert schema.migrate(pg_url) == schema.LATEST  # again: nothing to do
    old_claim = q._CLAIM.replace(", started_at = now()", "")
    assert old_claim != q._CLAIM
    with psycopg.connect(pg_url, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM jobs WHERE started_at IS NULL").fetchone() == (3,)
        params = {"queue": "default", "worker": "old", "limit": 1, "lease": 30}
        (old_id, _, _, old_token) = c.execute(old_claim, params).fetchone()  # type: ignore[misc]
        assert q.complete(c, old_id, "old", old_token)
        (new,) = q.claim(c, "new", "default", 1, 30)
        assert q.complete(c, new.id, "new", new.token)
        started = dict(c.execute("SELECT id, started_at IS NOT NULL FROM jobs").fetchall())
    assert started[old_id] is False and started[new.id] is True
    trace = workload.from_history(
        history.finished_jobs(pg_url, timedelta(hours=1)), since=timedelta(hours=1)
    )
    assert len(trace) == 3 and "2 of them from before the queue recorded a start" in trace.note


def test_from_db_of_a_directory_replays_each_fleets_own_queue(
    db_url: str,
    tmp_path,  # noqa: ANN001 - pytest's
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two fleets on two queues of one database: each replays its own history."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        for queue_name, n in (("web", 3), ("reports", 5)):
            for _ in range(n):
                conn.execute(
                    "INSERT INTO jobs (queue, state, run_at, created_at, started_at, finished_at) "
                    "VALUES (%s, 'succeeded', now() - interval '10 minutes', "
                    "now() - interval '10 minutes', now() - interval '9 minutes', "
                    "now() - interval '8 minutes')",
                    (queue_name,),
                )
    folder = tmp_path / "fleets"
    folder.mkdir()
    for name in ("web", "reports"):
        (folder / f"{name}.toml").write_text(
            f'[fleet]\nname = "{name}"\ntag = "vs-{name}"\n[worker]\nqueue = "{name}"\n'
            f'[queue]\nqueue = "{name}"\n'
        )
    monkeypatch.setenv("DATABASE_URL", db_url)
    code = main(
        ["--config", str(folder), "simulate", "--from-db", "--since", "1h", "--boot-time", "1m",
         "--json", "--policies", "vultrscale"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert {f["fleet"]: f["workload"]["jobs"] for f in doc["fleets"]} == {"web": 3, "reports": 5}
