"""`vultrscale simulate`: the world, the baselines and the real pass on small traces worked out
by hand, conservation and determinism, and the command's bad-input paths."""

from __future__ import annotations

import heapq
import json
import sys
import warnings
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from vultrscale import config as config_mod
from vultrscale.cli import main
from vultrscale.config import Config, FloorConfig, Offering, WaitTarget
from vultrscale.errors import UsageError
from vultrscale.replay import baselines, compare, engine, workload
from vultrscale.replay.fleet import Vultrscale
from vultrscale.replay.report import measure
from vultrscale.replay.world import MAX_ATTEMPTS, Faults, World

BOOT = 600.0  # a fixed 10-minute boot makes the hand arithmetic exact
SETUP = compare.Setup(interval=30.0, boot_time=(BOOT, BOOT), seed=0)
CFG = Config()
PRICE = compare.plan_price(CFG)


# A sweep replays its rows on one process per core: here on this one (the unit tier starts no
# process).
pytestmark = pytest.mark.usefixtures("one_process")


def _trace(jobs: list[tuple[float, float]], span: float | None = None) -> workload.Trace:
    return workload.from_jobs("hand", jobs, span=span)


def _play(policy_name: str, trace: workload.Trace, cfg: Config = CFG):
    pol = compare._policies([policy_name], cfg, trace, PRICE)[0]
    world, stats = compare.play(pol, trace, cfg, SETUP)
    result = compare.run_one(
        compare._policies([policy_name], cfg, trace, PRICE)[0], trace, cfg, SETUP, PRICE
    )
    return world, stats, result


def _conserved(world: World) -> None:
    """Every attempt started ends finished, killed or given back, or still runs; every job is
    finished, dead, or still somewhere in the queue."""
    c = world.c
    running = sum(len(i.running) for i in world.live.values())
    assert c.starts == c.finished + c.killed + c.given_back + running
    unfinished = len(world.ready) + world.limbo + running
    assert len(world.trace) == c.finished + c.dead + unfinished
    assert sum(f is not None for f in world.finished_at) == c.finished
    assert all(a <= MAX_ATTEMPTS for a in world.attempts)


# --- worked out by hand ------------------------------------------------------------------


def test_one_job_from_zero_waits_one_boot_and_bills_one_hour() -> None:
    world, _, r = _play("vultrscale", _trace([(0.0, 60.0)]))
    assert r.finished == 1 and r.lost == 0 and r.killed == 0
    # The pass at 0 s creates; the worker is up at 600 s and runs the job to 660 s.
    assert world.finished_at[0] == BOOT + 60.0
    assert r.wait_max == BOOT
    assert r.scale_ups == 1 and r.scale_downs == 1
    # Kept idle until its paid hour nearly ends (billing_hour_aware), deleted within it.
    assert r.billed_hours == 1
    assert r.cost_usd == pytest.approx(PRICE.hourly)
    inst = world.instances[0]
    assert inst.gone_at is not None and 3000.0 <= inst.gone_at < 3600.0


def test_two_bursts_closer_than_the_cool_down_share_the_same_instances() -> None:
    first = [(0.0, 60.0)] * 8  # 8 jobs at 4 per instance: 2 instances, busy 600..660 s
    second = [(900.0, 60.0)] * 8  # 4 min after the first burst ended (cool-down: 5 min)
    world, _, r = _play("vultrscale", _trace(first + second))
    assert r.scale_ups == 2  # the second burst is served by the first burst's instances
    assert r.killed == 0 and r.lost == 0
    assert all(world.finished_at[j] == 960.0 for j in range(8, 16))  # no wait at all
    assert r.billed_hours == 2


def test_a_burst_straddling_the_end_of_a_floor_window_is_served_then_scaled_to_zero() -> None:
    cfg = replace(
        CFG,
        policy=replace(CFG.policy, floor=(FloorConfig(cron="* 9 * * *", timezone="UTC"),)),
    )
    burst = [(9 * 3600.0 + 50 * 60.0 + k, 120.0) for k in range(20)]  # 09:50, 20 jobs
    world, stats, r = _play("vultrscale", _trace(burst, span=86_400.0), cfg)
    # Passes before 09:00 on an idle, empty fleet were skipped, yet the floor's instance is
    # created by the 09:00 pass exactly.
    assert stats.skipped > 0
    assert world.instances[0].created == 9 * 3600.0
    assert world.finished_at[0] == 9 * 3600.0 + 50 * 60.0 + 120.0  # the warm one took it at once
    assert r.killed == 0 and r.lost == 0 and r.given_back == 0
    assert not world.live  # after the window and the burst: back to zero
    assert all(i.gone_at is not None and i.gone_at > 10 * 3600.0 for i in world.instances)


def test_a_job_longer_than_the_drain_time_is_given_back_without_spending_an_attempt() -> None:
    world = World(
        _trace([(0.0, 3600.0)]),
        jobs_per_instance=4,
        drain_seconds=20.0,
        lease_seconds=60.0,
        boot_time=(0.0, 0.0),
        seed=0,
    )
    world.warm("w-1")
    world.arrive(0)
    world.dispatch()
    assert world.attempts[0] == 1
    world.now = 100.0
    assert world.stop("w-1")
    assert world.service_active("w-1") is True  # still running its job within the drain time
    world.now = 120.0  # the drain time is over
    while world.events and world.events[0][0] <= 120.0:
        _, kind, _, obj, tok = heapq.heappop(world.events)
        world.handle(kind, obj, tok)
    assert world.c.given_back == 1 and world.c.killed == 0
    assert world.attempts[0] == 0  # refunded
    assert world.service_active("w-1") is False  # the worker exited: the scaler may delete
    assert world.ready_count == 1
    _conserved(world)


