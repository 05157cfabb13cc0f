"""Unit tests of the Vultr client against respx-mocked HTTP (no network, no real sleeping)."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from vultrscale.core.clock import Deadline, FakeClock
from vultrscale.errors import UsageError
from vultrscale.vultr import transport as transport_mod
from vultrscale.vultr.client import CALL_BUDGET_S, PER_PAGE, VultrClient
from vultrscale.vultr.errors import (
    AmbiguousCreate,
    ApiUnreachable,
    AuthError,
    BadRequest,
    InstanceLimit,
    InstanceLocked,
    NotFound,
    OfferingUnavailable,
    RateLimited,
    ServerError,
    VultrError,
)
from vultrscale.vultr.models import VInstance

BASE = "https://api.vultr.test"
KEY = "K3YSECRET0123456789ABCDEFGHIJKLMNOPQ"


class SleepRecorder:
    """Stands in for time.sleep: records each wait instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def slept() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router


@pytest.fixture
def client(slept: SleepRecorder) -> Iterator[VultrClient]:
    with VultrClient(KEY, BASE, sleep=slept, max_attempts=4) as c:
        yield c


def instance(i: int, **over: Any) -> dict[str, Any]:
    data = {
        "id": f"00000000-0000-0000-0000-{i:012d}",
        "label": f"worker-{i}",
        "status": "active",
        "power_status": "running",
        "server_status": "ok",
        "main_ip": f"192.0.2.{i % 250}",
        "region": "ewr",
        "plan": "vc2-1c-2gb",
        "date_created": "2026-11-30T01:02:03+00:00",
        "tags": ["vultrscale-workers"],
        "some_future_field": {"x": 1},
    }
    data.update(over)
    return data


def page(items: list[dict[str, Any]], next_cursor: str, total: int) -> dict[str, Any]:
    return {
        "instances": items,
        "meta": {"total": total, "links": {"next": next_cursor, "prev": ""}},
    }


def err(status: int, message: str, *, status_first: bool = False) -> httpx.Response:
    """A Vultr error body; key order varies in the wild."""
    if status_first:
        text = f'{{"status": {status},"error": "{message}"}}'
    else:
        text = f'{{"error":"{message}","status":{status}}}'
    return httpx.Response(status, text=text, headers={"Content-Type": "application/json"})


# --- pagination ------------------------------------------------------------------------------


def test_list_instances_follows_cursors_over_three_pages(
    api: respx.MockRouter, client: VultrClient
):
    pages = {
        None: page([instance(i) for i in range(0, 500)], "bmV4dF9fNDk5", 1003),
        "bmV4dF9fNDk5": page([instance(i) for i in range(500, 1000)], "bmV4dF9fOTk5", 1003),
        "bmV4dF9fOTk5": page([instance(i) for i in range(1000, 1003)], "", 1003),
    }

    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=pages[request.url.params.get("cursor")])

    route = api.get("/v2/instances").mock(side_effect=respond)

    found = client.list_instances(tag="vultrscale-workers")

    assert [i.id for i in found] == [instance(i)["id"] for i in range(1003)]
    assert route.call_count == 3
    sent = [dict(call.request.url.params) for call in route.calls]
    assert [p.get("cursor") for p in sent] == [None, "bmV4dF9fNDk5", "bmV4dF9fOTk5"]
    assert all(p["per_page"] == str(PER_PAGE) == "500" for p in sent)
    assert all(p["tag"] == "vultrscale-workers" for p in sent)
    assert client.requests_made == 3
    first = found[0]
    assert first.status == "active" and first.tags == ("vultrscale-workers",)
    assert first.date_created is not None and first.date_created.tzinfo is not None
    assert first.raw["some_future_field"] == {"x": 1}


def test_a_repeated_cursor_stops_instead_of_looping(api: respx.MockRouter, client: VultrClient):
    api.get("/v2/instances").mock(
        return_value=httpx.Response(200, json=page([instance(1)], "c1", 2))
    )
    with pytest.raises(VultrError, match="repeated a page cursor"):
        client.list_instances()


@pytest.mark.parametrize(
    ("pages", "match"),
    [
        pytest.param(lambda n: page([], f"c{n}", 0), "empty page with a next cursor", id="empty"),
        pytest.param(
            lambda n: page([instance(n)], f"c{n}", 10**9), "more than 2000 pages", id="endless"
        ),
        pytest.param(
            lambda n: page([instance(n)], {"cursor": "x"}, 2), "cursor is not a string", id="dict"
        ),
    ],
)
def test_a_listing_that_would_never_end_stops_with_an_api_error(
    api: respx.MockRouter, pages: Any, match: str
) -> None:
    """Fresh cursors on empty pages were followed for good (the reviewer stopped one at 2,001
    requests); a cursor that is an object raised TypeError, which ended the pass as a bug.
    Unpaced: at Vultr's pace, 2000 pages would outlast the call's time limit first."""
    served = iter(range(1, 10**6))
    api.get("/v2/instances").mock(
        side_effect=lambda request: httpx.Response(200, json=pages(next(served)))
    )
    client = VultrClient(KEY, BASE, sleep=lambda s: None, pace=None)
    with client, pytest.raises(VultrError, match=match):
        client.list_instances()
    assert api.calls.call_count <= 2000


