"""The simulator's state machine under a FakeClock: boot, visibility, delete, snapshots,
billing per started hour with the monthly cap, faults and determinism under a seed."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from vultrscale.core.clock import FakeClock
from vultrscale.fake_vultr import (
    SeededIps,
    SequentialIps,
    SimTransport,
    Simulator,
    SimulatorError,
    Timings,
)

KEY = "lifecycle-key"
TIMINGS = Timings(boot_pending=30, boot_ready=90, visible_after=5, snapshot_complete=300)


def make(clock: FakeClock | None = None, **kwargs: Any) -> tuple[Simulator, httpx.Client]:
    sim = Simulator(
        KEY, clock=clock or FakeClock(), timings=kwargs.pop("timings", TIMINGS), **kwargs
    )
    client = httpx.Client(
        base_url="http://sim.invalid",
        transport=SimTransport(sim),
        headers={"Authorization": f"Bearer {KEY}"},
    )
    return sim, client


def post(client: httpx.Client, label: str = "w-1", **extra: Any) -> dict[str, Any]:
    body = {"region": "ewr", "plan": "vc2-4c-8gb", "os_id": 2284, "label": label, "tags": ["t"]}
    body.update(extra)
    resp = client.post("/v2/instances", json=body)
    assert resp.status_code == 202, resp.text
    instance: dict[str, Any] = resp.json()["instance"]
    return instance


def test_boot_goes_pending_then_active_with_ip_then_ok() -> None:
    clock = FakeClock()
    sim, client = make(clock)
    inst = post(client)
    assert (inst["status"], inst["server_status"], inst["main_ip"]) == (
        "pending",
        "none",
        "0.0.0.0",
    )
    assert inst["disk"] == 0 and inst["power_status"] == "running"

    clock.advance(29)
    assert sim.instances[inst["id"]]["status"] == "pending"
    clock.advance(1)
    active = client.get(f"/v2/instances/{inst['id']}").json()["instance"]
    assert (active["status"], active["server_status"]) == ("active", "installingbooting")
    assert active["main_ip"].startswith("10.") and active["disk"] == 160
    assert active["gateway_v4"] != "0.0.0.0" and active["netmask_v4"] == "255.255.254.0"

    clock.advance(89)
    assert sim.instances[inst["id"]]["server_status"] == "installingbooting"
    clock.advance(1)
    assert sim.instances[inst["id"]]["server_status"] == "ok"
    assert sim.instances[inst["id"]]["main_ip"] == active["main_ip"]


def test_get_answers_404_right_after_create_then_finds_it() -> None:
    clock = FakeClock()
    sim, client = make(clock)
    iid = post(client)["id"]
    first = client.get(f"/v2/instances/{iid}")
    assert (first.status_code, first.json()["error"]) == (404, "instance not found")
    assert client.get(f"/v2/instances/{iid}/user-data").status_code == 404
    clock.advance(5)
    assert client.get(f"/v2/instances/{iid}").status_code == 200

    # the window can be switched off
    sim2, client2 = make(timings=Timings(visible_after=0))
    assert client2.get(f"/v2/instances/{post(client2)['id']}").status_code == 200


def test_delete_is_refused_while_provisioning_or_locked_then_succeeds() -> None:
    clock = FakeClock()
    sim, client = make(clock)
    iid = post(client)["id"]
    locked = client.delete(f"/v2/instances/{iid}")
    assert locked.status_code == 500
    assert locked.json() == {
        "error": "Unable to destroy server: Unable to remove VM: Server is currently locked",
        "status": 500,
    }
    clock.advance(30)  # active, installingbooting: deletable
    sim.lock_instance(iid)
    assert sim.instances[iid]["server_status"] == "locked"
    assert client.delete(f"/v2/instances/{iid}").status_code == 500
    sim.lock_instance(iid, False)
    gone = client.delete(f"/v2/instances/{iid}")
    assert (gone.status_code, gone.content) == (204, b"")
    assert client.get(f"/v2/instances/{iid}").status_code == 404
    assert client.delete(f"/v2/instances/{iid}").status_code == 404
    assert iid not in sim.instances

    # the lock during provisioning can be switched off
    sim2, client2 = make(lock_while_provisioning=False)
    assert client2.delete(f"/v2/instances/{post(client2)['id']}").status_code == 204


def test_ready_hook_fires_once_with_the_decoded_user_data() -> None:
    clock = FakeClock()
    seen: list[tuple[dict[str, Any], str]] = []
    sim, client = make(
        clock,
        ip_allocator=SequentialIps("127.0.0.0/24"),
        on_instance_ready=lambda i, u: seen.append((i, u)),
    )
    user_data = base64.b64encode(b"#cloud-config\nruncmd: [echo hi]\n").decode()
    iid = post(client, user_data=user_data)["id"]
    second = post(client, label="w-2")["id"]
    clock.advance(29)
    sim.tick()
    assert seen == []
    clock.advance(1)
    sim.tick()
    sim.tick()
    assert [(i["id"], i["main_ip"], i["status"]) for i, _ in seen] == [
        (iid, "127.0.0.2", "active"),
        (second, "127.0.0.3", "active"),
    ]
    assert seen[0][1] == "#cloud-config\nruncmd: [echo hi]\n" and seen[1][1] == ""
    # a released address is handed out again
    client.delete(f"/v2/instances/{iid}")
    assert sim.create_instance(region="ewr", plan="vc2-1c-1gb", os_id=2284)["main_ip"] == "0.0.0.0"
    clock.advance(30)
    assert sorted(i["main_ip"] for i in sim.instances.values()) == ["127.0.0.2", "127.0.0.3"]

    on_ok: list[str] = []
    sim_ok, client_ok = make(
        clock, on_instance_ready=lambda i, u: on_ok.append(i["server_status"]), ready_on="ok"
    )
    post(client_ok)
    clock.advance(30)
    sim_ok.tick()
    assert on_ok == []
    clock.advance(90)
    sim_ok.tick()
    assert on_ok == ["ok"]


def test_snapshot_completes_and_can_be_used_to_create() -> None:
    clock = FakeClock()
    sim, client = make(clock)
    iid = post(client)["id"]
    snap = client.post("/v2/snapshots", json={"instance_id": iid, "description": "gold"}).json()
    snap = snap["snapshot"]
    assert (snap["status"], snap["size"], snap["compressed_size"]) == ("pending", 0, 0)
    refused = client.post(
        "/v2/instances", json={"region": "ewr", "plan": "vc2-1c-1gb", "snapshot_id": snap["id"]}
    )
    assert refused.status_code == 400 and "not complete" in refused.json()["error"]
    clock.advance(300)
    done = client.get(f"/v2/snapshots/{snap['id']}").json()["snapshot"]
    assert done["status"] == "complete"
    assert done["size"] == 160 * 1024**3 and 0 < done["compressed_size"] < done["size"]
    from_snap = post(client, label="w-2", snapshot_id=snap["id"], os_id=None)
    assert (from_snap["os"], from_snap["os_id"], from_snap["snapshot_id"]) == (
        "Snapshot",
        164,
        snap["id"],
    )


@pytest.mark.parametrize("outcome", ["stuck", "deleted"])
def test_a_snapshot_can_be_made_to_fail(outcome: str) -> None:
    clock = FakeClock()
    sim, client = make(clock)
    sim.snapshot_outcome = outcome  # type: ignore[assignment]
    iid = post(client)["id"]
    sid = client.post("/v2/snapshots", json={"instance_id": iid}).json()["snapshot"]["id"]
    clock.advance(3600)
    resp = client.get(f"/v2/snapshots/{sid}")
    if outcome == "stuck":
        assert resp.json()["snapshot"]["status"] == "pending"
    else:
        assert resp.status_code == 404


def charges(client: httpx.Client) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.get("/v2/billing/pending-charges").json()[
        "pending_charges"
    ]
    return items


def test_charges_per_started_hour() -> None:
    clock = FakeClock(datetime(2026, 3, 10, 8, 0, tzinfo=UTC))
    sim, client = make(clock)
    post(client)  # vc2-4c-8gb: $40/month, hourly_cost 0.0595
    (item,) = charges(client)
    assert (item["units"], item["unit_price"], item["total"]) == (1, 0.0595, 0.06)  # min 1 hour
    clock.advance(timedelta(hours=1, seconds=1))
    (item,) = charges(client)
    assert (item["units"], item["total"]) == (2, 0.12)
    assert client.get("/v2/account").json()["account"]["pending_charges"] == 0.12
    assert item["description"].endswith("(8192 MB) [w-1]") and item["unit_type"] == "hours"


def test_charges_fall_back_to_monthly_over_672_and_are_capped_per_month() -> None:
    plan = {
        "id": "vc2-test",
        "vcpu_count": 1,
        "ram": 1024,
        "disk": 25,
        "disk_count": 1,
        "bandwidth": 1024,
        "monthly_cost": 67.2,  # no hourly_cost: 67.2 / 672 = 0.1 per hour
        "type": "vc2",
        "locations": ["ewr"],
    }
    clock = FakeClock(datetime(2026, 1, 20, 0, 0, tzinfo=UTC))
    sim, client = make(clock, plans=[plan])
    post(client, plan="vc2-test")
    clock.advance(timedelta(hours=9, minutes=30))
    (item,) = charges(client)
    assert item["units"] == 10 and item["unit_price"] == pytest.approx(0.1)
    assert item["total"] == pytest.approx(1.0)

    # Jan 20 -> Feb 1 is 288 hours: under the cap. On Feb 28 the February segment (648 h so
    # far) is still under; one day later (March) the month restarts at one started hour.
    clock.set(datetime(2026, 2, 28, 0, 0, tzinfo=UTC))
    (item,) = charges(client)
    assert item["start_date"] == "2026-02-01T00:00:00+00:00"
    assert item["units"] == 648 and item["total"] == pytest.approx(64.8)
    clock.set(datetime(2026, 2, 28, 23, 59, tzinfo=UTC))  # 672 started hours: the cap
    (item,) = charges(client)
    assert (item["units"], item["total"]) == (672, 67.2)
    clock.set(datetime(2026, 3, 31, 23, 0, tzinfo=UTC))  # 743 hours in March: capped
    (item,) = charges(client)
    assert (item["units"], item["total"]) == (743, 67.2)
    clock.set(datetime(2026, 4, 1, 0, 10, tzinfo=UTC))
    (item,) = charges(client)
    assert (item["units"], item["total"]) == (1, 0.1)


def test_deleted_instances_keep_their_charges_until_the_month_ends() -> None:
    clock = FakeClock(datetime(2026, 5, 30, 0, 0, tzinfo=UTC))
    sim, client = make(clock)
    iid = post(client)["id"]
    clock.advance(timedelta(hours=2, minutes=1))
    assert client.delete(f"/v2/instances/{iid}").status_code == 204
    clock.advance(timedelta(hours=10))
    (item,) = charges(client)
    assert item["units"] == 3  # billing stopped at the delete
    clock.set(datetime(2026, 6, 1, 0, 5, tzinfo=UTC))
    assert charges(client) == []


def test_rate_limit_refills_with_the_clock_and_is_per_client() -> None:
    clock = FakeClock()
    sim, client = make(clock)
    statuses = [client.get("/v2/account").status_code for _ in range(31)]
    assert statuses[:30] == [200] * 30 and statuses[30] == 429
    other = client.get("/v2/account", headers={"X-Sim-Client": "10.9.9.9"})
    assert other.status_code == 200
    clock.advance(0.1)  # 3 tokens back
    assert [client.get("/v2/account").status_code for _ in range(4)] == [200, 200, 200, 429]
    sim.rate_limit = None
    assert all(client.get("/v2/account").status_code == 200 for _ in range(100))


def test_fail_next_and_drop_after_acting() -> None:
    clock = FakeClock()
    sim, client = make(clock)
    sim.fail_next(
        "GET", "/v2/instances", 504, "We are currently conducting some software upgrades."
    )
    html = client.get("/v2/instances")
    assert html.status_code == 504 and html.headers["content-type"] == "text/html"
    assert client.get("/v2/instances").status_code == 200

    sim.fail_next("POST", "/v2/instances", 503, count=2)
    assert [client.post("/v2/instances", json={}).status_code for _ in range(3)] == [503, 503, 400]
    assert sim.instances == {}  # a failed request did not act

    sim.drop_after_acting("POST", "/v2/instances")
    assert client.post("/v2/instances", json={}).status_code == 400  # refused: nothing to lose
    lost = client.post(
        "/v2/instances", json={"region": "ewr", "plan": "vc2-1c-1gb", "os_id": 2284, "label": "x"}
    )
    assert lost.status_code == 500
    assert [i["label"] for i in sim.instances.values()] == ["x"]
    sim.drop_after_acting("POST", "/v2/instances", mode="drop")
    with pytest.raises(httpx.RemoteProtocolError):
        post(client, label="y")
    assert sorted(i["label"] for i in sim.instances.values()) == ["x", "y"]
    assert sim.count("POST", "/v2/instances") == 6
    assert sim.count("POST", "/v2/instances", status=0) == 1

    sim.latency = 2.5
    client.get("/v2/account")
    assert clock.slept[-1] == 2.5


def test_error_rate_is_seeded() -> None:
    def run(seed: int) -> list[int]:
        sim, client = make(seed=seed, rate_limit=None)
        sim.error_rate = 0.3
        return [client.get("/v2/account").status_code for _ in range(60)]

    first = run(3)
    assert first == run(3)
    failures = sum(1 for s in first if s >= 500)
    assert 5 <= failures <= 35 and set(first) <= {200, 500, 502, 503}


def test_same_seed_and_clock_give_the_same_world() -> None:
    def world(seed: int) -> list[dict[str, Any]]:
        clock = FakeClock()
        sim, client = make(clock, seed=seed)
        for n in range(5):
            post(client, label=f"w-{n}")
            clock.advance(7)
        clock.advance(200)
        return [client.get("/v2/instances").json()]

    assert world(1) == world(1)
    assert world(1) != world(2)


def test_create_validation_and_helpers() -> None:
    sim, client = make(max_instances=1)
    with pytest.raises(SimulatorError, match="base64"):
        sim.create_instance(region="ewr", plan="vc2-1c-1gb", os_id=2284, user_data=b"x")
    made = sim.create_instance(region="ewr", plan="vc2-1c-1gb", os_id=2284, user_data="hello")
    assert sim.user_data(made["id"]) == "hello"
    with pytest.raises(SimulatorError, match="maximum number of active virtual machines"):
        sim.create_instance(region="ewr", plan="vc2-1c-1gb", os_id=2284)
    assert client.post("/v2/instances", content=b"{not json").status_code == 400
    unknown_os = client.post(
        "/v2/instances", json={"region": "ewr", "plan": "vc2-1c-1gb", "os_id": 9}
    )
    assert "operating system" in unknown_os.json()["error"]


def test_seeded_ip_allocator_is_unique_and_reusable() -> None:
    ips = SeededIps(seed=4, network="10.20.0.0/29")
    got = {ips.allocate() for _ in range(6)}
    assert len(got) == 6 and all(ip.startswith("10.20.0.") for ip in got)
    with pytest.raises(SimulatorError):
        ips.allocate()
    ips.release(sorted(got)[0])
    assert ips.allocate() == sorted(got)[0]
