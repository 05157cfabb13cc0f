"""The floor forecast on real Postgres: the history adapter (one aggregated scan of the jobs
table) gives the buckets the memory adapters give, and the profile cached in
``forecast_profiles`` comes back in the pass's one round trip, shared by every pass and
process, recomputed only once per ``policy.forecast.refresh``."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from vultrscale import cli, read
from vultrscale.config import Config, FleetConfig, ForecastConfig, PolicyConfig, Secret, Secrets
from vultrscale.core import forecast
from vultrscale.core.clock import FakeClock
from vultrscale.core.forecast import Bucket
from vultrscale.db import ledger
from vultrscale.db.history import PgHistory
from vultrscale.db.store import PgStore
from vultrscale.errors import VultrscaleError
from vultrscale.memory import SNAPSHOT, MemoryCloud, MemoryDrain, MemoryHistory, host_keys
from vultrscale.ports import Parts
from vultrscale.reconcile import run_pass
from vultrscale.vultr.errors import ApiUnreachable
from vultrscale.vultr.models import VInstance, VPlan

MONDAY = datetime(2026, 6, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
WEEK = forecast.WEEK


def _insert(
    conn: psycopg.Connection,
    created: datetime,
    run: float | None,
    *,
    queue: str = "default",
    due: datetime | None = None,
) -> None:
    """One job as the queue leaves it: finished after ``run`` seconds, or still ready."""
    started = None if run is None else (due or created) + timedelta(seconds=5)
    finished = None if started is None or run is None else started + timedelta(seconds=run)
    conn.execute(
        "INSERT INTO jobs (queue, state, created_at, run_at, started_at, finished_at) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        (
            queue,
            "ready" if run is None else "succeeded",
            created,
            due or created,
            started,
            finished,
        ),
    )


def _history() -> list[tuple[datetime, float | None]]:
    """Two weeks of a Monday 09:00 surge (90 jobs of 60-150 s in 30 minutes: 1.5 to 2.1 jobs
    at once over the hour), a job a day at 03:07, and one job not finished yet."""
    jobs: list[tuple[datetime, float | None]] = []
    for w in range(2):
        monday = MONDAY + w * WEEK
        jobs += [(monday + timedelta(days=d, hours=3, minutes=7), 30.0) for d in range(7)]
        jobs += [(monday + 9 * HOUR + timedelta(seconds=20 * i), 60.0 + i) for i in range(90)]
    jobs.append((MONDAY + WEEK + 9 * HOUR + timedelta(minutes=59), None))  # still ready
    return jobs


def test_the_postgres_history_gives_the_buckets_the_memory_history_gives(db_url: str) -> None:
    jobs = _history()
    until = MONDAY + 2 * WEEK
    with psycopg.connect(db_url, autocommit=True) as conn:
        for created, run in jobs:
            _insert(conn, created, run)
        _insert(conn, MONDAY + 9 * HOUR, 60.0, queue="other")  # another queue
        # Created before until, but due after it: not yet demand, never counted.
        _insert(conn, until - HOUR, 60.0, due=until + HOUR)
    for width in (HOUR, timedelta(minutes=15)):
        got = PgHistory(db_url, "default").buckets(MONDAY, until, width)
        assert got == MemoryHistory(jobs).buckets(MONDAY, until, width)
    surge = next(b for b in got if b.start == MONDAY + WEEK + 9 * HOUR)
    assert surge == Bucket(MONDAY + WEEK + 9 * HOUR, 45, 45, sum(60.0 + i for i in range(45)))
    every_queue = PgHistory(db_url).buckets(MONDAY, until, HOUR)
    assert sum(b.arrivals for b in every_queue) == len(jobs) + 1


class CountingHistory:
    """The Postgres history, counting its scans."""

    def __init__(self, url: str) -> None:
        self.inner = PgHistory(url)
        self.scans = 0

    def buckets(self, since: datetime, until: datetime, width: timedelta) -> list[Bucket]:
        self.scans += 1
        return self.inner.buckets(since, until, width)


def _parts(db_url: str, cloud: MemoryCloud, history: CountingHistory) -> Parts:
    clock = cloud.clock
    return Parts(
        cloud=cloud,
        store=PgStore(db_url),
        drain=MemoryDrain(),
        clock=clock,
        keygen=host_keys(),
        render_user_data=lambda label, private, public: "#cloud-config\n",
        history=history,
    )


def _config(mode: str) -> Config:
    secrets = Secrets(worker_database_url=Secret("postgresql://worker@db.invalid/q"))
    fc = ForecastConfig(mode=mode)
    fleet = FleetConfig(snapshot_id=SNAPSHOT)
    return Config(fleet=fleet, policy=PolicyConfig(forecast=fc), secrets=secrets)


def test_passes_share_one_cached_profile_and_scan_the_history_once_per_refresh(
    db_url: str,
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for created, run in _history():
            _insert(conn, created, run)
    now = MONDAY + 2 * WEEK + 8 * HOUR + timedelta(minutes=50)
    clock = FakeClock(now)
    cloud = MemoryCloud(clock)
    first, second = CountingHistory(db_url), CountingHistory(db_url)
    cfg = _config("observe")

    result = run_pass(cfg, _parts(db_url, cloud, first))
    assert first.scans == 1
    assert result.plan is not None and result.plan.forecast_floor == 1
    assert any(r.startswith("forecast floor 1 not applied") for r in result.plan.reasons)
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT computed_at FROM forecast_profiles").fetchone()
    assert row == (now,)

    clock.advance(59 * 60)  # another process's pass, within the refresh: reads the cache
    result = run_pass(cfg, _parts(db_url, cloud, second))
    assert (first.scans, second.scans) == (1, 0)
    assert result.plan is not None and result.plan.forecast_floor == 1
    clock.advance(60)  # an hour on: recomputed, once
    run_pass(cfg, _parts(db_url, cloud, second))
    run_pass(cfg, _parts(db_url, cloud, second))
    assert second.scans == 1


def test_mode_off_reads_no_profile_and_scans_no_history(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for created, run in _history():
            _insert(conn, created, run)
    history = CountingHistory(db_url)
    cloud = MemoryCloud(FakeClock(MONDAY + 2 * WEEK + 9 * HOUR))
    result = run_pass(_config("off"), _parts(db_url, cloud, history))
    assert history.scans == 0 and result.plan is not None and result.plan.forecast_floor is None
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM forecast_profiles").fetchone() == (0,)



class _BrokenCloud(MemoryCloud):
    """A cloud that fails the pass while ``broken``: the API unreachable, or the fleet's
    snapshot deleted (a pass that must create then refuses, exit 2)."""

    def __init__(self, clock: FakeClock, how: str) -> None:
        super().__init__(clock, snapshots={} if how == "snapshot-missing" else None)
        self.how = how
        self.broken = True

    def mend(self) -> None:
        self.broken = False
        self.snapshots[SNAPSHOT] = "complete"

    def get_plan(self, plan_id: str) -> VPlan:
        self._down()
        return super().get_plan(plan_id)

    def list_instances(self, tag: str | None = None) -> list[VInstance]:
        self._down()
        return super().list_instances(tag)

    def _down(self) -> None:
        if self.broken and self.how == "api-unreachable":
            raise ApiUnreachable("GET /v2/instances: cannot connect to api.vultr.com")


@pytest.mark.parametrize(("how", "code"), [("api-unreachable", 1), ("snapshot-missing", 2)])
def test_a_failed_pass_leaves_the_cached_profile_and_the_next_good_one_saves_it(
    db_url: str, how: str, code: int
) -> None:
    """Issue 36: a pass that failed (API unreachable, snapshot missing) still upserted its
    freshly computed profile into forecast_profiles; a failed pass changes nothing."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        for created, run in _history():
            _insert(conn, created, run)
    now = MONDAY + 2 * WEEK + 8 * HOUR
    policy = PolicyConfig(min_instances=2, forecast=ForecastConfig(mode="observe"))
    cfg = replace(_config("observe"), policy=policy)  # it creates: the snapshot is needed
    stale = read.forecast_profile(cfg, PgHistory(db_url), None, now - 2 * HOUR)
    with psycopg.connect(db_url, autocommit=True) as conn:
        ledger.save_forecast_profile(conn, cfg.fleet.name, stale)
    clock = FakeClock(now)
    cloud = _BrokenCloud(clock, how)
    parts = _parts(db_url, cloud, CountingHistory(db_url))

    try:
        got = run_pass(cfg, parts).exit_code
    except VultrscaleError as exc:
        got = exc.exit_code
    assert got == code
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT computed_at FROM forecast_profiles").fetchall() == [
            (now - 2 * HOUR,)
        ]
        assert conn.execute("SELECT exit_code FROM fleet_events").fetchall() == [(code,)]

    cloud.mend()  # the next pass succeeds: the profile this process computed is saved now
    assert run_pass(cfg, parts).exit_code == 0
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT computed_at FROM forecast_profiles").fetchall() == [(now,)]