def test_a_server_error_text_is_redacted_before_it_is_shortened(
    api: respx.MockRouter, client: VultrClient
) -> None:
    """Shortened first, a key cut by the 200-character limit was not found whole, and its first
    part was shown (a proxy page echoing the request's Authorization header)."""
    html = "<html><body>" + "x" * 160 + f" Authorization: Bearer {KEY} </body></html>"
    api.get("/v2/account").mock(return_value=httpx.Response(400, text=html))
    deep = {"error": {"pad": "y" * 260, "auth": f"Bearer {KEY}"}}  # cut at 300 characters
    api.get("/v2/plans").mock(return_value=httpx.Response(400, json=deep))
    for call in (client.account, client.list_plans):
        with pytest.raises(VultrError) as caught:
            call()
        text = f"{caught.value} {caught.value.api_message} {caught.value.hint}"
        assert KEY[:6] not in text, text


@pytest.mark.parametrize(
    "location",
    [
        f"https://user:pr0xyPassw0rd@elsewhere.example/?t={KEY}",
        "//user:pr0xyPassw0rd@elsewhere.example/",  # protocol-relative
    ],
)
def test_a_redirect_hint_shows_no_key_and_no_password(
    api: respx.MockRouter, client: VultrClient, location: str
) -> None:
    api.get("/v2/account").mock(return_value=httpx.Response(302, headers={"Location": location}))
    with pytest.raises(VultrError) as caught:
        client.account()
    hint = caught.value.hint or ""
    assert "elsewhere.example" in hint and KEY not in hint and "pr0xyPassw0rd" not in hint


@pytest.mark.parametrize("value", ["abc#frag", "#", "abc?tag=x", "a%2fb", "abc\x00def", ""])
def test_an_id_that_would_change_the_request_is_refused_before_it_is_sent(
    api: respx.MockRouter, client: VultrClient, value: str
) -> None:
    """'abc#frag' sent DELETE /v2/instances/abc: another instance's id."""
    route = api.delete(url__regex=r".*").mock(return_value=httpx.Response(204))
    with pytest.raises(UsageError, match="is not a valid Vultr id"):
        client.delete_instance(value)
    assert not route.called


@pytest.mark.parametrize("value", ["-1", "nan", "-inf", "1.5e3"])
def test_a_retry_after_that_is_not_delta_seconds_keeps_the_backoff(
    api: respx.MockRouter, value: str
) -> None:
    """'-1', 'nan' or '-inf' were read as 0 s: four retries back to back."""
    waits: list[float] = []
    client = VultrClient(KEY, BASE, sleep=waits.append)
    api.get("/v2/account").mock(
        return_value=httpx.Response(429, headers={"Retry-After": value}, json={"error": "slow"})
    )
    with pytest.raises(VultrError):
        client.account()
    assert len(waits) == 4 and all(w >= 0.5 for w in waits), waits


@pytest.mark.parametrize("body", [{"instance": {"label": "x"}}, {"instance": {"id": ""}}])
def test_a_create_answered_without_an_id_is_an_ambiguous_create(
    api: respx.MockRouter, client: VultrClient, body: dict[str, Any]
) -> None:
    api.post("/v2/instances").mock(return_value=httpx.Response(202, json=body))
    with pytest.raises(AmbiguousCreate):
        client.create_instance(region="ewr", plan="vc2-1c-2gb", label="x", tags=[], os_id=1)


def test_odd_numbers_and_deep_json_are_api_errors_not_crashes(
    api: respx.MockRouter, client: VultrClient
) -> None:
    plans = {"plans": [{"id": "p", "vcpu_count": 1e999, "monthly_cost": 5}], "meta": {}}
    api.get("/v2/plans").mock(
        return_value=httpx.Response(200, text=json.dumps(plans).replace("Infinity", "1e999"))
    )
    assert client.list_plans()[0].vcpu_count == 0
    api.get("/v2/account").mock(return_value=httpx.Response(200, text="[" * 100_000))
    with pytest.raises(VultrError):
        client.account()
    api.get("/v2/regions").mock(return_value=httpx.Response(500, text="{" * 100_000))
    with pytest.raises(VultrError):
        client.list_regions()


def test_models_tolerate_missing_and_odd_fields():
    inst = VInstance.from_api({"id": "x", "main_ip": None, "tags": None, "date_created": "bad"})
    assert inst.main_ip == "" and inst.tags == () and inst.date_created is None
    old = VInstance.from_api({"id": "y", "tag": "legacy", "date_created": "2013-12-19 14:45:41"})
    assert old.tags == ("legacy",)
    assert old.date_created is not None and old.date_created.utcoffset() is not None


