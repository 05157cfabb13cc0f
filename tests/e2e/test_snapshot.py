"""`vultrscale snapshot` against the Vultr simulator and a real Postgres.

Most tests drive the unchanged VultrClient through the simulator's in-process transport with
one FakeClock shared by the simulator and the bake, so a 5-minute snapshot takes no real time.
The CLI tests go over real loopback HTTP with the system clock and a short snapshot time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from vultrscale import cli
from vultrscale import snapshot as snapshots
from vultrscale.config import Config, FleetConfig
from vultrscale.core.clock import FakeClock, SystemClock
from vultrscale.db import snapshots as store
from vultrscale.errors import DatabaseError, RuntimeFailure, UsageError
from vultrscale.fake_vultr import SimTransport, Simulator, Timings, serving
from vultrscale.vultr.client import VultrClient

KEY = "sim-test-key-0123456789"
SNAP_SECONDS = 300.0  # how long the simulated cloud takes to complete a snapshot
VID = "cb676a46-66fd-4dfb-b839-443f2e6c0b60"  # a well-formed Vultr id no instance has


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> Simulator:
    return Simulator(
        KEY, clock=clock, timings=Timings(snapshot_complete=SNAP_SECONDS), rate_limit=None
    )


@pytest.fixture
def client(sim: Simulator, clock: FakeClock) -> Iterator[VultrClient]:
    with VultrClient(KEY, "http://vultr.sim", transport=SimTransport(sim), sleep=clock.sleep) as c:
        yield c


@pytest.fixture
def base_instance(sim: Simulator, clock: FakeClock) -> str:
    """A booted instance to snapshot (past the simulator's not-visible-yet window)."""
    inst = sim.create_instance(region="ewr", plan="vc2-1c-2gb", os_id=2136, label="base", tags=[])
    clock.advance(120)
    return str(inst["id"])


def _cfg(fleet: str = "workers", snapshot_id: str = "") -> Config:
    return Config(fleet=FleetConfig(name=fleet, snapshot_id=snapshot_id))


def _posts(sim: Simulator) -> int:
    return sim.count("POST", "/v2/snapshots")


def test_bake_waits_with_backoff_until_complete_and_records_it(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    seen: list[snapshots.Progress] = []
    result = snapshots.bake(
        client, db_url, _cfg(), base_instance, clock=clock, on_progress=seen.append
    )

    assert result.is_complete and result.instance_id == base_instance
    assert result.description.startswith("workers-")
    assert sim.snapshots[result.snapshot_id]["status"] == "complete"
    assert result.size > 0
    assert _posts(sim) == 1
    # progress: pending until complete, the wait grows from 3 s and is capped at 30 s
    assert seen and {p.status for p in seen} == {"pending"}
    pauses = [p.next_poll for p in seen]
    assert pauses[0] == snapshots.FIRST_POLL
    assert pauses == sorted(pauses) and max(pauses) == snapshots.MAX_POLL
    assert SNAP_SECONDS <= result.elapsed < SNAP_SECONDS + snapshots.MAX_POLL
    # polls are few: a 5-minute snapshot takes well under 30 GETs
    assert sim.count("GET", f"/v2/snapshots/{result.snapshot_id}") < 30

    with store.connect(db_url) as conn:
        assert store.recorded_snapshot(conn, "workers") == result.snapshot_id
        rows = store.fleet_snapshots(conn, "workers")
    assert [(r.snapshot_id, r.status, r.description) for r in rows] == [
        (result.snapshot_id, "complete", result.description)
    ]


def test_prune_to_keep_deletes_only_older_fleet_snapshots(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    # Snapshots that are not this fleet's: one made by hand, one recorded for another fleet.
    manual = client.create_snapshot(base_instance, description="hand-made").id
    other = snapshots.bake(client, db_url, _cfg("other"), base_instance, clock=clock, keep=1)

    made = []
    for _ in range(4):
        clock.advance(60)  # distinct default descriptions and creation times
        made.append(snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, keep=2))

    last = made[-1]
    assert last.deleted == (made[1].snapshot_id,)
    assert made[2].deleted == (made[0].snapshot_id,)
    assert last.kept == (made[3].snapshot_id, made[2].snapshot_id)
    at_vultr = set(sim.snapshots)
    assert {made[2].snapshot_id, made[3].snapshot_id, manual, other.snapshot_id} == at_vultr
    with store.connect(db_url) as conn:
        assert store.recorded_snapshot(conn, "workers") == last.snapshot_id
        assert store.recorded_snapshot(conn, "other") == other.snapshot_id
        assert [r.snapshot_id for r in store.fleet_snapshots(conn, "other")] == [other.snapshot_id]


def test_prune_never_deletes_the_configured_snapshot(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    first = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    second = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    third = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    pinned = _cfg(snapshot_id=first.snapshot_id)  # fleet.snapshot_id in the config
    fourth = snapshots.bake(client, db_url, pinned, base_instance, clock=clock, keep=1)

    # third was the fleet's snapshot before this bake: kept too (see the test below)
    assert fourth.deleted == (second.snapshot_id,)
    assert set(sim.snapshots) == {first.snapshot_id, third.snapshot_id, fourth.snapshot_id}


def test_prune_keeps_the_previous_fleet_snapshot_a_running_pass_may_create_from(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    first = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, keep=1)
    # A reconcile pass reads the fleet's snapshot (first), then a bake with --keep 1 finishes
    # before the pass sends its create.
    with store.connect(db_url) as conn:
        in_flight = store.recorded_snapshot(conn, "workers")
    second = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, keep=1)

    assert second.previous == first.snapshot_id == in_flight
    assert second.deleted == ()
    assert second.kept == (second.snapshot_id, first.snapshot_id)
    made = client.create_instance(
        region="ewr", plan="vc2-1c-2gb", label="w-1", tags=[], snapshot_id=in_flight
    )
    assert made.id in sim.instances
    # One bake later nothing can still hold it: it goes.
    third = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, keep=1)
    assert third.deleted == (first.snapshot_id,)
    assert set(sim.snapshots) == {second.snapshot_id, third.snapshot_id}


def test_a_snapshot_recorded_while_a_bake_waits_is_kept_by_that_bakes_prune(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    """The snapshot the prune must keep, the fleet's previous one, was read when the bake
    began: B, resumed and made the fleet's snapshot while A waited, was deleted by A's prune
    (and a pass creating from it got 'Invalid snapshot ID'). The one the fleet had when A began
    is kept too: a pass may still create from it."""
    first = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    b = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, wait=False)
    resumed: list[snapshots.BakeResult] = []

    def meanwhile(progress: snapshots.Progress) -> None:  # another terminal: --resume B
        if not resumed:
            resumed.append(snapshots.resume(client, db_url, _cfg(), b.snapshot_id, clock=clock))

    a = snapshots.bake(
        client, db_url, _cfg(), base_instance, clock=clock, keep=1, on_progress=meanwhile
    )
    assert resumed and a.previous == b.snapshot_id
    assert b.snapshot_id in sim.snapshots and first.snapshot_id in sim.snapshots
    assert a.deleted == ()
    later = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, keep=1)
    assert set(later.deleted) == {first.snapshot_id, b.snapshot_id}  # the next bake prunes


