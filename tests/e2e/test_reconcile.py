"""Reconcile against the simulator over HTTP and a real Postgres, many passes on a fake clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from tests.e2e.reconcile_world import API_KEY, World
from vultrscale.core.limits import Limit
from vultrscale.core.model import ServiceState
from vultrscale.db import ledger, queue
from vultrscale.errors import DatabaseError, UsageError
from vultrscale.reconcile import run_pass
from vultrscale.vultr.client import VultrClient

MONDAY_NOON = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def world(db_url: str, tmp_path: Path) -> Iterator[World]:
    w = World(db_url, tmp_path, MONDAY_NOON)
    try:
        yield w
    finally:
        w.close()


def creates(w: World) -> int:
    return w.sim.count("POST", "/v2/instances", 202)


def test_burst_from_zero_scales_up_once_and_holds_while_booting(world: World) -> None:
    cfg = world.config()
    world.enqueue(10)  # 4 jobs per instance -> 3 instances
    first = world.run(cfg)
    assert first.exit_code == 0, first.errors
    assert first.plan is not None and first.plan.desired == 3
    assert len(world.fleet()) == 3
    # Instances take minutes to boot: later passes see them as capacity and create nothing.
    for _ in range(8):
        world.clock.advance(30)
        result = world.run(cfg)
        assert result.exit_code == 0, result.errors
    assert creates(world) == 3
    assert sorted(world.ledger().values()) == ["booting"] * 3
    # Workers report in: the ledger follows.
    world.boot_ready()
    world.run(cfg)
    assert sorted(world.ledger().values()) == ["running"] * 3


def test_scale_in_waits_for_idle_window_and_cooldown_then_drains_and_deletes(world: World) -> None:
    cfg = world.config(policy={"scale_down_cooldown": "5m", "idle_before_scale_down": "90s"})
    (label,) = world.bring_up(cfg, 4)
    world.hosts.claim(label, 4)
    world.run(cfg)
    assert world.ledger() == {label: "running"}
    world.hosts.finish(label)  # the queue is empty from here on
    scale_up_at = world.clock.now()
    drained_at = None
    for _ in range(30):
        world.clock.advance(30)
        result = world.run(cfg)
        assert result.exit_code == 0, result.errors
        if world.hosts.hosts[label].stops:
            drained_at = world.clock.now()
            break
    assert drained_at is not None, "never scaled in"
    # Not before the idle window, and not before the down cool-down after the last scale-up.
    assert (drained_at - scale_up_at).total_seconds() >= 90
    assert world.ledger() == {label: "draining"}
    world.clock.advance(30)
    result = world.run(cfg)
    assert result.exit_code == 0, result.errors
    assert world.ledger() == {label: "gone"}
    assert world.fleet() == []
    assert world.sim.count("DELETE", "/v2/instances/*", 204) == 1


def test_no_delete_while_a_drained_worker_still_holds_a_live_lease(world: World) -> None:
    # The queue still wants `a`: revive off, so that the drain's delete guard is what is seen.
    cfg = world.config(policy={"max_instances": 2, "revive": False})
    a, b = world.bring_up(cfg, 8)
    world.hosts.claim(a, 4)
    world.hosts.claim(b, 4)
    world.run(cfg)
    # The worker on `a` reports inactive but a lease of it is still live (a kill, not a drain):
    with psycopg.connect(world.db_url, autocommit=True) as conn:
        ledger.mark_draining(conn, a, world.clock.now(), fleet="workers")
    world.hosts.hosts[a].service = ServiceState.INACTIVE
    for _ in range(3):
        world.clock.advance(30)
        result = world.run(cfg)
        assert result.exit_code == 0, result.errors
        assert world.ledger()[a] == "draining"
    assert world.sim.count("DELETE", "/v2/instances/*") == 0
    # Once the lease is gone (expired or given back), the instance is deleted.
    world.hosts.finish(a)
    world.clock.advance(30)
    world.run(cfg)
    assert world.ledger()[a] == "gone"


def test_work_returning_while_an_instance_drains_starts_its_worker_again(world: World) -> None:
    cfg = world.config(policy={"max_instances": 2})
    a, b = world.bring_up(cfg, 8)
    world.hosts.claim(b, 4)
    # `a` was scaled in and its worker drained and exited; its delete is due at the next pass.
    with psycopg.connect(world.db_url, autocommit=True) as conn:
        ledger.mark_draining(conn, a, world.clock.now(), fleet="workers")
        queue.mark_stopped(conn, a)
    world.hosts.hosts[a].service = ServiceState.INACTIVE
    world.enqueue(4)  # work returns: two instances wanted
    world.clock.advance(30)
    result = world.run(cfg)
    assert result.exit_code == 0, result.errors
    assert [k for k in world.hosts.calls if k[1] == a][-2:] == [("is-active", a), ("start", a)]
    assert world.ledger()[a] == "running"
    assert world.sim.count("DELETE", "/v2/instances/*") == 0
    assert world.sim.count("POST", "/v2/instances") == 2  # the two of bring_up, nothing new
    with psycopg.connect(world.db_url) as conn:
        draining_at, flagged = conn.execute(
            "SELECT f.draining_at, w.draining FROM fleet_instances f "
            "JOIN workers w ON w.instance_label = f.label WHERE f.label = %s",
            (a,),
        ).fetchone() or (None, None)
    assert draining_at is None and flagged is False  # the new worker claims
    assert world.hosts.claim(a, 4) == 4
    world.clock.advance(30)
    result = world.run(cfg)
    assert result.exit_code == 0 and world.ledger() == {a: "running", b: "running"}


class CrashInjected(BaseException):
    """Stops a pass dead, like a kill -9 would (a BaseException: nothing catches it)."""


def test_crash_between_post_and_ledger_write_leaves_exactly_one_instance(world: World) -> None:
    cfg = world.config()
    world.enqueue(1)

    class CrashAfterPost:
        """The client, killed the moment Vultr accepted the POST (before the ledger hears)."""

        def __getattr__(self, name: str) -> object:
            return getattr(world.client, name)

        def create_instance(self, **kw: object) -> object:
            world.client.create_instance(**kw)  # type: ignore[arg-type]
            raise CrashInjected("after_post")

    crashing = world.make_parts(cloud=CrashAfterPost())
    with pytest.raises(CrashInjected):
        run_pass(cfg, crashing)
    assert len(world.fleet()) == 1
    assert list(world.ledger().values()) == ["creating"]
    for _ in range(4):
        world.clock.advance(30)
        result = world.run(cfg)
        assert result.exit_code == 0, result.errors
    assert len(world.fleet()) == 1
    assert list(world.ledger().values()) == ["booting"]


def test_ambiguous_create_is_looked_up_by_label_not_replayed(world: World) -> None:
    cfg = world.config()
    world.enqueue(1)
    world.sim.drop_after_acting("POST", "/v2/instances", mode="500")
    result = world.run(cfg)
    assert result.exit_code == 1
    assert any("outcome unknown" in e for e in result.errors)
    assert world.sim.count("POST", "/v2/instances") == 1  # not retried blindly
    world.clock.advance(30)
    world.run(cfg)
    assert len(world.fleet()) == 1
    assert list(world.ledger().values()) == ["pending"]


def test_two_passes_at_once_only_one_acts(world: World) -> None:
    cfg = world.config()
    world.enqueue(4)
    with psycopg.connect(world.db_url, autocommit=True) as holder:
        assert ledger.try_lock(holder, cfg.fleet.name)
        blocked = world.run(cfg)
        assert blocked.lock_held and blocked.exit_code == 0
        assert world.sim.count("POST", "/v2/instances") == 0
        # Freed by a statement: the close alone frees it only when the server gets to it.
        holder.execute("SELECT pg_advisory_unlock_all()")
    # Truly concurrent: the first pass is held inside its act step (just before its POST)
    # until the second has run to the end; the second must find the lock taken.
    inside, second_done = threading.Event(), threading.Event()

    class HoldBeforePost:
        def __getattr__(self, name: str) -> object:
            return getattr(world.client, name)

        def create_instance(self, **kw: object) -> object:
            inside.set()
            assert second_done.wait(timeout=60)
            return world.client.create_instance(**kw)  # type: ignore[arg-type]

    first: list[object] = []
    hold = world.make_parts(cloud=HoldBeforePost())
    t = threading.Thread(target=lambda: first.append(run_pass(cfg, hold)))
    t.start()
    assert inside.wait(timeout=60)
    second = world.run(cfg)
    second_done.set()
    t.join(timeout=60)
    assert second.lock_held and second.exit_code == 0
    assert len(world.fleet()) == 1


def test_api_storm_does_no_damage_and_exits_1(world: World) -> None:
    cfg = world.config(policy={"max_instances": 2})
    a, b = world.bring_up(cfg, 8)
    with psycopg.connect(world.db_url, autocommit=True) as conn:
        ledger.mark_draining(conn, a, world.clock.now(), fleet="workers")
    before = world.ledger()
    world.sim.error_rate = 1.0
    world.sim.error_statuses = (429, 500, 503)
    for _ in range(3):
        world.clock.advance(30)
        result = world.run(cfg)
        assert result.exit_code == 1
        assert any("Vultr API" in e for e in result.errors)
        assert result.plan is not None and result.plan.drains == ()
    assert world.sim.count("DELETE", "/v2/instances/*") == 0
    assert world.ledger() == before
    world.sim.error_rate = 0.0
    world.clock.advance(30)
    assert world.run(cfg).exit_code == 0


def test_database_down_exits_1_and_deletes_nothing(world: World) -> None:
    cfg = world.config()
    dead = world.make_parts(db_url="postgresql://postgres@127.0.0.1:9/nope?connect_timeout=2")
    with pytest.raises(DatabaseError) as err:
        run_pass(cfg, dead)
    assert err.value.exit_code == 1
    assert world.sim.count("DELETE", "/v2/instances/*") == 0
    assert world.sim.count("POST", "/v2/instances") == 0


def test_runaway_producer_never_breaks_the_budget_rule(world: World) -> None:
    # 1,000 jobs, a $50 ceiling, a $10/month plan: (a) allows at most 5 instances.
    cfg = world.config(
        policy={"max_instances": 50, "scale_up_cooldown": "60s"},
        budget={"monthly_ceiling_usd": 50.0},
    )
    world.enqueue(1000)
    most = 0
    for _ in range(40):
        result = world.run(cfg)
        assert result.exit_code == 0, result.errors
        world.boot_ready()
        live = [i for i in world.fleet()]
        most = max(most, len(live))
        assert len(live) <= 5
        world.clock.advance(600)
    assert most == 5
    assert result.plan is not None
    assert any(c.kind.rule == "budget" for c in result.plan.clamps), result.plan.clamps


def test_locked_delete_is_retried_on_later_passes(world: World) -> None:
    cfg = world.config(policy={"boot_timeout": "15m"})
    world.enqueue(1)
    world.run(cfg)
    (inst,) = world.fleet()
    world.clock.advance(121)
    world.run(cfg)
    (label,) = world.boot_ready()
    with psycopg.connect(world.db_url, autocommit=True) as conn:
        ledger.transition(
            conn, label, ledger.InstanceState.DELETING, world.clock.now(), fleet="workers"
        )
    world.sim.lock_instance(inst["id"])
    result = world.run(cfg)
    assert any("locked" in r["result"] for r in result.results)
    assert world.ledger()[label] == "deleting"
    world.sim.lock_instance(inst["id"], locked=False)
    world.clock.advance(30)
    world.run(cfg)
    assert world.ledger()[label] == "gone"


def test_instance_stuck_booting_is_replaced(world: World) -> None:
    cfg = world.config(policy={"boot_timeout": "10m"})
    world.enqueue(1)
    world.run(cfg)
    (first,) = world.fleet()
    # Active at Vultr but its worker never reports in.
    for _ in range(25):
        world.clock.advance(30)
        world.run(cfg)
    labels = world.ledger()
    assert labels[first["label"]] == "gone"
    assert sorted(labels.values()).count("gone") == 1
    assert len(world.fleet()) == 1 and world.fleet()[0]["id"] != first["id"]


def test_dry_run_changes_nothing(world: World) -> None:
    cfg = world.config()
    world.enqueue(6)
    result = world.run(cfg, dry_run=True)
    assert result.plan is not None and result.plan.creates == 2
    assert world.fleet() == [] and world.ledger() == {}
    with psycopg.connect(world.db_url) as conn:
        assert conn.execute("SELECT count(*) FROM fleet_events").fetchone() == (0,)


def test_floor_switches_on_and_off_at_window_edges_in_its_time_zone(
    world: World, tmp_path: Path
) -> None:
    # Winter: Berlin is UTC+1, so the 08:00-18:59 window is 07:00-17:59 UTC.
    path = tmp_path / "floor.toml"
    path.write_text(
        f"""
