"""A Vultr API v2 simulator: the state machine, the routes, rate limiting and fault injection.

One function, :meth:`Simulator.handle`, answers every request; the in-process httpx transport
and the loopback HTTP server (``vultrscale.fake_vultr.server``) both call it, so tests that
use either
see the same behaviour. Wire shapes follow the official OpenAPI document (2023-12-07) and
``API-NOTES.md``: flat ``v6_*`` fields, ``{"error", "status"}`` error bodies, base64 cursors.

Time comes from an injected Clock and randomness from RNGs seeded with ``seed``, so a run is
reproducible: the same requests at the same clock readings give the same ids, IPs and faults.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import fnmatch
import ipaddress
import json
import math
import random
import re
import string
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from vultrscale.core.clock import Clock
from vultrscale.fake_vultr import data
from vultrscale.fake_vultr.ips import IpAllocator, SeededIps, SequentialIps
from vultrscale.fake_vultr.wire import (
    JSON,
    RequestRecord,
    SimRequest,
    SimResponse,
    SimulatorError,
    decode_user_data,
    default_message,
    error,
    iso,
    json_response,
    matches,
    no_content,
    not_allowed,
    page_cursor,
    parse_body,
    valid_base64,
)
from vultrscale.vultr import refusals

ReadyHook = Callable[[JSON, str], None]

MAX_PER_PAGE = 500
DEFAULT_PER_PAGE = 100
HOURS_PER_MONTH = 672  # Vultr's monthly cap for Cloud Compute (DOC-BILL)
LOCKED_MESSAGE = "Unable to destroy server: Unable to remove VM: Server is currently locked"


@dataclass(frozen=True)
class Timings:
    """Seconds the simulated cloud takes for each step.

    ``boot_pending``: create -> ``active`` with an IP (``installingbooting``);
    ``boot_ready``: ``active`` -> ``server_status`` ``ok``;
    ``visible_after``: after create, ``GET /instances/{id}`` answers 404 for this long
    (0 switches the window off); ``snapshot_complete``: snapshot ``pending`` -> ``complete``.
    """

    boot_pending: float = 20.0
    boot_ready: float = 30.0
    visible_after: float = 2.0
    snapshot_complete: float = 60.0


# --- IP allocation ----------------------------------------------------------------------------


# --- internal records -------------------------------------------------------------------------


@dataclass
class _Instance:
    data: JSON
    seq: int
    created: datetime
    user_data: str  # base64, as posted
    ip: str
    active_at: datetime
    ok_at: datetime
    ready_fired: bool = False
    locked: bool = False


@dataclass
class _Snapshot:
    data: JSON
    seq: int
    complete_at: datetime
    outcome: str
    full_size: int


@dataclass
class _BillingRecord:
    label: str
    plan: JSON
    created: datetime
    ip: str = "0.0.0.0"
    deleted: datetime | None = None


@dataclass
class _FailRule:
    method: str
    pattern: str
    status: int
    body: bytes
    headers: dict[str, str]
    remaining: int


@dataclass
class _DropRule:
    method: str
    pattern: str
    mode: str
    remaining: int


_INSTANCE_PATH = re.compile(r"^/v2/instances/([^/]+)$")
_USER_DATA_PATH = re.compile(r"^/v2/instances/([^/]+)/user-data$")
_SNAPSHOT_PATH = re.compile(r"^/v2/snapshots/([^/]+)$")
_AVAILABILITY_PATH = re.compile(r"^/v2/regions/([^/]+)/availability$")
_PUBLIC = re.compile(r"^/v2/(plans|regions)(/.*)?$")  # security: [] in the OpenAPI document


class Simulator:
    """A fake Vultr account: instances, snapshots, plans, regions, billing.

    ``api_key`` is the only accepted Bearer token. ``ip_allocator`` decides main IPs (default:
    seeded 10.x addresses). ``on_instance_ready(instance, user_data)`` is called once per
    instance when it reaches ``ready_on`` (``"active"``: has its IP and is booting, the moment
    cloud-init would run; or ``"ok"``), with a copy of the instance and its decoded user-data.
    It runs outside the simulator's lock, on whichever thread advanced the state.

    The rate limiter keys on the client address, or on an ``X-Sim-Client`` request header
    when one is sent (several simulated clients behind one loopback address).

    Test hooks: ``instances`` (current view), ``request_log``, ``rate_limit``, ``error_rate``,
    ``latency``, :meth:`fail_next`, :meth:`drop_after_acting`, :meth:`lock_instance`,
    ``snapshot_outcome`` and :meth:`create_instance` to seed many instances without HTTP.

    Capacity: :meth:`stock_out` makes an offering (region, plan) refuse creates with Vultr's
    words, while availability still lists it or dropped from it too; :meth:`restock` ends it.
    ``max_instances`` is the account's instance limit (None: none). ``refused`` counts the
    creates refused for either, by :class:`~vultrscale.vultr.refusals.Refusal`.
    """

    def __init__(
        self,
        api_key: str,
        *,
        clock: Clock,
        seed: int = 0,
        timings: Timings | None = None,
        plans: list[JSON] | None = None,
        regions: list[JSON] | None = None,
        ip_allocator: IpAllocator | None = None,
        rate_limit: float | None = 30.0,
        lock_while_provisioning: bool = True,
        max_instances: int | None = None,
        on_instance_ready: ReadyHook | None = None,
        ready_on: Literal["active", "ok"] = "active",
    ) -> None:
        if not api_key:
            raise SimulatorError("the simulator needs a non-empty api_key")
        self._api_key = api_key
        self.clock = clock
        self.seed = seed
        self.timings = timings or Timings()
        self.plans: list[JSON] = [dict(p) for p in (plans if plans is not None else data.PLANS)]
        self.regions: list[JSON] = [
            dict(r) for r in (regions if regions is not None else data.REGIONS)
        ]
        self._plan_by_id = {p["id"]: p for p in self.plans}
        self._region_ids = {r["id"] for r in self.regions}
        self.ip_allocator: IpAllocator = ip_allocator or SeededIps(seed)
        self.rate_limit = rate_limit
        self.lock_while_provisioning = lock_while_provisioning
        self.max_instances = max_instances
        self.on_instance_ready = on_instance_ready
        self.ready_on = ready_on
        self.error_rate = 0.0
        self.error_statuses: tuple[int, ...] = (500, 502, 503)
        self.latency = 0.0
        self.snapshot_outcome: Literal["complete", "stuck", "deleted", "failed"] = "complete"
        self.request_log: list[RequestRecord] = []
        self.request_log_limit = 200_000

        self._lock = threading.RLock()
        self._ids = random.Random(f"{seed}:ids")
        self._faults = random.Random(f"{seed}:faults")
        self._internal_ips = SequentialIps("10.1.96.0/20", first=3)
        self._instances: dict[str, _Instance] = {}
        self._snapshots: dict[str, _Snapshot] = {}
        self._billing: dict[str, _BillingRecord] = {}
        self._seq_of: dict[str, int] = {}
        self._next_seq = 0
        self._buckets: dict[str, tuple[float, float]] = {}
        # (region, plan) -> still listed by GET /regions/{id}/availability while sold out
        self._sold_out: dict[tuple[str, str], bool] = {}
        self.refused: dict[refusals.Refusal, int] = dict.fromkeys(refusals.Refusal, 0)
        self._fail_rules: list[_FailRule] = []
        self._drop_rules: list[_DropRule] = []
        for item in [*self.plans, *self.regions]:
            self._register(item["id"])

    # --- public helpers ---------------------------------------------------------------------

    @property
    def instances(self) -> dict[str, JSON]:
        """Current instances by id (copies, as ``GET`` would show them; no 404 window)."""
        self.tick()
        with self._lock:
            return {i: self._instance_view(r) for i, r in self._instances.items()}

    @property
    def snapshots(self) -> dict[str, JSON]:
        """Current snapshots by id (copies)."""
        self.tick()
        with self._lock:
            return {i: dict(s.data) for i, s in self._snapshots.items()}

    def user_data(self, instance_id: str) -> str:
        """The decoded user-data of an instance."""
        with self._lock:
            return decode_user_data(self._instances[instance_id].user_data)

    def create_instance(self, **body: Any) -> JSON:
        """Create an instance as ``POST /v2/instances`` would (same validation); returns it.

        ``user_data`` here is plain text (it is base64-encoded for you). Raises
        :class:`SimulatorError` with the API's message when the API would answer 400.
        """
        if isinstance(body.get("user_data"), str):
            body["user_data"] = base64.b64encode(body["user_data"].encode()).decode()
        with self._lock:
            resp = self._create_instance(body)
        if resp.status != 202:
            raise SimulatorError(resp.json()["error"])
        created: JSON = resp.json()["instance"]
        return created

    def stock_out(self, region: str, plan: str, *, listed: bool = True) -> None:
        """Sell out ``plan`` in ``region``: creates of it there are refused with Vultr's words
        (``refusals.SOLD_OUT``) until :meth:`restock`. ``listed``: availability still lists
        it, as when a location's host nodes fill up between the listing and the create; False
        drops it from ``GET /v2/regions/{region}/availability`` too."""
        with self._lock:
            if plan not in self._plan_by_id or region not in self._region_ids:
                raise SimulatorError(f"no offering {region}/{plan} in the catalogue")
            self._sold_out[(region, plan)] = listed

    def restock(self, region: str, plan: str) -> None:
        """End a :meth:`stock_out` (nothing happens if there was none)."""
        with self._lock:
            self._sold_out.pop((region, plan), None)

    def sold_out(self) -> dict[tuple[str, str], bool]:
        """The offerings sold out now, each with whether availability still lists it."""
        with self._lock:
            return dict(self._sold_out)

    def lock_instance(self, instance_id: str, locked: bool = True) -> None:
        """Set ``server_status`` to ``locked`` (as during a reinstall) or release it."""
        with self._lock:
            self._instances[instance_id].locked = locked

    def fail_next(
        self,
        method: str,
        path_pattern: str,
        status: int,
        body: str | bytes | JSON | None = None,
        count: int = 1,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Answer the next ``count`` matching requests with ``status`` without acting.

        ``path_pattern`` is an fnmatch pattern on the path (``/v2/instances/*``). ``body``:
        None for the API's JSON error shape, a dict for a JSON body, str/bytes for a raw body
        sent as ``text/html`` (like the maintenance 504).
        """
        hdrs = dict(headers or {})
        if status == 429:
            hdrs.setdefault("Retry-After", "1")
        if body is None:
            raw = json.dumps({"error": default_message(status), "status": status}).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif isinstance(body, dict):
            raw = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        else:
            raw = body.encode() if isinstance(body, str) else body
            hdrs.setdefault("Content-Type", "text/html")
        with self._lock:
            self._fail_rules.append(
                _FailRule(method.upper(), path_pattern, status, raw, hdrs, count)
            )

    def drop_after_acting(
        self,
        method: str,
        path_pattern: str,
        *,
        mode: Literal["500", "drop"] = "500",
        count: int = 1,
    ) -> None:
        """Act on the next ``count`` matching requests, then lose the answer.

        ``mode="500"`` sends a 500 error instead of the real answer; ``"drop"`` closes the
        connection without a response. Models a create that happened although the client
        saw a failure.
        """
        with self._lock:
            self._drop_rules.append(_DropRule(method.upper(), path_pattern, mode, count))

    def drops_pending(self) -> int:
        """How many ``drop_after_acting`` answers are still to be lost."""
        with self._lock:
            return sum(rule.remaining for rule in self._drop_rules)

    def count(self, method: str, path_pattern: str, status: int | None = None) -> int:
        """How many logged requests match (test helper)."""
        with self._lock:
            return sum(
                1
                for r in self.request_log
                if r.method == method.upper()
                and fnmatch.fnmatchcase(r.path, path_pattern)
                and (status is None or r.status == status)
            )

    def pending_charges(self) -> list[JSON]:
        """This month's charges so far, one item per instance (live or deleted this month)."""
        with self._lock:
            return self._charges(self.clock.now())

    # --- the state machine ------------------------------------------------------------------

    def tick(self) -> None:
        """Advance lifecycles to the clock's now and run the ready hooks that became due."""
        fired: list[tuple[JSON, str]] = []
        with self._lock:
            now = self.clock.now()
            for rec in self._instances.values():
                self._advance(rec, now)
                due = rec.active_at if self.ready_on == "active" else rec.ok_at
                if not rec.ready_fired and now >= due:
                    rec.ready_fired = True
                    fired.append((self._instance_view(rec), decode_user_data(rec.user_data)))
            for sid, snap in list(self._snapshots.items()):
                if snap.data["status"] == "pending" and now >= snap.complete_at:
                    if snap.outcome == "complete":
                        snap.data["status"] = "complete"
                        snap.data["size"] = snap.full_size
                        # compression ratio of a mostly-empty disk image, seeded
                        snap.data["compressed_size"] = int(
                            snap.full_size * (0.02 + 0.06 * self._ids.random())
                        )
                    elif snap.outcome == "deleted":
                        del self._snapshots[sid]
                    elif snap.outcome == "failed":  # the spec names no statuses: a guess
                        snap.data["status"] = "failed"
        hook = self.on_instance_ready
        if hook is not None:
            for instance, user_data in fired:
                hook(instance, user_data)

    def _advance(self, rec: _Instance, now: datetime) -> None:
        d = rec.data
        if d["status"] == "pending" and now >= rec.active_at:
            plan = self._plan_by_id[d["plan"]]
            net = ipaddress.ip_network(f"{rec.ip}/23", strict=False)
            d.update(
                status="active",
                main_ip=rec.ip,
                netmask_v4=str(net.netmask),
                gateway_v4=str(net.network_address + 1),
                disk=plan["disk"],
                server_status="installingbooting",
                kvm="https://my.vultr.com/subs/vps/novnc/api.php?data="
                + "".join(self._ids.choices(string.ascii_uppercase + string.digits, k=32)),
            )
            if d["features"] and "ipv6" in d["features"]:
                d.update(
                    v6_network=f"2001:db8:{rec.seq % 0xFFFF:x}::",
                    v6_main_ip=f"2001:db8:{rec.seq % 0xFFFF:x}::1",
                    v6_network_size=64,
                )
            if d.pop("_vpc", False):
                d["internal_ip"] = self._internal_ips.allocate()
            self._billing[d["id"]].ip = rec.ip
        if d["server_status"] == "installingbooting" and now >= rec.ok_at:
            d["server_status"] = "ok"

    def _instance_view(self, rec: _Instance) -> JSON:
        view = {k: v for k, v in rec.data.items() if not k.startswith("_")}
        if rec.locked:
            view["server_status"] = "locked"
        return view

    # --- request handling -------------------------------------------------------------------

    def handle(self, req: SimRequest) -> SimResponse:
        """Answer one request: rate limit, injected faults, auth, then the route."""
        method = req.method.upper()
        path = req.path.rstrip("/") or "/"
        self.tick()
        with self._lock:
            resp = self._handle_locked(method, path, req)
            self.request_log.append(RequestRecord(method, path, 0 if resp.drop else resp.status))
            if len(self.request_log) > self.request_log_limit:
                # a long `sim serve` must not grow without bound; keep the recent half
                del self.request_log[: self.request_log_limit // 2]
        if self.latency > 0:
            self.clock.sleep(self.latency)
        return resp

    def _handle_locked(self, method: str, path: str, req: SimRequest) -> SimResponse:
        limited = self._rate_limited(req.headers.get("x-sim-client") or req.client)
        if limited is not None:
            return limited
        for rule in self._fail_rules:
            if rule.remaining > 0 and matches(rule.method, rule.pattern, method, path):
                rule.remaining -= 1
                return SimResponse(rule.status, rule.body, rule.headers)
        if self.error_rate > 0 and self._faults.random() < self.error_rate:
            status = self._faults.choice(self.error_statuses)
            retry = {"Retry-After": "1"} if status == 429 else None
            return error(status, default_message(status), retry)
        if (
            not _PUBLIC.match(path)
            and req.headers.get("authorization") != f"Bearer {self._api_key}"
        ):
            return error(401, "Invalid API token.")
        resp = self._route(method, path, req)
        if resp.status >= 400:
            return resp  # nothing was done, so there is nothing to lose
        for drop in self._drop_rules:
            if drop.remaining > 0 and matches(drop.method, drop.pattern, method, path):
                drop.remaining -= 1
                if drop.mode == "drop":
                    return SimResponse(0, drop=True)
                return error(500, default_message(500))
        return resp

    def _rate_limited(self, client: str) -> SimResponse | None:
        """A token bucket of ``rate_limit`` requests per second (and as burst) per client."""
        rate = self.rate_limit
        if rate is None:
            return None
        now = self.clock.monotonic()
        tokens, last = self._buckets.get(client, (rate, now))
        tokens = min(rate, tokens + (now - last) * rate)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            return error(429, "rate limit exceeded", {"Retry-After": "1"})
        self._buckets[client] = (tokens - 1.0, now)
        return None

    def _route(self, method: str, path: str, req: SimRequest) -> SimResponse:
        q = req.query
        if path == "/v2/instances":
            if method == "GET":
                return self._list_instances(q)
            if method == "POST":
                body = parse_body(req.body)
                if body is None:
                    return error(400, "Bad request.")
                return self._create_instance(body)
            return not_allowed("GET, POST")
        if m := _INSTANCE_PATH.match(path):
            if method == "GET":
                return self._get_instance(m.group(1))
            if method == "DELETE":
                return self._delete_instance(m.group(1))
            return not_allowed("DELETE, GET, PATCH")
        if m := _USER_DATA_PATH.match(path):
            if method == "GET":
                return self._get_user_data(m.group(1))
            return not_allowed("GET")
        if path == "/v2/snapshots":
            if method == "GET":
                return self._list_snapshots(q)
            if method == "POST":
                body = parse_body(req.body)
                if body is None:
                    return error(400, "Bad request.")
                return self._create_snapshot(body)
            return not_allowed("GET, POST")
        if m := _SNAPSHOT_PATH.match(path):
            if method == "GET":
                snap = self._snapshots.get(m.group(1))
                if snap is None:
                    return error(404, "snapshot not found")
                return json_response(200, {"snapshot": dict(snap.data)})
            if method == "DELETE":
                if self._snapshots.pop(m.group(1), None) is None:
                    return error(404, "snapshot not found")
                return no_content()
            return not_allowed("DELETE, GET, PUT")
        if path == "/v2/plans":
            if method != "GET":
                return not_allowed("GET")
            ptype = q.get("type", "all")
            plans = [p for p in self.plans if ptype in ("all", "") or p["type"] == ptype]
            return self._paginate("plans", plans, q)
        if path == "/v2/regions":
            if method != "GET":
                return not_allowed("GET")
            return self._paginate("regions", self.regions, q)
        if m := _AVAILABILITY_PATH.match(path):
            if method != "GET":
                return not_allowed("GET")
            region = m.group(1)
            if region not in self._region_ids:
                return error(404, "Invalid region.")
            ptype = q.get("type", "all")
            available = [
                p["id"]
                for p in self.plans
                if region in p["locations"]
                and (ptype in ("all", "") or p["type"] == ptype)
                and self._sold_out.get((region, p["id"]), True)
            ]
            return json_response(200, {"available_plans": available})
        if path == "/v2/account":
            if method != "GET":
                return not_allowed("GET")
            return json_response(200, {"account": self._account()})
        if path == "/v2/billing/pending-charges":
            if method != "GET":
                return not_allowed("GET")
            return json_response(200, {"pending_charges": self._charges(self.clock.now())})
        return error(404, "Invalid API route.")

    # --- routes -----------------------------------------------------------------------------

    def _register(self, item_id: str) -> int:
        seq = self._next_seq
        self._next_seq += 1
        self._seq_of[item_id] = seq
        return seq

    def _new_id(self) -> str:
        return str(uuid.UUID(int=self._ids.getrandbits(128), version=4))

    def _paginate(
        self,
        key: str,
        items: list[Any],
        q: Mapping[str, str],
        view: Callable[[Any], JSON] = dict,
        ident: Callable[[Any], str] = lambda i: str(i["id"]),
    ) -> SimResponse:
        """One page of ``items`` (already in list order) with ``meta.total`` and cursors; only
        the page's items are shown (``view``), so a list read page by page stays linear."""
        raw = q.get("per_page", "")
        if raw == "":
            per_page = DEFAULT_PER_PAGE
        else:
            try:
                per_page = int(raw)
            except ValueError:
                return error(400, "per_page must be an integer.")
            if not 1 <= per_page <= MAX_PER_PAGE:
                return error(400, f"per_page must be between 1 and {MAX_PER_PAGE}.")
        start, end = 0, min(per_page, len(items))
        cursor = q.get("cursor", "")
        if cursor:
            try:
                kind, _, ref = base64.b64decode(cursor, validate=True).decode().partition("__")
            except (binascii.Error, UnicodeDecodeError):
                return error(400, "Invalid cursor.")
            if kind not in ("next", "prev") or ref not in self._seq_of:
                return error(400, "Invalid cursor.")
            seq = self._seq_of[ref]
            seqs = [self._seq_of[ident(i)] for i in items]  # ascending: items are in list order
            if kind == "next":  # items after the last one of the previous page
                start = bisect.bisect_right(seqs, seq)
                end = min(start + per_page, len(items))
            else:  # the page that ends just before the first one of the current page
                end = bisect.bisect_left(seqs, seq)
                start = max(0, end - per_page)
        page = [view(i) for i in items[start:end]]
        links = {
            "next": page_cursor("next", page[-1]["id"]) if page and end < len(items) else "",
            "prev": page_cursor("prev", page[0]["id"]) if page and start > 0 else "",
        }
        body = {key: page, "meta": {"total": len(items), "links": links}}  # fresh copies
        return json_response(200, body)

    def _visible(self, instance_id: str) -> _Instance | None:
        rec = self._instances.get(instance_id)
        if rec is None:
            return None
        window = timedelta(seconds=self.timings.visible_after)
        if self.clock.now() < rec.created + window:
            return None  # eventual consistency right after create (TF #462)
        return rec

    def _list_instances(self, q: Mapping[str, str]) -> SimResponse:
        # Filtered on the records, and only the page's views built: building every instance's
        # view for every page made a paginated list quadratic (1 s a pass at 5,000 instances).
        # Records are kept in creation order, so the sort is one linear pass.
        recs = sorted(self._instances.values(), key=lambda r: r.seq)
        for name in ("label", "region", "main_ip", "firewall_group_id"):  # none is hidden
            if value := q.get(name):
                recs = [r for r in recs if r.data.get(name) == value]
        if tag := q.get("tag"):
            recs = [r for r in recs if tag in r.data["tags"]]
        return self._paginate(
            "instances", recs, q, view=self._instance_view, ident=lambda r: str(r.data["id"])
        )

    def _get_instance(self, instance_id: str) -> SimResponse:
        rec = self._visible(instance_id)
        if rec is None:
            return error(404, "instance not found")
        return json_response(200, {"instance": self._instance_view(rec)})

    def _get_user_data(self, instance_id: str) -> SimResponse:
        rec = self._visible(instance_id)
        if rec is None:
            return error(404, "instance not found")
        return json_response(200, {"user_data": {"data": rec.user_data}})

    def _delete_instance(self, instance_id: str) -> SimResponse:
        rec = self._instances.get(instance_id)
        if rec is None:
            return error(404, "instance not found")
        status = self._instance_view(rec)["server_status"]
        if rec.locked or (self.lock_while_provisioning and status in ("none", "locked")):
            return error(500, LOCKED_MESSAGE)
        del self._instances[instance_id]
        self.ip_allocator.release(rec.ip)
        if rec.data.get("internal_ip"):
            self._internal_ips.release(rec.data["internal_ip"])
        self._billing[instance_id].deleted = self.clock.now()
        return no_content()

    def _create_instance(self, body: JSON) -> SimResponse:
        region, plan_id = body.get("region"), body.get("plan")
        if not isinstance(region, str) or not region or not isinstance(plan_id, str) or not plan_id:
            return error(400, "Bad request.")
        plan = self._plan_by_id.get(plan_id)
        if plan is None:
            return error(400, "Invalid plan chosen.")
        if region not in self._region_ids:
            return error(400, f"Server add failed: Invalid region chosen ({region}).")
        if region not in plan["locations"] or (region, plan_id) in self._sold_out:
            # Vultr's one answer for a plan not sold in a region and for one sold out there
            self.refused[refusals.Refusal.UNAVAILABLE] += 1
            return error(400, refusals.CREATE_FAILED + refusals.SOLD_OUT)
        tags = body.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            return error(400, "Bad request.")
        snapshot_id, os_id = body.get("snapshot_id"), body.get("os_id")
        if snapshot_id:
            snap = self._snapshots.get(str(snapshot_id))
            if snap is None:
                return error(400, "Server add failed: Invalid snapshot ID.")
            if snap.data["status"] != "complete":
                return error(400, "Server add failed: Snapshot is not complete yet.")
            os_id = data.SNAPSHOT_OS_ID
        elif os_id is None:
            return error(
                400,
                "Server add failed: You must choose an operating system, application, ISO, "
                "or snapshot.",
            )
        elif not isinstance(os_id, int) or os_id not in data.OPERATING_SYSTEMS:
            return error(400, "Server add failed: Invalid operating system chosen.")
        user_data = body.get("user_data") or ""
        if not isinstance(user_data, str) or not valid_base64(user_data):
            return error(400, "Server add failed: user_data must be base64 encoded.")
        if self.max_instances is not None and len(self._instances) >= self.max_instances:
            self.refused[refusals.Refusal.INSTANCE_LIMIT] += 1
            return error(400, refusals.CREATE_FAILED + refusals.INSTANCE_LIMIT)

        now = self.clock.now()
        instance_id = self._new_id()
        seq = self._register(instance_id)
        ip = self.ip_allocator.allocate()
        label = str(body.get("label") or "")
        features = ["ipv6"] if body.get("enable_ipv6") else []
        if body.get("ddos_protection"):
            features.append("ddos_protection")
        instance: JSON = {
            "id": instance_id,
            "os": data.OPERATING_SYSTEMS[int(os_id)],
            "ram": plan["ram"],
            "disk": 0,
            "main_ip": "0.0.0.0",
            "vcpu_count": plan["vcpu_count"],
            "region": region,
            "plan": plan_id,
            "date_created": iso(now),
            "status": "pending",
            "allowed_bandwidth": plan["bandwidth"],
            "netmask_v4": "",
            "gateway_v4": "0.0.0.0",
            "power_status": "running",
            "server_status": "none",
            "v6_network": "",
            "v6_main_ip": "",
            "v6_network_size": 0,
            "label": label,
            "internal_ip": "",
            "kvm": "",
            "hostname": str(body.get("hostname") or label or "vultr.guest"),
            "os_id": int(os_id),
            "app_id": 0,
            "image_id": "",
            "snapshot_id": str(snapshot_id or ""),
            "firewall_group_id": str(body.get("firewall_group_id") or ""),
            "features": features,
            "tags": list(tags),
            "user_scheme": str(body.get("user_scheme") or "root"),
        }
        if body.get("attach_vpc") or body.get("enable_vpc"):
            instance["_vpc"] = True
        active_at = now + timedelta(seconds=self.timings.boot_pending)
        rec = _Instance(
            data=instance,
            seq=seq,
            created=now,
            user_data=user_data,
            ip=ip,
            active_at=active_at,
            ok_at=active_at + timedelta(seconds=self.timings.boot_ready),
        )
        self._instances[instance_id] = rec
        self._billing[instance_id] = _BillingRecord(label=label, plan=plan, created=now)
        password = "".join(self._ids.choices(string.ascii_letters + string.digits + "#{[!", k=16))
        shown = self._instance_view(rec)
        shown["default_password"] = password  # only ever in the create response
        return json_response(202, {"instance": shown})

    def _list_snapshots(self, q: Mapping[str, str]) -> SimResponse:
        snaps = sorted(self._snapshots.values(), key=lambda s: s.seq)
        views = [dict(s.data) for s in snaps]
        if q.get("description"):
            views = [v for v in views if v["description"] == q["description"]]
        return self._paginate("snapshots", views, q)

    def _create_snapshot(self, body: JSON) -> SimResponse:
        instance_id = body.get("instance_id")
        if not isinstance(instance_id, str) or not instance_id:
            return error(400, "Bad request.")
        rec = self._instances.get(instance_id)
        if rec is None:
            return error(404, "instance not found")
        now = self.clock.now()
        snapshot_id = self._new_id()
        plan = self._plan_by_id[rec.data["plan"]]
        snapshot = {
            "id": snapshot_id,
            "date_created": iso(now),
            "description": str(body.get("description") or ""),
            "size": 0,
            "compressed_size": 0,
            "status": "pending",
            "os_id": rec.data["os_id"],
            "app_id": rec.data["app_id"],
        }
        self._snapshots[snapshot_id] = _Snapshot(
            data=snapshot,
            seq=self._register(snapshot_id),
            complete_at=now + timedelta(seconds=self.timings.snapshot_complete),
            outcome=self.snapshot_outcome,
            full_size=int(plan["disk"]) * 1024**3,
        )
        return json_response(201, {"snapshot": dict(snapshot)})

    def _account(self) -> JSON:
        charges = self._charges(self.clock.now())
        return {
            "name": "Simulated Account",
            "email": "sim@example.com",
            "acls": ["subscriptions_view", "subscriptions", "billing", "provisioning"],
            "balance": 0,
            "pending_charges": round(sum(c["total"] for c in charges), 2),
            "last_payment_date": "",
            "last_payment_amount": 0,
        }

    def _charges(self, now: datetime) -> list[JSON]:
        """Per started hour this calendar month (UTC), capped at the plan's monthly cost."""
        month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        items = []
        for rec in self._billing.values():
            end = rec.deleted or now
            if end <= month_start:
                continue
            start = max(rec.created, month_start)
            hours = max(1, math.ceil((end - start).total_seconds() / 3600))
            plan = rec.plan
            monthly = float(plan["monthly_cost"])
            price = plan.get("hourly_cost")
            price = float(price) if price is not None else monthly / HOURS_PER_MONTH
            total = min(hours * price, monthly)
            items.append(
                {
                    "description": f"{rec.ip} ({plan['ram']} MB) [{rec.label}]",
                    "start_date": iso(start),
                    "end_date": iso(end),
                    "units": hours,
                    "unit_type": "hours",
                    "unit_price": price,
                    "total": round(total, 2),
                    "product": data.PRODUCT_NAMES.get(plan["type"], "Vultr Cloud Compute"),
                }
            )
        return items