def test_a_job_longer_than_the_drain_timeout_finishes_under_vultrscale() -> None:
    long_job = 2 * 3600.0  # far past drain.timeout (5 min) and the worker's drain (20 s)
    world, _, r = _play("vultrscale", _trace([(0.0, long_job)]))
    assert r.killed == 0 and r.given_back == 0 and r.lost == 0
    assert world.finished_at[0] == BOOT + long_job
    assert r.scale_ups == 1


def test_naive_kills_the_job_that_vultrscale_lets_finish() -> None:
    trace = _trace([(0.0, 600.0)])
    nworld, _, naive = _play("naive", trace)
    vworld, _, ours = _play("vultrscale", trace)
    # naive: the job starts, nothing is ready any more, so the instance is deleted under it;
    # each retry after the lease expires meets the same fate until the job is dead.
    assert naive.killed == MAX_ATTEMPTS and naive.lost == 1
    assert nworld.c.dead == 1
    assert ours.killed == 0 and ours.lost == 0
    assert vworld.finished_at[0] == BOOT + 600.0


def test_keda_deletes_a_busy_instance_when_its_stabilised_target_drops() -> None:
    # 8 jobs need 2 instances; the 40-minute job runs on the newer one. When the short jobs
    # end, demand is 1: 300 s later KEDA removes the newest instance, job and all.
    jobs = [(0.0, 60.0)] * 7 + [(0.0, 2400.0)]
    world, _, r = _play("keda", _trace(jobs))
    _conserved(world)
    assert r.killed == 1 and r.lost == 0
    assert world.attempts[7] == 2  # the kill spent an attempt; the rerun finished it
    ours = _play("vultrscale", _trace(jobs))[2]
    assert ours.killed == 0


# --- properties ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["always-on", "naive", "keda", "vultrscale"])
def test_every_job_is_accounted_for(name: str) -> None:
    trace = workload.shape("spiky", days=1, seed=3, jobs_per_day=300)
    for pol in compare._policies([name], CFG, trace, PRICE):
        world, _ = compare.play(pol, trace, CFG, SETUP)
        _conserved(world)
        assert world.c.finished + world.c.dead <= len(trace)


@pytest.mark.parametrize("name", ["always-on", "naive", "keda", "vultrscale"])
def test_a_job_finished_in_the_grace_is_paid_for_under_every_policy(name: str) -> None:
    # One 5 s job 10 s before the trace's end (a CSV span: rounded up to the hour): every
    # instance that runs it is created at or after that end, inside the grace.
    trace = _trace([(3590.0, 5.0)])
    r = _play(name, trace)[2]
    assert r.finished == 1 or name == "naive"  # naive's delete-when-nothing-ready kills it
    assert r.billed_hours >= 1 and r.cost_usd >= PRICE.hourly
    assert r.instance_hours > 0
    if r.finished:
        assert r.ratio >= 1


@pytest.mark.parametrize("name", ["always-on", "naive", "keda", "vultrscale"])
def test_instance_hours_are_every_instance_created_to_gone_or_to_the_replay_end(
    name: str,
) -> None:
    # Sixty half-hour jobs at once: the fleet works well past the trace's one-hour span.
    trace = _trace([(0.0, 1800.0)] * 60)
    end = trace.span + compare.grace_seconds(CFG, SETUP, trace)  # where the replay stops
    for pol in compare._policies([name], CFG, trace, PRICE):
        world, _ = compare.play(pol, trace, CFG, SETUP)
        r = compare.run_one(
            compare._policies([name], CFG, trace, PRICE)[0], trace, CFG, SETUP, PRICE
        )
        alive = sum(
            (i.gone_at if i.gone_at is not None else end) - i.created for i in world.instances
        )
        assert r.instance_hours == pytest.approx(alive / 3600.0)
        if r.lost == 0:  # a fleet that did all the work cannot beat the lower bound
            assert r.ratio >= 1
        break  # the first (peak) always-on fleet is enough


def test_keda_pays_every_started_hour_up_to_its_deletes() -> None:
    # Five instances, each created at 0 s and deleted after its jobs end past the first
    # hour: two started hours each, where the span-clipped count said one.
    r = _play("keda", _trace([(0.0, 1800.0)] * 60))[2]
    assert r.lost == 0 and r.scale_ups == 5
    assert r.billed_hours == 10
    assert r.cost_usd == pytest.approx(10 * PRICE.hourly)


def test_a_lost_job_counts_as_waiting_until_the_replay_end() -> None:
    # Naive deletes the instance whenever nothing is ready, killing the one running job:
    # it is killed at every attempt and never finishes.
    trace = _trace([(0.0, 1800.0)])
    world, _, r = _play("naive", trace)
    assert r.lost == 1 and r.finished == 0
    end = trace.span + compare.grace_seconds(CFG, SETUP, trace)
    assert r.wait_p50 == r.wait_p95 == r.wait_max == pytest.approx(end - 1800.0)
    assert r.wait_p50_at_least and r.wait_p95_at_least and r.wait_max_at_least
    doc = r.to_json()
    assert doc["wait_p95"] > 0 and doc["wait_p95_at_least"] is True


