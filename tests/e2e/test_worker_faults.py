"""Worker processes facing a skewed clock, a database that goes away, and a bad --app."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from tests.e2e.worker_procs import EXAMPLES, WorkerProcess, jobs, leases, states, wait_for
from vultrscale.db import queue as q

pytestmark = pytest.mark.e2e


def _faketime_env() -> dict[str, str]:
    """LD_PRELOAD libfaketime into the worker itself (the `faketime` wrapper would be the
    process that receives our signals)."""
    tool = shutil.which("faketime")
    assert tool, "this test needs libfaketime (apt-get install faketime)"
    prefix = Path(tool).resolve().parent.parent
    found = sorted(prefix.glob("lib/**/faketime/libfaketime.so.1"))
    assert found, f"libfaketime.so.1 not found under {prefix}/lib"
    # The wall clock is 6 h behind. The monotonic clock stays real: libfaketime's offset on it
    # makes pthread timed waits hang, which would test libfaketime rather than the worker.
    return {
        "LD_PRELOAD": str(found[0]),
        "FAKETIME": "-6h",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def test_a_worker_six_hours_behind_runs_jobs_longer_than_its_lease(
    db_url: str, conn: psycopg.Connection, procs: list[WorkerProcess]
) -> None:
    """Jobs of 3 x 1.2 s with a 3 s lease live only through heartbeats; had the worker's clock
    (6 h behind) gone into a lease, every lease would be long expired and the jobs reaped."""
    skew = _faketime_env()
    skewed = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **skew},
        capture_output=True,
        text=True,
        check=True,
    )
    assert time.time() - float(skewed.stdout) > 5 * 3600  # the skew is real

    ids = q.enqueue(conn, [{"step_seconds": 1.2}] * 4)
    args = ("--concurrency", "4", "--lease-seconds", "3", "--drain-seconds", "5")
    w = WorkerProcess(db_url, f"{EXAMPLES}:three_steps", *args, env=skew)
    procs.append(w)
    w.wait_started()
    wait_for(lambda: states(conn) == {"succeeded": 4}, "the jobs to finish", 30)
    lag = conn.execute("SELECT extract(epoch FROM now() - max(last_seen)) FROM workers").fetchone()
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.text()

    assert jobs(conn) == {i: ("succeeded", 1) for i in ids}
    assert lag is not None and 0 <= float(lag[0]) < 5  # last_seen is database time
    assert any("4 succeeded" in line and "0 lost lease" in line for line in w.out), w.text()


def test_database_gone_mid_run_exits_1_and_leases_run_out_on_their_own(
    db_url: str,
    pg_admin_url: str,
    conn: psycopg.Connection,
    procs: list[WorkerProcess],
) -> None:
    ids = q.enqueue(conn, [{"step_seconds": 2}] * 4)
    args = ("--concurrency", "4", "--lease-seconds", "3", "--drain-seconds", "5")
    w = WorkerProcess(db_url, f"{EXAMPLES}:three_steps", *args)
    procs.append(w)
    w.wait_started()
    wait_for(lambda: leases(conn) == 4, "4 leased jobs")

    dbname = urlsplit(db_url).path.lstrip("/")
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS false")
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            )
            assert w.wait(timeout=30) == 1, w.text()
        finally:
            admin.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")

    err = "\n".join(w.err)
    assert "lost the database" in err and "Fix:" in err, w.text()
    assert "Traceback" not in err
    with psycopg.connect(db_url, autocommit=True) as again:
        # Nothing stays leased past its lease: without heartbeats the leases just run out.
        wait_for(lambda: q.reap_expired(again) > 0 or leases(again) == 0, "expiry", 10)
        wait_for(lambda: (q.reap_expired(again), leases(again))[1] == 0, "all reaped", 10)
        assert jobs(again) == {i: ("ready", 1) for i in ids}


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("no_such_module_xyz:handle", "cannot import module 'no_such_module_xyz'"),
        ("vultrscale.worker.examples:missing", "has no attribute 'missing'"),
        ("vultrscale.worker.examples", "must be MODULE:FUNC"),
    ],
)
def test_bad_app_exits_2_before_touching_the_database(app: str, message: str) -> None:
    # An address nothing listens on: reaching the database would be a different error (exit 1).
    w = WorkerProcess("postgresql://u:pw-secret@127.0.0.1:9/none", app)
    code = w.wait(timeout=30)
    assert code == 2, w.text()
    err = "\n".join(w.err)
    assert message in err and "Fix:" in err
    assert "pw-secret" not in err
