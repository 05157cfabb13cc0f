"""`vultrscale simulate` as the tool that tunes a fleet: every lever sweepable (config keys,
floors, the world's [simulate] table, a variants file), the frontier report, the hindsight
baseline and a world that fails like Vultr."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from vultrscale import config as config_mod
from vultrscale.cli import main
from vultrscale.config import Config
from vultrscale.errors import UsageError
from vultrscale.replay import baselines, compare, workload
from vultrscale.replay.report import PolicyResult
from vultrscale.replay.world import Faults

BOOT = 600.0
SETUP = compare.Setup(interval=30.0, boot_time=(BOOT, BOOT), seed=0)
CFG = Config()
PRICE = compare.plan_price(CFG)
DAY = ["simulate", "--days", "1", "--jobs-per-day", "100", "--json"]
FLOOR_2 = '[{cron="* 8-17 * * mon-fri",min_instances=2}]'
# A sweep replays its rows on one process per core: here on this one (the unit tier starts no
# process).
pytestmark = pytest.mark.usefixtures("one_process")


def _trace(jobs: list[tuple[float, float]], span: float | None = None) -> workload.Trace:
    return workload.from_jobs("hand", jobs, span=span)


def _run(kind: str, trace: workload.Trace, cfg: Config = CFG, setup: compare.Setup = SETUP):
    pol = compare._policies([kind], cfg, trace, PRICE, setup)[0]
    return compare.run_one(pol, trace, cfg, setup, PRICE)


def _doc(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


# --- every lever sweepable ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sweep", "message", "suggestion"),
    [
        ("polcy.max_instances=1,2", "'polcy.max_instances' is not a config key",
         "policy.max_instances"),
        ("bogus.key=1,2", "'bogus.key' is not a config key", "config check"),
        ("fleet.max_instances=1,2", "not a config key", "policy.max_instances"),
    ],
    ids=["section-misspelled", "no-such-key", "key-in-another-section"],
)  # fmt: skip
def test_a_sweep_key_no_config_has_exits_2_with_the_nearest_key(
    sweep: str, message: str, suggestion: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown key became a VULTRSCALE_* variable no setting reads: every row the same."""
    assert main([*DAY, "--sweep", sweep]) == 2
    err = capsys.readouterr().err
    assert message in err and suggestion in err