# --- `vultrscale forecast` ---------------------------------------------------------------------


def test_forecast_json_shows_the_coming_surge_and_its_floor_one_lead_ahead(
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    now = datetime.now(UTC)
    surge = forecast.slot_start(now + 3 * HOUR, HOUR)  # three hours from now, every week
    with psycopg.connect(db_url, autocommit=True) as conn:
        for weeks_ago in (1, 2):
            start = surge - weeks_ago * WEEK
            _insert(conn, start - 20 * HOUR, 30.0)  # the history reaches back this far
            for i in range(360):  # 6 jobs at once for the hour
                _insert(conn, start + timedelta(seconds=10 * i), 60.0)
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert cli.main(["forecast", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["mode"], doc["usable"], doc["note"], doc["lead_seconds"]) == (
        "observe",
        True,
        None,
        12 * 60.0,  # policy.boot_time: no boots learned yet
    )
    assert doc["profile"] == "computed now from the jobs table"
    slots = {s["start"]: s for s in doc["slots"]}
    assert len(doc["slots"]) in (48, 49)  # from the slot holding now, 48 hours on
    at = slots[surge.isoformat()]
    assert (at["jobs_at_once"], at["needs"], at["floor"]) == (6.0, 2, 2)
    before = slots[(surge - HOUR).isoformat()]  # its floor rises one lead (12m) ahead
    assert (before["needs"], before["floor"]) == (0, 2)
    assert slots[(surge - 2 * HOUR).isoformat()]["floor"] == 0
    # The same as a table and as a picture.
    png = tmp_path / "week.png"
    assert cli.main(["forecast", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "mode observe (observes only)" in out and "next 48 hours (UTC)" in out
    assert png.read_bytes().startswith(b"\x89PNG")


def test_forecast_with_too_little_history_says_so_and_exits_0(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        _insert(conn, datetime.now(UTC) - timedelta(days=2), 60.0)
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert cli.main(["forecast", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["usable"] is False and doc["slots"] == []
    assert doc["note"].startswith("too little history: 2d of jobs, 7d needed")
    assert cli.main(["forecast"]) == 0
    assert "no forecast: too little history" in capsys.readouterr().out


def test_forecast_of_a_queue_that_keeps_no_finished_jobs_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VULTRSCALE_QUEUE_PRESET", "graphile-worker")
    assert cli.main(["forecast"]) == 2
    err = capsys.readouterr().err
    assert "with queue.preset = 'graphile-worker' there are none" in err
    assert "deletes a job when it succeeds" in err
