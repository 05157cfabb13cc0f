"""The reconcile pass on in-memory ports: no Postgres, no sockets, a fake clock."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from vultrscale import config as config_mod
from vultrscale import metrics, ssh
from vultrscale.core.clock import FakeClock
from vultrscale.core.limits import Limit
from vultrscale.core.model import (
    HostTarget,
    Instance,
    InstanceState,
    PassEvent,
    ServiceState,
    Signals,
    WorkerView,
)
from vultrscale.errors import EXIT_USAGE, HostKeyMismatch, SSHError, UsageError
from vultrscale.memory import (
    SNAPSHOT,
    MemoryCloud,
    MemoryDrain,
    MemoryLedger,
    MemorySignals,
    MemoryStore,
    memory_parts,
)
from vultrscale.ports import PassCache
from vultrscale.read import PRICE_TTL
from vultrscale.reconcile import Parts, PassResult, run_forever, run_pass
from vultrscale.rules import budget
from vultrscale.vultr.errors import ApiUnreachable, AuthError
from vultrscale.vultr.models import VInstance, VPlan

START = datetime(2026, 5, 10, 9, 0, tzinfo=UTC)
S = InstanceState


class Fleet:
    """One fleet on in-memory ports, with the scaler's key file checked before each pass."""

    def __init__(self, tmp_path: Path, **sections: dict[str, Any]) -> None:
        self.clock = FakeClock(START)
        self.cloud = MemoryCloud(self.clock)
        self.ledger = MemoryLedger("workers")
        self.signals = MemorySignals()
        self.drain = MemoryDrain()
        self.key = tmp_path / "id_ed25519"
        self.key.write_text("not read: only its mode and presence are checked\n")
        self.key.chmod(0o600)
        body = {
            "fleet": {"snapshot_id": SNAPSHOT, "ssh_key": str(self.key)},
            "policy": {"max_instances": 5, "billing_hour_aware": False},
            "budget": {"monthly_ceiling_usd": 200.0},
        }
        for name, values in sections.items():
            body.setdefault(name, {}).update(values)
        toml = "".join(
            f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items())
            for name, values in body.items()
        )
        (tmp_path / "vultrscale.toml").write_text(toml)
        env = {
            "VULTR_API_KEY": "k" * 32,
            "DATABASE_URL": "postgresql://unused@nowhere/db",
            "WORKER_DATABASE_URL": "postgresql://worker@nowhere/db",
        }
        self.cfg = config_mod.load(tmp_path / "vultrscale.toml", env=env)
        self.parts = memory_parts(
            self.clock,
            self.cloud,
            self.ledger,
            self.signals,
            self.drain,
            preflight=(lambda: ssh.check_key_file(self.key),),
        )

    def run(self, parts: Parts | None = None) -> PassResult:
        return run_pass(self.cfg, parts or self.parts)

    def queue(self, ready: int, in_flight: int = 0) -> None:
        self.signals.signals = Signals(ready=ready, in_flight=in_flight)

    def states(self) -> dict[str, str]:
        return {r.label: r.state.value for r in self.ledger.rows(START) if r.state is not S.GONE}

    def labels(self, state: InstanceState) -> list[str]:
        return sorted(label for label, s in self.states().items() if s == state.value)

    def workers_report(self) -> None:
        """A worker heartbeats on every instance the cloud has booted."""
        for v in self.cloud.list_instances():
            if v.status == "active" and v.label not in self.ledger.workers_by_label:
                view = WorkerView(v.label, self.clock.now(), False, 0, True)
                self.ledger.workers_by_label[v.label] = view

    def lease(self, label: str, live: int) -> None:
        w = self.ledger.workers_by_label[label]
        self.ledger.workers_by_label[label] = dataclasses.replace(w, live_leases=live)

    def bring_up(self, jobs: int) -> list[str]:
        """Queue ``jobs``, create, boot (61 s) and let the workers report: running labels."""
        self.queue(jobs)
        self.run()
        self.clock.advance(61)
        self.run()
        self.workers_report()
        self.clock.advance(30)
        assert self.run().exit_code == 0
        return self.labels(S.RUNNING)

    def drain_now(self, *labels: str) -> None:
        for label in labels:
            self.ledger.mark_draining(label, self.clock.now())

    def instance_id(self, label: str) -> str:
        iid = self.ledger.instances[label].instance_id
        assert iid is not None
        return iid


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


def _results(result: PassResult, label: str) -> list[str]:
    return [r["result"] for r in result.results if r["label"] == label]


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def test_a_burst_from_zero_creates_what_the_queue_needs_and_they_boot_to_running(
    fleet: Fleet,
) -> None:
    fleet.queue(12)
    first = fleet.run()
    assert first.exit_code == 0, first.errors
    assert fleet.cloud.posts == 3  # 12 jobs at 4 per instance
    assert sorted(fleet.states().values()) == ["pending"] * 3
    assert fleet.ledger.events[-1]["exit_code"] == 0
    fleet.clock.advance(61)
    fleet.run()
    assert sorted(fleet.states().values()) == ["booting"] * 3
    fleet.workers_report()
    fleet.clock.advance(30)
    fleet.run()
    assert sorted(fleet.states().values()) == ["running"] * 3
    assert fleet.cloud.posts == 3 and len(fleet.ledger.events) == 3