def test_a_parsed_instance_is_the_one_its_constructor_builds_every_field_set():
    body = instance(1, tags=["a", 7, None], main_ip=None, region=12, os="Debian 12")
    body["date_created"] = "2026-03-02T12:00:00Z"
    inst = VInstance.from_api(body)
    built = VInstance(**{f.name: getattr(inst, f.name) for f in dataclasses.fields(VInstance)})
    assert inst == built and repr(inst) == repr(built) and hash(inst) == hash(built)
    assert set(vars(inst)) == {f.name for f in dataclasses.fields(VInstance)}
    assert (inst.tags, inst.main_ip, inst.region) == (("a", "7"), "", "12")
    assert inst.raw is body and inst.raw["os"] == "Debian 12"  # fields no code reads stay in raw
    assert inst.date_created is not None and inst.date_created.utcoffset() is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        inst.label = "changed"  # type: ignore[misc]


def test_the_create_responses_root_password_is_no_field_and_not_in_repr():
    inst = VInstance.from_api(instance(1, default_password="v5{Fkvb#2ycPGwHs"))
    assert not hasattr(inst, "default_password")
    assert "v5{Fkvb" not in repr(inst)


# --- retries ---------------------------------------------------------------------------------


def test_429_then_success_honours_retry_after(
    api: respx.MockRouter, client: VultrClient, slept: SleepRecorder
):
    route = api.get("/v2/account").mock(
        side_effect=[
            httpx.Response(
                429,
                json={"status": 429, "error": "rate limit exceeded"},
                headers={"Retry-After": "7"},
            ),
            httpx.Response(200, json={"account": {"name": "Acme", "balance": -10.5}}),
        ]
    )
    acct = client.account()
    assert acct.name == "Acme" and acct.balance == -10.5
    assert route.call_count == 2
    assert slept.waits == [7.0]


def test_429_without_retry_after_backs_off_and_gives_up(
    api: respx.MockRouter, client: VultrClient, slept: SleepRecorder
):
    route = api.get("/v2/account").mock(return_value=err(429, "rate limit exceeded"))
    with pytest.raises(RateLimited) as info:
        client.account()
    assert route.call_count == 4  # max_attempts
    assert len(slept.waits) == 3
    assert all(0.4 <= w <= 8.25 for w in slept.waits)
    assert slept.waits[1] > slept.waits[0] - 0.25  # exponential, with small jitter
    assert info.value.status == 429 and info.value.api_message == "rate limit exceeded"


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_is_retried_for_get(
    api: respx.MockRouter, client: VultrClient, slept: SleepRecorder, status: int
):
    route = api.get("/v2/instances/abc").mock(
        side_effect=[err(status, "oops"), httpx.Response(200, json={"instance": instance(1)})]
    )
    assert client.get_instance("abc").label == "worker-1"
    assert route.call_count == 2
    assert len(slept.waits) == 1


def test_5xx_is_retried_for_delete_then_raises_server_error(
    api: respx.MockRouter, client: VultrClient, slept: SleepRecorder
):
    route = api.delete("/v2/instances/abc").mock(return_value=err(503, "Service Unavailable"))
    with pytest.raises(ServerError) as info:
        client.delete_instance("abc")
    assert route.call_count == 4
    assert len(slept.waits) == 3
    assert info.value.status == 503
    assert not isinstance(info.value, InstanceLocked)


def test_delete_succeeds_after_a_502(api: respx.MockRouter, client: VultrClient):
    route = api.delete("/v2/instances/abc").mock(
        side_effect=[err(502, "Bad Gateway"), httpx.Response(204)]
    )
    client.delete_instance("abc")
    assert route.call_count == 2


CREATE: dict[str, Any] = {
    "region": "ewr",
    "plan": "vc2-1c-2gb",
    "label": "worker-1764470000-ab12",
    "tags": ["vultrscale-workers"],
    "snapshot_id": "snap-1",
}


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_on_create_is_not_retried(
    api: respx.MockRouter, client: VultrClient, slept: SleepRecorder, status: int
):
    route = api.post("/v2/instances").mock(return_value=err(status, "Internal error"))
    with pytest.raises(AmbiguousCreate) as info:
        client.create_instance(**CREATE)
    assert route.call_count == 1
    assert slept.waits == []
    assert info.value.label == CREATE["label"]
    assert info.value.status == status


def test_connection_lost_after_sending_create_is_ambiguous(
    api: respx.MockRouter, client: VultrClient, slept: SleepRecorder
):
    route = api.post("/v2/instances").mock(
        side_effect=httpx.RemoteProtocolError("Server disconnected without sending a response.")
    )
    with pytest.raises(AmbiguousCreate) as info:
        client.create_instance(**CREATE)
    assert route.call_count == 1
    assert slept.waits == []
    assert info.value.label == CREATE["label"]


