"""The client paces its requests under Vultr's rate (30 requests/s per source address), with
one token bucket for all its calls: bursts take fake time, never real sleeps."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
import respx

from vultrscale.core.clock import Deadline, FakeClock
from vultrscale.fake_vultr.app import Simulator
from vultrscale.fake_vultr.server import SimTransport
from vultrscale.vultr.client import (
    API_PACE,
    API_RATE_LIMIT,
    PACE_BURST,
    VultrClient,
    shared_pace,
)
from vultrscale.vultr.errors import RateLimited

BASE = "https://api.vultr.test"
KEY = "K3YSECRET0123456789ABCDEFGHIJKLMNOPQ"
ID = "00000000-0000-0000-0000-000000000001"


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router


@pytest.fixture
def fake() -> FakeClock:
    return FakeClock()


def paced_client(fake: FakeClock, deadline: Deadline | None = None) -> VultrClient:
    return VultrClient(KEY, BASE, sleep=fake.sleep, monotonic=fake.monotonic, deadline=deadline)


def test_the_pace_stays_under_vultrs_rate_in_every_window() -> None:
    # burst + pace * t <= 30 + 30 * t for every t >= 0
    assert PACE_BURST <= API_RATE_LIMIT and API_PACE <= API_RATE_LIMIT


def test_a_burst_of_deletes_takes_the_paced_time(api: respx.MockRouter, fake: FakeClock) -> None:
    route = api.delete(f"/v2/instances/{ID}").mock(return_value=httpx.Response(204))
    n = 60
    began = fake.monotonic()
    with paced_client(fake) as client:
        for _ in range(n):
            client.delete_instance(ID)
    assert route.call_count == n
    # the first PACE_BURST go at once, the rest one per 1/API_PACE s
    assert fake.monotonic() - began == pytest.approx((n - PACE_BURST) / API_PACE)
    assert len(fake.slept) == n - PACE_BURST
    assert all(w == pytest.approx(1 / API_PACE) for w in fake.slept)
    assert client.paced_seconds == pytest.approx((n - PACE_BURST) / API_PACE)


def test_calls_within_a_burst_do_not_wait(api: respx.MockRouter, fake: FakeClock) -> None:
    api.get("/v2/account").mock(return_value=httpx.Response(200, json={"account": {}}))
    with paced_client(fake) as client:
        for _ in range(PACE_BURST):
            client.account()
        assert fake.slept == []
        fake.advance(PACE_BURST / API_PACE)  # a quiet spell refills the bucket
        for _ in range(PACE_BURST):
            client.account()
    assert fake.slept == []


def test_every_kind_of_call_and_each_page_draws_from_the_same_bucket(
    api: respx.MockRouter, fake: FakeClock
) -> None:
    api.get("/v2/account").mock(return_value=httpx.Response(200, json={"account": {}}))
    api.delete(f"/v2/instances/{ID}").mock(return_value=httpx.Response(204))
    pages = [
        httpx.Response(200, json={"instances": [], "meta": {"links": {"next": ""}}}),
    ]
    api.get("/v2/instances").mock(side_effect=pages * 5)
    with paced_client(fake) as client:
        for _ in range(5):
            client.account()
            client.delete_instance(ID)
            client.list_instances()
    assert len(fake.slept) == 15 - PACE_BURST


def test_threads_of_one_client_share_its_pace(api: respx.MockRouter, fake: FakeClock) -> None:
    # The pass lists the cloud in a thread of its own: both threads' calls count.
    api.get("/v2/account").mock(return_value=httpx.Response(200, json={"account": {}}))
    lock = threading.Lock()
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # each thread's waits, on one fake clock
        with lock:
            waits.append(seconds)

    client = VultrClient(KEY, BASE, sleep=sleep, monotonic=fake.monotonic)

    def calls() -> None:
        for _ in range(10):
            client.account()

    threads = [threading.Thread(target=calls) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    assert len(waits) == 30 - PACE_BURST  # the 20 past the burst each waited for a slot


def test_a_turn_that_would_come_past_the_deadline_is_not_sent(
    api: respx.MockRouter, fake: FakeClock
) -> None:
    route = api.post("/v2/instances").mock(
        return_value=httpx.Response(202, json={"instance": {"id": ID}})
    )
    deadline = Deadline(30.0, fake.monotonic)
    with paced_client(fake, deadline) as client, deadline.running():
        fake.advance(30.0 - 1.0 - 2.5 / API_PACE)  # room for 2 slots before the last start
        sent = 0
        with pytest.raises(RateLimited) as info:
            for i in range(PACE_BURST + 10):
                client.create_instance(
                    region="ewr", plan="vc2-1c-2gb", label=f"w-{i}", tags=["t"], snapshot_id="s"
                )
                sent += 1
    assert sent == route.call_count == PACE_BURST + 2
    assert "not sent" in info.value.message
    assert deadline.remaining() is None  # disarmed; and the clock never passed the deadline


def test_pacing_can_be_switched_off(api: respx.MockRouter, fake: FakeClock) -> None:
    api.get("/v2/account").mock(return_value=httpx.Response(200, json={"account": {}}))
    with VultrClient(KEY, BASE, sleep=fake.sleep, monotonic=fake.monotonic, pace=None) as client:
        for _ in range(100):
            client.account()
    assert fake.slept == []


def _burst_against_the_simulator(pace: float | None) -> int:
    """A hundred creates and deletes against a simulator that answers 429 above 30/s; how
    many 429s the client earned (one attempt each: a 429 would be an error too)."""
    clock = FakeClock()
    sim = Simulator(KEY, clock=clock, rate_limit=API_RATE_LIMIT)
    client = VultrClient(
        KEY,
        "http://sim.invalid",
        transport=SimTransport(sim),
        sleep=clock.sleep,
        monotonic=clock.monotonic,
        max_attempts=1,
        pace=pace,
    )
    with client:
        created = []
        try:
            for i in range(50):
                created.append(
                    client.create_instance(
                        region="ewr", plan="vc2-1c-2gb", label=f"w-{i}", tags=["t"], os_id=2284
                    )
                )
            clock.advance(120)  # booted: deletable
            for inst in created:
                client.delete_instance(inst.id)
        except RateLimited:
            pass
    return sim.count("POST", "*", status=429) + sim.count("DELETE", "*", status=429)


def test_a_paced_burst_earns_no_429_from_a_server_that_enforces_the_rate() -> None:
    assert _burst_against_the_simulator(API_PACE) == 0


def test_an_unpaced_burst_does_earn_429s() -> None:
    # the control: the simulator does enforce the rate the paced client keeps under
    assert _burst_against_the_simulator(None) > 0


def test_clients_of_one_shared_pace_keep_to_it_together(
    api: respx.MockRouter, fake: FakeClock
) -> None:
    """A directory of fleets: one client per fleet, one pace for the key. Sixty deletes made
    by three clients take the time sixty made by one would, not a third of it."""
    api.delete(f"/v2/instances/{ID}").mock(return_value=httpx.Response(204))
    pace = shared_pace(1, fake.monotonic)
    clients = [
        VultrClient(KEY, BASE, sleep=fake.sleep, monotonic=fake.monotonic, pace=pace)
        for _ in range(3)
    ]
    began = fake.monotonic()
    for i in range(60):
        clients[i % 3].delete_instance(ID)
    assert fake.monotonic() - began == pytest.approx((60 - PACE_BURST) / API_PACE)
    for c in clients:
        c.close()


def test_two_scalers_on_one_key_each_keep_to_half(api: respx.MockRouter, fake: FakeClock) -> None:
    """account.scalers = 2: each process sends at most half the pace, bursts of half: the two
    together never pass what one process would send."""
    api.delete(f"/v2/instances/{ID}").mock(return_value=httpx.Response(204))
    half = shared_pace(2, fake.monotonic)
    assert (half.rate, half.burst) == (API_PACE / 2, PACE_BURST // 2)
    began = fake.monotonic()
    with VultrClient(KEY, BASE, sleep=fake.sleep, monotonic=fake.monotonic, pace=half) as c:
        for _ in range(30):
            c.delete_instance(ID)
    assert fake.monotonic() - began == pytest.approx((30 - PACE_BURST // 2) / (API_PACE / 2))