def test_drain_progresses_through_every_verdict(tmp_path: Path) -> None:
    # The floor wants both back: revive off, so that the drain's verdicts are what is seen.
    fleet = Fleet(tmp_path, policy={"min_instances": 2, "max_instances": 2, "revive": False})
    a, b = fleet.bring_up(8)
    fleet.drain_now(a)

    fleet.clock.advance(30)  # still active: the stop never arrived, send it again
    fleet.drain.stop_to = ServiceState.DEACTIVATING
    result = fleet.run()
    assert fleet.drain.stops == [a] and fleet.states()[a] == "draining"
    assert _results(result, a) == ["draining: worker active"]

    fleet.clock.advance(30)  # stopping: wait
    assert _results(fleet.run(), a) == ["draining: worker deactivating"]

    fleet.drain.services[a] = ServiceState.INACTIVE  # stopped, but a lease is still live: wait
    fleet.lease(a, 1)
    fleet.clock.advance(30)
    assert _results(fleet.run(), a) == ["worker inactive; waiting for 1 live lease(s) to expire"]
    assert fleet.cloud.deletes == 0

    fleet.lease(a, 0)  # lease gone; Vultr has the instance locked: retried next pass
    fleet.cloud.locked.add(fleet.instance_id(a))
    fleet.clock.advance(30)
    result = fleet.run()
    assert "delete refused: instance locked at Vultr; retrying next pass" in _results(result, a)
    assert fleet.states()[a] == "deleting" and fleet.cloud.deletes == 0

    fleet.cloud.locked.clear()
    fleet.clock.advance(30)
    assert _results(fleet.run(), a) == ["deleted"]
    assert a not in fleet.states() and fleet.cloud.deletes == 1

    # b: its host key changed. Within the grace that is an error; past it, deleted.
    fleet.drain_now(b)
    fleet.drain.refuse[b] = HostKeyMismatch(f"{b}: host key does not match the pinned one")
    fleet.clock.advance(30)
    result = fleet.run()
    assert result.exit_code == 1
    assert any(e.startswith(f"{b}: drain check failed") for e in result.errors)
    fleet.clock.advance(fleet.cfg.drain.unreachable_grace)
    result = fleet.run()
    assert any("unreachable past its grace" in r for r in _results(result, b))
    assert b not in fleet.states() and fleet.cloud.deletes == 2


def test_a_host_key_refused_on_one_of_three_drains_stops_nothing_else(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, policy={"max_instances": 6, "revive": False})
    a, b, c = fleet.bring_up(12)
    fleet.drain_now(a, b, c)
    fleet.drain.services.update({a: ServiceState.INACTIVE, b: ServiceState.INACTIVE})
    fleet.drain.refuse[c] = HostKeyMismatch(f"{c}: host key does not match the pinned one")
    fleet.queue(24)  # the queue grows meanwhile
    fleet.clock.advance(60)
    result = fleet.run()
    assert result.exit_code == 1
    assert fleet.cloud.deletes == 2 and a not in fleet.states() and b not in fleet.states()
    assert fleet.states()[c] == "draining"
    assert fleet.cloud.posts > 3, "new instances are created for the grown queue"
    event = fleet.ledger.events[-1]
    assert any(
        e.startswith(f"{c}: drain check failed") and "host key" in e for e in event["errors"]
    )
    assert event["exit_code"] == 1


@pytest.mark.parametrize("damage", ["mode-0644", "missing"])
def test_a_key_that_turns_unusable_refuses_the_pass_and_changes_nothing(
    fleet: Fleet, damage: str
) -> None:
    a, _b = fleet.bring_up(8)
    fleet.drain_now(a)
    fleet.drain.services[a] = ServiceState.INACTIVE  # would be deleted
    fleet.queue(40)  # would create
    before = (dict(fleet.ledger.instances), fleet.cloud.posts, fleet.cloud.deletes)
    stops = list(fleet.drain.stops)
    if damage == "missing":
        fleet.key.unlink()
    else:
        fleet.key.chmod(0o644)
    fleet.clock.advance(60)
    with pytest.raises(UsageError) as refused:
        fleet.run()
    assert refused.value.exit_code == EXIT_USAGE
    assert (dict(fleet.ledger.instances), fleet.cloud.posts, fleet.cloud.deletes) == before
    assert fleet.drain.stops == stops
    event = fleet.ledger.events[-1]
    assert event["exit_code"] == EXIT_USAGE
    assert any("SSH private key" in e for e in event["errors"])
    assert event["plan"] is None and event["results"] == []


def test_an_error_that_ends_a_recorded_pass_carries_the_pass_id_events_shows(
    fleet: Fleet,
) -> None:
    # The loop's log line for a failed pass names it, so the line leads to its events row.
    assert fleet.run().pass_id == 1
    fleet.key.chmod(0o644)
    fleet.clock.advance(60)
    with pytest.raises(UsageError) as refused:
        fleet.run()
    assert refused.value.pass_id == len(fleet.ledger.events) == 2


def test_a_metrics_target_that_cannot_be_written_refuses_the_pass(
    fleet: Fleet, tmp_path: Path
) -> None:
    target = str(tmp_path / "missing-dir" / "vultrscale.prom")
    parts = dataclasses.replace(
        fleet.parts, preflight=(*fleet.parts.preflight, lambda: metrics.check_textfile(target))
    )
    fleet.queue(12)
    with pytest.raises(UsageError) as refused:
        fleet.run(parts)
    assert "missing-dir" in refused.value.message
    assert fleet.cloud.posts == 0 and fleet.ledger.instances == {}
    assert [e["exit_code"] for e in fleet.ledger.events] == [EXIT_USAGE]


def _gauge(m: metrics.Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, {"fleet": "workers", **labels})


def test_queue_gauges_read_nan_when_a_pass_could_not_read_the_queue(fleet: Fleet) -> None:
    m = metrics.Metrics("workers")
    fleet.queue(12, in_flight=3)
    m.observe(fleet.run())
    assert _gauge(m, "vultrscale_queue_ready") == 12.0
    fleet.signals.error = "connection refused"
    fleet.clock.advance(30)
    m.observe(fleet.run())
    # a stale depth would look like a healthy queue: the figures say "unknown" instead
    for name in ("vultrscale_queue_ready", "vultrscale_queue_in_flight"):
        value = _gauge(m, name)
        assert value is not None and math.isnan(value), name
    assert _gauge(m, "vultrscale_instances", state="running") is not None