def _undecodable() -> httpx.Response:
    # A proxy or a maintenance page that says gzip and sends something else.
    return httpx.Response(
        200, headers={"Content-Encoding": "gzip"}, stream=httpx.ByteStream(b"not gzip")
    )


def test_a_body_that_cannot_be_decoded_is_retried_then_unreachable_not_a_crash(
    api: respx.MockRouter, client: VultrClient, slept: SleepRecorder
):
    route = api.get("/v2/instances").mock(return_value=_undecodable())
    with pytest.raises(ApiUnreachable, match="DecodingError"):
        client.list_instances()
    assert route.call_count == client.max_attempts and len(slept.waits) == client.max_attempts - 1


def test_a_create_answered_with_an_undecodable_body_is_ambiguous(
    api: respx.MockRouter, client: VultrClient
):
    route = api.post("/v2/instances").mock(return_value=_undecodable())
    with pytest.raises(AmbiguousCreate):
        client.create_instance(**CREATE)
    assert route.call_count == 1


def test_read_timeout_on_create_is_ambiguous(api: respx.MockRouter, client: VultrClient):
    route = api.post("/v2/snapshots").mock(side_effect=httpx.ReadTimeout("timed out"))
    with pytest.raises(AmbiguousCreate):
        client.create_snapshot("inst-1", description="vultrscale workers base")
    assert route.call_count == 1


def test_create_whose_connection_never_opened_is_retried(
    api: respx.MockRouter, client: VultrClient, slept: SleepRecorder
):
    # A refused TCP connect means nothing reached Vultr: repeating the POST cannot double it.
    route = api.post("/v2/instances").mock(
        side_effect=[
            httpx.ConnectError("[Errno 111] Connection refused"),
            httpx.Response(202, json={"instance": instance(7, status="pending")}),
        ]
    )
    created = client.create_instance(**CREATE)
    assert created.status == "pending"
    assert route.call_count == 2
    assert len(slept.waits) == 1


def test_429_on_create_is_retried(api: respx.MockRouter, client: VultrClient, slept: SleepRecorder):
    route = api.post("/v2/instances").mock(
        side_effect=[
            httpx.Response(
                429,
                json={"error": "rate limit exceeded", "status": 429},
                headers={"Retry-After": "1"},
            ),
            httpx.Response(202, json={"instance": instance(7, status="pending")}),
        ]
    )
    assert client.create_instance(**CREATE).id == instance(7)["id"]
    assert route.call_count == 2
    assert slept.waits == [1.0]


def test_connection_errors_on_get_are_retried_then_unreachable(
    api: respx.MockRouter, client: VultrClient, slept: SleepRecorder
):
    route = api.get("/v2/account").mock(side_effect=httpx.ConnectTimeout("timed out"))
    with pytest.raises(ApiUnreachable) as info:
        client.account()
    assert route.call_count == 4
    assert len(slept.waits) == 3
    assert info.value.status is None
    assert "cannot connect" in info.value.message


def test_every_request_has_a_timeout(api: respx.MockRouter, slept: SleepRecorder):
    route = api.get("/v2/account").mock(return_value=httpx.Response(200, json={"account": {}}))
    with VultrClient(KEY, BASE, timeout=3.5, sleep=slept) as c:
        c.account()
    timeouts = route.calls.last.request.extensions["timeout"]
    assert timeouts == {"connect": 3.5, "read": 3.5, "write": 3.5, "pool": 3.5}


# --- error bodies ----------------------------------------------------------------------------


@pytest.mark.parametrize("status_first", [False, True], ids=["error-first", "status-first"])
def test_error_body_keys_in_either_order(
    api: respx.MockRouter, client: VultrClient, status_first: bool
):
    api.post("/v2/instances").mock(
        return_value=err(400, "Invalid plan chosen.", status_first=status_first)
    )
    with pytest.raises(BadRequest) as info:
        client.create_instance(**CREATE)
    assert info.value.status == 400
    assert info.value.api_message == "Invalid plan chosen."
    assert "Invalid plan chosen." in str(info.value)
    assert info.value.exit_code == 1


def test_non_json_error_body_is_tolerated(api: respx.MockRouter, client: VultrClient):
    html = (
        "<html><body><h1>Maintenance</h1><p>We are currently conducting some software upgrades."
        "  Check back in a few minutes!</p></body></html>"
    )
    api.get("/v2/instances").mock(
        return_value=httpx.Response(504, text=html, headers={"Content-Type": "text/html"})
    )
    with pytest.raises(ServerError) as info:
        client.list_instances()
    assert info.value.status == 504
    assert info.value.api_message.startswith("Maintenance We are currently conducting")
    assert "<" not in info.value.api_message