[fleet]
snapshot_id = "{world.snapshot_id}"
[policy]
max_instances = 3
billing_hour_aware = false
idle_before_scale_down = "90s"
scale_down_cooldown = "5m"
[[policy.floor]]
cron = "* 8-18 * * mon-fri"
timezone = "Europe/Berlin"
min_instances = 1
"""
    )
    from vultrscale import config

    env = {"VULTR_API_KEY": "x" * 10, "DATABASE_URL": world.db_url}
    cfg = config.load(path, env={**env, "WORKER_DATABASE_URL": world.db_url})
    world.clock.set(datetime(2026, 1, 12, 6, 59, tzinfo=UTC))  # Monday 07:59 in Berlin
    world.run(cfg)
    assert world.fleet() == []
    world.clock.advance(60)  # 08:00 in Berlin
    world.run(cfg)
    assert len(world.fleet()) == 1
    world.clock.set(datetime(2026, 1, 12, 17, 58, tzinfo=UTC))  # 18:58 Berlin: still on
    world.boot_ready()
    world.run(cfg)
    assert not any(h.stops for h in world.hosts.hosts.values())
    drained = None
    for _ in range(20):
        world.clock.advance(30)
        world.run(cfg)
        if any(h.stops for h in world.hosts.hosts.values()):
            drained = world.clock.now()
            break
    assert drained is not None and drained >= datetime(2026, 1, 12, 18, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        ("fleet", {"plan": "vc2-99c-1tb"}, "is not a Vultr plan"),
        ("fleet", {"plan": "vhf-2c-4gb", "region": "syd"}, "is not offered in region"),
        ("budget", {"monthly_ceiling_usd": 5.0}, "lower than one instance-month"),
        ("fleet", {"snapshot_id": "0a1b2c3d-0000-4000-8000-000000000000"}, "does not exist"),
    ],
    ids=["unknown-plan", "plan-not-in-region", "ceiling-below-one-month", "missing-snapshot"],
)
def test_bad_input_is_refused_before_any_instance_is_touched(
    world: World, section: str, values: dict[str, object], message: str
) -> None:
    cfg = world.config(**{section: values})
    world.enqueue(4)
    with pytest.raises(UsageError) as err:
        world.run(cfg)
    assert message in err.value.message and err.value.exit_code == 2
    assert world.sim.count("POST", "/v2/instances") == 0
    assert world.sim.count("DELETE", "/v2/instances/*") == 0


def test_unreadable_queue_holds_scale_in_and_deletes(world: World) -> None:
    cfg = world.config(
        policy={"max_instances": 2, "idle_before_scale_down": "30s", "scale_down_cooldown": "30s"}
    )
    a, b = world.bring_up(cfg, 8)
    with psycopg.connect(world.db_url, autocommit=True) as conn:
        ledger.mark_draining(conn, a, world.clock.now(), fleet="workers")
    world.hosts.hosts[a].service = ServiceState.INACTIVE

    def broken(conn: object) -> None:
        raise DatabaseError('relation "jobs" does not exist')

    blind = world.make_parts(signals_reader=broken)
    for _ in range(5):
        world.clock.advance(600)  # long past every idle window, cool-down and drain deadline
        result = run_pass(cfg, blind)
        assert result.exit_code == 1
        assert result.plan is not None and not result.plan.actions
    assert world.sim.count("DELETE", "/v2/instances/*") == 0
    assert world.ledger() == {a: "draining", b: "running"}


def test_an_instance_missing_from_one_list_is_not_forgotten(world: World) -> None:
    cfg = world.config(policy={"max_instances": 3})
    world.bring_up(cfg, 12)
    world.run(cfg)
    assert sorted(world.ledger().values()) == ["running"] * 3
    # One list comes back empty but successful (an API glitch): GET says they are there.
    world.sim.fail_next(
        "GET",
        "/v2/instances",
        200,
        body={"instances": [], "meta": {"total": 0, "links": {"next": "", "prev": ""}}},
    )
    world.clock.advance(30)
    result = world.run(cfg)
    assert result.exit_code == 0, result.errors
    assert sorted(world.ledger().values()) == ["running"] * 3
    assert len(world.fleet()) == 3 and creates(world) == 3


def test_replacing_a_stuck_instance_never_exceeds_max_instances(
    db_url: str, tmp_path: Path
) -> None:
    # Instances never leave pending, and a pending instance cannot be deleted (locked).
    w = World(db_url, tmp_path, MONDAY_NOON, boot_pending=10**6)
    try:
        cfg = w.config(policy={"max_instances": 1, "boot_timeout": "10m"})
        w.enqueue(4)
        for _ in range(60):  # 30 minutes
            result = w.run(cfg)
            assert len(w.fleet()) <= 1, result.plan
            w.clock.advance(30)
        leaving = (Limit.CAP_LEAVING, Limit.OVER_CAP)  # instances on their way out count
        assert any(c.kind in leaving for c in result.plan.clamps), result.plan.clamps
    finally:
        w.close()


def test_a_restarted_worker_on_a_draining_instance_is_marked_draining_again(world: World) -> None:
    cfg = world.config()
    (label,) = world.bring_up(cfg, 1)
    world.hosts.hosts[label].reachable = False  # the stop cannot be sent
    with psycopg.connect(world.db_url, autocommit=True) as conn:
        ledger.mark_draining(conn, label, world.clock.now(), fleet="workers")
        conn.execute("UPDATE workers SET draining = false WHERE worker_id = %s", (label,))
    world.clock.advance(30)
    world.run(cfg)
    with psycopg.connect(world.db_url) as conn:
        (draining,) = conn.execute(
            "SELECT draining FROM workers WHERE worker_id = %s", (label,)
        ).fetchone()
    assert draining


def test_a_running_instance_whose_worker_vanished_is_replaced(world: World) -> None:
    cfg = world.config(policy={"boot_timeout": "10m"})
    (label,) = world.bring_up(cfg, 1)
    world.run(cfg)
    assert world.ledger() == {label: "running"}
    with psycopg.connect(world.db_url, autocommit=True) as conn:
        conn.execute("UPDATE workers SET last_seen = now() - interval '10 minutes'")
    world.clock.advance(30)
    world.run(cfg)
    assert world.ledger()[label] == "booting"
    for _ in range(25):
        world.clock.advance(30)
        world.run(cfg)
    assert world.ledger()[label] == "gone"
    assert len(world.fleet()) == 1 and world.fleet()[0]["label"] != label


def test_foreign_preset_instances_count_as_running_once_vultr_says_ok(world: World) -> None:
    cfg = world.config(
        queue={
            "preset": "custom",
            "ready_sql": "SELECT 0",
            "in_flight_sql": "SELECT 4",
            "oldest_ready_seconds_sql": "SELECT 0",
        },
        policy={"boot_timeout": "10m"},
    )
    for _ in range(50):  # 25 minutes with 4 jobs in flight the whole time
        result = world.run(cfg)
        assert result.exit_code == 0, result.errors
        world.clock.advance(30)
    assert list(world.ledger().values()) == ["running"]
    assert world.sim.count("DELETE", "/v2/instances/*") == 0


def test_scaler_clock_ahead_of_the_database_still_sees_its_workers(
    db_url: str, tmp_path: Path
) -> None:
    ahead = datetime.now(UTC) + timedelta(hours=1)
    w = World(db_url, tmp_path, ahead)
    try:
        cfg = w.config(policy={"boot_timeout": "10m"})
        w.enqueue(1)
        w.run(cfg)
        w.clock.advance(121)
        w.run(cfg)
        (label,) = w.boot_ready()
        for _ in range(30):
            w.run(cfg)
            w.clock.advance(30)
        assert w.ledger() == {label: "running"}
    finally:
        w.close()


def test_a_failing_lookup_of_a_missing_instance_holds_the_fleet(world: World) -> None:
    cfg = world.config(policy={"max_instances": 3})
    labels = world.bring_up(cfg, 12)
    world.run(cfg)
    world.sim.fail_next(
        "GET",
        "/v2/instances",
        200,
        body={"instances": [], "meta": {"total": 0, "links": {"next": "", "prev": ""}}},
    )
    world.sim.fail_next("GET", "/v2/instances/*", 503, count=20)
    world.clock.advance(30)
    result = world.run(cfg)
    assert result.exit_code == 1 and any("Vultr API" in e for e in result.errors)
    assert result.plan is not None and not result.plan.actions
    assert sorted(world.ledger()) == sorted(labels)
    assert set(world.ledger().values()) == {"running"}


def test_a_fresh_steady_one_shot_pass_makes_one_request(world: World) -> None:
    """Cron runs `vultrscale reconcile` as a new process each time: a new client, an empty
    in-process cache. The plan check comes from Postgres, so only the list is asked."""
    cfg = world.config()
    world.bring_up(cfg, jobs=8)
    world.run(cfg)
    world.clock.advance(30)
    with VultrClient(API_KEY, world.server.url, sleep=world.clock.sleep) as fresh:
        before = len(world.sim.request_log)
        result = run_pass(cfg, world.make_parts(cloud=fresh))
        asked = [(r.method, r.path) for r in world.sim.request_log[before:]]
    assert result.exit_code == 0 and result.plan is not None and not result.plan.actions
    assert asked == [("GET", "/v2/instances")]
