"""The real VultrClient against the simulator over real HTTP on 127.0.0.1.

The simulator runs on a FakeClock and the client's ``sleep`` is that clock's ``sleep``: a
Retry-After or a backoff advances simulated time (refilling the rate limiter) instantly, so
nothing here sleeps for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from vultrscale.core.clock import FakeClock, SystemClock
from vultrscale.fake_vultr import ServerHandle, Simulator, Timings, start_server
from vultrscale.vultr.client import VultrClient
from vultrscale.vultr.errors import (
    AmbiguousCreate,
    AuthError,
    InstanceLocked,
    NotFound,
    ServerError,
)

pytestmark = pytest.mark.e2e

KEY = "sim-e2e-key-5f1c0ffee"
TAG = "vultrscale-e2e"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> Simulator:
    return Simulator(
        KEY,
        clock=clock,
        seed=11,
        timings=Timings(boot_pending=30, boot_ready=60, visible_after=5, snapshot_complete=120),
    )


@pytest.fixture
def server(sim: Simulator) -> Iterator[ServerHandle]:
    handle = start_server(sim, "127.0.0.1", 0)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def client(server: ServerHandle, clock: FakeClock) -> Iterator[VultrClient]:
    assert server.url.startswith("http://127.0.0.1:")
    with VultrClient(
        KEY, server.url, timeout=5.0, sleep=clock.sleep, monotonic=clock.monotonic
    ) as c:
        yield c


def _create(client: VultrClient, label: str, **extra: Any) -> Any:
    return client.create_instance(
        region="ewr", plan="vc2-1c-2gb", label=label, tags=[TAG], os_id=2284, **extra
    )


def test_list_follows_every_page(sim: Simulator, client: VultrClient) -> None:
    made = [
        sim.create_instance(
            region="ewr", plan="vc2-1c-1gb", os_id=2284, label=f"w-{n}", tags=[TAG]
        )["id"]
        for n in range(1234)
    ]
    for n in range(20):  # not ours: the tag filter must leave them out
        sim.create_instance(region="ewr", plan="vc2-1c-1gb", os_id=2284, label=f"o-{n}")
    sim.rate_limit = None
    listed = client.list_instances(tag=TAG)
    assert [i.id for i in listed] == made
    assert all(i.status == "pending" and i.main_ip == "0.0.0.0" for i in listed)
    assert sim.count("GET", "/v2/instances", 200) == 3  # 500 + 500 + 234
    assert client.requests_made == 3
    assert [i.label for i in client.list_instances(label="w-42")] == ["w-42"]


def test_create_get_delete(sim: Simulator, client: VultrClient, clock: FakeClock) -> None:
    created = _create(client, "w-1", user_data="#cloud-config\nruncmd: [true]\n")
    assert (created.status, created.server_status, created.main_ip) == (
        "pending",
        "none",
        "0.0.0.0",
    )
    assert created.raw["default_password"]  # the simulator sends it, as Vultr does
    with pytest.raises(NotFound):
        client.get_instance(created.id)  # not visible yet, like TF #462
    clock.advance(5)
    assert client.get_instance(created.id).status == "pending"
    # the client sent the user-data base64-encoded, as Vultr wants it, and it arrived whole
    assert sim.user_data(created.id) == "#cloud-config\nruncmd: [true]\n"
    with pytest.raises(InstanceLocked):
        client.delete_instance(created.id)
    assert sim.count("DELETE", f"/v2/instances/{created.id}") == 1  # a lock is not retried now
    clock.advance(25)
    active = client.get_instance(created.id)
    assert (active.status, active.server_status) == ("active", "installingbooting")
    assert active.main_ip == sim.instances[created.id]["main_ip"] != "0.0.0.0"
    assert active.raw["disk"] == 55 and active.tags == (TAG,)
    client.delete_instance(created.id)
    with pytest.raises(NotFound):
        client.get_instance(created.id)
    with pytest.raises(NotFound):
        client.delete_instance(created.id)
    assert sim.instances == {}


def test_locked_instance_delete_raises_instance_locked(
    sim: Simulator, client: VultrClient, clock: FakeClock
) -> None:
    iid = _create(client, "w-1").id
    clock.advance(100)
    sim.lock_instance(iid)
    with pytest.raises(InstanceLocked) as info:
        client.delete_instance(iid)
    assert info.value.status == 500 and "currently locked" in info.value.api_message
    sim.lock_instance(iid, locked=False)
    client.delete_instance(iid)
    assert iid not in sim.instances


def test_rate_limited_calls_wait_and_then_succeed(
    sim: Simulator, client: VultrClient, clock: FakeClock
) -> None:
    sim.rate_limit = 3
    for _ in range(8):
        assert client.account().name == "Simulated Account"
    limited = sim.count("GET", "/v2/account", 429)
    assert limited >= 2
    assert sim.count("GET", "/v2/account", 200) == 8
    assert clock.slept.count(1.0) == limited  # Retry-After: 1 honoured each time

    # a 429 refused the create outright, so the client may repeat it: one instance results
    sim.rate_limit = 1
    client.account()  # spends the only token; the clock does not move until the client sleeps
    created = _create(client, "w-rl")
    assert sim.count("POST", "/v2/instances", 429) == 1
    assert sim.count("POST", "/v2/instances", 202) == 1
    assert [i["label"] for i in sim.instances.values()] == [created.label] == ["w-rl"]


def test_injected_server_errors_are_retried_for_get(
    sim: Simulator, client: VultrClient, clock: FakeClock
) -> None:
    iid = _create(client, "w-1").id
    clock.advance(5)
    sim.fail_next("GET", "/v2/instances/*", 500, count=2)
    assert client.get_instance(iid).id == iid
    assert sim.count("GET", f"/v2/instances/{iid}") == 3

    sim.fail_next(
        "GET", "/v2/instances", 504, "We are currently conducting some software upgrades."
    )
    assert [i.id for i in client.list_instances(tag=TAG)] == [iid]

    sim.fail_next("GET", "/v2/account", 503, count=50)
    with pytest.raises(ServerError) as info:
        client.account()
    assert info.value.status == 503
    assert sim.count("GET", "/v2/account") == client.max_attempts


@pytest.mark.parametrize("mode", ["500", "drop"])
def test_lost_create_answer_is_ambiguous_and_creates_exactly_one(
    sim: Simulator, client: VultrClient, mode: str
) -> None:
    sim.drop_after_acting("POST", "/v2/instances", mode=mode)  # type: ignore[arg-type]
    with pytest.raises(AmbiguousCreate) as info:
        _create(client, "w-lost")
    assert info.value.label == "w-lost"
    assert sim.count("POST", "/v2/instances") == 1  # never replayed blindly
    assert [i["label"] for i in sim.instances.values()] == ["w-lost"]
    # what the caller does next: look the label up, and find the one instance
    assert len(client.list_instances(label="w-lost")) == 1


def test_snapshots_plans_and_billing(sim: Simulator, client: VultrClient, clock: FakeClock) -> None:
    iid = _create(client, "base").id
    snap = client.create_snapshot(iid, "golden-1")
    assert (snap.status, snap.size) == ("pending", 0)
    clock.advance(121)
    done = client.get_snapshot(snap.id)
    assert done.status == "complete" and done.size == 55 * 1024**3 and done.compressed_size > 0
    assert [s.id for s in client.list_snapshots(description="golden-1")] == [snap.id]
    from_snap = client.create_instance(
        region="ewr", plan="vc2-1c-2gb", label="w-2", tags=[TAG], snapshot_id=snap.id
    )
    assert from_snap.raw["os"] == "Snapshot"
    client.delete_snapshot(snap.id)
    with pytest.raises(NotFound):
        client.get_snapshot(snap.id)

    plan = client.get_plan("vc2-1c-2gb")
    assert (plan.monthly_cost, plan.hourly_cost) == (10, 0.0149)
    assert "vc2-24c-96gb" not in client.region_availability("syd")
    clock.advance(3600 * 3)
    charges = client.pending_charges()
    assert sorted(c.units for c in charges) == [3, 4]  # created 121 s apart
    assert client.account().pending_charges == pytest.approx(sum(c.total for c in charges))


def test_wrong_key_is_refused_without_echoing_it(server: ServerHandle, clock: FakeClock) -> None:
    wrong = "not-the-key-123456"
    with VultrClient(wrong, server.url, sleep=clock.sleep) as c, pytest.raises(AuthError) as info:
        c.list_instances(tag=TAG)
    assert info.value.status == 401 and wrong not in str(info.value)
    assert c.requests_made == 1


def test_a_slow_create_times_out_as_ambiguous_and_still_happens() -> None:
    # real time here: the server takes 0.6 s after acting, the client waits 0.2 s
    sim = Simulator(KEY, clock=SystemClock(), seed=2, rate_limit=None)
    sim.latency = 0.6
    with start_server(sim) as server, VultrClient(KEY, server.url, timeout=0.2) as client:
        with pytest.raises(AmbiguousCreate):
            _create(client, "w-slow")
        assert [i["label"] for i in sim.instances.values()] == ["w-slow"]
        assert sim.count("POST", "/v2/instances") == 1
        sim.latency = 0.0
        assert [i.label for i in client.list_instances(tag=TAG)] == ["w-slow"]