def test_a_grid_past_the_limit_exits_2_before_any_replay(
    capsys: pytest.CaptureFixture[str],
) -> None:
    values = ",".join(str(n) for n in range(1, 200))
    argv = [*DAY, "--sweep", f"policy.max_instances={values}",
            "--sweep", f"policy.max_step_up={values}"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "39,601 variants" in err and f"more than the {compare.MAX_VARIANTS}" in err
    # Issue 36: it named neither --sweep nor how far to shrink it.
    assert "--sweep policy.max_instances (199 values) x --sweep policy.max_step_up (199" in err
    assert "Sweep fewer keys at once" in err


@pytest.mark.parametrize(
    ("tables", "sweep", "says", "fix"),
    [(101, None, "{file} (101 variants) make 101 variants", "Keep at most 100 variants in {file}"),
     (30, "policy.max_instances=1,2,3,4",
      "--sweep policy.max_instances (4 values) x {file} (30 variants) make 120 variants",
      "Keep at most 25 variants in {file}"),
     (2, "policy.max_instances=" + ",".join(map(str, range(1, 52))),
      "--sweep policy.max_instances (51 values) x {file} (2 variants) make 102 variants",
      "Give --sweep policy.max_instances at most 50 values")],
    ids=["file-alone", "file-the-larger", "sweep-the-larger"],
)  # fmt: skip
def test_a_grid_past_the_limit_names_what_makes_it_and_how_far_to_shrink_it(
    tables: int,
    sweep: str | None,
    says: str,
    fix: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 36: the refusal named neither --sweep nor the variants file."""
    variants = tmp_path / "v.toml"
    variants.write_text("".join(f"[v{i}]\n" for i in range(tables)))
    argv = [*DAY, "--variants", str(variants), *(["--sweep", sweep] if sweep else [])]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())  # the message as one line
    assert says.format(file=variants) in err and fix.format(file=variants) in err


def test_a_floor_with_commas_inside_is_one_sweep_value() -> None:
    assert compare.split_values(f"[],{FLOOR_2}") == ["[]", FLOOR_2]
    assert compare.split_values("0s, 5m ,15m") == ["0s", "5m", "15m"]
    assert compare.split_values('"a,b",c') == ['"a,b"', "c"]


def test_whole_floors_are_swept_and_the_current_setting_is_marked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = _doc(capsys, [*DAY, "--policies", "vultrscale", "--sweep", f"policy.floor=[],{FLOOR_2}"])
    rows = {r["policy"]: r for r in doc["results"]}
    assert set(rows) == {"policy.floor=[]", f"policy.floor={FLOOR_2}"}
    assert rows["policy.floor=[]"]["current"]  # the default config has no floor
    assert not rows[f"policy.floor={FLOOR_2}"]["current"]
    floored = rows[f"policy.floor={FLOOR_2}"]
    assert floored["knobs"] == {"policy.floor": FLOOR_2}
    # Two instances held 08:00-18:00 on a Monday: at least 2 x 10 hours billed.
    assert floored["billed_hours"] >= 20 > rows["policy.floor=[]"]["billed_hours"]


def test_the_boot_time_comes_from_the_configs_simulate_table(tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text('[simulate]\nboot_time = "2m"\n')
    cfg = config_mod.load(config, {})
    r = _run("vultrscale", _trace([(0.0, 60.0)]), cfg, compare.Setup())
    assert r.wait_max == 120.0  # created by the pass at 0 s, up at 120 s


@pytest.mark.parametrize(
    ("toml", "key"),
    [('boot_time = "15m..10m"', "simulate.boot_time"),
     ('boot_time = "soon"', "simulate.boot_time"),
     ("dead_boot_share = 1.5", "simulate.dead_boot_share"),
     ("stockout_every = -1", "stockout_every")],
    ids=["reversed", "not-a-duration", "share-above-1", "negative"],
)  # fmt: skip
def test_a_bad_simulate_table_is_a_config_error_naming_the_key(
    toml: str, key: str, tmp_path: Path
) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(f"[simulate]\n{toml}\n")
    with pytest.raises(config_mod.ConfigError, match=key):
        config_mod.load(config, {})


def test_the_world_is_swept_like_any_key(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(capsys, [*DAY, "--sweep", "simulate.boot_time=1m,20m",
                        "--sweep", "simulate.duration_scale=1,2"])  # fmt: skip
    rows = {r["policy"]: r for r in doc["results"] if not r["baseline"]}
    fast = rows["simulate.boot_time=1m simulate.duration_scale=1"]
    slow = rows["simulate.boot_time=20m simulate.duration_scale=1"]
    assert fast["wait_p95"] < slow["wait_p95"]
    heavy = rows["simulate.boot_time=1m simulate.duration_scale=2"]
    assert heavy["lower_bound_hours"] == pytest.approx(2 * fast["lower_bound_hours"])
    assert any("varies the world" in n for n in doc["notes"])


def test_boot_time_flag_and_a_boot_time_sweep_together_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*DAY, "--boot-time", "5m", "--sweep", "simulate.boot_time=1m,2m"]) == 2
    assert "--boot-time fixes the boot time" in capsys.readouterr().err


def test_a_variants_file_names_each_variant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    variants = tmp_path / "variants.toml"
    variants.write_text(
        "[as-is]\n\n"
        "[business-floor]\n"
        'policy.floor = [{ cron = "* 8-17 * * mon-fri", min_instances = 2 }]\n\n'
        "[lazy]\n"
        'policy.idle_before_scale_down = "15m"\n'
    )
    argv = [*DAY, "--policies", "vultrscale", "--variants", str(variants),
            "--sweep", "policy.max_instances=3,5"]  # fmt: skip
    doc = _doc(capsys, argv)
    rows = {r["policy"]: r for r in doc["results"]}
    assert set(rows) == {
        f"{n} policy.max_instances={m}" for n in ("as-is", "business-floor", "lazy") for m in (3, 5)
    }
    assert [n for n, r in rows.items() if r["current"]] == ["as-is policy.max_instances=5"]
    assert rows["lazy policy.max_instances=3"]["knobs"] == {
        "policy.idle_before_scale_down": "15m",
        "policy.max_instances": "3",
    }


def test_a_variant_sets_a_key_of_a_nested_section(tmp_path: Path) -> None:
    variants = tmp_path / "v.toml"
    variants.write_text('[scale]\npolicy.forecast.mode = "scale"\npolicy.target_wait = "0s"\n')
    assert compare.load_variants(variants) == [
        ("scale", {"policy.forecast.mode": "scale", "policy.target_wait": "0s"})
    ]
    variants.write_text('[x]\npolicy.forecast.mod = "scale"\n')
    with pytest.raises(UsageError, match="'policy.forecast.mod' is not a config key"):
        compare.load_variants(variants)


@pytest.mark.parametrize(
    ("text", "message"),
    [("[x]\npolicy.max_instancs = 3\n", "'policy.max_instancs' is not a config key"),
     ("[x]\nmax_instances = 3\n", "'max_instances' is not a config key"),
     ("x = 3\n", "'x' is not a table of config keys"),
     ("[x\n", "is not a TOML file of variants"),
     ("", "no variant in it")],
    ids=["misspelled", "no-section", "not-a-table", "bad-toml", "empty"],
)  # fmt: skip
def test_a_bad_variants_file_exits_2(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    variants = tmp_path / "v.toml"
    variants.write_text(text)
    assert main([*DAY, "--variants", str(variants)]) == 2
    assert message in capsys.readouterr().err


# --- the frontier report ------------------------------------------------------------------


def _result(name: str, cost: float, p95: float, lost: int = 0) -> PolicyResult:
    r = _run("keda", _trace([(0.0, 60.0)]))
    return replace(r, policy=name, cost_usd=cost, wait_p95=p95, lost=lost)


def test_the_frontier_is_the_rows_no_other_row_beats_on_cost_and_wait() -> None:
    rows = [
        _result("cheap-slow", 1.0, 600.0),
        _result("dear-quick", 3.0, 60.0),
        _result("beaten", 3.0, 600.0),  # as dear as dear-quick, slower
        _result("middle", 2.0, 300.0),
        _result("twin", 2.0, 300.0),  # a tie beats nobody
        _result("lossy", 0.5, 30.0, lost=3),  # cheapest and quickest, but lost jobs
    ]
    on = {rows[i].policy for i in compare.frontier(rows)}
    assert on == {"cheap-slow", "dear-quick", "middle", "twin"}


def test_rows_billed_the_same_hours_cost_the_same_on_the_frontier() -> None:
    """A bill is a sum of per-instance bills: 152 hours summed in another order came to
    2.2647999999999953 for one row and 2.264799999999997 for hindsight on the bursty week, and
    the slower row stood on the frontier (and above hindsight in the table) as "cheaper"."""
    hour = 0.0149
    slow = _result("slow", sum([hour] * 152), 882.0)
    quick = _result("quick", sum([hour * 2] * 76), 222.0)
    assert slow.cost_usd != quick.cost_usd  # the float sums differ, the bills do not
    assert {[slow, quick][i].policy for i in compare.frontier([slow, quick])} == {"quick"}
    cmp = compare._comparison(_trace([(0.0, 60.0)]), [slow, quick], CFG, SETUP, PRICE)
    assert [r.policy for r in cmp.results] == ["quick", "slow"]  # the quicker of equal cost


def test_json_rows_carry_the_frontier_the_limits_and_unrounded_hours(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = _doc(capsys, DAY)
    for r in doc["results"]:
        for key in ("policy", "cost_usd", "billed_hours", "wait_p95", "on_frontier", "bound_by",
                    "knobs", "current", "cost_vs_hindsight", "cost_vs_lower_bound"):  # fmt: skip
            assert key in r, key
        assert isinstance(r["on_frontier"], bool) and isinstance(r["bound_by"], list)
    assert any(r["on_frontier"] for r in doc["results"])
    hours = [r["instance_hours"] for r in doc["results"]]
    assert any(round(h, 2) != h for h in hours)  # not rounded to 0.01 h
    hind = next(r for r in doc["results"] if r["policy"] == "hindsight")
    assert hind["cost_vs_hindsight"] == 1.0 and doc["hindsight_cost_usd"] == hind["cost_usd"]


def test_a_higher_cap_that_the_budget_binds_says_so() -> None:
    """max_instances = 8 gave exactly the row of 5: the $50 budget bound both, unsaid."""
    burst = _trace([(0.0, 1800.0)] * 40)  # 10 instances' worth at once
    rows = {}
    for cap in (5, 8):
        cfg = replace(CFG, policy=replace(CFG.policy, max_instances=cap))
        rows[cap] = _run("vultrscale", burst, cfg)
    assert rows[5].cost_usd == rows[8].cost_usd
    assert rows[5].bound_by == ("cap",)
    assert "budget" in rows[8].bound_by  # 8 x $10 a month is past the $50 ceiling


def test_the_table_fits_100_columns_and_wide_shows_every_column(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--days", "1", "--jobs-per-day", "100",
            "--sweep", f"policy.floor=[],{FLOOR_2}",
            "--sweep", "policy.idle_before_scale_down=90s,15m,30m"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    table = out.split("\nworkload:")[0]
    assert max(len(line) for line in table.splitlines()) <= 100
    assert "bound by" in table and "xHS" in table
    # The current setting is marked, whether on the frontier ("*>") or not (" >").
    assert sum(line[1:3] == "> " for line in table.splitlines()) == 1
    assert main([*argv, "--wide"]) == 0
    wide = capsys.readouterr().out.split("\nworkload:")[0]
    assert "refused/429/dead" in wide and f"policy.floor={FLOOR_2}" in wide


@pytest.mark.parametrize(
    ("terminal", "columns", "wide", "fits"),
    [(True, "100", False, 100), (True, "140", False, 140), (False, "200", False, 100),
     (False, "200", True, 100)],
    ids=["terminal-100", "terminal-140", "piped", "piped-wide"],
)  # fmt: skip
def test_the_notes_under_the_table_wrap_to_the_terminal_or_100_when_piped(
    terminal: bool,
    columns: str,
    wide: bool,
    fits: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 36: with COLUMNS=100 the table fit in 94 columns and its notes ran to 198."""
    import re

    monkeypatch.setenv("COLUMNS", columns)
    if terminal:
        monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich's own switch: write as to a terminal
    argv = ["simulate", "--days", "1", "--jobs-per-day", "30", "--policies", "naive,vultrscale",
            *(["--wide"] if wide else [])]  # fmt: skip
    assert main(argv) == 0
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # the colours' codes
    notes = out[out.index("workload: ") :].splitlines()
    assert max(len(line) for line in notes) <= fits
    assert max(len(line) for line in notes) > fits - 20  # the lines are filled
    assert "and >= marks a wait that rests on one" in " ".join(notes)  # wrapped, not cut


# --- hindsight ------------------------------------------------------------------------------


def test_hourly_need_is_each_hours_work_over_an_instance_hour() -> None:
    need = baselines.hourly_need((0.0, 10.0, 3700.0), (14_400.0, 1.0, 60.0), 4)
    assert need == [2, 1]  # 14,401 s of work over 4 slots x 3600 s, then 60 s


def test_hindsight_starts_its_instance_one_boot_ahead_of_the_hour() -> None:
    trace = _trace([(7200.0 + 60 * k, 60.0) for k in range(4)], span=4 * 3600.0)
    pol = compare._policies(["hindsight"], CFG, trace, PRICE, SETUP)[0]
    world, _ = compare.play(pol, trace, CFG, SETUP)
    first = world.instances[0]
    assert first.created == 7200.0 - BOOT  # ready as the hour's first job arrives
    assert all(world.finished_at[j] == 7200.0 + 60 * j + 60.0 for j in range(4))  # no wait
    assert len(world.instances) == 1 and first.gone_at is not None
    assert first.gone_at - first.created < 3600.0  # drained inside its one paid hour


def test_hindsight_has_a_mid_hour_burst_s_instances_up_as_it_lands() -> None:
    """A perfect forecast knows when a burst lands, not only how much work its hour holds: the
    hour's work (40 x 300 s) fits one instance-hour, but the burst needs the whole cap at once.
    Hindsight starts those instances one boot ahead of the burst; sized by the hour alone and
    topped up from the queue it saw, it met every burst a boot late (p50 wait 10.5 min at 12-min
    boots on the bursty week, and it cost more than the default policy)."""
    burst = 7200.0 + 1800.0
    trace = _trace([(burst, 300.0)] * 40, span=4 * 3600.0)
    pol = compare._policies(["hindsight"], CFG, trace, PRICE, SETUP)[0]
    world, _ = compare.play(pol, trace, CFG, SETUP)
    cap = CFG.policy.max_instances
    assert sum(1 for i in world.instances if i.worker_at <= burst) == cap
    # 40 jobs on cap x 4 slots of 300 s each: the last round starts (40 / 20 - 1) x 300 s late.
    waits = [world.finished_at[j] - burst - 300.0 for j in range(40)]  # type: ignore[operator]
    assert max(waits) == (40 // (cap * CFG.worker.concurrency) - 1) * 300.0


def test_hindsight_never_stops_an_instance_under_a_job_it_knows_runs_on() -> None:
    """Two long jobs among a burst land on two instances; the next hour needs one. Stopping
    the less busy of those at the end of its paid hour gave its long job back to run again
    from the start (61 runs given back on the steady week): a forecast knows when each job
    ends and keeps that instance on."""
    burst = 7200.0
    jobs = [(burst, 3500.0)] * 2 + [(burst, 60.0)] * 7
    trace = _trace(jobs, span=4 * 3600.0)
    pol = compare._policies(["hindsight"], CFG, trace, PRICE, SETUP)[0]
    world, _ = compare.play(pol, trace, CFG, SETUP)
    assert world.c.given_back == 0 and world.c.killed == 0
    long_ones = [j for j, d in enumerate(trace.durations) if d == 3500.0]
    assert [world.finished_at[j] for j in long_ones] == [burst + 3500.0] * 2


# --- a world that fails like Vultr ----------------------------------------------------------


def test_fault_windows_come_from_the_seed_alone() -> None:
    a = Faults.draw(until=86_400.0, seed=3, stockout_every=3600.0, stockout_for=600.0)
    b = Faults.draw(until=2 * 86_400.0, seed=3, stockout_every=3600.0, stockout_for=600.0)
    assert a.stockouts and b.stockouts[: len(a.stockouts)] == a.stockouts
    assert all(end - start == 600.0 for start, end in a.stockouts)


def _faulty(**sim: object) -> tuple[Config, tuple[float, float]]:
    """A config whose world has the given faults, and the first window they make."""
    cfg = replace(CFG, simulate=replace(CFG.simulate, **sim))  # type: ignore[arg-type]
    s = cfg.simulate
    faults = Faults.draw(
        until=86_400.0,
        seed=SETUP.seed,
        stockout_every=s.stockout_every.total_seconds(),
        stockout_for=s.stockout_for.total_seconds(),
        throttle_every=s.throttle_every.total_seconds(),
        throttle_for=s.throttle_for.total_seconds(),
    )
    return cfg, (faults.stockouts or faults.throttles)[0]


def test_a_stock_out_refuses_creates_and_the_report_counts_them() -> None:
    cfg, (start, end) = _faulty(
        stockout_every=config_mod.to_duration("2h"), stockout_for=config_mod.to_duration("20m")
    )
    r = _run("vultrscale", _trace([(start + 1.0, 60.0)], span=86_400.0), cfg)
    assert r.refused_creates > 0
    # Served once the plan is back in stock: created at the first pass after the window.
    assert r.finished == 1 and r.wait_max >= (end - start - 1.0) + BOOT


def test_a_stock_out_names_its_offering_and_spares_another() -> None:
    # By default it hits the fleet's offering (fleet.region/fleet.plan), so the creates are
    # refused as above; naming another offering, the fleet's creates go through.
    cfg, (start, _) = _faulty(
        stockout_every=config_mod.to_duration("2h"),
        stockout_for=config_mod.to_duration("20m"),
        stockout_offering=f"{CFG.fleet.region}/vc2-24c-96gb",
    )
    r = _run("vultrscale", _trace([(start + 1.0, 60.0)], span=86_400.0), cfg)
    assert r.refused_creates == 0
    assert r.finished == 1 and r.wait_max <= 2 * SETUP.interval + BOOT
    assert compare.stockout_offering(CFG) == (CFG.fleet.region, CFG.fleet.plan)
    assert compare.stockout_offering(cfg) == (CFG.fleet.region, "vc2-24c-96gb")


def test_a_stock_out_offering_that_is_not_region_slash_plan_is_a_config_error(
    tmp_path: Path,
) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text('[simulate]\nstockout_offering = "ewr"\n')
    with pytest.raises(config_mod.ConfigError, match="simulate.stockout_offering"):
        config_mod.load(config, {})


@pytest.mark.parametrize("kind", ["vultrscale", "keda"])
def test_a_429_burst_holds_the_fleet_and_is_counted(kind: str) -> None:
    cfg, (start, end) = _faulty(
        throttle_every=config_mod.to_duration("2h"), throttle_for=config_mod.to_duration("10m")
    )
    r = _run(kind, _trace([(start + 1.0, 60.0)], span=86_400.0), cfg)
    assert r.throttled > 0
    assert r.finished == 1 and r.wait_max >= (end - start - 1.0) + BOOT


def test_an_instance_that_never_boots_is_replaced_after_boot_timeout() -> None:
    trace = _trace([(0.0, 60.0)], span=7200.0)
    cfg = replace(CFG, simulate=replace(CFG.simulate, dead_boot_share=1.0))
    r = _run("vultrscale", trace, cfg)
    assert r.dead_boots >= 2 and r.scale_ups == r.dead_boots  # replaced, and never came up
    assert r.lost == 1


def test_the_frontier_plot_draws_a_sweep_with_its_baselines(tmp_path: Path) -> None:
    import matplotlib  # noqa: F401 - a dev dependency: this test must draw, not skip

    out = tmp_path / "frontier.png"
    argv = ["simulate", "--days", "1", "--jobs-per-day", "50", "--plot", str(out),
            "--sweep", f"policy.floor=[],{FLOOR_2}",
            "--sweep", "policy.idle_before_scale_down=90s,15m"]  # fmt: skip
    assert main(argv) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_sweep_without_vultrscale_in_the_policies_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*DAY, "--policies", "keda", "--sweep", "policy.max_instances=3,5"]) == 2
    assert "--policies leaves it out" in capsys.readouterr().err
