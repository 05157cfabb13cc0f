"""The floor forecast (vultrscale.core.forecast) and its place among the policy's floors. Time is
an argument: every "now" below is a fixed moment, no clock runs."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from vultrscale.config import (
    BudgetConfig,
    Config,
    ConfigError,
    ForecastConfig,
    PolicyConfig,
    QueueConfig,
    load,
)
from vultrscale.core import forecast
from vultrscale.core.limits import Limit
from vultrscale.core.model import ActionKind, Observation, PlanPrice, Signals
from vultrscale.memory import MemoryHistory
from vultrscale.replay import compare, workload
from vultrscale.replay.fleet import Vultrscale
from vultrscale.rules import policy

HOUR = timedelta(hours=1)
WEEK = forecast.WEEK
# Mondays 00:00 UTC: the history's first week starts here.
MONDAY = datetime(2026, 6, 1, tzinfo=UTC)
PRICE = PlanPrice("vc2-1c-2gb", monthly=10.0)
LEAD = timedelta(minutes=15)


def surge_history(weeks: int, *, jobs: int = 360, run: float = 60.0) -> list:
    """A quiet week but for a Monday 09:00-10:00 surge of ``jobs`` jobs of ``run`` seconds
    (360 x 60 s over an hour: 6 jobs at once), every week, and one job a day at 03:00 (the
    history starts at the first Monday's)."""
    out: list[tuple[datetime, float | None]] = []
    for w in range(weeks):
        monday = MONDAY + w * WEEK
        out += [(monday + timedelta(days=d, hours=3), 30.0) for d in range(7)]
        out += [(monday + 9 * HOUR + timedelta(seconds=10 * i), run) for i in range(jobs)]
    return out


def profile_of(jobs: list, now: datetime, **kw: object) -> forecast.Profile:
    settings = {"slot": HOUR, "weeks": 4, "quantile": 0.75, "min_history": timedelta(days=7)}
    settings.update(kw)
    found = MemoryHistory(jobs).buckets(now - 4 * WEEK, now, settings["slot"])  # type: ignore[arg-type]
    return forecast.compute(found, now, **settings)  # type: ignore[arg-type]


def floor(p: forecast.Profile | None, now: datetime, *, max_instances: int = 5) -> int:
    return forecast.floor_at(p, now, LEAD, jobs_per_instance=4, max_instances=max_instances).floor


def test_the_forecast_raises_the_floor_one_lead_ahead_of_a_weekly_surge() -> None:
    third_monday = MONDAY + 2 * WEEK
    p = profile_of(surge_history(2), third_monday)  # two weeks seen, the third to come
    assert p.enough
    assert floor(p, third_monday + 8 * HOUR + timedelta(minutes=30)) == 0  # 09:00 is 30m away
    at = third_monday + 8 * HOUR + timedelta(minutes=45)  # 09:00 is one lead (15m) away
    assert floor(p, at) == 2  # 6 jobs at once, 4 per instance
    f = forecast.floor_at(p, at, LEAD, jobs_per_instance=4, max_instances=5)
    assert "Mon 09:00-10:00 UTC (15m ahead)" in f.source and "6.00 job(s) at once" in f.source
    assert floor(p, third_monday + 9 * HOUR + timedelta(minutes=50)) == 2  # kept through it
    assert floor(p, third_monday + 10 * HOUR) == 0  # and let go after it
    # decision.next_change wakes a replay where the floor rises: one lead before 09:00.
    nxt = forecast.next_change(p, third_monday + 8 * HOUR, LEAD)
    assert nxt == third_monday + 8 * HOUR + timedelta(minutes=45)


def test_a_quantile_across_weeks_ignores_one_odd_week() -> None:
    jobs = surge_history(3, jobs=0)  # three quiet weeks...
    jobs += [(MONDAY + WEEK + 9 * HOUR + timedelta(seconds=i), 60.0) for i in range(720)]
    now = MONDAY + 3 * WEEK  # ...but one surge in the second
    assert floor(profile_of(jobs, now, quantile=0.5), now + 9 * HOUR) == 0
    every = profile_of(jobs, now, quantile=1.0)  # the highest week: the odd one is kept...
    assert forecast.need(every, now + 9 * HOUR, 4) == 3  # 12 at once
    # ...and its backtest finds that the surge it predicted for the last week never came.
    assert every.checked_days == 7 and every.skill is not None and every.skill < 0.1
    assert not every.trusted and floor(every, now + 9 * HOUR) == 0
    f = forecast.floor_at(every, now + 9 * HOUR, LEAD, jobs_per_instance=4, max_instances=5)
    assert "would not have predicted the last 7 day(s)" in f.source and not f.usable
    assert forecast.next_change(every, now, LEAD) is None


def test_a_weekly_rhythm_passes_its_backtest_and_random_spikes_do_not() -> None:
    weekly = profile_of(surge_history(3), MONDAY + 3 * WEEK)
    assert weekly.trusted and weekly.skill is not None and weekly.skill > 0.9
    # A spike of 360 jobs on a different day and hour every week: nothing weekly to learn.
    spikes = [
        (MONDAY + w * WEEK + timedelta(days=(3 * w) % 7, hours=(7 * w) % 24, seconds=i), 60.0)
        for w in range(4)
        for i in range(360)
    ]
    random = profile_of(spikes, MONDAY + 4 * WEEK, quantile=0.9)
    assert random.enough and not random.trusted
    assert "nothing weekly to learn" in random.distrust()


def test_a_profile_is_checked_only_once_its_history_passes_min_history_by_a_day() -> None:
    jobs = surge_history(2)
    young = profile_of(jobs, MONDAY + WEEK + 12 * HOUR)  # a week and a half day
    assert young.enough and young.checked_days == 0 and not young.trusted
    assert "cannot be checked yet" in young.distrust()
    assert profile_of(jobs, MONDAY + WEEK + 30 * HOUR).checked_days == 1


def test_the_forecasts_arrival_rate_is_the_coming_slots_load_over_the_run_time() -> None:
    p = profile_of(surge_history(3), MONDAY + 3 * WEEK)
    monday = MONDAY + 3 * WEEK
    # 360 one-minute jobs over 09:00-10:00: 0.1 a second; half an hour ahead from 08:30 is
    # half quiet (the 08:00 slot) and half surge.
    assert forecast.arrival_rate(p, monday + 9 * HOUR, LEAD) == pytest.approx(0.1)
    assert forecast.arrival_rate(
        p, monday + 8 * HOUR + timedelta(minutes=45), 30 * timedelta(minutes=1)
    ) == pytest.approx(0.05)
    assert forecast.arrival_rate(p, monday + 12 * HOUR, LEAD) == 0.0


def test_the_forecasts_arrival_rate_is_each_slots_own_not_loads_over_the_mean_run() -> None:
    # Ten half-hour jobs at 02:00 a night, a thousand ten-second jobs an hour by day: the
    # history's mean run time (about 20 s) would turn 02:00's load into 1,500 jobs an hour.
    jobs = []
    for d in range(15):
        day = MONDAY + timedelta(days=d)
        jobs += [(day + 2 * HOUR + timedelta(seconds=i), 1800.0) for i in range(10)]
        jobs += [
            (day + h * HOUR + timedelta(seconds=3.6 * i), 10.0)
            for h in range(9, 17)
            for i in range(1000)
        ]
    now = MONDAY + timedelta(days=15)
    p = profile_of(jobs, now, min_history=timedelta(days=1), pool="weekday")
    assert p.trusted
    assert forecast.arrival_rate(p, now + 2 * HOUR, LEAD) == pytest.approx(10 / 3600)
    assert forecast.arrival_rate(p, now + 10 * HOUR, LEAD) == pytest.approx(1000 / 3600)
    # A profile cached before it kept its arrivals: no expected rate, not a guess.
    old = {k: v for k, v in p.to_json().items() if k != "arrivals"}
    assert forecast.arrival_rate(forecast.Profile.from_json(old), now, LEAD) is None


def test_unfinished_jobs_count_at_the_mean_run_time() -> None:
    jobs = [(due, None) for due, _ in surge_history(2)]
    jobs[0] = (jobs[0][0], 60.0)  # one finished job gives the run time of all
    p = profile_of(jobs, MONDAY + 2 * WEEK)
    assert p.mean_run_seconds == 60.0
    assert floor(p, MONDAY + 2 * WEEK + 9 * HOUR) == 2


@pytest.mark.parametrize(
    ("at_once", "round_up_from", "instances"),
    [
        (0.2, 0.0, 1),  # any load keeps an instance
        (0.2, 0.5, 0),  # ...unless asked for half an instance's work at least
        (2, 0.5, 1),  # half an instance's work
        (5, 0.5, 1),  # 1.25 instances
        (6, 0.5, 2),  # 1.5 instances
        (8, 0.0, 2),  # 2 instances, whole
    ],
)
def test_a_fraction_of_an_instance_is_rounded_up_from_round_up_from(
    at_once: float, round_up_from: float, instances: int
) -> None:
    # 360 jobs in the hour: each of ``10 * at_once`` seconds makes ``at_once`` jobs at once.
    p = profile_of(surge_history(2, run=10.0 * at_once), MONDAY + 2 * WEEK)
    at = MONDAY + 2 * WEEK + 9 * HOUR
    assert forecast.need(p, at, 4, round_up_from) == instances


def test_too_little_history_says_so_and_asks_nothing() -> None:
    now = MONDAY + timedelta(days=3, hours=12)
    p = profile_of(surge_history(1), now)
    assert not p.enough
    f = forecast.floor_at(p, MONDAY + 9 * HOUR, LEAD, jobs_per_instance=4, max_instances=5)
    assert (f.floor, f.usable) == (0, False)
    assert "too little history: 3d9h of jobs, 7d needed" in f.source
    none = forecast.floor_at(None, now, LEAD, jobs_per_instance=4, max_instances=5)
    assert (none.floor, none.usable) == (0, False)


def test_the_forecast_floor_is_capped_at_max_instances() -> None:
    p = profile_of(surge_history(2, run=600.0), MONDAY + 2 * WEEK)  # 60 jobs at once
    f = forecast.floor_at(
        p, MONDAY + 2 * WEEK + 9 * HOUR, LEAD, jobs_per_instance=4, max_instances=3
    )
    assert (f.floor, f.wanted) == (3, 15)
    assert "capped at max_instances=3" in f.source


def test_a_profile_survives_its_json_and_is_fresh_only_within_refresh() -> None:
    now = MONDAY + 2 * WEEK
    p = profile_of(surge_history(2), now)
    assert forecast.Profile.from_json(p.to_json()) == p
    cfg = ForecastConfig()
    assert p.fresh(cfg, now + timedelta(minutes=59))
    assert not p.fresh(cfg, now + HOUR)
    assert not p.fresh(cfg, now - timedelta(seconds=1))  # "computed in the future"
    assert not p.fresh(ForecastConfig(slot=timedelta(minutes=30)), now)  # setting changed


def burst_history(days: list[datetime], *, jobs: int = 135, run: float = 60.0) -> list:
    """A burst of ``jobs`` jobs of ``run`` seconds within three minutes at 09:00 of each of
    ``days`` (135 x 60 s: 2.25 jobs at once over the hour, all of them in its first minutes)."""
    return [
        (d + 9 * HOUR + timedelta(seconds=180 * i / jobs), run) for d in days for i in range(jobs)
    ]


def test_a_burst_is_sized_for_its_work_done_within_clear_within_not_its_mean() -> None:
    now = MONDAY + 2 * WEEK
    p = profile_of(burst_history([MONDAY, MONDAY + WEEK]), now)
    at = now + 9 * HOUR

    def wanted(clear_within: timedelta) -> int:
        return forecast.floor_at(
            p, at, LEAD, jobs_per_instance=4, max_instances=5, clear_within=clear_within
        ).wanted

    assert wanted(timedelta(0)) == 1  # the mean: 2.25 jobs at once, one instance
    assert wanted(HOUR) == 1  # within the slot is the mean
    assert wanted(timedelta(minutes=15)) == 3  # 9 jobs at once within 15 minutes
    f = forecast.floor_at(
        p, at, LEAD, jobs_per_instance=4, max_instances=5, clear_within=timedelta(minutes=6)
    )
    assert (f.floor, f.wanted) == (5, 6)  # 22.5 jobs at once within 6 minutes, capped
    assert "its work done within 6m -> 6 instance(s)" in f.source


def test_a_weekday_pool_learns_a_burst_from_the_days_before_and_keeps_the_weekend_apart() -> None:
    # Monday to Wednesday had a 09:00 burst; it is Thursday 00:00: a day of history past
    # min_history, for the backtest (Wednesday's burst, predicted from Monday's and Tuesday's).
    now = MONDAY + timedelta(days=3)
    jobs = burst_history([MONDAY + timedelta(days=d) for d in range(3)])
    by_week = profile_of(jobs, now, min_history=timedelta(days=1))
    assert floor(by_week, now + 9 * HOUR) == 0  # no Thursday seen yet
    p = profile_of(jobs, now, min_history=timedelta(days=1), pool="weekday")
    assert p.enough and len(p.loads) == 48  # a weekday's 24 slots, then the weekend's
    assert p.trusted and p.checked_days == 1
    assert floor(p, now + 9 * HOUR) == 1  # Thursday 09:00 learnt from the weekdays before
    assert floor(p, now + 8 * HOUR + timedelta(minutes=45)) == 1  # one lead ahead
    assert floor(p, now + 12 * HOUR) == 0
    assert floor(p, MONDAY + timedelta(days=5) + 9 * HOUR) == 0  # Saturday is not a weekday


def test_a_profile_keeps_its_pool_and_one_cached_without_it_is_a_week_profile() -> None:
    now = MONDAY + 2 * WEEK
    p = profile_of(surge_history(2), now, pool="weekday")
    assert forecast.Profile.from_json(p.to_json()) == p
    assert not p.fresh(ForecastConfig(), now)  # the config asks for a week profile
    assert p.fresh(ForecastConfig(pool="weekday"), now)
    old = {k: v for k, v in profile_of(surge_history(2), now).to_json().items() if k != "pool"}
    assert forecast.Profile.from_json(old).pool == "week"


# --- the policy: the forecast is one floor among the floors ------------------------------------


def cfg(mode: str, *, min_instances: int = 0, max_instances: int = 5, ceiling: float = 1000.0):
    return Config(
        policy=PolicyConfig(
            min_instances=min_instances,
            max_instances=max_instances,
            forecast=ForecastConfig(mode=mode),
        ),
        queue=QueueConfig(jobs_per_instance=4),
        budget=BudgetConfig(monthly_ceiling_usd=ceiling),
    )


SURGE = MONDAY + 2 * WEEK + 8 * HOUR + timedelta(minutes=50)  # 10 minutes before a surge


def obs(p: forecast.Profile | None) -> Observation:
    return Observation(instances=(), signals=Signals(0, 0), price=PRICE, forecast=p)


def test_mode_scale_raises_the_floor_and_creates_ahead_of_the_surge() -> None:
    p = profile_of(surge_history(2), MONDAY + 2 * WEEK)
    plan = policy.decide(obs(p), cfg("scale"), SURGE)
    assert (plan.floor, plan.creates, plan.forecast_floor) == (2, 2, 2)
    assert any(r.startswith("floor 2 from forecast: Mon 09:00-10:00 UTC") for r in plan.reasons)
    assert plan.summary()["forecast"] == {
        "mode": "scale",
        "floor": 2,
        "source": plan.forecast_source,
    }


def test_mode_observe_only_says_what_it_would_do() -> None:
    p = profile_of(surge_history(2), MONDAY + 2 * WEEK)
    plan = policy.decide(obs(p), cfg("observe"), SURGE)
    assert (plan.floor, plan.creates, plan.forecast_floor) == (0, 0, 2)
    assert any(r.startswith("forecast floor 2 not applied") for r in plan.reasons)


def test_the_forecast_never_lowers_a_floor() -> None:
    p = profile_of(surge_history(2), MONDAY + 2 * WEEK)  # asks 0 at 03:00... and 2 at 09:00
    quiet = MONDAY + 2 * WEEK + 4 * HOUR
    plan = policy.decide(obs(p), cfg("scale", min_instances=3), quiet)
    assert (plan.forecast_floor, plan.floor, plan.creates) == (0, 3, 3)
    plan = policy.decide(obs(p), cfg("scale", min_instances=3), SURGE)
    assert (plan.forecast_floor, plan.floor) == (2, 3)


def test_the_budget_clamps_a_forecast_floor_as_any_floor() -> None:
    p = profile_of(surge_history(2), MONDAY + 2 * WEEK)
    plan = policy.decide(obs(p), cfg("scale", ceiling=10.0), SURGE)  # one instance-month
    assert plan.creates == 1
    assert any(c.kind is Limit.BUDGET_MONTHLY for c in plan.clamps)


def test_mode_off_reads_and_says_nothing() -> None:
    p = profile_of(surge_history(2), MONDAY + 2 * WEEK)
    plan = policy.decide(obs(p), cfg("off"), SURGE)
    assert plan.forecast_floor is None and plan.summary()["forecast"] is None
    assert not any("forecast" in r for r in plan.reasons)


def test_the_creates_it_plans_say_the_floor_is_the_forecasts() -> None:
    p = profile_of(surge_history(2), MONDAY + 2 * WEEK)
    plan = policy.decide(obs(p), cfg("scale"), SURGE)
    creates = [a for a in plan.actions if a.kind is ActionKind.CREATE]
    assert creates and creates[0].reason.startswith("the floor is 2 instance(s)")


def test_the_forecast_floor_is_a_metric_unknown_without_enough_history() -> None:
    from vultrscale.metrics import Metrics
    from vultrscale.reconcile import PassResult

    m = Metrics("workers")
    p = profile_of(surge_history(2), MONDAY + 2 * WEEK)
    for profile, expected in ((p, 2.0), (None, math.nan)):
        plan = policy.decide(obs(profile), cfg("observe"), SURGE)
        m.observe(PassResult(0, SURGE, plan=plan, observation=obs(profile)))
        got = m.registry.get_sample_value("vultrscale_forecast_floor", {"fleet": "workers"})
        assert got == expected or (math.isnan(expected) and got is not None and math.isnan(got))


def test_status_shows_the_forecast_floor_and_its_source() -> None:
    from vultrscale.status import summary_lines

    p = profile_of(surge_history(2), MONDAY + 2 * WEEK)
    plan = policy.decide(obs(p), cfg("observe"), SURGE)
    lines = [t.plain for t in summary_lines(obs(p), plan, 1000.0)]
    assert (
        "forecast (observe: observed, not applied): floor 2; forecast: Mon 09:00-10:00 UTC "
        "(12m ahead) runs 6.00 job(s) at once" in "\n".join(lines)
    )


class Counted(MemoryHistory):
    scans: int = 0

    def buckets(self, since: datetime, until: datetime, width: timedelta) -> list:
        self.scans += 1
        return super().buckets(since, until, width)


def test_dry_runs_scan_the_history_once_per_refresh_though_they_save_nothing() -> None:
    """`status --watch` is a dry-run pass every few seconds: it saves no profile in the
    ledger, and keeps the one it computed for the refresh's length."""
    from vultrscale.config import FleetConfig, Secret, Secrets
    from vultrscale.core.clock import FakeClock
    from vultrscale.memory import (
        SNAPSHOT,
        MemoryCloud,
        MemoryDrain,
        MemoryLedger,
        MemorySignals,
        memory_parts,
    )
    from vultrscale.reconcile import run_pass

    clock = FakeClock(SURGE)
    history = Counted(surge_history(2))
    ledger = MemoryLedger("workers")
    parts = memory_parts(
        clock, MemoryCloud(clock), ledger, MemorySignals(), MemoryDrain(), history=history
    )
    config = Config(
        fleet=FleetConfig(snapshot_id=SNAPSHOT),
        policy=PolicyConfig(forecast=ForecastConfig(mode="scale")),
        secrets=Secrets(worker_database_url=Secret("postgresql://w@db.invalid/q")),
    )
    for _ in range(4):  # at 0, 20, 40 and 60 minutes
        result = run_pass(config, parts, dry_run=True, take_lock=False)
        assert result.plan is not None and result.plan.forecast_floor == 2
        clock.advance(20 * 60)
    assert history.scans == 2 and ledger.profile is None  # at 0 and 60 minutes: once an hour


def test_a_history_that_cannot_be_read_keeps_the_last_profile_and_never_fails_the_pass() -> None:
    from vultrscale.config import FleetConfig, Secret, Secrets
    from vultrscale.core.clock import FakeClock
    from vultrscale.memory import (
        SNAPSHOT,
        MemoryCloud,
        MemoryDrain,
        MemoryLedger,
        MemorySignals,
        memory_parts,
    )
    from vultrscale.reconcile import run_pass

    clock = FakeClock(SURGE)
    history = MemoryHistory(surge_history(2))
    parts = memory_parts(
        clock,
        MemoryCloud(clock),
        MemoryLedger("workers"),
        MemorySignals(),
        MemoryDrain(),
        history=history,
    )
    config = Config(
        fleet=FleetConfig(snapshot_id=SNAPSHOT),
        policy=PolicyConfig(forecast=ForecastConfig(mode="observe")),
        secrets=Secrets(worker_database_url=Secret("postgresql://w@db.invalid/q")),
    )
    assert run_pass(config, parts).plan.forecast_floor == 2  # type: ignore[union-attr]
    history.error = "canceling statement due to statement timeout"
    clock.advance(2 * 3600)  # the profile is due again; the history does not answer
    result = run_pass(config, parts)
    assert result.exit_code == 0 and not result.errors
    assert result.plan is not None and result.plan.forecast_floor == 0  # 11:50: the old one's


def test_an_idle_fleet_is_woken_one_lead_before_the_forecast_surge() -> None:
    """``decision.next_change`` names the moment the forecast floor rises: a replay that skips
    the passes of an idle world (and a loop that sleeps) does not sleep through it."""
    from vultrscale.config import FleetConfig, Secret, Secrets
    from vultrscale.core.clock import FakeClock
    from vultrscale.memory import (
        SNAPSHOT,
        MemoryCloud,
        MemoryDrain,
        MemoryLedger,
        MemorySignals,
        memory_parts,
    )
    from vultrscale.reconcile import run_pass
    from vultrscale.rules import decision

    night = MONDAY + 2 * WEEK + 4 * HOUR
    for mode, woken in (
        ("scale", night + 4 * HOUR + timedelta(minutes=48)),
        ("off", None),
    ):  # 09:00 less the lead (policy.boot_time 12m)
        clock = FakeClock(night - timedelta(minutes=2))
        parts = memory_parts(
            clock,
            MemoryCloud(clock),
            MemoryLedger("workers"),
            MemorySignals(),
            MemoryDrain(),
            history=MemoryHistory(surge_history(2)),
        )
        config = Config(
            fleet=FleetConfig(snapshot_id=SNAPSHOT),
            policy=PolicyConfig(forecast=ForecastConfig(mode=mode, refresh=timedelta(days=1))),
            secrets=Secrets(worker_database_url=Secret("postgresql://w@db.invalid/q")),
        )
        run_pass(config, parts)  # notes when the queue went idle
        clock.advance(120)  # past the idle window: nothing left to wait for but the forecast
        result = run_pass(config, parts)
        # Pass only at the times the decision names, as a skipping replay does.
        for _ in range(12):
            assert result.decision is not None and result.plan is not None
            if result.plan.creates:
                break
            when = decision.next_change(config, result.decision)
            assert when is not None
            if woken is None:  # no forecast: nothing before the month's end
                assert when == datetime(2026, 7, 1, tzinfo=UTC)
                break
            clock.advance(when - clock.now())
            result = run_pass(config, parts)
        assert woken is None or (clock.now(), result.plan and result.plan.creates) == (woken, 2)


# --- config ------------------------------------------------------------------------------------


def test_forecast_settings_are_read_from_the_table_the_environment_and_a_sweep() -> None:
    c = load(None, {"VULTRSCALE_POLICY_FORECAST_MODE": "scale"}, require_file=False)
    assert c.policy.forecast.mode == "scale"
    # simulate --sweep policy.forecast.slot=... sets it this way
    c = load(None, {"VULTRSCALE_POLICY_FORECAST.SLOT": "15m"}, require_file=False)
    assert c.policy.forecast.slot == timedelta(minutes=15)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("MODE", "scal", "policy.forecast.mode: 'scal' must be off, observe or scale"),
        ("SLOT", "5h", "policy.forecast.slot: 5h must be from 5m to 1d and cut the week"),
        ("MIN_HISTORY", "60d", "policy.forecast.min_history: 1440h must be from 1m to the 4"),
        ("QUANTILE", "0", "policy.forecast.quantile: 0.0 must be above 0 and at most 1"),
        ("WEEKS", "0", "policy.forecast.weeks: 0 is out of range: allowed 1 to 52"),
        ("ROUND_UP_FROM", "1", "policy.forecast.round_up_from: 1.0 must be from 0 to below 1"),
        ("WEEKZ", "3", "did you mean VULTRSCALE_POLICY_FORECAST_WEEKS?"),
        ("POOL", "days", "policy.forecast.pool: 'days' must be week or weekday"),
    ],
    ids=["mode", "slot", "min-history", "quantile", "weeks", "round-up-from", "misspelled", "pool"],
)
def test_bad_forecast_settings_are_named(key: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(None, {f"VULTRSCALE_POLICY_FORECAST_{key}": value}, require_file=False)
    assert says in err.value.message


def test_a_weekday_pool_needs_slots_that_cut_the_day() -> None:
    env = {"VULTRSCALE_POLICY_FORECAST_POOL": "weekday", "VULTRSCALE_POLICY_FORECAST_SLOT": "7h"}
    with pytest.raises(ConfigError) as err:
        load(None, env, require_file=False)
    assert 'policy.forecast.slot: 7h must cut the day into whole slots with pool = "weekday"' in (
        err.value.message
    )
    c = load(None, {**env, "VULTRSCALE_POLICY_FORECAST_SLOT": "30m"}, require_file=False)
    assert (c.policy.forecast.pool, c.policy.forecast.slot) == ("weekday", timedelta(minutes=30))


# --- simulate: the forecast sees only the replayed past ----------------------------------------

DAY = 86_400.0


def _replay_profile(trace: workload.Trace, until_days: float) -> forecast.Profile | None:
    """Replay ``trace`` under the vultrscale policy (forecast in mode scale, two days of
    history enough) to ``until_days``; the forecast profile its ledger holds then."""
    fc = ForecastConfig(mode="scale", min_history=timedelta(days=2))
    config = Config(policy=PolicyConfig(forecast=fc), queue=QueueConfig(jobs_per_instance=4))
    pol = Vultrscale(config, compare.plan_price(config), trace.epoch)
    compare.play(pol, trace, config, compare.Setup(boot_time=(600.0, 600.0)), end=until_days * DAY)
    return pol.ledger.profile


def test_a_replay_forecasts_from_its_past_never_from_its_future() -> None:
    past = workload.shape("steady", days=3, seed=3, jobs_per_day=50)
    jobs = list(zip(past.arrivals, past.durations, strict=True))
    # The same first three days; then one trace stays quiet and the other surges.
    quiet = workload.from_jobs("quiet", jobs, span=4 * DAY)
    surge = [(3 * DAY + 60.0 * i, 300.0) for i in range(6 * 60)]  # 5 at once for 6 hours
    busy = workload.from_jobs("busy", jobs + surge, span=4 * DAY)

    at_day_3 = _replay_profile(quiet, 3.0), _replay_profile(busy, 3.0)
    assert at_day_3[0] is not None and at_day_3[0].enough and max(at_day_3[0].loads) > 0
    assert at_day_3[0] == at_day_3[1]  # the futures differ; what each replay saw does not
    # Control: once the surge is past, the busy replay's forecast has seen it.
    later = _replay_profile(busy, 3.5)
    assert later is not None
    assert max(at_day_3[0].loads) < 1 < 4 < max(later.loads)


def test_the_forecast_counts_instances_at_the_jobs_of_the_offering_it_creates_on() -> None:
    # 6 jobs at once in the surge: 2 instances at the queue's 4, 1 on an offering of 8.
    import dataclasses

    from vultrscale.config import Offering

    base = cfg("scale")
    fleet = dataclasses.replace(base.fleet, offerings=(Offering("ewr", PRICE.plan, 8),))
    p = profile_of(surge_history(2), MONDAY + 2 * WEEK)
    plan = policy.decide(obs(p), dataclasses.replace(base, fleet=fleet), SURGE)
    assert (plan.floor, plan.creates, plan.forecast_floor) == (1, 1, 1)
    assert "-> 1 instance(s) at 8 per instance" in plan.forecast_source