def test_prune_leaves_pending_snapshots_alone_and_does_not_count_them(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    oldest = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    older = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    # A long snapshot still being made at Vultr (--no-wait), then a short one finishes first.
    sim.timings = dataclasses.replace(sim.timings, snapshot_complete=3 * 3600)
    pending = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, wait=False)
    sim.timings = dataclasses.replace(sim.timings, snapshot_complete=SNAP_SECONDS)
    clock.advance(60)
    newest = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, keep=3)

    # keep=3 counts the three complete ones; the pending one is neither counted nor deleted.
    assert newest.deleted == ()
    assert sim.snapshots[pending.snapshot_id]["status"] == "pending"
    one = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, keep=1)
    assert set(one.deleted) == {oldest.snapshot_id, older.snapshot_id}
    assert sim.snapshots[pending.snapshot_id]["status"] == "pending"
    assert set(sim.snapshots) == {newest.snapshot_id, one.snapshot_id, pending.snapshot_id}
    with store.connect(db_url) as conn:
        statuses = {r.snapshot_id: r.status for r in store.fleet_snapshots(conn, "workers")}
    assert statuses[pending.snapshot_id] == "pending"
    clock.advance(3 * 3600)
    done = snapshots.resume(client, db_url, _cfg(), pending.snapshot_id, keep=1, clock=clock)
    assert done.is_complete