def test_empty_error_body_is_tolerated(api: respx.MockRouter, client: VultrClient):
    api.get("/v2/account").mock(return_value=httpx.Response(418, content=b""))
    with pytest.raises(BadRequest) as info:
        client.account()
    assert info.value.status == 418 and info.value.api_message


def test_401_says_the_key_was_refused_and_how_to_fix_it(
    api: respx.MockRouter, client: VultrClient, slept: SleepRecorder
):
    route = api.get("/v2/instances").mock(
        return_value=err(401, "Unauthorized IP address: 203.0.113.9")
    )
    with pytest.raises(AuthError) as info:
        client.list_instances()
    assert route.call_count == 1 and slept.waits == []
    exc = info.value
    assert exc.exit_code == 2
    assert "refused the API key" in exc.message
    assert "Unauthorized IP address: 203.0.113.9" in exc.message
    assert "VULTR_API_KEY" in exc.hint and "allow-list" in exc.hint


@pytest.mark.parametrize(
    "response",
    [
        err(404, "instance not found"),
        err(400, "invalid instance ID", status_first=True),
        err(400, "Server is already pending destruction."),
    ],
    ids=["404", "400-invalid-id", "400-pending-destruction"],
)
def test_not_found_shapes(api: respx.MockRouter, client: VultrClient, response: httpx.Response):
    api.get("/v2/instances/gone").mock(return_value=response)
    api.delete("/v2/instances/gone").mock(return_value=response)
    with pytest.raises(NotFound):
        client.get_instance("gone")
    with pytest.raises(NotFound):
        client.delete_instance("gone")


def test_400_on_create_is_bad_request_not_not_found(api: respx.MockRouter, client: VultrClient):
    api.post("/v2/instances").mock(return_value=err(400, "Invalid snapshot ID"))
    with pytest.raises(BadRequest) as info:
        client.create_instance(**CREATE)
    assert not isinstance(info.value, NotFound)


def test_snapshot_of_a_gone_instance_is_not_found(api: respx.MockRouter, client: VultrClient):
    route = api.post("/v2/snapshots").mock(return_value=err(400, "invalid instance ID"))
    with pytest.raises(NotFound):
        client.create_snapshot("gone", description="base")
    assert route.call_count == 1


def test_locked_delete_raises_instance_locked_at_once(
    api: respx.MockRouter, client: VultrClient, slept: SleepRecorder
):
    route = api.delete("/v2/instances/pending1").mock(
        return_value=err(
            500, "Unable to destroy server: Unable to remove VM: Server is currently locked"
        )
    )
    with pytest.raises(InstanceLocked) as info:
        client.delete_instance("pending1")
    # Locked lasts minutes: the next pass retries, not this call.
    assert route.call_count == 1 and slept.waits == []
    assert isinstance(info.value, ServerError) and info.value.status == 500


# --- bodies ----------------------------------------------------------------------------------


def test_create_sends_base64_user_data_and_the_fields(api: respx.MockRouter, client: VultrClient):
    route = api.post("/v2/instances").mock(
        return_value=httpx.Response(202, json={"instance": instance(3, status="pending")})
    )
    user_data = "#cloud-config\nwrite_files:\n  - path: /etc/x\n    content: ünïcode\n"
    client.create_instance(
        **CREATE,
        user_data=user_data,
        hostname="worker-1",
        attach_vpc=["vpc-1"],
        firewall_group_id="fw-1",
    )
    body = json.loads(route.calls.last.request.content)
    assert base64.b64decode(body["user_data"]).decode("utf-8") == user_data
    assert body == {
        "region": "ewr",
        "plan": "vc2-1c-2gb",
        "label": CREATE["label"],
        "tags": ["vultrscale-workers"],
        "snapshot_id": "snap-1",
        "user_data": body["user_data"],
        "hostname": "worker-1",
        "attach_vpc": ["vpc-1"],
        "firewall_group_id": "fw-1",
    }
    request = route.calls.last.request
    assert request.headers["Authorization"] == f"Bearer {KEY}"
    assert request.headers["Content-Type"] == "application/json"


def test_create_needs_exactly_one_image_source(api: respx.MockRouter, client: VultrClient):
    route = api.post("/v2/instances")
    with pytest.raises(UsageError):
        client.create_instance(**{**CREATE, "snapshot_id": ""})
    with pytest.raises(UsageError):
        client.create_instance(**CREATE, os_id=1743)
    assert not route.called


