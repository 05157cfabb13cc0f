"""`vultrscale demo` end to end, as a user runs it: one process that starts the Vultr simulator,
simulated instances (a real `vultrscale worker` process and a paramiko SSH server each, booted
from the rendered user-data), and the real reconcile loop with the real SSH drain.

The summary is checked against the database the demo used, not only against itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.worker_procs import wait_for

pytestmark = pytest.mark.e2e

# 16 jobs at once ask for 4 instances (4 jobs each, cap 4); 8 more after 8 s, while those boot
# or run, ask for none beyond the cap. (A second burst after the scale-in, at 30 s, made this
# the suite's second-longest test, 64 s, and a second scale-up from zero is the same path.)
BURSTS = "0:16,8:8"


def _processes_using(db_url: str) -> list[int]:
    """Processes whose environment holds this test's own database URL (the demo's workers)."""
    needle = f"DATABASE_URL={db_url}".encode() + b"\0"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _run_demo(pg_url: str, tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    """Run ``vultrscale demo --no-live --json ARGS`` with worker logs kept in tmp_path/logs:
    (the summary, the output and logs to explain a failure)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VULTRSCALE_")}
    env["DATABASE_URL"] = pg_url
    logs = tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, "-m", "vultrscale.cli", "demo", "--no-live", "--json"]
        + ["--logs", str(logs), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
    )
    worker_logs = "\n".join(
        f"--- {p.parent.name}\n{p.read_text(errors='replace')[-1500:]}"
        for p in sorted(logs.glob("*/worker.log"))
    )
    # The start of the output too: a run that went wrong at once says so in its first lines.
    err = (
        proc.stderr
        if len(proc.stderr) < 8000
        else f"{proc.stderr[:4000]}\n...\n{proc.stderr[-4000:]}"
    )
    passes = logs / "passes.jsonl"  # a chaos run's pass processes: what the first two answered
    first = passes.read_text().splitlines()[:2] if passes.is_file() else []
    why = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{err}\n{worker_logs}\n" + "".join(
        f"--- pass\n{line[:3000]}\n" for line in first
    )
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no JSON summary (exit {proc.returncode}):\n{why}")
    doc["exit_code"] = proc.returncode
    assert proc.stderr.endswith("\n"), why  # the timestamped lines, each ended
    return doc, why


def test_demo_scales_up_and_back_down_without_losing_a_job(pg_url: str, tmp_path: Path) -> None:
    # the duration is a cap: the run ends as soon as the work is done and the fleet is down
    doc, why = _run_demo(pg_url, tmp_path, "--bursts", BURSTS, "--duration", "110")
    assert doc["exit_code"] == 0, why
    assert doc["ok"] and doc["finished"] and doc["problems"] == [], why

    jobs = doc["jobs"]
    assert jobs == {**jobs, "enqueued": 24, "succeeded": 24, "lost": 0, "steps_run_twice": 0}
    fleet = doc["fleet"]
    # up: the first burst is seen at once and asks for exactly the cap
    assert fleet["peak"] == fleet["max_instances"] == 4
    assert fleet["scale_ups"] >= 1 and fleet["created"] >= 4
    # and back down to zero
    assert fleet["scale_ins"] >= 1 and fleet["final"] == 0
    assert 0 < doc["instance_seconds"] < doc["always_on_instance_seconds"]

    hosts = doc["hosts"]
    assert hosts["booted"] == fleet["created"], why
    # every worker was stopped over SSH and drained cleanly; none was left to be killed
    assert hosts["worker_clean_exits"] == hosts["booted"]
    assert hosts["worker_failed_exits"] == 0 and hosts["killed_at_power_off"] == 0, why
    assert hosts["ssh"]["stop"] >= hosts["booted"]
    assert hosts["ssh"]["is_active"] >= hosts["booted"]
    assert hosts["ssh"]["refused_commands"] == 0 and hosts["ssh"]["refused_logins"] == 0

    # The database agrees: every job of the run succeeded, every instance is gone, every
    # worker recorded its stop, and the passes are in the decision ledger.
    with psycopg.connect(pg_url) as conn:
        states: dict[str, int] = dict(
            conn.execute(
                "SELECT state, count(*) FROM jobs WHERE queue LIKE 'demo-%' GROUP BY state"
            ).fetchall()
        )
        ledger: dict[str, int] = dict(
            conn.execute(
                "SELECT state, count(*) FROM fleet_instances WHERE fleet LIKE 'demo-%' "
                "GROUP BY state"
            ).fetchall()
        )
        workers = conn.execute(
            "SELECT count(*), count(stopped_at) FROM workers WHERE worker_id LIKE 'demo-%'"
        ).fetchone()
        events = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM "
            "jsonb_array_elements(actions) a WHERE a->>'kind' = 'drain')) "
            "FROM fleet_events WHERE fleet LIKE 'demo-%'"
        ).fetchone()
    assert states == {"succeeded": 24}
    assert ledger == {"gone": fleet["created"]}
    assert workers == (hosts["booted"], hosts["booted"])
    assert events is not None
    passes, with_drains = events
    assert passes >= 5 and with_drains == fleet["scale_ins"]

    # no worker process outlived the demo
    assert _processes_using(pg_url) == []


