"""The graphile-worker and pg-boss presets against the libraries' own schemas.

The default tests load each library's schema as the library itself creates it (committed under
tests/fixtures/, with its version; the file's header says how it was made) and write rows as
the library writes them (its own SQL functions where it has them: graphile's add_job,
pg-boss's create_queue; the columns its claim and settle statements set otherwise), then
check every number the preset reads.

The live test runs the real Node libraries (npm install, their workers: enqueue, work, kill a
worker mid-job, see the job come back by the library's own recovery) wherever node and npm are
on PATH (scripts/node_queues.py runs it; npm needs its registry the first time);
VULTRSCALE_TEST_NODE_QUEUES=0 turns it off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from vultrscale.config import QueueConfig
from vultrscale.db import detect, history
from vultrscale.db.signals import read_signals
from vultrscale.errors import QueueSchemaError, UsageError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GRAPHILE_SQL = FIXTURES / "graphile-worker-0.18.0.schema.sql"
PGBOSS_SQL = FIXTURES / "pg-boss-12.38.1.schema.sql"


def _load(url: str, path: Path) -> None:
    with psycopg.connect(url, autocommit=True) as conn:  # its own: the dump sets search_path
        conn.execute(path.read_bytes())


# --- graphile-worker ---------------------------------------------------------------------------


@pytest.fixture
def graphile(pg_url: str) -> str:
    """Jobs as graphile-worker writes them: add_job, its claim's UPDATE (getJobs.ts: attempts
    + 1, locked_at, locked_by; the named queue locked too), its completion's DELETE."""
    _load(pg_url, GRAPHILE_SQL)
    with psycopg.connect(pg_url, autocommit=True) as conn:

        def job(task: str, queue: str | None = None, run_at: str = "NULL") -> int:
            row = conn.execute(
                "SELECT id FROM graphile_worker.add_job(%s, '{}'::json, %s, "
                f"({run_at})::timestamptz)",
                (task, queue),
            ).fetchone()
            assert row is not None
            return int(row[0])

        def claim(job_id: int, pool: str, at: str = "now()") -> None:
            conn.execute(
                "UPDATE graphile_worker._private_jobs SET attempts = attempts + 1, "
                f"locked_by = %s, locked_at = {at} WHERE id = %s",
                (pool, job_id),
            )
            conn.execute(
                "UPDATE graphile_worker._private_job_queues q SET locked_by = %s, "
                f"locked_at = {at} FROM graphile_worker._private_jobs j "
                "WHERE j.id = %s AND q.id = j.job_queue_id",
                (pool, job_id),
            )

        for _ in range(3):
            job("email")  # ready
        job("email", run_at="now() - interval '90 seconds'")  # ready, the oldest
        job("email", run_at="now() + interval '1 hour'")  # not due
        claim(job("email"), "pool-a")  # in flight
        claim(job("report", "serial"), "pool-a")  # in flight, and holds its named queue
        job("report", "serial")  # behind that queue: not ready until its turn
        claim(job("report"), "pool-dead", "now() - interval '5 hours'")  # past the lock timeout
        failed = job("email")
        conn.execute(
            "UPDATE graphile_worker._private_jobs SET attempts = max_attempts, "
            "last_error = 'boom' WHERE id = %s",
            (failed,),
        )  # failed for good: never runs again
        done = job("email")
        claim(done, "pool-a")
        # completeJobs.ts: the worker deletes the job it ran
        conn.execute("DELETE FROM graphile_worker._private_jobs WHERE id = %s", (done,))
    return pg_url


def test_graphile_worker_counts_ready_locked_and_expired_jobs(graphile: str) -> None:
    s = read_signals(graphile, QueueConfig(preset="graphile-worker"))
    assert s.ready == 4
    assert 90 <= s.oldest_ready_seconds < 120
    assert (s.in_flight, s.expired_leases) == (2, 1)
    assert s.leases_by_worker == {"pool-a": 2}
    # It deletes what succeeds: no history, so the depth rule decides.
    assert (s.recent_jobs, s.recent_job_seconds, s.recent_arrivals) == (None, None, None)
    report = read_signals(graphile, QueueConfig(preset="graphile-worker", queue="report"))
    assert (report.ready, report.in_flight, report.expired_leases) == (0, 1, 1)
    with pytest.raises(UsageError, match="deletes a job when it succeeds"):
        history.of_preset("graphile-worker")


def test_graphile_worker_of_another_schema_version_is_named(graphile: str) -> None:
    with psycopg.connect(graphile, autocommit=True) as conn:
        conn.execute("ALTER TABLE graphile_worker._private_jobs DROP COLUMN is_available")
        found = {d.preset: d for d in detect.detect(conn, QueueConfig())}
    assert found["graphile-worker"].partial
    assert found["graphile-worker"].missing == (
        "column graphile_worker._private_jobs.is_available",
    )
    with pytest.raises(QueueSchemaError) as info:
        read_signals(graphile, QueueConfig(preset="graphile-worker"))
    assert "is_available" in info.value.message and "0.16 to 0.18" in info.value.message
    assert info.value.exit_code == 2


