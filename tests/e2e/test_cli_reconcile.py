"""`vultrscale reconcile / status / events` as a user runs them: real CLI, simulator over HTTP,
real Postgres. Also: secrets never reach the output, bad input exits 2 before any request."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.cli_world import scaler_key, simulator_with_snapshot
from vultrscale import cloudinit
from vultrscale.cli import main
from vultrscale.db import ledger, queue, store
from vultrscale.errors import RuntimeFailure
from vultrscale.fake_vultr.app import Simulator
from vultrscale.fake_vultr.server import ServerHandle

API_KEY = "VKEY-cli-test-0123456789abcdefghijkl"
DB_PASSWORD = "pw-not-to-be-printed-42"


@pytest.fixture
def cli_env(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Simulator, ServerHandle]]:
    sim, server, snapshot_id = simulator_with_snapshot(API_KEY, seed=3)
    key = scaler_key(tmp_path)
    cfg = tmp_path / "vultrscale.toml"
    cfg.write_text(
        f'[fleet]\nsnapshot_id = "{snapshot_id}"\nssh_key = "{key}"\n[policy]\nmax_instances = 3\n'
    )
    # trust auth ignores the password; it is here to prove it is never printed
    url_with_pw = db_url.replace("postgres@", f"postgres:{DB_PASSWORD}@")
    monkeypatch.setenv("VULTRSCALE_CONFIG", str(cfg))
    monkeypatch.setenv("VULTR_API_KEY", API_KEY)
    monkeypatch.setenv("VULTR_API_URL", server.url)
    monkeypatch.setenv("DATABASE_URL", url_with_pw)
    monkeypatch.setenv("WORKER_DATABASE_URL", url_with_pw)  # the instances' address
    monkeypatch.chdir(tmp_path)
    try:
        yield sim, server
    finally:
        server.stop()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    out = capsys.readouterr()
    text = out.out + out.err
    assert API_KEY not in text
    assert DB_PASSWORD not in text
    return code, out.out


def test_dry_run_then_pass_then_status_and_events(cli_env, capsys, tmp_path: Path) -> None:
    sim, _ = cli_env
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        queue.enqueue(conn, [{}] * 6)

    code, out = run(capsys, "reconcile", "--dry-run", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["dry_run"] and doc["plan"]["desired"] == 2
    assert [a["kind"] for a in doc["actions"]] == ["create", "create"]
    assert sim.count("POST", "/v2/instances") == 0

    metrics = tmp_path / "vultrscale.prom"
    code, out = run(capsys, "reconcile", "--json", "--metrics-file", str(metrics))
    assert code == 0, out
    assert sim.count("POST", "/v2/instances", 202) == 2
    prom = metrics.read_text()
    assert 'vultrscale_desired_instances{fleet="workers"} 2.0' in prom
    assert 'vultrscale_queue_ready{fleet="workers"} 6.0' in prom
    # the user-data that went to Vultr carries the worker env file and the pinned host key
    (inst,) = [i for i in sim.instances.values() if i["label"] != "base"][:1]
    doc = cloudinit.check_user_data(sim.user_data(inst["id"]))
    env = {f["path"]: f["content"] for f in doc["write_files"]}["/etc/vultrscale/worker.env"]
    assert f'VULTRSCALE_WORKER_ID="{inst["label"]}"' in env
    assert "PRIVATE KEY" in doc["ssh_keys"]["ed25519_private"]  # the real key went to Vultr
    assert DB_PASSWORD in env  # ... and the real database URL (masked only for display)

    code, out = run(capsys, "status", "--json")
    assert code == 0
    doc = json.loads(out)
    assert {i["state"] for i in doc["instances"]} == {"pending"}
    assert doc["queue"]["ready"] == 6 and doc["desired"] == 2
    assert doc["budget"]["ceiling_usd"] == 50.0
    # No boot seen yet: the configured boot time, said so; no job finished: no history.
    assert doc["boot_time"] == {"seconds": 720.0, "boots": 0, "learned": False}
    assert doc["queue"]["recent_jobs"] == 0 and "recent_job_seconds" not in doc["queue"]

    code, out = run(capsys, "status")
    assert code == 0 and "fleet workers" in out and "pending" in out
    assert "boot time: 12.0m (policy.boot_time: 0 boot(s) seen, 5 needed" in " ".join(out.split())

    code, out = run(capsys, "events", "--since", "1h", "--json")
    assert code == 0
    events = json.loads(out)["events"]
    assert len(events) == 1 and events[0]["exit_code"] == 0
    assert len(events[0]["actions"]) == 2


def test_missing_database_url_exits_2_before_any_request(cli_env, capsys, monkeypatch) -> None:
    sim, _ = cli_env
    monkeypatch.delenv("DATABASE_URL")
    before = len(sim.request_log)
    code, _ = run(capsys, "reconcile")
    assert code == 2
    assert len(sim.request_log) == before  # nothing sent


def test_refused_key_exits_2_with_a_fix(cli_env, capsys, monkeypatch) -> None:
    sim, _ = cli_env
    monkeypatch.setenv("VULTR_API_KEY", "wrong-key-1234567890")
    code = main(["reconcile"])
    out = capsys.readouterr()
    assert code == 2 and "VULTR_API_KEY" in out.err
    assert "wrong-key-1234567890" not in out.out + out.err
    assert sim.count("POST", "/v2/instances") == 0


def test_bad_interval_is_a_usage_error(cli_env, capsys) -> None:
    code, _ = run(capsys, "reconcile", "--loop", "--interval", "30 seconds")
    assert code == 2


def test_database_down_exits_1(cli_env, capsys, monkeypatch) -> None:
    sim, _ = cli_env
    monkeypatch.setenv(
        "DATABASE_URL", f"postgresql://u:{DB_PASSWORD}@127.0.0.1:9/x?connect_timeout=2"
    )
    code = main(["reconcile"])
    err = capsys.readouterr().err
    assert code == 1 and "database" in err.lower()
    assert DB_PASSWORD not in err
    assert sim.count("DELETE", "/v2/instances/*") == 0


def test_an_unwritable_metrics_file_or_an_insecure_key_refuses_the_pass_and_records_it(
    cli_env, capsys, tmp_path: Path
) -> None:
    sim, _ = cli_env
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        queue.enqueue(conn, [{}] * 6)
    missing = tmp_path / "no-such-dir" / "vultrscale.prom"
    code, _ = run(capsys, "reconcile", "--metrics-file", str(missing))
    assert code == 2
    (tmp_path / "scaler_key").chmod(0o644)
    code, _ = run(capsys, "reconcile")
    assert code == 2
    assert sim.count("POST", "/v2/instances") == 0
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM fleet_instances").fetchone() == (0,)
        rows = conn.execute("SELECT exit_code, errors FROM fleet_events ORDER BY id").fetchall()
    assert [code for code, _ in rows] == [2, 2]
    assert "no-such-dir" in rows[0][1][0] and "0644" in rows[1][1][0]


def test_a_pass_that_finds_the_lock_held_leaves_the_metrics_file_alone(
    cli_env, capsys, tmp_path: Path
) -> None:
    metrics = tmp_path / "vultrscale.prom"
    code, _ = run(capsys, "reconcile", "--metrics-file", str(metrics))
    assert code == 0
    before = metrics.read_text()
    assert 'vultrscale_queue_ready{fleet="workers"}' in before
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as other:
        assert ledger.try_lock(other, "workers")  # another pass is running
        code, _ = run(capsys, "reconcile", "--metrics-file", str(metrics))
    assert code == 0
    assert metrics.read_text() == before  # not replaced by a file without the fleet's gauges


def test_json_prints_one_document_when_the_metrics_cannot_be_written(
    cli_env, capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vultrscale import metrics as metrics_mod

    def refuse(self: object, path: str) -> None:
        raise RuntimeFailure(f"cannot write metrics to {path}: disk full")

    monkeypatch.setattr(metrics_mod.Metrics, "write_textfile", refuse)
    code, out = run(capsys, "reconcile", "--json", "--metrics-file", str(tmp_path / "m.prom"))
    assert code == 1
    doc = json.loads(out)  # one document, not the pass's followed by the error's
    assert "cannot write metrics" in doc["error"]


def test_events_over_a_long_window_show_the_newest_passes_and_say_older_ones_are_left_out(
    cli_env, capsys
) -> None:
    # A day of a 30 s loop is 2,880 passes, more than `events` lists: it listed the oldest
    # 1,000 and dropped the latest, without a word.
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO fleet_events (fleet, at, dry_run, inputs, plan, actions, results, "
            "errors, exit_code) SELECT 'workers', now() - interval '2 hours' - "
            "g * interval '30 seconds', false, '{}', '{}', '[]', '[]', '[]', 0 "
            "FROM generate_series(1, 1200) g"
        )
    code, _ = run(capsys, "reconcile")
    assert code == 0

    code, out = run(capsys, "events", "--since", "1d", "--json")
    assert code == 0
    doc = json.loads(out)
    events = doc["events"]
    assert len(events) == 1000 and doc["truncated"] is True
    assert events[-1]["inputs"] != {}  # the pass just run, last (oldest first, as always)
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)

    code, out = run(capsys, "events", "--since", "1d")
    assert code == 0 and "newest 1000 passes" in out

    code, out = run(capsys, "events", "--since", "1h", "--json")
    doc = json.loads(out)
    assert len(doc["events"]) == 1 and doc["truncated"] is False


def test_a_loop_pass_whose_metrics_file_cannot_be_written_keeps_its_figures_counted_once(
    cli_env, capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import functools

    from vultrscale import metrics as metrics_mod
    from vultrscale import reconcile

    seen: list[metrics_mod.Metrics] = []

    def refuse(self: metrics_mod.Metrics, path: str) -> None:
        seen.append(self)
        raise RuntimeFailure(f"cannot write metrics to {path}: disk full")

    monkeypatch.setattr(metrics_mod.Metrics, "write_textfile", refuse)
    monkeypatch.setattr(
        reconcile, "run_forever", functools.partial(reconcile.run_forever, max_passes=1)
    )
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        queue.enqueue(conn, [{}] * 3)
    code, _ = run(capsys, "reconcile", "--loop", "--metrics-file", str(tmp_path / "m.prom"))
    assert code == 1
    m = seen[0]
    sample = functools.partial(m.registry.get_sample_value, labels={"fleet": "workers"})
    # the pass ran and was observed: its figures stand (not NaN) and it counts once, as exit 0
    assert sample("vultrscale_queue_ready") == 3.0
    assert (
        m.registry.get_sample_value(
            "vultrscale_passes_total", {"fleet": "workers", "exit_code": "0"}
        )
        == 1.0
    )
    assert (
        m.registry.get_sample_value(
            "vultrscale_passes_total", {"fleet": "workers", "exit_code": "1"}
        )
        == 0.0  # there from the start (for the alerts' increase()), never counted
    )


def test_status_watch_rides_out_a_database_outage(
    cli_env, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refresh that cannot read Postgres (a restart) shows the error and the next one shows
    the fleet again; `status --watch` ended with exit 1 at the first such refresh."""
    import time

    from rich.console import Console

    from vultrscale.cli import fleet as fleet_cmd
    from vultrscale.cli import views
    from vultrscale.errors import DatabaseError

    real = fleet_cmd._status_once
    calls: list[int] = []

    def flaky(cfg: Any, parts: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise DatabaseError(  # the password in it, to prove the view redacts it as well
                f"cannot reach the database at postgresql://postgres:{DB_PASSWORD}@db/x: "
                "server closed the connection unexpectedly",
                hint="Check that Postgres is running.",
            )
        return real(cfg, parts)

    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt  # Ctrl-C, the way out of a watch

    monkeypatch.setattr(fleet_cmd, "_status_once", flaky)
    monkeypatch.setattr(time, "sleep", sleep)
    # a terminal: elsewhere the live view prints only its last state
    terminal = Console(force_terminal=True, force_interactive=True, no_color=True, width=100)
    monkeypatch.setattr(views, "console", lambda stderr=False: terminal)
    code, out = run(capsys, "status", "--watch", "--every", "5s")
    assert code == 130  # stopped by Ctrl-C, not by the outage
    assert len(calls) == 3
    assert "cannot reach the database" in out and "trying again every 5s" in out
    assert out.rindex("fleet workers") > out.index("cannot reach the database")  # back again


@pytest.mark.parametrize("as_json", [False, True])
def test_status_watch_without_a_terminal_prints_every_refresh_in_turn(
    cli_env, capsys, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    """Piped or with --json there is no screen to redraw: each refresh is printed after the
    last (--json: one document each), a failed one said and the next one tried. The live view
    printed only at exit to a pipe, and --json ignored --watch."""
    import time

    from vultrscale.cli import fleet as fleet_cmd
    from vultrscale.errors import DatabaseError

    real = fleet_cmd._status_once
    calls: list[int] = []

    def flaky(cfg: Any, parts: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise DatabaseError("cannot reach the database", hint="Check that it runs.")
        return real(cfg, parts)

    def sleep(seconds: float) -> None:
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(fleet_cmd, "_status_once", flaky)
    monkeypatch.setattr(time, "sleep", sleep)
    code, out = run(capsys, "status", "--watch", *(["--json"] if as_json else []))
    assert code == 130 and len(calls) == 3
    if not as_json:
        assert out.count("fleet workers") == 2
        return
    docs, decoder, at = [], json.JSONDecoder(), 0
    while at < len(out.rstrip()):
        doc, at = decoder.raw_decode(out, at)
        docs.append(doc)
        at += len(out[at:]) - len(out[at:].lstrip())
    assert [sorted(d)[:1] for d in docs][1] == ["error"]
    assert docs[0].keys() == docs[2].keys() and "instances" in docs[0]


def test_a_pass_that_finds_the_lock_held_past_its_holders_deadline_exits_1_and_says_so(
    cli_env, capsys
) -> None:
    # Before: exit 0, "another pass holds the lock; nothing to do", for as long as the stuck
    # pass lasted: cron never alerted, and nothing scaled the fleet.
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as other:
        assert ledger.take_pass_lock(other, "workers", 30)
        other.execute(
            "SELECT set_config('application_name', 'vultrscale pass: deadline 30s, since ' "
            "|| (floor(extract(epoch FROM now()))::bigint - 650), false)"
        )
        code, out = run(capsys, "reconcile", "--json")
    assert code == 1
    doc = json.loads(out)
    # 650 s ago and a few seconds more: never a whole number of minutes, which reads "11m"
    # (held 600 s ago, the test failed whenever the age rounded to 600: "for 10m").
    stuck = r"held the lock of fleet 'workers' for 6[5-9][0-9]s, past the 90s"
    assert re.search(stuck, doc["error"])
    assert "pg_terminate_backend(" in doc["hint"]


def test_a_pass_against_a_silent_api_ends_by_its_deadline_recorded_with_the_lock_freed(
    cli_env, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: every call waited out five 10 s attempts and their backoff (a minute each, the
    # pass several), holding the fleet's lock all along.
    import time

    from vultrscale.core import clock

    sim, _ = cli_env
    monkeypatch.setattr(clock, "PASS_DEADLINE_S", 2.0)
    sim.latency = 12.0  # longer than the client's 10 s timeout: an API that does not answer
    began = time.monotonic()
    code, out = run(capsys, "reconcile", "--json")
    took = time.monotonic() - began
    sim.latency = 0.0
    assert code == 1
    # the deadline, then the pass's database work, with room for a loaded machine
    assert took < 2.0 + 5.0, f"the pass took {took:.1f}s"
    doc = json.loads(out)
    assert any("the pass's 2s deadline" in e for e in doc["errors"])
    assert doc["plan"]["actions"] == []  # an API error holds the fleet
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        row = conn.execute(
            "SELECT exit_code, errors FROM fleet_events ORDER BY id DESC LIMIT 1"
        ).fetchone()
        assert row is not None and row[0] == 1 and any("deadline" in e for e in row[1])
        assert ledger.try_lock(conn, "workers")  # freed for the next pass


def test_an_api_error_echoing_part_of_the_key_is_masked_in_output_and_in_fleet_events(
    cli_env, capsys
) -> None:
    # Before: "key=VKEY-cli-tes..." was printed and stored in fleet_events.errors.
    sim, _ = cli_env
    echo = {"error": f"Invalid request, key={API_KEY[:14]}...", "status": 400}
    sim.fail_next("GET", "/v2/instances", 400, echo, count=5)
    code, out = run(capsys, "reconcile", "--json")
    assert code == 1
    assert API_KEY[:14] not in out and "key=***..." in out
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        stored = conn.execute("SELECT inputs::text, errors::text FROM fleet_events").fetchall()
    assert stored and all(API_KEY[:6] not in i + e for i, e in stored)
    assert any("key=***..." in e for _, e in stored)


def test_a_loop_runs_pass_after_pass_on_one_postgres_backend(
    cli_env, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`reconcile --loop` keeps its Postgres connection between passes: a new one costs a TCP
    and authentication handshake every pass (and a backend the server forks)."""
    import functools

    from vultrscale import reconcile

    pids: list[int] = []
    lock = store.PgLedger.lock

    def lock_and_note_backend(self: store.PgLedger) -> bool:
        row = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pids.append(int(row[0]))
        return lock(self)

    monkeypatch.setattr(store.PgLedger, "lock", lock_and_note_backend)
    monkeypatch.setattr(reconcile, "_wait", lambda clock, stop, seconds: None)  # no interval
    monkeypatch.setattr(
        reconcile, "run_forever", functools.partial(reconcile.run_forever, max_passes=3)
    )
    code, _ = run(capsys, "reconcile", "--loop")
    assert code == 0
    assert len(pids) == 3 and len(set(pids)) == 1, pids