def test_an_interrupted_demo_cleans_up_and_exits_130(pg_url: str, tmp_path: Path) -> None:
    """Ctrl-C while instances run: the run ends after the pass, every worker and the SSH
    servers stop, the summary says what was left, and the exit code is 130. Its stdout is a
    pipe, so the demo writes timestamped lines as they happen (read here while it runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VULTRSCALE_")}
    env["DATABASE_URL"] = pg_url
    proc = subprocess.Popen(
        [sys.executable, "-m", "vultrscale.cli", "demo", "--bursts", "0:8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(iter(proc.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    try:
        wait_for(lambda: any("-> running" in line for line in lines), "a worker up", timeout=60)
        workers = wait_for(lambda: _processes_using(pg_url), "worker processes", timeout=10)
        assert proc.poll() is None, "".join(lines)  # the lines came while the demo ran
        assert all(re.match(r"\d\d:\d\d:\d\d ", line) for line in list(lines)), lines
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=5)
    text = "".join(lines)
    assert code == 130, text
    assert "press Ctrl-C again to stop at once" in text, text
    assert "Stopping: cleaning up" in text and "problem: interrupted" in text, text
    assert _processes_using(pg_url) == [], f"left running (were {workers}):\n{text}"


def test_demo_chaos_injects_every_fault_and_still_loses_nothing(
    pg_url: str, tmp_path: Path
) -> None:
    """Seeded chaos: workers and passes SIGKILLed, API 429/500 bursts, a create whose answer
    is lost, a host whose SSH stops answering, the fleet's offering sold out. Every job still
    ends exactly once per step and the fleet comes back to zero."""
    from vultrscale.fake_vultr.chaos import KINDS

    doc, why = _run_demo(pg_url, tmp_path, "--chaos", "--seed", "1", "--bursts", "0:16")
    assert doc["exit_code"] == 0 and doc["ok"] and doc["finished"], why
    kinds = {f["kind"] for f in doc["faults"]}
    assert kinds == set(KINDS), why
    assert all(f["target"] and f["at"] >= 0 for f in doc["faults"]), why
    jobs = doc["jobs"]
    assert jobs == {**jobs, "enqueued": 16, "succeeded": 16, "lost": 0, "steps_run_twice": 0}
    assert doc["fleet"]["final"] == 0, why
    # the stock-out refused the first passes' creates; the queue waited it out
    assert doc["fleet"]["refused_creates"] >= 1, why
    assert not [p for p in doc["problems"] if p.startswith("chaos:")], why
    # a worker killed mid-job left its jobs to lease expiry: they ran again, on some worker
    assert jobs["retried"] >= 1, why

    # The execution log (each step appends when its work is done) and the database agree:
    # every step of every job ran exactly once, and the ledger saw every instance go.
    lines = (tmp_path / "logs" / "executions.log").read_text().splitlines()
    assert len(lines) == len(set(lines)) == 16 * 3, why
    with psycopg.connect(pg_url) as conn:
        states = dict(
            conn.execute(
                "SELECT state, count(*) FROM jobs WHERE queue LIKE 'demo-%' GROUP BY state"
            ).fetchall()
        )
        ledger = dict(
            conn.execute(
                "SELECT state, count(*) FROM fleet_instances WHERE fleet LIKE 'demo-%' "
                "GROUP BY state"
            ).fetchall()
        )
    assert states == {"succeeded": 16}
    assert set(ledger) <= {"gone"}, ledger
    assert _processes_using(pg_url) == []


def test_a_demo_whose_duration_runs_out_gives_running_jobs_back_and_loses_none(
    pg_url: str, tmp_path: Path
) -> None:
    """The duration ends the run while every job runs (each longer than the 5 s drain): each
    worker gets SIGTERM and its stop timeout, gives its jobs back and exits cleanly."""
    args = ["--bursts", "0:8", "--job-seconds", "30:40", "--duration", "14"]
    doc, why = _run_demo(pg_url, tmp_path, *args)
    assert doc["ended_by"] == "duration" and doc["exit_code"] == 1, why
    jobs = doc["jobs"]
    assert jobs["lost"] == 0 and jobs["succeeded"] == 0, why
    assert jobs["waiting"] == 8, why
    # each job a worker said it gave back is back in the queue, unleased
    given = [
        int(m.group(1))
        for p in (tmp_path / "logs").glob("*/worker.log")
        for m in re.finditer(r"job (\d+): given back to the queue", p.read_text())
    ]
    assert len(given) >= 1 and jobs["given_back"] == len(given), why
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT j.state, l.job_id FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.id "
            "WHERE j.id = ANY(%s)",
            (given,),
        ).fetchall()
    assert rows == [("ready", None)] * len(given), why
    hosts = doc["hosts"]
    assert hosts["worker_clean_exits"] == hosts["booted"] >= 1, why
    assert hosts["killed_at_power_off"] == 0 and hosts["worker_failed_exits"] == 0, why
    assert _processes_using(pg_url) == []


def test_a_key_value_database_url_is_shown_with_its_password_masked(tmp_path: Path) -> None:
    # Nothing listens on the port: the demo names the database it was given, then fails fast.
    # The port stays bound (never listened on) for the run: connections are refused, and no
    # other process can take it meanwhile, as one found free and let go could be.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        secret = "s3cr#t=pw"
        env = {k: v for k, v in os.environ.items() if not k.startswith("VULTRSCALE_")}
        env["DATABASE_URL"] = f"host=127.0.0.1 port={port} dbname=demo user=u password={secret}"
        env["COLUMNS"] = "200"  # one line per message
        proc = subprocess.run(
            [sys.executable, "-m", "vultrscale.cli", "demo", "--no-live", "--duration", "10"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stderr
    shown = f"Postgres: host=127.0.0.1 port={port} dbname=demo user=u password=***"
    assert shown in proc.stdout, proc.stdout
    assert "cannot reach the database" in proc.stderr
    assert "s3cr" not in proc.stdout + proc.stderr