def test_timeout_records_nothing_as_the_fleets_snapshot_and_resume_finishes(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    earlier = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    sim.timings = dataclasses.replace(sim.timings, snapshot_complete=3 * 3600)

    with pytest.raises(snapshots.SnapshotTimeout) as info:
        snapshots.bake(
            client, db_url, _cfg(), base_instance, clock=clock, timeout=timedelta(minutes=10)
        )
    err = info.value
    assert err.exit_code == 1
    assert f"snapshot {err.snapshot_id} is still pending at Vultr after 10m" in err.message
    assert f"vultrscale snapshot --resume {err.snapshot_id}" in err.hint
    assert sim.snapshots[err.snapshot_id]["status"] == "pending"  # left alone at Vultr
    with store.connect(db_url) as conn:
        assert store.recorded_snapshot(conn, "workers") == earlier.snapshot_id
        statuses = {r.snapshot_id: r.status for r in store.fleet_snapshots(conn, "workers")}
    assert statuses == {earlier.snapshot_id: "complete", err.snapshot_id: "pending"}

    clock.advance(3 * 3600)
    # Later, `--resume` waits for the same snapshot, records it and prunes; nothing is created.
    done = snapshots.resume(client, db_url, _cfg(), err.snapshot_id, keep=1, clock=clock)
    # earlier was the fleet's snapshot until now: kept for passes still using it
    assert done.is_complete and done.previous == earlier.snapshot_id and done.deleted == ()
    assert _posts(sim) == 2
    with store.connect(db_url) as conn:
        assert store.recorded_snapshot(conn, "workers") == err.snapshot_id


def test_resume_refuses_a_snapshot_recorded_for_another_fleet(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    theirs = snapshots.bake(client, db_url, _cfg("others"), base_instance, clock=clock)
    with pytest.raises(UsageError) as info:
        snapshots.resume(client, db_url, _cfg("workers"), theirs.snapshot_id, clock=clock)
    assert "recorded for fleet 'others', not 'workers'" in info.value.message
    assert "fleet.snapshot_id" in info.value.hint
    with store.connect(db_url) as conn:
        assert store.fleet_snapshots(conn, "workers") == []
        assert store.recorded_snapshot(conn, "others") == theirs.snapshot_id


def test_unknown_instance_is_a_usage_error_and_creates_nothing(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str
) -> None:
    with pytest.raises(UsageError) as info:
        snapshots.bake(client, db_url, _cfg(), "no-such-instance", clock=clock)
    assert info.value.exit_code == 2
    assert info.value.message == "no instance no-such-instance"
    assert "vultrscale instances" in info.value.hint
    assert _posts(sim) == 0 and sim.snapshots == {}
    with store.connect(db_url) as conn:
        assert store.fleet_snapshots(conn, "workers") == []


@pytest.mark.parametrize(
    ("outcome", "said"),
    [
        pytest.param("deleted", "disappeared at Vultr", id="disappears"),
        # It stayed at Vultr and recorded as pending, which no prune touches: kept for good.
        pytest.param("failed", "is 'failed' at Vultr", id="reported-failed-is-deleted"),
    ],
)
def test_a_snapshot_that_disappears_or_fails_is_a_clear_failure_and_forgotten(
    client: VultrClient,
    sim: Simulator,
    clock: FakeClock,
    db_url: str,
    base_instance: str,
    outcome: Any,
    said: str,
) -> None:
    sim.snapshot_outcome = outcome
    with pytest.raises(snapshots.SnapshotFailed) as info:
        snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    assert said in info.value.message
    if outcome == "failed":
        assert "was deleted" in info.value.message
    assert sim.snapshots == {}
    with store.connect(db_url) as conn:
        assert store.recorded_snapshot(conn, "workers") is None
        assert store.fleet_snapshots(conn, "workers") == []


def test_ambiguous_post_is_resolved_by_description_not_by_posting_again(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    # An older snapshot with the same description must not be mistaken for the new one.
    older = client.create_snapshot(base_instance, description="golden").id
    sim.drop_after_acting("POST", "/v2/snapshots", mode="drop")
    result = snapshots.bake(
        client, db_url, _cfg(), base_instance, description="golden", clock=clock
    )
    assert _posts(sim) == 2  # the hand-made one and exactly one from the bake
    assert result.snapshot_id != older and result.snapshot_id in sim.snapshots
    assert result.is_complete


def test_ambiguous_post_that_made_nothing_fails_clearly_and_records_nothing(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    sim.fail_next("POST", "/v2/snapshots", 500)  # refused without acting
    with pytest.raises(RuntimeFailure) as info:
        snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    assert "unclear outcome" in info.value.message and "has appeared" in info.value.message
    assert "run the same command again" in info.value.hint
    assert _posts(sim) == 1 and sim.snapshots == {}
    with store.connect(db_url) as conn:
        assert store.fleet_snapshots(conn, "workers") == []


def test_a_short_api_outage_while_waiting_does_not_end_the_wait(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    # More 503s than the client retries: the bake sees one ServerError and polls again.
    sim.fail_next("GET", "/v2/snapshots/*", 503, count=8)
    seen: list[snapshots.Progress] = []
    result = snapshots.bake(
        client, db_url, _cfg(), base_instance, clock=clock, on_progress=seen.append
    )
    assert result.is_complete
    assert any(p.note.startswith("API error, will retry") for p in seen)


def test_a_snapshot_that_cannot_be_deleted_stays_recorded_and_is_reported(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    first = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    second = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    sim.fail_next("DELETE", "/v2/snapshots/*", 400, {"error": "snapshot is busy", "status": 400})
    third = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, keep=1)
    assert third.deleted == ()
    [problem] = third.delete_errors
    assert problem.startswith(f"{first.snapshot_id}: ") and "snapshot is busy" in problem
    assert first.snapshot_id in sim.snapshots
    assert third.kept == (third.snapshot_id, second.snapshot_id, first.snapshot_id)
    # the next bake tries again and succeeds (third, the previous one, stays)
    fourth = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, keep=1)
    assert set(fourth.deleted) == {first.snapshot_id, second.snapshot_id}
    assert set(sim.snapshots) == {third.snapshot_id, fourth.snapshot_id}


def test_a_database_failure_while_pruning_leaves_the_bake_a_success_with_a_warning(
    client: VultrClient,
    sim: Simulator,
    clock: FakeClock,
    db_url: str,
    base_instance: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It failed the whole command (exit 1, only the database's error), though the new
    snapshot was complete and already the fleet's: the user would bake, and pay, again."""
    first = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)
    snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock)

    def fails(*args: object) -> None:
        raise DatabaseError("forgetting snapshot: terminating connection due to administrator")

    monkeypatch.setattr(store, "forget_snapshot", fails)
    third = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, keep=1)
    assert third.is_complete and third.deleted == ()
    assert any("the database failed" in e for e in third.delete_errors)
    monkeypatch.undo()
    with store.connect(db_url) as conn:
        assert store.recorded_snapshot(conn, "workers") == third.snapshot_id
    fourth = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, keep=1)
    assert first.snapshot_id in fourth.deleted  # deleted at Vultr before, forgotten now


def test_no_wait_lists_it_pending_but_does_not_make_it_the_fleets(
    client: VultrClient, sim: Simulator, clock: FakeClock, db_url: str, base_instance: str
) -> None:
    result = snapshots.bake(client, db_url, _cfg(), base_instance, clock=clock, wait=False)
    assert result.status == "pending" and not result.is_complete
    assert clock.slept == []
    with store.connect(db_url) as conn:
        assert store.recorded_snapshot(conn, "workers") is None
        assert [r.status for r in store.fleet_snapshots(conn, "workers")] == ["pending"]


def test_a_wrong_database_fails_before_anything_is_sent(
    client: VultrClient, sim: Simulator, clock: FakeClock, base_instance: str, pg_url: str
) -> None:
    with pytest.raises(RuntimeFailure, match="vultrscale tables are missing"):
        snapshots.bake(client, pg_url, _cfg(), base_instance, clock=clock)
    assert _posts(sim) == 0


def test_a_database_failure_after_the_post_names_the_snapshot_to_resume(
    client: VultrClient, sim: Simulator, clock: FakeClock, base_instance: str, pg_url: str
) -> None:
    # fleet_state can be read, but the snapshot cannot be written: the POST has happened.
    with store.connect(pg_url) as conn:
        conn.execute("CREATE TABLE fleet_state (fleet text PRIMARY KEY, snapshot_id text)")
    with pytest.raises(DatabaseError) as info:
        snapshots.bake(client, pg_url, _cfg(), base_instance, clock=clock)
    [made] = sim.snapshots
    assert f"snapshot {made} exists at Vultr but could not be recorded" in info.value.message
    assert f"vultrscale snapshot --resume {made}" in info.value.hint


@pytest.mark.parametrize("when", ["during-the-post", "during-the-record"])
def test_ctrl_c_between_the_post_and_its_record_says_what_to_resume(
    client: VultrClient,
    sim: Simulator,
    clock: FakeClock,
    db_url: str,
    base_instance: str,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    """Interrupted there, the bake said only 'interrupted' (exit 130): the snapshot existed at
    Vultr, recorded nowhere, and no prune would ever delete it."""
    if when == "during-the-post":
        post = client.create_snapshot

        def acts_then_interrupted(instance_id: str, description: str = "") -> object:
            post(instance_id, description=description)  # made at Vultr
            raise KeyboardInterrupt

        monkeypatch.setattr(client, "create_snapshot", acts_then_interrupted)
    else:

        def interrupted(*args: object) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(store, "record_snapshot", interrupted)
    with pytest.raises(snapshots.SnapshotInterrupted) as info:
        snapshots.bake(client, db_url, _cfg(), base_instance, description="bake-1", clock=clock)
    [made] = sim.snapshots
    said = f"{info.value.message} {info.value.hint}"
    assert info.value.exit_code == 130
    if when == "during-the-post":
        assert "'bake-1'" in said and "--resume <ID>" in said
    else:
        assert f"vultrscale snapshot --resume {made}" in said


# --- the command line, over real HTTP ------------------------------------------------------


@pytest.fixture
def http_sim() -> Iterator[tuple[Simulator, str]]:
    sim = Simulator(
        KEY, clock=SystemClock(), timings=Timings(snapshot_complete=1.0, visible_after=0)
    )
    with serving(sim) as server:
        yield sim, server.url


@pytest.fixture
def cli_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, db_url: str, http_sim: tuple[Simulator, str]
) -> Simulator:
    sim, url = http_sim
    monkeypatch.chdir(tmp_path)  # no stray ./vultrscale.toml or .env
    monkeypatch.delenv("VULTRSCALE_CONFIG", raising=False)
    monkeypatch.setenv("VULTR_API_KEY", KEY)
    monkeypatch.setenv("VULTR_API_URL", url)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("VULTRSCALE_FLEET_NAME", "clifleet")
    return sim


def _booted(sim: Simulator) -> str:
    inst = sim.create_instance(region="ewr", plan="vc2-1c-1gb", os_id=2136, label="b", tags=[])
    return str(inst["id"])


def test_cli_bakes_records_and_prunes_over_http(
    cli_env: Simulator, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = cli_env
    base = _booted(sim)
    # two older fleet snapshots, complete at once (no wait): with --keep 1 the oldest is
    # pruned, the previous one ("old") is kept for passes that may still create from it
    sim.timings = dataclasses.replace(sim.timings, snapshot_complete=0)
    assert cli.main(["snapshot", "--from-instance", base, "--description", "oldest"]) == 0
    oldest = store_id(db_url, "clifleet")
    assert cli.main(["snapshot", "--from-instance", base, "--description", "old"]) == 0
    old = store_id(db_url, "clifleet")
    capsys.readouterr()
    sim.timings = dataclasses.replace(sim.timings, snapshot_complete=1.0)  # one poll pause

    code = cli.main(["snapshot", "--from-instance", base, "--description", "new", "--keep", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    new = store_id(db_url, "clifleet")
    assert new != old
    assert f"Snapshot {new} (new) is complete" in out
    assert f"Deleted 1 older fleet snapshot(s): {oldest}" in out
    assert set(sim.snapshots) == {new, old}


def store_id(db_url: str, fleet: str) -> str:
    with store.connect(db_url) as conn:
        sid = store.recorded_snapshot(conn, fleet)
    assert sid is not None
    return sid


def test_cli_unknown_instance_exits_2_and_sends_no_post(
    cli_env: Simulator, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["snapshot", "--from-instance", VID]) == 2
    err = capsys.readouterr().err
    assert f"no instance {VID}" in err and "vultrscale instances" in err
    assert cli_env.count("POST", "/v2/snapshots") == 0


def test_cli_no_wait_then_resume(
    cli_env: Simulator, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _booted(cli_env)
    cli_env.timings = dataclasses.replace(cli_env.timings, snapshot_complete=0)
    assert cli.main(["snapshot", "--from-instance", base, "--no-wait"]) == 0
    out = capsys.readouterr().out
    sid = next(iter(cli_env.snapshots))
    assert f"vultrscale snapshot --resume {sid}" in out
    with store.connect(db_url) as conn:
        assert store.recorded_snapshot(conn, "clifleet") is None
    assert cli.main(["snapshot", "--resume", sid]) == 0
    assert store_id(db_url, "clifleet") == sid


@pytest.mark.parametrize(
    ("args", "unset", "needle"),
    [
        (["--from-instance", VID, "--timeout", "soon"], None, "--timeout"),
        (["--from-instance", VID, "--keep", "0"], None, "--keep"),
        ([], None, "exactly one of --from-instance"),
        (["--from-instance", VID], "VULTR_API_KEY", "VULTR_API_KEY is not set"),
        (["--from-instance", VID], "DATABASE_URL", "DATABASE_URL is not set"),
    ],
    ids=["bad-timeout", "keep-0", "no-source", "no-api-key", "no-database-url"],
)
def test_cli_bad_input_exits_2_before_any_request(
    cli_env: Simulator,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    unset: str | None,
    needle: str,
) -> None:
    if unset:
        monkeypatch.delenv(unset)
    assert cli.main(["snapshot", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert KEY not in err
    assert cli_env.request_log == []


class _CtrlCAfter(FakeClock):
    """A FakeClock whose n-th sleep is interrupted, as Ctrl-C interrupts the real wait."""

    def __init__(self, sleeps: int) -> None:
        super().__init__()
        self.left = sleeps

    def sleep(self, seconds: float) -> None:
        self.left -= 1
        if self.left < 0:
            raise KeyboardInterrupt
        super().sleep(seconds)


def test_ctrl_c_while_waiting_names_the_snapshot_and_the_resume_command(db_url: str) -> None:
    clock = _CtrlCAfter(sleeps=2)
    sim = Simulator(
        KEY, clock=clock, timings=Timings(snapshot_complete=SNAP_SECONDS), rate_limit=None
    )
    inst = sim.create_instance(region="ewr", plan="vc2-1c-2gb", os_id=2136, label="b", tags=[])
    clock.advance(120)
    with VultrClient(KEY, "http://vultr.sim", transport=SimTransport(sim), sleep=clock.sleep) as c:
        with pytest.raises(snapshots.SnapshotInterrupted) as err:
            snapshots.bake(c, db_url, _cfg(), str(inst["id"]), clock=clock)
        (snap_id,) = sim.snapshots
        assert err.value.exit_code == 130
        assert snap_id in err.value.message
        assert f"`vultrscale snapshot --resume {snap_id}`" in err.value.hint
        with store.connect(db_url) as conn:  # listed for the fleet, pending, not its snapshot
            assert [(r.snapshot_id, r.status) for r in store.fleet_snapshots(conn, "workers")] == [
                (snap_id, "pending")
            ]
            assert store.recorded_snapshot(conn, "workers") != snap_id
        clock.left = 10_000
        done = snapshots.resume(c, db_url, _cfg(), snap_id, clock=clock)  # the named command
    assert done.is_complete and done.snapshot_id == snap_id