def test_a_pass_that_failed_before_its_result_is_counted_by_its_exit_code(tmp_path: Path) -> None:
    m = metrics.Metrics("workers")
    m.failed(1)
    m.failed(1)
    target = tmp_path / "vultrscale.prom"
    m.write_textfile(str(target))
    assert _gauge(m, "vultrscale_passes_total", exit_code="1") == 2.0
    assert 'vultrscale_passes_total{exit_code="1",fleet="workers"} 2.0' in target.read_text()


def test_queue_gauges_read_nan_after_a_pass_that_failed_before_its_result(fleet: Fleet) -> None:
    m = metrics.Metrics("workers")
    fleet.queue(12, in_flight=3)
    m.observe(fleet.run())
    assert _gauge(m, "vultrscale_queue_ready") == 12.0
    m.failed(1)  # the next pass: the database down, the queue not read
    for name in (
        "vultrscale_queue_ready",
        "vultrscale_queue_in_flight",
        "vultrscale_queue_expired_leases",
        "vultrscale_queue_oldest_ready_seconds",
        "vultrscale_budget_month_to_date_usd",
    ):
        value = _gauge(m, name)
        assert value is not None and math.isnan(value), name  # not the figures of a pass ago


def test_a_metrics_file_under_home_is_written_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "textfile").mkdir()
    metrics.check_textfile("~/textfile/vultrscale.prom")
    metrics.Metrics("workers").write_textfile("~/textfile/vultrscale.prom")
    assert (tmp_path / "textfile" / "vultrscale.prom").is_file()
    assert not (tmp_path / "~").exists()  # not a directory named "~" under the working one


def test_a_missing_snapshot_is_refused_before_a_drain_deletes_anything(fleet: Fleet) -> None:
    a, _b = fleet.bring_up(8)
    fleet.drain_now(a)
    fleet.drain.services[a] = ServiceState.INACTIVE
    fleet.queue(40)
    fleet.cloud.snapshots.clear()  # deleted at Vultr; a new process has not checked it yet
    fleet.clock.advance(60)
    with pytest.raises(UsageError, match=f"snapshot {SNAPSHOT} does not exist"):
        fleet.run(dataclasses.replace(fleet.parts, cache=PassCache()))
    assert fleet.cloud.deletes == 0 and fleet.states()[a] == "draining"
    assert fleet.ledger.events[-1]["exit_code"] == EXIT_USAGE


# --- a crash between any two outside calls ------------------------------------------------------


class Crash(BaseException):
    """A kill -9 at a call point: nothing catches it, nothing after it runs."""


