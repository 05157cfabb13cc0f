"""The simulator runs out of stock and has an account instance limit, refusing creates with
Vultr's own words, which the scaler's classifier (vultrscale.vultr.refusals) recognises."""

from __future__ import annotations

import contextlib
from typing import Any

import httpx
import pytest

from vultrscale.core.clock import FakeClock
from vultrscale.fake_vultr import SimTransport, Simulator, SimulatorError
from vultrscale.vultr import refusals
from vultrscale.vultr.client import VultrClient
from vultrscale.vultr.errors import BadRequest
from vultrscale.vultr.refusals import Refusal, refusal

KEY = "capacity-key-0123456789"
PLAN = "vc2-1c-2gb"


@pytest.fixture
def sim() -> Simulator:
    return Simulator(KEY, clock=FakeClock(), rate_limit=None)


@pytest.fixture
def http(sim: Simulator) -> httpx.Client:
    return httpx.Client(
        base_url="http://sim.invalid",
        transport=SimTransport(sim),
        headers={"Authorization": f"Bearer {KEY}"},
    )


def post(http: httpx.Client, region: str = "ewr", plan: str = PLAN, label: str = "w") -> Any:
    body = {"region": region, "plan": plan, "os_id": 2284, "label": label, "tags": ["t"]}
    return http.post("/v2/instances", json=body)


def available(http: httpx.Client, region: str) -> list[str]:
    return list(http.get(f"/v2/regions/{region}/availability").json()["available_plans"])


def test_a_sold_out_offering_refuses_creates_while_availability_still_lists_it(
    sim: Simulator, http: httpx.Client
) -> None:
    sim.stock_out("ewr", PLAN)
    resp = post(http)
    assert resp.status_code == 400
    assert resp.json() == {
        "error": "Server add failed: " + refusals.SOLD_OUT,
        "status": 400,
    }
    assert PLAN in available(http, "ewr")
    assert sim.instances == {}
    assert sim.refused[Refusal.UNAVAILABLE] == 1


def test_only_the_sold_out_offering_is_refused(sim: Simulator, http: httpx.Client) -> None:
    sim.stock_out("ewr", PLAN)
    assert post(http, region="ord").status_code == 202  # the same plan elsewhere
    assert post(http, plan="vc2-2c-4gb").status_code == 202  # another plan here
    assert post(http).status_code == 400


def test_a_stock_out_can_drop_the_offering_from_availability(
    sim: Simulator, http: httpx.Client
) -> None:
    sim.stock_out("ewr", PLAN, listed=False)
    assert PLAN not in available(http, "ewr")
    assert "vc2-2c-4gb" in available(http, "ewr")
    assert PLAN in available(http, "ord")
    assert post(http).status_code == 400


def test_a_restock_ends_the_stock_out(sim: Simulator, http: httpx.Client) -> None:
    sim.stock_out("ewr", PLAN, listed=False)
    sim.restock("ewr", PLAN)
    assert PLAN in available(http, "ewr")
    assert post(http).status_code == 202
    assert sim.sold_out() == {}


def test_a_stock_out_of_an_offering_not_in_the_catalogue_is_an_error(sim: Simulator) -> None:
    with pytest.raises(SimulatorError, match="no offering"):
        sim.stock_out("xyz", PLAN)


def test_the_account_limit_refuses_creates_past_it_with_vultrs_words(
    sim: Simulator, http: httpx.Client
) -> None:
    sim.max_instances = 2
    ids = [post(http, label=f"w-{i}").json()["instance"]["id"] for i in range(2)]
    resp = post(http, region="ord", plan="vc2-2c-4gb")  # any offering
    assert resp.status_code == 400
    assert resp.json()["error"] == "Server add failed: " + refusals.INSTANCE_LIMIT
    assert sim.refused[Refusal.INSTANCE_LIMIT] == 1
    sim.clock.advance(600)  # booted, so deletable
    assert http.delete(f"/v2/instances/{ids[0]}").status_code == 204
    assert post(http).status_code == 202  # room again


def test_the_client_reports_a_refusal_with_vultrs_words_for_the_classifier(
    sim: Simulator,
) -> None:
    sim.stock_out("ewr", PLAN)
    client = VultrClient(KEY, "http://sim.invalid", transport=SimTransport(sim), max_attempts=1)
    with client, pytest.raises(BadRequest) as info:
        client.create_instance(region="ewr", plan=PLAN, label="w", tags=["t"], os_id=2284)
    assert refusal(info.value.api_message) is Refusal.UNAVAILABLE


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        pytest.param("Server add failed: " + refusals.SOLD_OUT, Refusal.UNAVAILABLE, id="sold-out"),
        pytest.param(refusals.INVALID_PLAN, Refusal.UNAVAILABLE, id="invalid-plan"),
        pytest.param(
            "Server add failed: " + refusals.INSTANCE_LIMIT, Refusal.INSTANCE_LIMIT, id="limit"
        ),
        pytest.param(
            "Server add failed: You have reached the maximum number of instances for this account",
            Refusal.INSTANCE_LIMIT,
            id="limit-reworded",
        ),
        pytest.param("Server add failed: Invalid snapshot ID.", None, id="other"),
        pytest.param("rate limit exceeded", None, id="rate"),
    ],
)
def test_the_classifier_reads_the_telling_phrases(message: str, kind: Refusal | None) -> None:
    assert refusal(message) is kind


def test_the_chaos_stock_out_sells_out_the_fleets_offering_then_restocks_it(
    sim: Simulator, http: httpx.Client
) -> None:
    from dataclasses import replace
    from typing import cast

    from vultrscale.fake_vultr.chaos import STOCK_OUT, STOCK_OUT_SECONDS, Chaos, schedule

    plan = replace(schedule(1), worker_kills=(), api_bursts=())  # the stock-out alone
    assert STOCK_OUT_SECONDS[0] <= plan.stockout_seconds <= STOCK_OUT_SECONDS[1]
    chaos = Chaos(plan, sim, cast(Any, None), 1, offering=("ewr", PLAN))
    chaos.arm(0.0)
    assert sim.sold_out() == {("ewr", PLAN): True}  # availability still lists it
    assert post(http).status_code == 400
    chaos.inject_due(plan.stockout_seconds - 0.1, set())
    assert post(http).status_code == 400
    chaos.inject_due(plan.stockout_seconds, set())
    assert sim.sold_out() == {}
    # created (arm also lost this first create's answer: a 500, or the connection dropped)
    with contextlib.suppress(httpx.RemoteProtocolError):
        post(http)
    assert len(sim.instances) == 1 and chaos.create_lost_fired()
    assert chaos.refused_creates() == 2
    assert [f.kind for f in chaos.injected()].count(STOCK_OUT) == 1