# --- pg-boss -----------------------------------------------------------------------------------


@pytest.fixture
def pgboss(pg_url: str) -> str:
    """Queues made by pg-boss's own create_queue ('report' partitioned, a table of its own),
    jobs with the columns its insert, fetch, heartbeat and settle statements set."""
    _load(pg_url, PGBOSS_SQL)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT pgboss.create_queue('email', '{\"policy\": \"standard\"}')")
        conn.execute(
            'SELECT pgboss.create_queue(\'report\', \'{"policy": "standard", "partition": true}\')'
        )

        def jobs(name: str, n: int, **cols: str) -> None:
            names = ", ".join(["name", *cols])
            values = ", ".join(["%s", *cols.values()])
            conn.execute(
                f"INSERT INTO pgboss.job ({names}) SELECT {values} FROM generate_series(1, %s)",
                (name, n),
            )

        jobs("email", 3)  # created: ready
        jobs("email", 1, start_after="now() - interval '90 seconds'")  # ready, the oldest
        jobs("email", 1, start_after="now() + interval '1 hour'")  # not due
        jobs("email", 1, state="'retry'", start_after="now() - interval '5 seconds'")  # ready
        jobs("report", 1, blocked="true")  # waits for a job it depends on
        jobs("email", 2, state="'active'", started_on="now()")  # in flight
        jobs("report", 1, state="'active'", started_on="now() - interval '16 minutes'")  # expired
        jobs(
            "report",
            1,
            state="'active'",
            started_on="now() - interval '1 minute'",
            heartbeat_seconds="30",
            heartbeat_on="now() - interval '2 minutes'",
        )  # its heartbeat lost: expired
        finished = {
            "state": "'completed'",
            "created_on": "now() - interval '10 minutes'",
            "start_after": "now() - interval '10 minutes'",
            "started_on": "now() - interval '5 minutes'",
            "completed_on": "now() - interval '5 minutes' + interval '3 seconds'",
        }
        jobs("report", 11, **finished)
        jobs("email", 1, **{**finished, "state": "'failed'"})  # failed for good: finished too
        jobs("email", 1, state="'completed'", created_on="now() - interval '2 days'",
             started_on="now() - interval '2 days'", completed_on="now() - interval '2 days'",
             )  # fmt: skip
    return pg_url


def test_pgboss_counts_ready_active_expired_and_its_history(pgboss: str) -> None:
    s = read_signals(pgboss, QueueConfig(preset="pg-boss"))
    assert s.ready == 5
    assert 90 <= s.oldest_ready_seconds < 120
    assert (s.in_flight, s.expired_leases, s.leases_by_worker) == (2, 2, {})
    assert s.recent_jobs == 12 and s.recent_job_seconds == pytest.approx(3.0)
    assert s.recent_arrivals == 11  # created in the last 10 minutes
    report = read_signals(pgboss, QueueConfig(preset="pg-boss", queue="report"))
    assert (report.ready, report.in_flight, report.expired_leases) == (0, 0, 2)
    assert (report.recent_jobs, report.recent_arrivals) == (11, 3)
    with psycopg.connect(pgboss, autocommit=True) as conn:
        replay = history.finished_jobs_in(conn, timedelta(hours=1), "", "pg-boss")
        found = {d.preset: d for d in detect.detect(conn, QueueConfig(preset="pg-boss"))}
    assert len(replay) == 12
    assert all(due <= started <= fin for due, started, fin in replay if started)
    assert found["pg-boss"].found and found["pg-boss"].version == "schema version 46"
    seen = found["pg-boss"].signals
    assert seen is not None and (seen.ready, seen.recent_jobs) == (s.ready, s.recent_jobs)
    assert not found["graphile-worker"].tables_found and not found["procrastinate"].found


# --- the real libraries (Node) -----------------------------------------------------------------

LIVE = os.environ.get("VULTRSCALE_TEST_NODE_QUEUES", "1") != "0"


@pytest.mark.skipif(
    not (LIVE and shutil.which("node") and shutil.which("npm")),
    reason="the live Node workers need node and npm on PATH, and not VULTRSCALE_TEST_NODE_QUEUES=0",
)
@pytest.mark.parametrize("library", ["graphile-worker", "pg-boss"])
def test_the_real_node_worker_is_counted_and_its_killed_job_comes_back(
    library: str, pg_url: str
) -> None:
    """scripts/node_queues.py installs the library (npm, once, outside the repository) and
    runs the scenario; the preset's counts are checked at each step (node_queues.live)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "node_queues.py"
    done = subprocess.run(
        [sys.executable, str(script), "--library", library, "--database-url", pg_url],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