def test_a_lost_job_makes_the_waits_at_and_above_it_floors() -> None:
    from vultrscale.replay.report import wait_percentile

    waits, lost = [10.0, 20.0, 30.0, 40.0], 20.0  # the job waiting 20 s so far was lost
    assert wait_percentile(waits, 0.25, lost) == (10.0, False)  # below the lost one: exact
    assert wait_percentile(waits, 0.50, lost) == (20.0, True)
    assert wait_percentile(waits, 1.0, lost) == (40.0, True)  # the lost one may be above it
    assert wait_percentile(waits, 1.0) == (40.0, False)  # nothing lost: exact
    assert wait_percentile([], 0.95) == (0.0, False)


def test_the_table_marks_a_wait_that_rests_on_a_lost_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--days", "1", "--workload", "spiky", "--jobs-per-day", "30",
            "--policies", "naive,keda"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = {
        w: line for line in out.splitlines() for w in line.split()[:2] if w in ("naive", "keda")
    }
    assert ">=" in rows["naive"]  # it loses jobs
    assert ">=" not in rows["keda"]  # it loses none


def test_billed_hours_stop_at_the_monthly_cap() -> None:
    from vultrscale.replay.report import instance_bill

    # A whole 30-day June (720 started hours) at $10/month, $0.0149/h: the cap is reached in
    # the 672nd hour; the 48 after it cost nothing and are not billed hours.
    assert instance_bill(0.0, 720 * 3600.0, workload.TRACE_EPOCH, PRICE) == (
        672,
        pytest.approx(PRICE.monthly),
    )
    # Into July: a new month, a new cap, the first hour billed again.
    assert instance_bill(0.0, 720 * 3600.0 + 1, workload.TRACE_EPOCH, PRICE)[0] == 673
    flat = replace(PRICE, hourly_cost=None)  # hourly = monthly / 672 exactly
    assert instance_bill(0.0, 720 * 3600.0, workload.TRACE_EPOCH, flat)[0] == 672


def test_the_same_seed_gives_the_same_results_and_another_seed_does_not() -> None:
    setup = compare.Setup(seed=7)

    def once(seed: int) -> list[dict[str, object]]:
        trace = workload.shape("bursty-day", days=1, seed=seed, jobs_per_day=200)
        names = ("naive", "keda", "vultrscale")
        cmp = compare.compare(trace, CFG, replace(setup, seed=seed), names, price=PRICE)
        return [r.to_json() for r in cmp.results]

    assert once(7) == once(7)
    assert once(7) != once(8)


def test_vultrscale_kills_and_loses_nothing_on_a_bursty_week() -> None:
    trace = workload.shape("bursty-day", days=2, seed=1)
    cmp = compare.compare(trace, CFG, compare.Setup(), ("keda", "vultrscale"), price=PRICE)
    by_name = {r.policy: r for r in cmp.results}
    keda, ours = by_name["keda"], by_name["vultrscale"]
    assert ours.killed == 0 and ours.lost == 0
    assert ours.cost_usd <= keda.cost_usd


def test_the_folded_gone_rows_bill_what_the_rows_themselves_would() -> None:
    from vultrscale.rules import budget

    trace = workload.shape("bursty-day", days=1, seed=2, jobs_per_day=200)
    pol = Vultrscale(CFG, PRICE, trace.epoch)
    folded: list = []
    orig = pol.ledger._fold
    pol.ledger._fold = lambda row: (folded.append(row), orig(row))  # type: ignore[method-assign]
    compare.play(pol, trace, CFG, SETUP)
    assert folded, "some instance went away"
    start, end = budget.month_bounds(trace.epoch)
    expected = sum(budget.ledger_bills(folded, None, trace.epoch + timedelta(days=1)).values())
    assert pol.ledger.gone_bill[start] == pytest.approx(expected, abs=1e-12)
    assert pol.ledger.passes > 0 and not pol.ledger.failed


# --- workloads ----------------------------------------------------------------------------


def test_csv_with_and_without_a_header(tmp_path: Path) -> None:
    p = tmp_path / "jobs.csv"
    p.write_text("arrival_seconds,duration_seconds\n10,5\n0,2.5\n")
    t = workload.load_csv(p)
    assert t.arrivals == (0.0, 10.0) and t.durations == (2.5, 5.0)
    p.write_text("0,1\n")
    assert len(workload.load_csv(p)) == 1


def test_csv_saved_by_excel_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    p = tmp_path / "excel.csv"
    p.write_bytes("arrival_seconds,duration_seconds\r\n10,5\r\n".encode("utf-8-sig"))
    t = workload.load_csv(p)
    assert t.arrivals == (10.0,) and t.durations == (5.0,)