def test_plans_are_read_as_vultr_prices_them_now(api: respx.MockRouter, client: VultrClient):
    plans = {
        "plans": [
            {"id": "vc2-1c-1gb", "vcpu_count": 1, "ram": 1024, "monthly_cost": 5, "type": "vc2"},
            {
                "id": "vc2-1c-2gb",
                "monthly_cost": 10,
                "hourly_cost": 0.015,
                "locations": ["ewr", "ams"],
            },
        ],
        "meta": {"total": 2, "links": {"next": "", "prev": ""}},
    }
    route = api.get("/v2/plans").mock(return_value=httpx.Response(200, json=plans))
    first = client.list_plans()
    plan = client.get_plan("vc2-1c-2gb")
    assert [p.id for p in first] == ["vc2-1c-1gb", "vc2-1c-2gb"]
    assert first[0].hourly_cost is None and first[0].monthly_cost == 5.0
    assert plan.hourly_cost == 0.015 and plan.locations == ("ewr", "ams")
    with pytest.raises(NotFound):
        client.get_plan("vc2-99c-1tb")
    assert route.calls.last.request.url.params["per_page"] == "500"

    # A long-lived client (reconcile --loop) sees a new price: the pass decides how often to ask.
    plans["plans"][1]["monthly_cost"] = 30
    route.return_value = httpx.Response(200, json=plans)
    assert client.get_plan("vc2-1c-2gb").monthly_cost == 30.0


def test_region_availability_snapshots_and_charges(api: respx.MockRouter, client: VultrClient):
    api.get("/v2/regions/ewr/availability").mock(
        return_value=httpx.Response(200, json={"available_plans": ["vc2-1c-1gb", "vc2-1c-2gb"]})
    )
    api.get("/v2/snapshots").mock(
        return_value=httpx.Response(
            200,
            json={
                "snapshots": [{"id": "s1", "description": "base", "status": "complete", "size": 9}],
                "meta": {"total": 1, "links": {"next": "", "prev": ""}},
            },
        )
    )
    api.get("/v2/billing/pending-charges").mock(
        return_value=httpx.Response(
            200,
            json={
                "pending_charges": [
                    {"description": "worker-1", "units": 3, "unit_type": "hours", "total": 0.045}
                ]
            },
        )
    )
    assert client.region_availability("ewr") == {"vc2-1c-1gb", "vc2-1c-2gb"}
    snaps = client.list_snapshots(description="base")
    assert [(s.id, s.status, s.size) for s in snaps] == [("s1", "complete", 9)]
    charges = client.pending_charges()
    assert charges[0].units == 3.0 and charges[0].total == 0.045


def test_an_unexpected_success_body_is_an_error(api: respx.MockRouter, client: VultrClient):
    api.get("/v2/instances/abc").mock(return_value=httpx.Response(200, text="<html>proxy</html>"))
    with pytest.raises(VultrError, match="not JSON"):
        client.get_instance("abc")


@pytest.mark.parametrize(
    "response",
    [httpx.Response(202, text="<html>ok</html>"), httpx.Response(202, json={"other": {}})],
    ids=["not-json", "no-instance-object"],
)
def test_an_unreadable_create_answer_is_ambiguous(
    api: respx.MockRouter, client: VultrClient, response: httpx.Response
):
    route = api.post("/v2/instances").mock(return_value=response)
    with pytest.raises(AmbiguousCreate) as info:
        client.create_instance(**CREATE)
    assert route.call_count == 1 and info.value.label == CREATE["label"]


def test_a_redirect_is_not_followed(api: respx.MockRouter, client: VultrClient):
    api.get("/v2/account").mock(
        return_value=httpx.Response(301, headers={"Location": "https://api.vultr.com/v2/account"})
    )
    with pytest.raises(BadRequest) as info:
        client.account()
    assert "redirects to https://api.vultr.com/v2/account" in info.value.hint


# --- secrets and usage -----------------------------------------------------------------------


def _texts(exc: BaseException) -> list[str]:
    """str and repr of an exception and of every exception chained to it."""
    out: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        out += [str(seen), repr(seen), getattr(seen, "hint", ""), str(seen.args)]
        seen = seen.__cause__ or seen.__context__
    return out