class Calls:
    """Counts every call through the ports; at call ``crash_at`` the process dies."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.crash_at = crash_at
        self.names: list[str] = []

    def wrap(self, port: Any, name: str) -> Any:
        calls = self

        class Crashing:
            def __getattr__(self, attr: str) -> Any:
                value = getattr(port, attr)
                if not callable(value):
                    return value

                def call(*args: Any, **kwargs: Any) -> Any:
                    if calls.crash_at is not None and len(calls.names) >= calls.crash_at:
                        raise Crash(f"{name}.{attr}")
                    calls.names.append(f"{name}.{attr}")
                    return value(*args, **kwargs)

                return call

        return Crashing()


def _crash_scene(tmp_path: Path) -> tuple[Fleet, str]:
    """Two running instances, one of them drained (its delete is due) and a queue that grows:
    the pass deletes, creates and records (revive off: test_revive.py has the revive's)."""
    fleet = Fleet(tmp_path, policy={"max_instances": 4, "revive": False})
    a, _b = fleet.bring_up(8)
    fleet.drain_now(a)
    fleet.drain.services[a] = ServiceState.INACTIVE
    fleet.queue(16)
    fleet.clock.advance(60)
    return fleet, a


def _crashing_parts(fleet: Fleet, calls: Calls) -> Parts:
    store = MemoryStore(calls.wrap(fleet.ledger, "ledger"), calls.wrap(fleet.signals, "signals"))
    return dataclasses.replace(
        fleet.parts,
        cloud=calls.wrap(fleet.cloud, "cloud"),
        store=store,
        drain=calls.wrap(fleet.drain, "drain"),
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "crash_at" in metafunc.fixturenames:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            fleet, _ = _crash_scene(Path(d))
            calls = Calls()
            fleet.run(_crashing_parts(fleet, calls))
        ids = [f"{i:02d}-before-{name}" for i, name in enumerate(calls.names)]
        metafunc.parametrize("crash_at", range(len(calls.names)), ids=ids)


def test_a_crash_between_any_two_outside_calls_is_mended_by_the_next_passes(
    tmp_path: Path, crash_at: int
) -> None:
    fleet, drained = _crash_scene(tmp_path)
    with pytest.raises(Crash):
        fleet.run(_crashing_parts(fleet, Calls(crash_at)))
    for _ in range(6):
        result = fleet.run()
        assert result.exit_code == 0, result.errors
        fleet.clock.advance(61)
        fleet.workers_report()
    fleet.run()
    at_vultr = sorted(v.label for v in fleet.cloud.list_instances())
    assert at_vultr == sorted(fleet.states()), "every paid instance is in the ledger (no leak)"
    assert len(at_vultr) == 4 and fleet.cloud.posts == 2 + 3, "no duplicate create"
    assert drained not in at_vultr
    assert set(fleet.states().values()) == {"running"}


class CountingCloud:
    """The fleet's MemoryCloud, with every call a pass makes named in ``calls``."""

    def __init__(self, cloud: MemoryCloud) -> None:
        self.cloud = cloud
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.cloud, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return method(*args, **kwargs)

        return call


def fresh_process(fleet: Fleet) -> tuple[Parts, CountingCloud]:
    """The parts of a new process (cron): an empty in-process cache, a counted cloud."""
    counting = CountingCloud(fleet.cloud)
    return dataclasses.replace(fleet.parts, cloud=counting, cache=PassCache()), counting


def test_a_fresh_steady_pass_asks_the_cloud_only_for_the_list(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    assert len(fleet.bring_up(jobs=8)) == 2
    fleet.clock.advance(30)
    parts, cloud = fresh_process(fleet)
    result = fleet.run(parts)
    assert result.exit_code == 0 and result.plan is not None and not result.plan.actions
    assert cloud.calls == ["list_instances"]


def test_the_plan_check_is_asked_again_once_its_ttl_has_passed(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.bring_up(jobs=8)
    fleet.clock.advance(PRICE_TTL)
    parts, cloud = fresh_process(fleet)
    assert fleet.run(parts).exit_code == 0
    assert sorted(cloud.calls) == ["get_plan", "list_instances", "region_availability"]
    parts, cloud = fresh_process(fleet)
    assert fleet.run(parts).exit_code == 0
    assert cloud.calls == ["list_instances"]


def test_a_dry_run_remembers_no_plan_check(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    assert run_pass(fleet.cfg, fleet.parts, dry_run=True).exit_code == 0
    assert fleet.ledger.plan_checks == {}
    parts, cloud = fresh_process(fleet)
    assert run_pass(fleet.cfg, parts, dry_run=True).exit_code == 0
    assert "get_plan" in cloud.calls


def test_a_plan_its_region_does_not_list_is_remembered_as_not_listed(tmp_path: Path) -> None:
    """Availability changes like stock (docs/offerings.md): cached for the TTL as any check,
    so a cron pass on a fleet whose first offering is not listed still makes one request."""
    fleet = Fleet(tmp_path, fleet={"region": "ams"})  # the memory cloud offers it in ewr only
    with pytest.raises(UsageError, match="not offered in region"):
        fleet.run()
    ((check, _),) = fleet.ledger.plan_checks.values()
    assert (check.region, check.listed) == ("ams", False)
    parts, cloud = fresh_process(fleet)
    with pytest.raises(UsageError, match="not offered in region"):
        fleet.run(parts)
    assert cloud.calls == ["list_instances"]  # the check was not asked again


def test_an_unknown_plan_is_never_remembered(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, fleet={"plan": "vc2-9c-99gb"})
    with pytest.raises(UsageError, match="not a Vultr plan"):
        fleet.run()
    assert fleet.ledger.plan_checks == {}


@pytest.mark.parametrize(
    "monthly, hourly",
    [(0.0, 0.015), (math.nan, 0.015), (-10.0, None), (10.0, 0.0), (10.0, math.inf)],
    ids=["monthly-missing-read-as-0", "monthly-nan", "monthly-negative", "hourly-0", "hourly-inf"],
)
def test_a_plan_listed_without_a_usable_price_creates_nothing(
    tmp_path: Path, monthly: float, hourly: float | None
) -> None:
    """A missing monthly_cost parses as 0.0: read as a free plan it passed every ceiling and
    the fleet scaled to max_instances on a $20 budget."""
    from vultrscale.memory import PLAN

    fleet = Fleet(tmp_path, budget={"monthly_ceiling_usd": 20.0}, policy={"max_instances": 20})
    fleet.cloud.plans[PLAN.id] = dataclasses.replace(PLAN, monthly_cost=monthly, hourly_cost=hourly)
    fleet.queue(80)
    with pytest.raises(UsageError, match="without a usable price"):
        fleet.run()
    assert fleet.cloud.posts == 0 and fleet.ledger.plan_checks == {}


def test_a_remembered_price_is_still_held_against_the_ceiling(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.bring_up(jobs=4)
    assert fleet.ledger.plan_checks  # the check that passed is shared with later passes
    low = dataclasses.replace(
        fleet.cfg, budget=dataclasses.replace(fleet.cfg.budget, monthly_ceiling_usd=5.0)
    )
    fleet.queue(40)
    posts = fleet.cloud.posts
    result = run_pass(low, fresh_process(fleet)[0])
    assert result.exit_code == EXIT_USAGE and fleet.cloud.posts == posts
    assert any("lower than one instance-month" in e for e in result.errors)


def test_a_price_rise_above_the_ceiling_holds_creates_but_not_drains_and_deletes(
    tmp_path: Path,
) -> None:
    from vultrscale.memory import PLAN

    fleet = Fleet(tmp_path, budget={"monthly_ceiling_usd": 25.0})  # the plan: $10 a month
    a, b = fleet.bring_up(8)
    fleet.drain_now(a)
    fleet.drain.services[a] = ServiceState.INACTIVE  # drained: due for its delete
    fleet.cloud.plans[PLAN.id] = dataclasses.replace(PLAN, monthly_cost=30.0, hourly_cost=0.045)
    fleet.queue(40)  # demand for more than the two
    fleet.clock.advance(PRICE_TTL.total_seconds() + 1)  # the price is asked again
    posts = fleet.cloud.posts

    result = fleet.run()
    assert result.exit_code == EXIT_USAGE
    assert any("lower than one instance-month" in e for e in result.errors)
    assert fleet.cloud.deletes == 1 and a not in fleet.states()  # drained, deleted
    assert fleet.cloud.posts == posts  # nothing created

    events = len(fleet.ledger.events)
    last = run_forever(
        fleet.cfg, fleet.parts, interval=timedelta(seconds=30), max_passes=3
    )  # the loop goes on through refused passes
    assert last == EXIT_USAGE and len(fleet.ledger.events) == events + 3


def test_the_loop_goes_on_when_a_refused_fleet_has_wound_down_to_nothing(
    tmp_path: Path,
) -> None:
    """Once the last instance of a fleet whose price went over the ceiling was deleted, the
    next pass was refused outright and the loop ended (exit 2): nothing was left running to
    bring the fleet back when the price came down. Only a first pass ends the loop now."""
    from vultrscale.memory import PLAN

    fleet = Fleet(tmp_path, budget={"monthly_ceiling_usd": 25.0})
    fleet.bring_up(8)
    fleet.cloud.plans[PLAN.id] = dataclasses.replace(PLAN, monthly_cost=30.0, hourly_cost=0.045)
    fleet.clock.advance(PRICE_TTL.total_seconds() + 1)
    fleet.queue(0)
    for label in fleet.states():
        fleet.drain.services[label] = ServiceState.INACTIVE  # drained at once
    errors: list[str] = []

    last = run_forever(
        fleet.cfg,
        fleet.parts,
        interval=timedelta(seconds=30),
        max_passes=40,
        on_error=lambda exc: errors.append(exc.message),
    )
    assert last == EXIT_USAGE and not fleet.states() and not fleet.cloud.instances
    assert errors and all("lower than one instance-month" in e for e in errors)
    fleet.cloud.plans[PLAN.id] = PLAN  # the price comes down: the fleet can come back
    fleet.clock.advance(PRICE_TTL.total_seconds() + 1)
    fleet.queue(8)
    assert fleet.run().exit_code == 0 and fleet.cloud.posts > 2
    (tmp_path / "new").mkdir()
    new = Fleet(tmp_path / "new", fleet={"region": "ams"})  # the memory cloud offers ewr only
    with pytest.raises(UsageError, match="not offered in region"):  # a first pass: it ends
        run_forever(new.cfg, new.parts, interval=timedelta(seconds=30), max_passes=3)
    new.ledger.held_elsewhere = True  # another pass holds the lock at first: none ran yet
    with pytest.raises(UsageError, match="not offered in region"):
        run_forever(
            new.cfg,
            new.parts,
            interval=timedelta(seconds=30),
            max_passes=3,
            on_result=lambda r: setattr(new.ledger, "held_elsewhere", False),
        )


def test_each_observed_instance_has_every_field_a_constructed_one_has(tmp_path: Path) -> None:
    """The pass builds its Instance values in one step (model.frozen_from), not by __init__:
    each must equal the one __init__ builds from the same fields, with no field missing."""
    fleet = Fleet(tmp_path)
    fleet.bring_up(jobs=8)
    obs = fleet.run().observation
    assert obs is not None and len(obs.instances) == 2
    names = {f.name for f in dataclasses.fields(Instance)}
    for inst in obs.instances:
        assert set(vars(inst)) == names
        assert inst == Instance(**{name: getattr(inst, name) for name in names})


def test_listing_in_a_thread_while_the_ledger_is_read_decides_the_same(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    inline, threaded = Fleet(tmp_path / "a"), Fleet(tmp_path / "b")
    threaded.parts = dataclasses.replace(threaded.parts, overlap_reads=True)
    assert inline.bring_up(12) == threaded.bring_up(12)
    for fleet in (inline, threaded):
        fleet.queue(0)
        fleet.clock.advance(3600)
        fleet.run()
    assert inline.states() == threaded.states()
    assert [e["plan"] for e in inline.ledger.events] == [e["plan"] for e in threaded.ledger.events]


class _ListFails(MemoryCloud):
    def __init__(self, clock: FakeClock, error: Exception) -> None:
        super().__init__(clock)
        self.error = error

    def list_instances(self, tag: str | None = None) -> list[Any]:
        raise self.error


def test_a_list_failing_in_its_thread_holds_the_fleet_as_an_api_error(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    running = fleet.bring_up(8)
    fails = _ListFails(fleet.clock, ApiUnreachable("GET /v2/instances: no answer (timed out)."))
    fails.instances = fleet.cloud.instances  # the GETs of the rows the list missed
    fleet.queue(0)
    fleet.clock.advance(3600)
    result = fleet.run(dataclasses.replace(fleet.parts, cloud=fails, overlap_reads=True))
    assert result.exit_code == 1
    assert any("no answer" in e for e in result.errors), result.errors
    assert fleet.labels(S.RUNNING) == running and not fleet.drain.stops


def test_a_refused_api_key_in_the_listing_thread_ends_the_pass_as_usage(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fails = _ListFails(fleet.clock, AuthError("the API key was refused (401)."))
    fleet.queue(12)
    with pytest.raises(AuthError):
        fleet.run(dataclasses.replace(fleet.parts, cloud=fails, overlap_reads=True))
    assert fails.posts == 0 and fleet.ledger.events[-1]["exit_code"] == EXIT_USAGE


def test_a_running_instance_whose_worker_goes_quiet_is_replaced_boot_timeout_later(
    fleet: Fleet,
) -> None:
    a, b = fleet.bring_up(8)
    fleet.clock.advance(20 * 60)  # both well older than boot_timeout (15m)
    for label in (a, b):
        fleet.ledger.workers_by_label[label] = WorkerView(label, fleet.clock.now(), False, 0, True)
    fleet.run()
    quiet = fleet.ledger.workers_by_label[a]
    fleet.ledger.workers_by_label[a] = dataclasses.replace(quiet, seen=False)
    fleet.clock.advance(30)

    fell_back = fleet.run()
    assert fleet.states()[a] == "booting"
    assert not [x for x in fell_back.actions if x.label == a], "replaced as it fell back"
    fleet.clock.advance(14 * 60)
    assert fleet.run().exit_code == 0 and fleet.states()[a] == "booting"

    fleet.clock.advance(61)  # boot_timeout after it fell back: its worker did not come back
    replaced = fleet.run()
    assert [x.kind.value for x in replaced.actions if x.label == a] == ["replace"]
    assert "into its boot" in next(x.reason for x in replaced.actions if x.label == a)


def _by_hand(
    fleet: Fleet,
    iid: str,
    created: datetime | None = None,
    *,
    label: str = "worker-by-hand",
    ip: str = "10.9.0.1",
) -> VInstance:
    """A running instance made by hand at Vultr with the fleet's tag."""
    hand = VInstance(
        id=iid,
        label=label,
        status="active",
        power_status="running",
        server_status="ok",
        main_ip=ip,
        region="ewr",
        plan="vc2-1c-2gb",
        date_created=created,
        tags=(fleet.cfg.fleet.tag,),
    )
    fleet.cloud.instances[iid] = hand
    return hand


def test_a_tagged_instance_adopted_already_up_gets_boot_timeout_from_its_adoption(
    fleet: Fleet,
) -> None:
    fleet.queue(4)
    hand = _by_hand(fleet, "hand-1", fleet.clock.now() - timedelta(hours=2))  # made long before

    adopted = fleet.run()
    assert fleet.states()["worker-by-hand"] == "booting"
    assert not [x for x in adopted.actions if x.label == "worker-by-hand"]
    assert hand.id in fleet.cloud.instances
    fleet.clock.advance(15 * 60 + 1)
    replaced = fleet.run()
    assert [x.kind.value for x in replaced.actions if x.label == "worker-by-hand"] == ["replace"]


def test_a_tagged_instance_adopted_while_vultr_says_pending_gets_boot_timeout_from_its_adoption(
    fleet: Fleet,
) -> None:
    fleet.queue(4)
    hand = _by_hand(fleet, "hand-1", fleet.clock.now() - timedelta(hours=2))  # made long before
    fleet.cloud.instances[hand.id] = dataclasses.replace(hand, status="pending")

    adopted = fleet.run()
    assert fleet.states()["worker-by-hand"] == "pending"
    assert not [x for x in adopted.actions if x.label == "worker-by-hand"], "replaced at once"
    assert hand.id in fleet.cloud.instances
    fleet.clock.advance(15 * 60 + 1)
    replaced = fleet.run()
    assert [x.kind.value for x in replaced.actions if x.label == "worker-by-hand"] == ["replace"]


@pytest.mark.parametrize("listed", [True, False], ids=["its-plan-priced", "its-plan-unlisted"])
def test_an_instance_adopted_on_a_dearer_plan_is_billed_at_its_own_plans_price(
    tmp_path: Path, listed: bool
) -> None:
    """Made by hand on a $40 plan, it was recorded at the fleet plan's $10, and a $50 ceiling
    let four more $10 instances in: $80 a month. A plan Vultr does not list is said."""
    big = VPlan("vc2-4c-8gb", vcpu_count=4, ram=8192, monthly_cost=40.0, hourly_cost=0.06)
    fleet = Fleet(tmp_path, budget={"monthly_ceiling_usd": 50.0}, policy={"max_instances": 5})
    if listed:
        fleet.cloud.plans[big.id] = big
    hand = _by_hand(fleet, "hand-1", fleet.clock.now())
    fleet.cloud.instances[hand.id] = dataclasses.replace(hand, plan=big.id)
    fleet.queue(20)  # demand for 5

    result = fleet.run()
    row = fleet.ledger.instances["worker-by-hand"]
    if listed:
        assert (row.monthly_cost, row.hourly_rate) == (40.0, 0.06)
        assert result.plan is not None and result.plan.creates == 1  # $40 + $10 = the ceiling
        assert not result.errors
    else:
        assert row.monthly_cost == 10.0  # no price to be had: the fleet plan's, and said
        assert any(
            "vc2-4c-8gb, which Vultr lists without a usable price" in e for e in result.errors
        )
    if listed:
        fleet.clock.advance(600)
        fleet.run()
        assert len(fleet.cloud.instances) == 2  # and no more: the fleet is at its ceiling


@pytest.mark.parametrize("fault", ["ledger-fails-after-the-post", "post-answer-lost"])
def test_a_pass_cut_short_after_its_post_still_starts_the_scale_up_cool_down(
    tmp_path: Path, fault: str
) -> None:
    """The fleet state is written at the end of a pass: a pass whose ledger failed after its
    POST, or whose only POST had an unclear outcome, left last_scale_up unwritten, and the
    next pass 30 s later created again, past the 60 s cool-down and max_step_up's pace."""
    from vultrscale.errors import DatabaseError
    from vultrscale.rules.decision import Move
    from vultrscale.vultr.errors import AmbiguousCreate

    fleet = Fleet(tmp_path, policy={"max_instances": 5, "max_step_up": 1})
    fleet.queue(16)  # wants 4
    ledger, cloud = fleet.ledger, fleet.cloud
    transition, create = ledger.transition, cloud.create_instance

    def failing_transition(move: Move, now: datetime) -> None:
        if move.state is S.PENDING:
            ledger.transition = transition  # type: ignore[method-assign]
            raise DatabaseError("fleet ledger: moving to pending: server closed the connection")
        transition(move, now)

    def answer_lost(**kw: Any) -> VInstance:
        cloud.create_instance = create  # type: ignore[method-assign]
        create(**kw)  # made at Vultr; the answer never came
        raise AmbiguousCreate("POST /v2/instances: no answer (ReadTimeout)", label=kw["label"])

    if fault == "ledger-fails-after-the-post":
        ledger.transition = failing_transition  # type: ignore[method-assign]
        with pytest.raises(DatabaseError):
            fleet.run()
    else:
        cloud.create_instance = answer_lost  # type: ignore[method-assign]
        assert fleet.run().exit_code == 1
    assert cloud.posts == 1
    fleet.clock.advance(30)
    held = fleet.run()
    assert cloud.posts == 1, held.actions
    assert held.plan is not None
    assert any(c.kind is Limit.COOLDOWN_UP for c in held.plan.clamps)


class _ShortList:
    """The cloud whose tagged list leaves some instances out (a short page) while a GET by id
    still finds them, as Vultr's list does now and then."""

    def __init__(self, cloud: MemoryCloud, hidden: set[str]) -> None:
        self.cloud, self.hidden = cloud, hidden

    def list_instances(self, tag: str | None = None) -> list[VInstance]:
        return [v for v in self.cloud.list_instances(tag) if v.id not in self.hidden]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cloud, name)


def test_a_short_list_keeps_a_shared_labels_draining_instance_while_its_worker_holds_leases(
    fleet: Fleet,
) -> None:
    """Found by its GET, an instance tracked as ``<label>@<id>`` keeps that name, and with it
    its workers' leases: keyed by its Vultr label it had none that pass, and a drain past its
    deadline deleted it with two leases live."""
    fleet.signals.signals = Signals(ready=0, in_flight=2)
    for i in range(2):  # two made by hand under one label; their workers report under it
        _by_hand(fleet, f"hand-{i}", label="twin", ip=f"10.9.0.{i}")
    workers = fleet.ledger.workers_by_label
    workers["twin"] = WorkerView("twin", fleet.clock.now(), False, 2, True)
    fleet.run()
    assert fleet.states() == {"twin@hand-0": "running", "twin@hand-1": "running"}
    fleet.drain_now("twin@hand-0")
    for _ in range(12):  # past the drain deadline (5m + 30s), its leases still live
        fleet.clock.advance(30)
        workers["twin"] = dataclasses.replace(workers["twin"], last_seen=fleet.clock.now())
        waiting = fleet.run()
    assert any("2 live lease(s), waiting" in r for r in _results(waiting, "twin@hand-0"))

    fleet.clock.advance(30)
    short = fleet.run(dataclasses.replace(fleet.parts, cloud=_ShortList(fleet.cloud, {"hand-0"})))
    assert "hand-0" in fleet.cloud.instances, _results(short, "twin@hand-0")
    assert any("2 live lease(s), waiting" in r for r in _results(short, "twin@hand-0"))
    assert fleet.states()["twin@hand-1"] == "running"  # not taken for a quiet worker either


def test_an_instance_adopted_running_whose_worker_goes_quiet_gets_boot_timeout_to_come_back(
    fleet: Fleet,
) -> None:
    fleet.queue(4)
    _by_hand(fleet, "hand-1", fleet.clock.now() - timedelta(hours=2))  # made long before
    label = "worker-by-hand"
    fleet.ledger.workers_by_label[label] = WorkerView(label, fleet.clock.now(), False, 0, True)
    fleet.run()
    assert fleet.states()[label] == "running"
    fleet.clock.advance(3600)
    quiet = fleet.ledger.workers_by_label[label]
    fleet.ledger.workers_by_label[label] = dataclasses.replace(quiet, seen=False)

    fell_back = fleet.run()  # a worker restarting, say: not a boot 3 hours long
    assert fleet.states()[label] == "booting"
    assert not [x for x in fell_back.actions if x.label == label], "replaced as it fell back"
    assert "hand-1" in fleet.cloud.instances
    fleet.clock.advance(15 * 60 + 1)  # boot_timeout after it fell back: not back, replaced
    replaced = fleet.run()
    assert [x.kind.value for x in replaced.actions if x.label == label] == ["replace"]


def test_a_label_used_again_by_hand_after_its_instance_went_keeps_both_in_the_bill(
    fleet: Fleet,
) -> None:
    fleet.queue(4)
    first = _by_hand(fleet, "hand-1", fleet.clock.now())
    fleet.run()  # adopted
    fleet.clock.advance(3 * 3600)
    del fleet.cloud.instances[first.id]  # deleted by hand at Vultr
    fleet.run()
    assert "worker-by-hand" not in fleet.states()
    fleet.clock.advance(3600)
    second = _by_hand(fleet, "hand-2", fleet.clock.now() - timedelta(minutes=5))  # the same name

    result = fleet.run()
    rows = {r.label: r for r in fleet.ledger.rows(START)}
    old, new = rows["worker-by-hand@hand-1"], rows["worker-by-hand"]
    assert (old.state, old.instance_id) == (S.GONE, "hand-1")
    assert (new.instance_id, new.created_at) == ("hand-2", second.date_created)
    assert old.gone_at is not None and old.created_at == first.date_created
    everything = fleet.ledger.rows(START)  # the gone row, the new one, and the queue's worker
    expected = sum(budget.ledger_bills(everything, None, fleet.clock.now()).values())
    gone_bill = budget.ledger_bills([old], None, fleet.clock.now())[old.label]
    assert gone_bill == pytest.approx(3 * 0.015)
    assert result.observation is not None
    # The pass that adopted it bills both, the gone row's hours and the new instance's (the
    # new row's price is stored by that pass: within it, it is the plan's monthly / 672).
    assert result.observation.month_to_date_usd == pytest.approx(expected, abs=1e-3)
    fleet.clock.advance(30)
    again = fleet.run().observation
    assert again is not None and again.month_to_date_usd == pytest.approx(expected)


def test_tagged_instances_without_a_label_of_their_own_are_tracked_and_held_to_the_cap(
    fleet: Fleet,
) -> None:

    for i, label in enumerate(["", "", "twin", "twin"]):  # Vultr requires neither
        _by_hand(fleet, f"hand-{i}", label=label, ip=f"10.9.0.{i}")
    fleet.run()
    assert sorted(fleet.states()) == [
        "twin@hand-2",
        "twin@hand-3",
        "unlabelled@hand-0",
        "unlabelled@hand-1",
    ]
    fleet.queue(40)  # asks for 10; max_instances is 5 and the four count
    for _ in range(3):
        fleet.run()
        fleet.clock.advance(30)
    assert len(fleet.cloud.list_instances(fleet.cfg.fleet.tag)) == 5
    assert len(fleet.states()) == 5


def test_tagged_twins_whose_workers_hold_leases_under_their_label_are_never_deleted(
    fleet: Fleet,
) -> None:
    """Two tagged instances share the label "twin": the ledger tracks them as twin@<id>, but
    their workers report under the instance's label, "twin". Their live leases are theirs."""
    for i in range(2):
        _by_hand(fleet, f"hand-{i}", label="twin", ip=f"10.9.0.{i}")
    fleet.queue(0, in_flight=2)
    for _ in range(40):  # 20 minutes, past boot_timeout (15m) from their adoption
        fleet.ledger.workers_by_label["twin"] = WorkerView(
            "twin", fleet.clock.now(), False, 2, True
        )
        result = fleet.run()
        assert not [a for a in result.actions if a.label], result.actions
        fleet.clock.advance(30)
    assert sorted(fleet.cloud.instances) == ["hand-0", "hand-1"]
    assert fleet.states() == {"twin@hand-0": "running", "twin@hand-1": "running"}


def test_a_pass_that_dies_of_a_bug_is_recorded_as_failed_not_ok(fleet: Fleet) -> None:
    class Broken(MemorySignals):
        def read(self) -> Signals:
            raise ZeroDivisionError("a bug in a signals adapter")

    fleet.parts = dataclasses.replace(fleet.parts, store=MemoryStore(fleet.ledger, Broken()))
    with pytest.raises(ZeroDivisionError):
        fleet.run()
    event = fleet.ledger.events[-1]
    assert event["exit_code"] == 1
    assert event["errors"] == ["unexpected ZeroDivisionError: a bug in a signals adapter"]


def test_a_pass_interrupted_by_ctrl_c_is_recorded_as_interrupted_not_ok(fleet: Fleet) -> None:
    """Ctrl-C (SIGINT) in `reconcile --loop` lands in the middle of a pass: its row in
    fleet_events must say so, not exit 0 with no error (what `events` showed)."""

    def interrupted(**kw: Any) -> VInstance:
        raise KeyboardInterrupt

    fleet.cloud.create_instance = interrupted  # type: ignore[method-assign]
    fleet.queue(8)
    with pytest.raises(KeyboardInterrupt):
        fleet.run()
    event = fleet.ledger.events[-1]
    assert event["exit_code"] == 130
    assert event["errors"] == ["interrupted (SIGINT) before the pass finished"]


def test_ctrl_c_while_a_pass_records_itself_is_raised_once_it_is_recorded(fleet: Fleet) -> None:
    """Issue 36: a Ctrl-C (a real SIGINT) landing as the pass writes its fleet_events row cut
    that write: a pass that ran, created, and left no row. It is raised once the row is in."""
    import signal

    record = fleet.ledger.record_event

    def ctrl_c_then_record(event: PassEvent) -> int:
        signal.raise_signal(signal.SIGINT)
        return record(event)

    fleet.ledger.record_event = ctrl_c_then_record  # type: ignore[method-assign]
    fleet.queue(8)
    with pytest.raises(KeyboardInterrupt):
        fleet.run()
    assert [e["exit_code"] for e in fleet.ledger.events] == [0]  # the pass, as it ended
    assert fleet.cloud.posts > 0


class _WatchedDrain(MemoryDrain):
    """Records, at each SSH fan-out, the lock extensions the pass had announced by then."""

    def __init__(self, ledger: MemoryLedger) -> None:
        super().__init__()
        self.ledger = ledger
        self.calls: list[tuple[str, int, list[float]]] = []

    def stop_many(self, targets: list[HostTarget]) -> dict[str, SSHError | None]:
        self.calls.append(("stop", len(targets), list(self.ledger.lock_extensions)))
        return super().stop_many(targets)

    def is_active_many(self, targets: list[HostTarget]) -> dict[str, ServiceState | SSHError]:
        self.calls.append(("is-active", len(targets), list(self.ledger.lock_extensions)))
        return super().is_active_many(targets)


def test_a_pass_announces_how_long_its_ssh_may_take_before_it_waits_on_it(
    tmp_path: Path,
) -> None:
    # Before: a pass showed only its 30 s Vultr deadline while SSH (not under it) went on, so
    # a healthy pass draining many hosts was reported stuck by the next one after 90 s.
    fleet = Fleet(tmp_path, policy={"min_instances": 2, "max_instances": 2})
    a, _b = fleet.bring_up(8)
    fleet.drain_now(a)
    fleet.clock.advance(30)  # still active: probed, then the stop is sent again
    watched = _WatchedDrain(fleet.ledger)
    fleet.run(dataclasses.replace(fleet.parts, drain=watched))
    bound = ssh.fan_out_bound_s(1)
    assert watched.calls == [("is-active", 1, [bound]), ("stop", 1, [bound, bound])]


def test_the_bound_of_an_ssh_fan_out_grows_with_its_rounds_of_hosts() -> None:
    one_round = ssh.fan_out_bound_s(1)
    assert one_round >= ssh.CONNECT_TIMEOUT_S + ssh.COMMAND_TIMEOUT_S
    assert ssh.fan_out_bound_s(ssh.MAX_PARALLEL) == one_round
    assert ssh.fan_out_bound_s(100) == 4 * one_round  # 32 at a time
    assert ssh.fan_out_bound_s(0) == 0


def test_a_plan_priced_past_the_ceiling_stops_creates_but_drains_and_deletes_go_on(
    fleet: Fleet,
) -> None:
    a, b = fleet.bring_up(8)
    fleet.drain_now(a)
    fleet.drain.services[a] = ServiceState.INACTIVE  # drained: its delete is due
    fleet.queue(40)  # the queue asks for more
    plan = fleet.cloud.plans["vc2-1c-2gb"]
    fleet.cloud.plans[plan.id] = dataclasses.replace(plan, monthly_cost=500.0, hourly_cost=0.75)
    fleet.clock.advance(PRICE_TTL.total_seconds() + 1)  # the plan is checked again
    created = len(fleet.cloud.instances)
    result = fleet.run(dataclasses.replace(fleet.parts, cache=PassCache()))
    assert result.exit_code == EXIT_USAGE
    assert any("nothing is created" in e for e in result.errors)
    assert a not in fleet.states() and fleet.states()[b] == "running"
    assert len(fleet.cloud.instances) == created - 1  # deleted, and nothing new