def test_csv_header_after_comment_lines_is_a_header(tmp_path: Path) -> None:
    p = tmp_path / "commented.csv"
    p.write_text("# exported 2026-11-30\n\narrival_seconds,duration_seconds\n0,2.5\n")
    t = workload.load_csv(p)
    assert t.arrivals == (0.0,) and t.durations == (2.5,)
    p.write_text("0,1\narrival_seconds,duration_seconds\n")  # past the first row: an error
    with pytest.raises(UsageError, match="line 2: not a number"):
        workload.load_csv(p)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("0,1\n5,abc\n", "line 2: not a number"),
        ("0,1\n1,2,3\n", "line 2: expected 2 columns"),
        ("arrival_seconds,duration_seconds\n0,1\n-4,1\n", "line 3: arrival_seconds is negative"),
        ("0,0\n", "line 1: duration_seconds must be above 0"),
        ("1e12,10\n", "line 1: 1e+12 s is past a year"),
    ],
    ids=["not-a-number", "three-columns", "negative-arrival", "zero-duration", "huge"],
)
def test_a_bad_csv_row_names_its_line_and_exits_2(
    tmp_path: Path, body: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(body)
    assert main(["simulate", "--workload", str(p)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_history_across_a_dst_change_keeps_real_arrivals_and_durations() -> None:
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    # psycopg hands timestamptz back in the session's zone. Berlin leaves summer time at
    # 01:00 UTC on 2026-10-25 (03:00 CEST becomes 02:00 CET): in wall time the job due at
    # 01:10 UTC (02:10) comes before the one due at 00:30 UTC (02:30), and the job from
    # 00:50 to 01:05 UTC (02:50 to 02:05) lasts less than nothing.
    berlin = ZoneInfo("Europe/Berlin")

    def at(h: int, m: int) -> datetime:
        return datetime(2026, 10, 25, h, m, tzinfo=UTC).astimezone(berlin)

    rows = [(at(0, 30), None, at(0, 40)), (at(0, 50), None, at(1, 5)), (at(1, 10), None, at(1, 20))]
    t = workload.from_history(rows, since=timedelta(days=1))
    assert t.epoch == datetime(2026, 10, 25, tzinfo=UTC)
    assert t.arrivals == (1800.0, 3000.0, 4200.0)
    assert t.durations == (600.0, 900.0, 600.0)


def test_a_csv_with_more_jobs_than_a_replay_holds_exits_2_at_the_first_one_too_many(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from vultrscale import params

    monkeypatch.setattr(params, "MAX_REPLAY_JOBS", 3)
    p = tmp_path / "big.csv"
    p.write_text("0,1\n1,1\n2,1\n")
    assert len(workload.load_csv(p)) == 3  # at the limit: fine
    # One job more, then a bad row: refused at the fourth job, before reading the bad row.
    p.write_text("0,1\n1,1\n2,1\n3,1\nnot,a number\n")
    assert main(["simulate", "--workload", str(p)]) == 2
    err = capsys.readouterr().err
    assert "more than 3 jobs" in err and "Traceback" not in err


def test_a_csv_that_is_not_utf8_exits_2_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "latin1.csv"
    p.write_bytes("# caf\u00e9 jobs\n0,1\n".encode("latin-1"))
    assert main(["simulate", "--workload", str(p)]) == 2
    err = capsys.readouterr().err
    assert "not a UTF-8 text CSV" in err and "Traceback" not in err


def test_a_csv_the_reader_refuses_exits_2_naming_the_row_format_not_the_encoding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "bigfield.csv"
    p.write_text("0," + "1" * 200_000 + "\n")  # valid UTF-8; past the csv module's field limit
    assert main(["simulate", "--workload", str(p)]) == 2
    err = capsys.readouterr().err
    assert "arrival_seconds,duration_seconds" in err and "UTF-8" not in err


@pytest.mark.parametrize("name", workload.SHAPES)
def test_zero_jobs_per_day_is_no_job_at_all(name: str) -> None:
    assert len(workload.shape(name, days=3, seed=0, jobs_per_day=0)) == 0


def test_shapes_are_seeded() -> None:
    a = workload.shape("steady", days=1, seed=1, jobs_per_day=100)
    assert a == workload.shape("steady", days=1, seed=1, jobs_per_day=100)
    assert a != workload.shape("steady", days=1, seed=2, jobs_per_day=100)
    assert 60 <= len(a) <= 140


# --- the command ----------------------------------------------------------------------------


def test_json_has_every_policy_and_the_lower_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--days", "1", "--jobs-per-day", "100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [r["policy"] for r in doc["results"]]
    assert len(names) == 6 and "always-on 1" in names
    assert set(names) >= {"naive", "keda", "hindsight", "vultrscale"}
    assert [n for n in names if n.endswith("(peak)")]
    assert doc["lower_bound_hours"] > 0
    for r in doc["results"]:
        assert r["ratio_to_lower_bound"] == pytest.approx(
            r["instance_hours"] / doc["lower_bound_hours"], rel=0.02
        )


def test_sweep_ranks_the_combinations_by_cost(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "simulate", "--days", "1", "--jobs-per-day", "100", "--json",
        "--sweep", "policy.billing_hour_aware=true,false",
        "--sweep", "policy.idle_before_scale_down=0s,15m",
    ]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    settings = [r for r in rows if not r["baseline"]]
    assert len(settings) == 4 + 1  # the current setting (idle 90s) is none of them: added
    assert [r["policy"] for r in settings if r["current"]] == ["current"]
    assert len(rows) == 5 + 5  # and the baselines: always-on twice, naive, keda, hindsight
    costs = [r["cost_usd"] for r in rows if r["lost"] == 0]
    assert costs == sorted(costs)
    assert {r["policy"] for r in rows} >= {
        "policy.billing_hour_aware=false policy.idle_before_scale_down=15m"
    }


def test_a_plan_sweep_prices_each_variant_at_its_own_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vultrscale.fake_vultr import data

    hourly = {p["id"]: float(p["hourly_cost"]) for p in data.PLANS}
    # the dearer plan first: the ranking puts it last
    argv = ["simulate", "--days", "1", "--jobs-per-day", "100", "--json", "--policies",
            "vultrscale", "--sweep", "fleet.plan=vc2-2c-4gb,vc2-1c-1gb"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = [r for r in doc["results"] if r["policy"] != "current"]
    assert len(rows) == 2
    assert doc["price"]["plan"] == doc["results"][0]["plan"]  # the first row's, after ranking
    for r in rows:
        plan = r["policy"].removeprefix("fleet.plan=")
        assert r["billed_hours"] > 0  # a day is far below the monthly cap: hours x rate
        assert r["cost_usd"] == pytest.approx(r["billed_hours"] * hourly[plan], abs=1e-4)


def test_a_sweep_measures_every_row_over_one_window(capsys: pytest.CaptureFixture[str]) -> None:
    """Each row's window ended at its own grace, which holds drain.timeout: the row with 2h
    billed the same behaviour 1.98 instance-hours more, and ranked dearer."""
    argv = ["simulate", "--days", "1", "--jobs-per-day", "50", "--json",
            "--sweep", "drain.timeout=1m,2h", "--sweep", "policy.min_instances=1"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["policy"].split()[0]: r for r in doc["results"]}
    short, long = rows["drain.timeout=1m"], rows["drain.timeout=2h"]
    assert short["instance_hours"] == pytest.approx(long["instance_hours"], abs=0.01)
    assert short["cost_usd"] == pytest.approx(long["cost_usd"], abs=1e-6)
    assert doc["grace_seconds"] > 7200  # the longer drain's grace, for both


def test_keda_keeps_to_a_cap_of_zero(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv = tmp_path / "jobs.csv"
    csv.write_text("0,60\n300,60\n600,60\n")
    config = tmp_path / "zero.toml"
    config.write_text("[policy]\nmax_instances = 0\n")
    argv = ["--config", str(config), "simulate", "--workload", str(csv), "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["policy"]: r for r in doc["results"]}
    assert rows["keda"]["scale_ups"] == 0 and rows["keda"]["cost_usd"] == 0
    assert "always-on 1" not in rows


def test_a_concurrency_sweep_gives_each_row_its_own_lower_bound(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulated instances ran queue.jobs_per_instance jobs at once, not the worker's
    concurrency (what the user-data gives it): a sweep of worker.concurrency gave three
    identical rows."""
    # The depth rule: on 100 jobs a day the wait rule boots one instance a burst whatever the
    # slots, so the rows' instance-hours would not tell the two worlds apart.
    monkeypatch.setenv("VULTRSCALE_POLICY_TARGET_WAIT", "0s")
    argv = ["simulate", "--days", "1", "--jobs-per-day", "100", "--json",
            "--sweep", "worker.concurrency=2,4"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    bounds = {r["policy"]: r["lower_bound_hours"] for r in doc["results"]}
    job_hours = doc["workload"]["job_hours"]
    assert bounds["worker.concurrency=2"] == pytest.approx(job_hours / 2, abs=0.01)
    assert bounds["worker.concurrency=4"] == pytest.approx(job_hours / 4, abs=0.01)
    rows = {r["policy"]: r for r in doc["results"]}
    assert (
        rows["worker.concurrency=2"]["instance_hours"]
        != rows["worker.concurrency=4"]["instance_hours"]
    )
    assert doc["lower_bound_hours"] is None  # no single bound stands for both rows
    assert main(argv[:-3] + argv[-2:]) == 0  # the table: its footer names no single bound
    assert "lower bound: each row's own" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sweep", "policy.max_instances"], "is not KEY=V1,V2"),
        (["--sweep", "policy.no_such_key=1,2"], "no_such_key"),
        (["--sweep", "policy.max_instances=1,many"], "max_instances"),
        (["--sweep", "polcy.max_instances=1,2"], "Did you mean policy.max_instances?"),
        (["--sweep", "policy.max_instance=1,2"], "Did you mean policy.max_instances?"),
        (["--sweep", "policy.max_instances=" + ",".join(map(str, range(1, 12))),
          "--sweep", "policy.max_step_up=" + ",".join(map(str, range(10)))], "more than the 100"),
        (["--boot-time", "15m..10m"], "ends before it starts"),
        (["--boot-time", "soon"], "expected a duration"),
        (["--policies", "always-on,hpa"], "unknown policy: hpa"),
        (["--policies", ","], "--policies names no policy"),
        (["--workload", "weekly"], "unknown workload 'weekly'"),
        (["--from-db"], "--from-db needs DATABASE_URL"),
    ],
    ids=["sweep-no-values", "sweep-unknown-key", "sweep-bad-value", "sweep-misspelled-section",
         "sweep-misspelled-key", "sweep-grid-too-large", "boot-reversed",
         "boot-not-a-duration", "unknown-policy", "no-policy", "unknown-shape",
         "from-db-without-url"],
)  # fmt: skip
def test_bad_options_exit_2_before_any_replay(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.chdir(Path(__file__).parent)  # no vultrscale.toml or .env here
    assert main(["simulate", "--days", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    if argv[0] == "--sweep":  # a --sweep key is the user's flag, not a variable
        assert "environment" not in err


@pytest.mark.parametrize(
    ("preset", "why"),
    [
        ("graphile-worker", "graphile-worker deletes a job when it succeeds"),
        ("custom", "the custom preset reads numbers, not jobs"),
    ],
)
def test_from_db_with_a_preset_that_keeps_no_finished_jobs_exits_2_before_reading_anything(
    preset: str, why: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.chdir(Path(__file__).parent)  # no vultrscale.toml or .env here
    monkeypatch.setenv("VULTRSCALE_QUEUE_PRESET", preset)
    if preset == "custom":  # the custom preset needs its three queries to load
        for key in ("READY_SQL", "IN_FLIGHT_SQL", "OLDEST_READY_SECONDS_SQL"):
            monkeypatch.setenv(f"VULTRSCALE_QUEUE_{key}", "SELECT 0")
    # A URL nothing listens on: reaching it would be a database error (exit 1), not exit 2.
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:9/none")
    assert main(["simulate", "--from-db"]) == 2
    err = capsys.readouterr().err
    assert f"queue.preset '{preset}' has no history of finished jobs" in err and why in err
    assert "--workload PATH.csv" in err
    assert "Traceback" not in err


def test_plot_without_matplotlib_exits_2_with_the_extra_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    out = tmp_path / "p.png"
    assert main(["simulate", "--days", "1", "--plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "vultrscale[plot]" in err
    assert not out.exists()


def test_plot_draws_a_png(tmp_path: Path) -> None:
    import matplotlib  # noqa: F401 - a dev dependency: this test must draw, not skip

    out = tmp_path / "p.png"
    code = main(
        [
            "simulate",
            "--days",
            "1",
            "--jobs-per-day",
            "100",
            "--policies",
            "keda,vultrscale",
            "--plot",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plot_format_matplotlib_cannot_write_exits_2_before_any_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setattr(compare, "compare", lambda *a, **k: pytest.fail("replayed"))
    out = tmp_path / "fleet.xyz"
    assert main(["simulate", "--days", "1", "--plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert "cannot draw a .xyz file" in err and ".png" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("where", [".", "dir"])
def test_a_plot_path_that_names_no_file_exits_2_before_any_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch, where: str
) -> None:
    monkeypatch.setattr(compare, "compare", lambda *a, **k: pytest.fail("replayed"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    assert main(["simulate", "--days", "1", "--plot", where]) == 2
    err = capsys.readouterr().err
    assert "not a file name" in err and "unexpected" not in err
    assert not (tmp_path / "dir.png").exists()


def test_a_plot_in_a_directory_that_is_not_there_exits_2_before_any_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """It failed only after the whole replay (9 s here), and --json lost the results."""
    monkeypatch.setattr(compare, "compare", lambda *a, **k: pytest.fail("replayed"))
    assert main(["simulate", "--days", "1", "--plot", str(tmp_path / "no" / "week.png")]) == 2
    err = capsys.readouterr().err
    assert "is not a directory this user can write in" in err and "Fix:" in err


def test_a_plot_of_baselines_only_draws_the_cheapest_one_over_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With neither the current setting nor hindsight replayed, the fleet panel was empty
    (matplotlib: "No artists with labels found to put in legend")."""
    argv = ["simulate", "--days", "1", "--jobs-per-day", "20", "--policies", "keda,naive",
            "--plot", str(tmp_path / "fleet.png")]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(argv) == 0
    assert "plot written to" in capsys.readouterr().out


def test_a_plot_name_without_extension_reports_the_png_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--days", "1", "--jobs-per-day", "20", "--policies", "keda",
            "--plot", str(tmp_path / "fleet")]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    written = tmp_path / "fleet.png"
    assert json.loads(capsys.readouterr().out)["plot"] == str(written)
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(argv) == 0
    assert f"plot written to {written}" in capsys.readouterr().out.replace("\n", "")


def test_parse_boot_time() -> None:
    assert compare.parse_boot_time("12m") == (720.0, 720.0)
    assert compare.parse_boot_time("30s..15m") == (30.0, 900.0)
    assert config_mod.parse_duration("7d").days == 7
    assert isinstance(baselines.Keda(5, 4), baselines.Baseline)


_BERLIN_HOURS = FloorConfig(cron="* 8-17 * * mon-fri", timezone="Europe/Berlin", min_instances=2)


@pytest.mark.parametrize(
    ("policy_changes", "world_changes"),
    [
        ({}, {}),
        (
            {
                "max_instances": 3,
                "billing_hour_aware": False,
                "idle_before_scale_down": timedelta(),
            },
            {},
        ),
        (  # floors (business hours; the first ten minutes of each hour), cool-downs, paced
            {
                "floor": (_BERLIN_HOURS, FloorConfig(cron="0-9 * * * *", timezone="UTC")),
                "scale_up_cooldown": timedelta(minutes=5),
                "scale_down_cooldown": timedelta(minutes=30),
                "idle_before_scale_down": timedelta(minutes=10),
                "max_step_up": 1,
            },
            {},
        ),
        (  # the world fails: 429 bursts, stock-outs, boots that never finish
            {"floor": (_BERLIN_HOURS,), "boot_timeout": timedelta(minutes=5)},
            {
                "throttle_every": timedelta(hours=1),
                "throttle_for": timedelta(minutes=5),
                "stockout_every": timedelta(hours=2),
                "stockout_for": timedelta(minutes=30),
                "dead_boot_share": 0.2,
                "boot_time": "30s..8m",
            },
        ),
    ],
    ids=["defaults", "small-cap-no-billing-hour", "floors-cool-downs", "faults"],
)
def test_skipping_passes_changes_no_outcome(policy_changes: dict, world_changes: dict) -> None:
    # The reference runs every pass; the replay skips where the core says nothing changes,
    # both on an idle, empty fleet (next_change) and on a steady busy one (demand_band).
    cfg = replace(
        CFG,
        policy=replace(CFG.policy, **policy_changes),
        simulate=replace(CFG.simulate, **world_changes),
        drain=replace(CFG.drain, timeout=timedelta(minutes=2)),  # long jobs pass deadlines
    )
    trace = workload.shape("bursty-day", days=1, seed=5, jobs_per_day=6000)
    setup = compare.Setup(seed=5)
    every = compare.run_one(EveryPass(cfg, PRICE, trace.epoch), trace, cfg, setup, PRICE)
    skipping = compare.run_one(Vultrscale(cfg, PRICE, trace.epoch), trace, cfg, setup, PRICE)
    assert skipping.passes < every.passes * 0.8  # the point of it
    doc, ref = skipping.to_json(), every.to_json()
    for key in ("passes", "passes_skipped"):
        doc.pop(key), ref.pop(key)
    assert doc == ref


def test_a_stock_out_of_the_first_offering_sends_the_replay_s_creates_to_the_second() -> None:
    # A week of bursts with the first offering sold out two hours in every four: with only
    # that offering the queue waits the stock-outs out; with a second (a bigger plan, 8 jobs
    # an instance) the same pass creates there, billed at its own price and size.
    big = Offering("ewr", "vc2-2c-4gb", jobs_per_instance=8)
    faults = {"stockout_every": timedelta(hours=2), "stockout_for": timedelta(hours=2)}
    one = replace(CFG, simulate=replace(CFG.simulate, **faults))
    two = replace(one, fleet=replace(CFG.fleet, offerings=(Offering("ewr", "vc2-1c-2gb"), big)))
    trace = workload.shape("bursty-day", days=2, seed=1)
    setup = compare.Setup(seed=1)
    end = compare.replay_end(one, setup, trace)
    worlds, results = {}, {}
    for name, cfg in (("one", one), ("two", two)):
        policy = Vultrscale(cfg, PRICE, trace.epoch)
        world, stats = compare.play(policy, trace, cfg, setup, end=end)
        worlds[name] = world
        results[name] = measure(
            name, world, stats, price=PRICE, end=end, jobs_per_instance=compare.worker_slots(cfg)
        )
    small = compare.worker_slots(CFG)
    assert {i.slots for i in worlds["one"].instances} == {small}
    assert {i.slots for i in worlds["two"].instances} == {small, 8}  # both offerings took creates
    # each billed at its own plan's list price: the replay's plan's, the bigger one's
    assert {i.price for i in worlds["two"].instances if i.slots == small} == {None}
    assert {i.price[0] for i in worlds["two"].instances if i.price} == {20.0}
    assert results["one"].lost == results["two"].lost == 0
    assert results["two"].refused_creates < results["one"].refused_creates
    assert results["two"].wait_p95 < results["one"].wait_p95


_FORECAST_SCALE = replace(CFG.policy.forecast, mode="scale", weeks=1, min_history=timedelta(days=1))


@pytest.mark.parametrize(
    ("policy_changes", "boot_time", "days", "jobs_per_day"),
    [
        # The wait rule (target_wait "auto") at Vultr's snapshot boots: the oldest job ages,
        # booting instances come closer to ready and arrivals leave the window with no new
        # observation.
        ({}, "12m", 1, 600),
        # A shorter target over boots that vary, at a plain depth rule's revives too.
        ({"target_wait": WaitTarget(timedelta(minutes=5))}, "6m..14m", 1, 1500),
        ({"target_wait": WaitTarget(timedelta(0))}, "12m", 1, 1500),
        # The forecast floor (mode scale) moves by slot, one learned boot time ahead, on an
        # idle fleet as on a busy one: a week and a day, so a time of the week recurs.
        ({"forecast": _FORECAST_SCALE}, "12m", 8, 600),
    ],
    ids=["wait-rule-default", "wait-rule-5m-varying-boots", "depth-rule-revives", "forecast"],
)
def test_skipping_passes_changes_no_outcome_with_wait_rule_forecast_and_revive(
    policy_changes: dict, boot_time: str, days: int, jobs_per_day: int
) -> None:
    cfg = replace(
        CFG,
        policy=replace(CFG.policy, **policy_changes),
        simulate=replace(CFG.simulate, boot_time=boot_time),
        drain=replace(CFG.drain, timeout=timedelta(minutes=2)),
    )
    trace = workload.shape("bursty-day", days=days, seed=5, jobs_per_day=jobs_per_day)
    setup = compare.Setup(seed=5)
    every = compare.run_one(EveryPass(cfg, PRICE, trace.epoch), trace, cfg, setup, PRICE)
    skipping = compare.run_one(Vultrscale(cfg, PRICE, trace.epoch), trace, cfg, setup, PRICE)
    assert skipping.passes < every.passes * 0.8
    doc, ref = skipping.to_json(), every.to_json()
    for key in ("passes", "passes_skipped"):
        doc.pop(key), ref.pop(key)
    assert doc == ref


@pytest.mark.parametrize("price", ["nan", "inf", "0", "-3"])
def test_a_monthly_price_that_is_no_price_exits_2(
    price: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--days", "1", "--monthly-usd", price]) == 2
    assert "--monthly-usd must be above 0" in capsys.readouterr().err


def test_json_of_a_day_with_no_work_is_valid_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["simulate", "--days", "1", "--jobs-per-day", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))
    assert doc  # no Infinity, no NaN: a ratio with no lower bound is null


def test_a_floor_in_the_repeated_hour_when_clocks_go_back_is_kept_in_a_replay() -> None:
    # 25 Oct 2026, Berlin: 03:00 CEST becomes 02:00 CET, so 02:30 happens twice (00:30 and
    # 01:30 UTC). The one-minute floor must bring an instance up both times, though the world
    # is idle (no job at all) and the replay skips the passes that change nothing.
    floor = FloorConfig(cron="30 2 * * *", timezone="Europe/Berlin", min_instances=1)
    cfg = replace(
        CFG,
        policy=replace(
            CFG.policy,
            floor=(floor,),
            billing_hour_aware=False,
            idle_before_scale_down=timedelta(seconds=60),
            scale_down_cooldown=timedelta(seconds=60),
        ),
    )
    epoch = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)  # midnight in Berlin
    trace = workload.Trace("empty", (), (), span=5 * 3600.0, epoch=epoch)
    setup = compare.Setup(boot_time=(120.0, 120.0))
    world, stats = compare.play(Vultrscale(cfg, PRICE, epoch), trace, cfg, setup)
    assert world.c.creates == 2
    assert stats.skipped > stats.passes  # the idle night is skipped, not walked pass by pass


def test_history_replays_the_run_time_where_the_queue_recorded_a_start() -> None:
    from datetime import UTC, datetime

    t0 = datetime(2026, 6, 1, 9, tzinfo=UTC)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    # due at 0, waited 100 s in the fleet, ran 30 s; a row from before v6 (no start) ran 40 s
    # after being due at 10
    t = workload.from_history(
        [(at(0), at(100), at(130)), (at(10), None, at(50))], since=timedelta(days=1)
    )
    assert t.durations == (30.0, 40.0)
    assert "1 of them from before the queue recorded a start" in t.note


# --- skipping passes changes no outcome ----------------------------------------------------


class EveryPass(Vultrscale):
    """The vultrscale policy with no pass skipped at all: the reference for skipping."""

    def quiet_until(self, world: World) -> float:
        return 0.0

    def unchanged(self, world: World) -> bool:
        return False


def _replay(
    pol: Vultrscale, trace: workload.Trace, cfg: Config, faults: Faults, until: float
) -> tuple[World, engine.RunStats]:
    world = World(
        trace,
        jobs_per_instance=cfg.worker.concurrency,
        drain_seconds=cfg.worker.drain_seconds,
        lease_seconds=cfg.worker.lease_seconds,
        boot_time=(120.0, 120.0),
        seed=0,
        faults=faults,
    )
    return world, engine.run(world, pol, interval=30.0, until=until)


def test_a_429_burst_at_the_start_of_a_floor_skips_no_pass_on_an_idle_fleet() -> None:
    # The floor starts at 10:00 UTC on an idle, empty fleet; a 429 burst covers 10:00-10:02.
    # The 10:00 pass cannot list the fleet and holds (on_signal_error=hold): it carries
    # nothing out, but the burst ends at 10:02 and the 10:02 pass brings the floor up, as
    # every pass of the real loop would. Skipping must not sleep through to the next hour.
    floor = FloorConfig(cron="* 10-13 * * *", timezone="UTC", min_instances=1)
    cfg = replace(CFG, policy=replace(CFG.policy, floor=(floor,), billing_hour_aware=False))
    epoch = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
    trace = workload.Trace("empty", (), (), span=3 * 3600.0, epoch=epoch)
    faults = Faults(throttles=((3600.0 - 5.0, 3600.0 + 120.0),))
    worlds = [
        _replay(pol, trace, cfg, faults, 3 * 3600.0)[0]
        for pol in (EveryPass(cfg, PRICE, epoch), Vultrscale(cfg, PRICE, epoch))
    ]
    every, skipping = ([i.created for i in w.instances] for w in worlds)
    assert every == [3600.0 + 120.0]  # the first pass after the burst
    assert skipping == every


def test_a_stock_out_of_the_first_offering_falls_back_to_the_second_in_the_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # simulate replays the real pass: with [[fleet.offerings]] its cloud must sell every
    # offering, in its own region, and the stock-outs hit the first offering by default.
    from vultrscale.config import Offering
    from vultrscale.replay.fleet import WorldCloud

    created: list[str] = []
    create = WorldCloud.create_instance

    def counted(self: WorldCloud, **kw: object) -> object:
        v = create(self, **kw)
        created.append(str(kw["region"]))
        return v

    monkeypatch.setattr(WorldCloud, "create_instance", counted)

    offers = (Offering("ams", "vc2-1c-2gb"), Offering("fra", "vc2-1c-2gb"))
    cfg = replace(
        CFG,
        fleet=replace(CFG.fleet, offerings=offers),
        simulate=replace(
            CFG.simulate, stockout_every=timedelta(minutes=1), stockout_for=timedelta(days=2)
        ),
    )
    assert compare.stockout_offering(cfg) == ("ams", "vc2-1c-2gb")
    trace = workload.shape("bursty-day", days=1, seed=5, jobs_per_day=600)
    pol = Vultrscale(cfg, PRICE, trace.epoch)
    row = compare.run_one(pol, trace, cfg, compare.Setup(seed=5), PRICE)
    assert row.lost == 0
    assert created and set(created) == {"fra"}  # ams refused (sold out), fra took them