def test_the_key_never_shows(
    api: respx.MockRouter, slept: SleepRecorder, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)  # every logger, httpx's included
    # The server echoes the key back (a badly written proxy): it must still not leak.
    api.get("/v2/instances").mock(return_value=err(401, f"Invalid API token {KEY}."))
    api.get("/v2/account").mock(side_effect=httpx.ConnectError(f"boom {KEY}"))
    api.post("/v2/instances").mock(side_effect=httpx.ReadError(f"reset Bearer {KEY}"))
    api.delete("/v2/instances/abc").mock(return_value=err(503, f"down {KEY}"))
    api.get("/v2/plans").mock(
        side_effect=[
            httpx.Response(429, json={"error": "slow down"}, headers={"Retry-After": "0"}),
            httpx.Response(200, json={"plans": [], "meta": {"links": {"next": ""}}}),
        ]
    )
    errors: list[BaseException] = []
    with VultrClient(KEY, BASE, sleep=slept, max_attempts=2) as c:
        assert KEY not in repr(c) and KEY not in str(c)
        assert KEY not in repr(vars(c))
        c.list_plans()
        for call in (
            c.list_instances,
            c.account,
            lambda: c.create_instance(**CREATE),
            lambda: c.delete_instance("abc"),
        ):
            with pytest.raises(VultrError) as info:
                call()
            errors.append(info.value)
    assert [type(e) for e in errors] == [AuthError, ApiUnreachable, AmbiguousCreate, ServerError]
    assert len(caplog.records) >= 8
    assert any("GET /v2/plans -> 429" in r.getMessage() for r in caplog.records)
    for record in caplog.records:
        assert KEY not in record.getMessage()
        assert KEY not in repr(record.args)
        assert KEY not in str(record.__dict__)
    for exc in errors:
        for text in _texts(exc):
            assert KEY not in text
    # The request did carry it.
    assert api.calls.last.request.headers["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize(
    ("key", "url", "fragment"),
    [
        ("", BASE, "VULTR_API_KEY is empty"),
        ("   ", BASE, "VULTR_API_KEY is empty"),
        ("abc def", BASE, "spaces"),
        (KEY, "ftp://api.vultr.com", "not an http(s) URL"),
        (KEY, "api.vultr.com", "not an http(s) URL"),
        (KEY, "http://", "not"),
    ],
)
def test_bad_key_or_url_is_a_usage_error_before_any_request(
    api: respx.MockRouter, key: str, url: str, fragment: str
):
    with pytest.raises(UsageError) as info:
        VultrClient(key, url)
    assert fragment in info.value.message
    assert info.value.exit_code == 2
    assert not api.calls


def test_base_url_may_end_in_v2(api: respx.MockRouter, slept: SleepRecorder):
    route = api.get("/v2/account").mock(return_value=httpx.Response(200, json={"account": {}}))
    with VultrClient(KEY, BASE + "/v2/", sleep=slept) as c:
        c.account()
    assert route.called
    assert str(route.calls.last.request.url) == f"{BASE}/v2/account"


def test_ids_cannot_change_the_path(api: respx.MockRouter, client: VultrClient):
    with pytest.raises(UsageError):
        client.delete_instance("../account")
    assert not api.calls


# --- deadlines -------------------------------------------------------------------------------


@pytest.fixture
def fake() -> FakeClock:
    return FakeClock()


def deadline_client(clock: FakeClock, seconds: float = 30.0) -> tuple[VultrClient, Deadline]:
    deadline = Deadline(seconds, clock.monotonic)
    client = VultrClient(KEY, BASE, sleep=clock.sleep, monotonic=clock.monotonic, deadline=deadline)
    return client, deadline


def test_a_huge_retry_after_is_not_waited_when_it_does_not_fit_the_pass(
    api: respx.MockRouter, fake: FakeClock
):
    # Before: capped at 60 s but waited four times (241 s in all) while the pass held the lock.
    route = api.get("/v2/account").mock(
        return_value=httpx.Response(
            429, json={"error": "slow down"}, headers={"Retry-After": "100000000000000000000"}
        )
    )
    client, deadline = deadline_client(fake)
    with client, deadline.running(), pytest.raises(RateLimited) as info:
        client.account()
    assert route.call_count == 1
    assert fake.slept == []
    assert "Gave up after 1 attempt(s)" in info.value.message
    assert "the pass's 30s deadline" in info.value.message


def test_a_silent_api_gives_up_within_the_pass_deadline(api: respx.MockRouter, fake: FakeClock):
    # Each attempt waits out its whole timeout (10 s), or what is left of the pass when less
    # (the sockets' own bound, which tests/e2e/test_client_deadline.py shows on a real one).
    def silent(request: httpx.Request) -> httpx.Response:
        fake.advance(min(10.0, deadline.remaining() or 0.0))
        raise httpx.ReadTimeout("timed out", request=request)

    route = api.get("/v2/account").mock(side_effect=silent)
    client, deadline = deadline_client(fake)
    began = fake.monotonic()
    with client, deadline.running(), pytest.raises(ApiUnreachable) as info:
        client.account()
    # Before: five attempts of 10 s and their backoff, about 54 s, against a 30 s deadline.
    assert fake.monotonic() - began <= 30.0
    assert route.call_count == 3
    assert "would end past the pass's 30s deadline" in info.value.message


def test_each_attempt_ends_by_the_deadline_however_much_of_its_timeout_is_left(
    api: respx.MockRouter, fake: FakeClock
):
    seen: list[float] = []

    def silent(request: httpx.Request) -> httpx.Response:
        seen.append(deadline.remaining() or 0.0)
        fake.advance(10.0)
        raise httpx.ReadTimeout("timed out", request=request)

    api.get("/v2/account").mock(side_effect=silent)
    client, deadline = deadline_client(fake, seconds=25.0)
    with client, deadline.running(), pytest.raises(ApiUnreachable):
        client.account()
    assert len(seen) == 3 and seen[-1] < 10.0  # the third attempt began with less than 10 s


