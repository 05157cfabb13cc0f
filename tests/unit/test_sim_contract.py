"""The simulator's responses against the official Vultr OpenAPI document (2023-12-07).

The document is read from a trimmed extract kept in the repository,
``tests/openapi/vultr-v2-extract.json`` (the operations the client calls and the schemas they
use, without prose); ``scripts/openapi_extract.py`` regenerates it from the full document and
records the document's version, date and SHA-256 in it.

Every route the client uses is called through the in-process transport with raw httpx, and
the body is validated with jsonschema against the response schema of that operation. The
spec's component schemas declare no ``required`` and allow extra fields, so on top of it every
declared property is made required and unknown properties are refused, except for the
differences the API notes document (flat ``v6_*`` fields instead of ``v6_networks``,
``hourly_cost`` and ``compressed_size`` from newer API versions, ``default_password`` only in
the create response).
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from vultrscale.core.clock import FakeClock
from vultrscale.fake_vultr import SimTransport, Simulator, Timings

SPEC_PATH = Path(__file__).parents[1] / "openapi" / "vultr-v2-extract.json"
KEY = "contract-test-key"

# Documented departures from the 2023 schemas (API-NOTES §3.3, §4, §5).
MAY_BE_ABSENT = {
    "instance": {"v6_networks", "tag", "default_password"},  # default_password: create only
    "plans": {"name"},
}
_STR, _INT, _NUM = {"type": "string"}, {"type": "integer"}, {"type": "number"}
# fields the notes tell us to emit although the 2023 schema does not declare them (required)
EXTRA_FIELDS: dict[str, dict[str, Any]] = {
    "instance": {"v6_network": _STR, "v6_main_ip": _STR, "v6_network_size": _INT},
    "plans": {"hourly_cost": _NUM},
    "snapshot": {"compressed_size": _INT},
}
# optional extras: newer fields some responses carry
OPTIONAL_EXTRAS: dict[str, dict[str, Any]] = {"instance": {"snapshot_id": _STR}}
STRICT_TITLES = {"instance", "snapshot", "plans", "region", "account", "meta"}

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "status"],
    "additionalProperties": False,
    "properties": {"error": {"type": "string", "minLength": 1}, "status": {"type": "integer"}},
}


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SPEC_PATH.read_text())
    return loaded


def test_the_extract_names_the_document_it_was_cut_from(spec: dict[str, Any]) -> None:
    made = spec["x-extract"]
    assert (made["version"], made["date"]) == ("2.0", "2023-12-07")
    assert len(made["sha256"]) == 64
    # no prose left: the schemas only
    text = json.dumps(spec)
    assert '"summary"' not in text and '"example' not in text and '"x-codeSamples"' not in text


def _resolve(node: Any, spec: dict[str, Any]) -> Any:
    """Inline $refs, turn OpenAPI ``nullable`` into JSON Schema, tighten known objects."""
    if isinstance(node, list):
        return [_resolve(n, spec) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target: Any = spec
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        return _resolve(copy.deepcopy(target), spec)
    out = {k: _resolve(v, spec) for k, v in node.items() if not k.startswith("x-")}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    title = out.get("title")
    if title in STRICT_TITLES and out.get("type") == "object":
        props = out.setdefault("properties", {})
        props.update(EXTRA_FIELDS.get(title, {}))
        out["required"] = sorted(set(props) - MAY_BE_ABSENT.get(title, set()))
        props.update(OPTIONAL_EXTRAS.get(title, {}))
        out["additionalProperties"] = False
    return out


def response_schema(spec: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    op = spec["paths"][path][method.lower()]
    content = op["responses"][str(status)]["content"]["application/json"]
    schema: dict[str, Any] = _resolve(content["schema"], spec)
    # every top-level key the operation declares must be there (``instances`` and ``meta`` ...)
    schema["required"] = sorted(schema.get("properties", {}))
    return schema


def validate(spec: dict[str, Any], resp: httpx.Response, path: str, method: str) -> None:
    assert resp.headers["content-type"] == "application/json"
    schema = response_schema(spec, path, method, resp.status_code)
    jsonschema.Draft7Validator(schema).validate(resp.json())


@pytest.fixture
def world() -> tuple[Simulator, httpx.Client, FakeClock]:
    clock = FakeClock()
    sim = Simulator(
        KEY,
        clock=clock,
        seed=7,
        timings=Timings(boot_pending=30, boot_ready=60, visible_after=0, snapshot_complete=120),
    )
    client = httpx.Client(
        base_url="http://sim.invalid",
        transport=SimTransport(sim),
        headers={"Authorization": f"Bearer {KEY}"},
    )
    return sim, client, clock


def _create(client: httpx.Client, **extra: Any) -> httpx.Response:
    body = {
        "region": "ewr",
        "plan": "vc2-1c-1gb",
        "os_id": 2284,
        "label": "w-1",
        "tags": ["fleet-a"],
        "user_data": base64.b64encode(b"#cloud-config\n").decode(),
        **extra,
    }
    return client.post("/v2/instances", json=body)


def test_instance_routes_match_the_spec(world: Any, spec: dict[str, Any]) -> None:
    sim, client, clock = world
    created = _create(client, enable_ipv6=True)
    assert created.status_code == 202
    validate(spec, created, "/instances", "post")
    assert created.json()["instance"]["default_password"]
    iid = created.json()["instance"]["id"]

    # pending, then active/installingbooting, then ok: each state's body fits the schema
    for seconds, server_status in ((0, "none"), (31, "installingbooting"), (61, "ok")):
        clock.advance(seconds)
        got = client.get(f"/v2/instances/{iid}")
        assert got.status_code == 200
        validate(spec, got, "/instances/{instance-id}", "get")
        assert got.json()["instance"]["server_status"] == server_status
        assert "default_password" not in got.json()["instance"]
        listed = client.get("/v2/instances", params={"tag": "fleet-a"})
        validate(spec, listed, "/instances", "get")

    user_data = client.get(f"/v2/instances/{iid}/user-data")
    validate(spec, user_data, "/instances/{instance-id}/user-data", "get")
    assert base64.b64decode(user_data.json()["user_data"]["data"]) == b"#cloud-config\n"

    deleted = client.delete(f"/v2/instances/{iid}")
    assert deleted.status_code == 204
    assert deleted.content == b""


def test_snapshot_routes_match_the_spec(world: Any, spec: dict[str, Any]) -> None:
    sim, client, clock = world
    iid = _create(client).json()["instance"]["id"]
    made = client.post("/v2/snapshots", json={"instance_id": iid, "description": "golden"})
    assert made.status_code == 201
    validate(spec, made, "/snapshots", "post")
    sid = made.json()["snapshot"]["id"]
    for seconds, status in ((0, "pending"), (121, "complete")):
        clock.advance(seconds)
        one = client.get(f"/v2/snapshots/{sid}")
        validate(spec, one, "/snapshots/{snapshot-id}", "get")
        assert one.json()["snapshot"]["status"] == status
        many = client.get("/v2/snapshots", params={"description": "golden"})
        validate(spec, many, "/snapshots", "get")
        assert [s["id"] for s in many.json()["snapshots"]] == [sid]
    gone = client.delete(f"/v2/snapshots/{sid}")
    assert (gone.status_code, gone.content) == (204, b"")


def test_catalogue_and_account_routes_match_the_spec(world: Any, spec: dict[str, Any]) -> None:
    sim, client, clock = world
    _create(client)
    clock.advance(3600 * 2.5)
    cases = [
        ("/v2/plans", "/plans", {"type": "vc2"}),
        ("/v2/regions", "/regions", {}),
        ("/v2/regions/ewr/availability", "/regions/{region-id}/availability", {}),
        ("/v2/account", "/account", {}),
    ]
    for url, spec_path, params in cases:
        resp = client.get(url, params=params)
        assert resp.status_code == 200, url
        validate(spec, resp, spec_path, "get")

    plans = client.get("/v2/plans").json()["plans"]
    assert all(p["hourly_cost"] > 0 and p["locations"] for p in plans)
    assert all(p["type"] == "vc2" for p in client.get("/v2/plans?type=vc2").json()["plans"])
    available = client.get("/v2/regions/syd/availability").json()["available_plans"]
    assert "vc2-1c-1gb" in available and "vc2-24c-96gb" not in available
    assert client.get("/v2/account").json()["account"]["pending_charges"] > 0


def test_pending_charges_match_the_invoice_item_schema(world: Any, spec: dict[str, Any]) -> None:
    # /billing/pending-charges is newer than the 2023 document; its items have the shape of
    # the invoice items it documents (API-NOTES §6).
    sim, client, clock = world
    _create(client)
    clock.advance(3600)
    resp = client.get("/v2/billing/pending-charges")
    items_schema = response_schema(spec, "/billing/invoices/{invoice-id}/items", "get", 200)
    item_schema = items_schema["properties"]["invoice_items"]["items"]
    item_schema["required"] = sorted(item_schema["properties"])
    item_schema["additionalProperties"] = False
    schema = {
        "type": "object",
        "required": ["pending_charges"],
        "properties": {"pending_charges": {"type": "array", "items": item_schema}},
    }
    jsonschema.Draft7Validator(schema).validate(resp.json())
    assert len(resp.json()["pending_charges"]) == 1


def _error_of(resp: httpx.Response, status: int) -> str:
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    jsonschema.validate(body, ERROR_SCHEMA)
    assert body["status"] == status
    message: str = body["error"]
    return message


def test_errors_have_the_api_shape(world: Any) -> None:
    sim, client, clock = world
    bad_key = httpx.Client(base_url="http://sim.invalid", transport=SimTransport(sim))
    assert _error_of(bad_key.get("/v2/instances"), 401) == "Invalid API token."
    # plans and regions are public (security: [] in the document)
    assert bad_key.get("/v2/plans").status_code == 200
    assert _error_of(client.get("/v2/instances/nope"), 404) == "instance not found"
    assert _error_of(_create(client, plan="vc9-1c-1gb"), 400) == "Invalid plan chosen."
    assert "Server add failed" in _error_of(_create(client, region="xxx"), 400)
    assert "not available" in _error_of(_create(client, plan="vc2-24c-96gb", region="syd"), 400)
    assert "base64" in _error_of(_create(client, user_data="not base64!"), 400)
    assert "snapshot" in _error_of(_create(client, snapshot_id="nope", os_id=None), 400).lower()
    iid = _create(client).json()["instance"]["id"]
    assert "currently locked" in _error_of(client.delete(f"/v2/instances/{iid}"), 500)
    assert _error_of(client.get("/v2/instances", params={"per_page": 501}), 400)
    assert "Must be one of" in _error_of(client.put("/v2/account"), 405)
    sim.rate_limit = 2
    statuses = [client.get("/v2/account").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    limited = client.get("/v2/account")
    assert _error_of(limited, 429) == "rate limit exceeded"
    assert limited.headers["retry-after"] == "1"


def test_pagination_metadata(world: Any) -> None:
    sim, client, clock = world
    ids = [
        sim.create_instance(
            region="ewr",
            plan="vc2-1c-1gb",
            os_id=2284,
            label=f"w-{n}",
            tags=["fleet-a"] if n % 5 else ["other"],
        )["id"]
        for n in range(300)
    ]
    tagged = [i for n, i in enumerate(ids) if n % 5]
    assert len(tagged) == 240

    pages, cursor, prevs = [], "", []
    while True:
        params: dict[str, Any] = {"tag": "fleet-a", "per_page": 100}
        if cursor:
            params["cursor"] = cursor
        body = client.get("/v2/instances", params=params).json()
        assert body["meta"]["total"] == 240
        pages.append([i["id"] for i in body["instances"]])
        prevs.append(body["meta"]["links"]["prev"])
        cursor = body["meta"]["links"]["next"]
        if not cursor:
            break
        kind, _, ref = base64.b64decode(cursor).decode().partition("__")
        assert (kind, ref) == ("next", pages[-1][-1])
    assert [len(p) for p in pages] == [100, 100, 40]
    assert [i for p in pages for i in p] == tagged
    assert prevs[0] == ""
    back = client.get(
        "/v2/instances", params={"tag": "fleet-a", "per_page": 100, "cursor": prevs[2]}
    ).json()
    assert [i["id"] for i in back["instances"]] == pages[1]

    default = client.get("/v2/instances").json()
    assert len(default["instances"]) == 100 and default["meta"]["total"] == 300
    one_page = client.get("/v2/instances", params={"per_page": 500}).json()
    assert len(one_page["instances"]) == 300
    assert one_page["meta"]["links"] == {"next": "", "prev": ""}
    assert client.get("/v2/instances", params={"label": "w-7"}).json()["meta"]["total"] == 1
    assert client.get("/v2/instances", params={"region": "ams"}).json()["meta"]["total"] == 0
    assert client.get("/v2/instances", params={"cursor": "bm9wZQ=="}).status_code == 400


def test_a_list_read_page_by_page_shows_each_instance_once(world: Any) -> None:
    """Linear in the fleet: every page built every instance's view (quadratic: 1 s a pass at
    5,000 instances, the fake rather than the list being measured)."""
    sim, client, _clock = world
    for n in range(1000):
        sim.create_instance(region="ewr", plan="vc2-1c-1gb", os_id=2284, label=f"w-{n}")
    sim.tick()
    built = 0
    real_view = sim._instance_view

    def counted(rec: Any) -> dict[str, Any]:
        nonlocal built
        built += 1
        return real_view(rec)

    sim._instance_view = counted
    listed, cursor = 0, ""
    while True:
        params: dict[str, Any] = {"per_page": 100, **({"cursor": cursor} if cursor else {})}
        body = client.get("/v2/instances", params=params).json()
        listed += len(body["instances"])
        cursor = body["meta"]["links"]["next"]
        if not cursor:
            break
    assert listed == 1000
    assert built == 1000