def test_a_call_after_the_deadline_is_not_sent(api: respx.MockRouter, fake: FakeClock):
    route = api.post("/v2/instances").mock(return_value=httpx.Response(202, json={}))
    client, deadline = deadline_client(fake)
    with client, deadline.running():
        fake.advance(29.5)
        with pytest.raises(ApiUnreachable) as info:
            client.create_instance(
                region="ewr", plan="vc2-1c-2gb", label="w-1", tags=["t"], snapshot_id="s"
            )
    assert not isinstance(info.value, AmbiguousCreate)  # nothing left this machine
    assert route.call_count == 0
    assert "not sent" in info.value.message


def test_without_a_pass_a_call_ends_within_its_own_limit(api: respx.MockRouter, fake: FakeClock):
    def silent(request: httpx.Request) -> httpx.Response:
        fake.advance(min(10.0, began + CALL_BUDGET_S - fake.monotonic()))
        raise httpx.ReadTimeout("timed out", request=request)

    api.get("/v2/account").mock(side_effect=silent)
    began = fake.monotonic()
    client = VultrClient(KEY, BASE, sleep=fake.sleep, monotonic=fake.monotonic)
    with client, pytest.raises(ApiUnreachable) as info:
        client.account()
    assert fake.monotonic() - began <= CALL_BUDGET_S
    assert f"the call's {CALL_BUDGET_S:g}s limit" in info.value.message


def test_the_sockets_of_the_api_and_of_an_environment_proxy_are_all_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The client's transport makes httpcore's pools through httpcore's public API, each with
    # the backend that bounds every socket wait, a proxy's from the environment too; NO_PROXY
    # hosts go straight.
    import httpcore

    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    with VultrClient(KEY, "https://api.vultr.com") as client:
        transport = client.transport
        assert isinstance(transport, transport_mod.BoundedTransport)
        via = transport.pool_for(httpx.URL("https://api.vultr.com/v2/account"))
        straight = transport.pool_for(httpx.URL("https://internal.example/v2/account"))
    assert isinstance(via, httpcore.HTTPProxy) and not isinstance(straight, httpcore.HTTPProxy)
    assert isinstance(transport.backend, transport_mod.LimitedBackend)


@pytest.mark.parametrize(
    ("no_proxy", "url", "proxied"),
    [
        ("127.0.0.1:8080", "http://127.0.0.1:8080/v2/account", False),  # a host with its port
        ("127.0.0.1:8080", "http://127.0.0.1:9090/v2/account", True),
        ("*", "https://api.vultr.com/v2/account", False),
        ("", "https://api.vultr.com/v2/account", True),
    ],
)
def test_no_proxy_names_a_host_with_or_without_its_port_or_every_host(
    monkeypatch: pytest.MonkeyPatch, no_proxy: str, url: str, proxied: bool
) -> None:
    import httpcore

    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    transport = transport_mod.BoundedTransport(transport_mod.Limit())
    try:
        pool = transport.pool_for(httpx.URL(url))
        assert isinstance(pool, httpcore.HTTPProxy) is proxied
    finally:
        transport.close()


@pytest.mark.parametrize(
    "status, text, kind",
    [
        (
            400,
            "Plan is not available in the selected datacenter. This could mean you have chosen "
            "the wrong plan for this datacenter, or the location you have selected does not have "
            "any more capacity.",
            OfferingUnavailable,
        ),
        (400, "Invalid plan chosen.", OfferingUnavailable),
        (
            400,
            "You have reached the maximum number of active virtual machines for this account",
            InstanceLimit,
        ),
        (403, "Server add failed: instance limit reached", InstanceLimit),
        (400, "Invalid snapshot_id", BadRequest),
    ],
    ids=["v1-sold-out", "invalid-plan", "v1-limit", "limit-403", "unknown"],
)
def test_a_refused_create_is_classified_by_its_words_and_never_retried(
    api: respx.MockRouter, client: VultrClient, status: int, text: str, kind: type
) -> None:
    route = api.post("/v2/instances").mock(
        return_value=httpx.Response(status, json={"error": text, "status": status})
    )
    with pytest.raises(BadRequest) as caught:
        client.create_instance(region="ewr", plan="vc2-1c-2gb", label="x", tags=[], os_id=1)
    assert type(caught.value) is kind and caught.value.api_message == text
    assert route.call_count == 1


def test_only_a_create_is_classified_as_a_refusal_of_its_offering(
    api: respx.MockRouter, client: VultrClient
) -> None:
    api.post("/v2/snapshots").mock(
        return_value=httpx.Response(400, json={"error": "Snapshot limit reached", "status": 400})
    )
    with pytest.raises(BadRequest) as caught:
        client.create_snapshot("cb676a46-66fd-4dfb-b839-443f2e6c0b60")
    assert type(caught.value) is BadRequest
