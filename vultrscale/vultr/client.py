"""The Vultr v2 API client (httpx + tenacity): safe to call from cron.

- Idempotent calls (GET, DELETE) are retried on 429 (honouring ``Retry-After``), on
  500/502/503/504 and on connection errors and timeouts, with capped exponential backoff.
- A POST that creates (instance, snapshot) is never replayed once it may have reached the
  server: a 5xx, a timeout or a dropped connection raises ``AmbiguousCreate`` and the caller
  looks the label up. Only outcomes where the server certainly did nothing are retried: a 429
  (refused) and a connection that was never established.
- Every call has a total deadline, not only httpx's per-read timeout: an attempt ends
  ``timeout`` seconds after it began however the server trickles its answer (every read and
  write on the socket is bounded by what is left), and a call with its retries ends within
  ``CALL_BUDGET_S``, or by the pass's ``Deadline`` when one runs. A wait (backoff or
  ``Retry-After``) that would not fit is not waited: the call gives up at once.
- Requests are paced (``API_PACE`` a second after a burst of ``PACE_BURST``) by a token
  bucket that every call of the client shares, retries included, so that a pass that creates
  or deletes a large fleet stays under Vultr's 30 requests/s per source address instead of
  earning 429s. A paced request that could only be sent past the deadline is not sent.
- The API key is sent by an auth flow and never appears in a repr, a log record or an
  exception; error texts from the server are redacted too.
"""

from __future__ import annotations

import base64
import email.utils
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

import tenacity

from vultrscale import __version__
from vultrscale.config import Secret
from vultrscale.core.clock import PASS_DEADLINE_S, Deadline
from vultrscale.errors import UsageError
from vultrscale.redaction import http_userinfo, is_host_name, mask_url, redact, secret_values
from vultrscale.vultr._http import httpx
from vultrscale.vultr.errors import (
    AmbiguousCreate,
    ApiUnreachable,
    AuthError,
    BadRequest,
    InstanceLocked,
    NotFound,
    RateLimited,
    ServerError,
    VultrError,
    create_refusal,
)
from vultrscale.vultr.models import VAccount, VCharge, VInstance, VPlan, VRegion, VSnapshot
from vultrscale.vultr.transport import BoundedTransport, Limit

log = logging.getLogger("vultrscale.vultr")

DEFAULT_BASE_URL = "https://api.vultr.com"
PER_PAGE = 500  # the documented maximum: fewest requests for a large fleet
# A listing past this many pages (a million instances at PER_PAGE) is a server that never
# stops sending cursors, not an account: stop rather than loop for good.
MAX_PAGES = 2000
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER = 60.0  # seconds; a larger Retry-After is capped, not obeyed blindly
# A call outside a pass (`snapshot`'s polls, a script's) ends, retries included, within this:
# a pass's own deadline, so no command waits on a silent API longer than a pass would.
CALL_BUDGET_S = PASS_DEADLINE_S
# An attempt is not begun with less than this left: it could not be answered in time, and a
# create begun that late would mostly end as "outcome unknown".
MIN_ATTEMPT_S = 1.0
# Vultr answers 429 above 30 requests a second per source address (the OpenAPI document's
# introduction; docs.vultr.com "What rate limits apply to the Vultr API"). The client keeps
# below it with room for the other programs behind the same address (a cron pass beside
# `status`, the demo's pass processes): bursts of PACE_BURST, then API_PACE a second, which
# never exceeds 30 in any window (10 + 25t <= 30 + 30t).
API_RATE_LIMIT = 30.0
API_PACE = 25.0
PACE_BURST = 10
_LOCKED = re.compile(r"currently locked", re.IGNORECASE)
# 400 "invalid instance ID" (2021), "... not found", "Server is pending destruction": all mean
# the resource is gone or going, for calls that name a resource by id.
_GONE = re.compile(r"invalid\b.*\bid\b|not found|pending destruction", re.IGNORECASE)
_TAGS = re.compile(r"<[^>]*>")


class _BearerAuth(httpx.Auth):
    """Adds the Authorization header per request, so no client-level header holds the key."""

    def __init__(self, key: str) -> None:
        self._key = key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._key}"
        yield request

    def __repr__(self) -> str:
        return "_BearerAuth('***')"


class _Pace:
    """A token bucket (GCRA form) shared by every call of one client: ``burst`` requests at
    once, then one every ``1/rate`` seconds. ``reserve`` takes the next slot and says when to
    send; the caller sleeps until then (on its own injected sleep).

    Each thread's time is the later of ``monotonic()`` and the end of its last wait, so a test
    that injects a fake ``sleep`` but reads the real clock is paced as a real run would be
    (waits of 1/rate each), not ever longer; with real sleeps the two readings agree."""

    def __init__(self, rate: float, burst: int, monotonic: Callable[[], float]) -> None:
        if rate <= 0 or burst < 1:
            raise UsageError(f"pacing needs a positive rate and burst, got {rate}/s, {burst}.")
        self.rate = rate
        self.burst = burst
        self._interval = 1.0 / rate
        self._tolerance = (burst - 1) * self._interval
        self._monotonic = monotonic
        self._tat = float("-inf")  # when the bucket is next full to one token short of empty
        self._lock = threading.Lock()
        self._local = threading.local()

    def reserve(self) -> tuple[float, float]:
        """Take a slot: (this thread's now, when the request may be sent)."""
        with self._lock:
            now = max(self._monotonic(), getattr(self._local, "woke", float("-inf")))
            tat = max(self._tat, now)
            send = max(now, tat - self._tolerance)
            self._tat = tat + self._interval
            self._local.woke = send
            return now, send

    def give_back(self) -> None:
        """The reserved slot was not used (the request was not sent)."""
        with self._lock:
            self._tat -= self._interval
            self._local.woke = float("-inf")


def shared_pace(share: int = 1, monotonic: Callable[[], float] = time.monotonic) -> _Pace:
    """One pace for the clients of one API key in a process (``reconcile`` of a directory of
    fleets: a client per fleet), at ``1/share`` of the client's own when ``share`` scaler
    processes use the key at once (``account.scalers``): together they keep to it."""
    return _Pace(API_PACE / share, max(1, PACE_BURST // share), monotonic)


class _OutOfTime(tenacity.stop.stop_base):
    """Stop retrying when the wait asked for (backoff, ``Retry-After``) would end past
    ``last_start``, the latest time an attempt may begin."""

    def __init__(self, monotonic: Callable[[], float], last_start: float) -> None:
        self._monotonic = monotonic
        self._last_start = last_start
        self.wait = 0.0  # the wait that was asked for when it stopped

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        # tenacity >= 8.3 computes the wait before it asks stop (8.2 had no upcoming_sleep:
        # every retry raised AttributeError), hence the floor of the pin in pyproject.toml.
        self.wait = retry_state.upcoming_sleep
        return self._monotonic() + self.wait > self._last_start


class _Retry(Exception):
    """Internal: this attempt failed in a way that is safe to repeat."""

    def __init__(self, error: VultrError, retry_after: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after = retry_after


def _validate_base_url(base_url: str) -> str:
    hint = "Set VULTR_API_URL to an http(s) URL such as https://api.vultr.com (without /v2)."
    try:
        url = httpx.URL(base_url.strip())
        host = url.host  # decoded from IDNA: an invalid A-label raises here
    except (httpx.InvalidURL, TypeError, UnicodeError):  # UnicodeError: IDNA refuses the host
        shown = mask_url(base_url)
        raise UsageError(f"Vultr API URL {shown!r} is not a valid URL.", hint=hint) from None
    if url.scheme not in ("http", "https") or not host:
        shown = mask_url(base_url)
        raise UsageError(f"Vultr API URL {shown!r} is not an http(s) URL.", hint=hint)
    if not is_host_name(host):  # every request raised UnicodeError: 'unexpected'
        shown = mask_url(base_url)
        raise UsageError(f"Vultr API URL {shown!r} names a host that is not valid.", hint=hint)
    text = str(url).rstrip("/")
    return text[: -len("/v2")] if text.endswith("/v2") else text


def _validate_key(api_key: str) -> str:
    hint = "Set VULTR_API_KEY to the key shown at my.vultr.com > Account > API."
    key = (api_key or "").strip()
    if not key:
        raise UsageError("VULTR_API_KEY is empty.", hint=hint)
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        # The key itself is never echoed.
        raise UsageError("VULTR_API_KEY contains spaces or non-ASCII characters.", hint=hint)
    return key


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), None when absent or bad."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # delta-seconds (RFC 9110): digits only
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _api_message(response: httpx.Response, redact_text: Callable[[str], str]) -> str:
    """The ``error`` text of a Vultr error body, in whatever key order; for a body that is not
    JSON (an HTML 504 during maintenance), its text without tags, shortened. ``redact_text``
    runs before any shortening: a secret cut in two would no longer be found whole, and its
    first part would be shown."""
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError, RecursionError):
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, str) and error.strip():
            return redact_text(error.strip())
        if error is not None:
            try:
                dumped = json.dumps(error)
            except (ValueError, RecursionError):
                dumped = "(an error object too deep to show)"
            return redact_text(dumped)[:300]
    try:
        text = response.text
    except (UnicodeDecodeError, LookupError):
        text = ""
    text = redact_text(" ".join(_TAGS.sub(" ", text).split()))
    if not text:
        return response.reason_phrase or "(empty body)"
    return text if len(text) <= 200 else text[:197] + "..."


class VultrClient:
    """A client for the Vultr v2 API (``base_url`` without ``/v2``). Use it as a context manager
    or call ``close()``. ``sleep`` is what waits between retries and ``monotonic`` what times
    them (tests inject a fake clock's); ``timeout`` bounds each attempt in total, and
    ``deadline`` (armed by the pass's owner for each pass) every call made while it runs.
    ``pace`` requests a second (after bursts of ``pace_burst``) is the most the client sends,
    over all its calls and threads; a ``shared_pace`` is shared with the other clients given
    it; None sends as fast as the calls come."""

    def __init__(
        self,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        max_attempts: int = 5,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        deadline: Deadline | None = None,
        user_agent: str = f"vultrscale/{__version__}",
        pace: float | _Pace | None = API_PACE,
        pace_burst: int = PACE_BURST,
    ) -> None:
        self.base_url = _validate_base_url(base_url)
        key = _validate_key(api_key)
        if max_attempts < 1:
            raise UsageError(f"max_attempts must be at least 1, got {max_attempts}.")
        if timeout <= 0:
            raise UsageError(f"timeout must be positive, got {timeout}.")
        self._key = Secret(key)  # kept only to redact echoes of it
        self.max_attempts = max_attempts
        self.timeout = timeout
        self._sleep = sleep
        self._monotonic = monotonic
        self.deadline = deadline
        self._limit = Limit()
        if isinstance(pace, _Pace) or pace is None:
            self._pace = pace
        else:
            self._pace = _Pace(pace, pace_burst, monotonic)
        self.paced_seconds = 0.0  # the waits pacing asked for, in all
        # 0.5 s, 1 s, 2 s ... capped at 8 s, plus up to 0.25 s of jitter so that several
        # clients behind one address do not retry in step.
        self._backoff = tenacity.wait_exponential(multiplier=0.5, max=8.0) + tenacity.wait_random(
            0, 0.25
        )
        self.requests_made = 0
        # Every socket the client opens waits at most until the call's end (``Limit``), the
        # proxies' from the environment too; a transport given (a test's mock, the
        # simulator's in-process one) opens none.
        self.transport = transport or BoundedTransport(self._limit)
        self._http = httpx.Client(
            base_url=self.base_url,
            auth=_BearerAuth(key),
            timeout=httpx.Timeout(timeout),
            transport=self.transport,
            headers={"User-Agent": user_agent, "Accept": "application/json"},
            follow_redirects=False,
            trust_env=False,  # the environment's proxies are the transport's (above)
        )

    def __repr__(self) -> str:
        return f"VultrClient(base_url={mask_url(self.base_url)!r}, api_key='***')"

    def __enter__(self) -> VultrClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # --- instances ---------------------------------------------------------------------------

    def list_instances(self, tag: str | None = None, label: str | None = None) -> list[VInstance]:
        """Every instance (all pages), optionally only those with ``tag`` and/or ``label``."""
        params = {"tag": tag, "label": label}
        return [VInstance.from_api(d) for d in self._paginate("/v2/instances", "instances", params)]

    def get_instance(self, instance_id: str) -> VInstance:
        """One instance. Raises NotFound (also shortly after a create: not visible yet)."""
        body = self._call("GET", f"/v2/instances/{_seg(instance_id)}", by_id=True)
        return VInstance.from_api(_object(body, "instance"))

    def create_instance(
        self,
        *,
        region: str,
        plan: str,
        label: str,
        tags: Sequence[str],
        snapshot_id: str | None = None,
        os_id: int | None = None,
        user_data: str | None = None,
        hostname: str | None = None,
        attach_vpc: Sequence[str] = (),
        firewall_group_id: str | None = None,
        enable_ipv6: bool = False,
    ) -> VInstance:
        """POST /v2/instances (202). Exactly one of ``snapshot_id``/``os_id``; ``user_data`` is
        plain text (base64-encoded here). Raises AmbiguousCreate when the outcome is unknown:
        look the label up before creating again."""
        if bool(snapshot_id) == (os_id is not None):
            raise UsageError(
                "create_instance needs exactly one image source: snapshot_id or os_id.",
                hint="Set fleet.snapshot_id or run `vultrscale snapshot --from-instance ID`.",
            )
        body: dict[str, Any] = {"region": region, "plan": plan, "label": label, "tags": list(tags)}
        if snapshot_id:
            body["snapshot_id"] = snapshot_id
        if os_id is not None:
            body["os_id"] = os_id
        if user_data is not None:
            body["user_data"] = base64.b64encode(user_data.encode("utf-8")).decode("ascii")
        if hostname:
            body["hostname"] = hostname
        if attach_vpc:
            body["attach_vpc"] = list(attach_vpc)
        if firewall_group_id:
            body["firewall_group_id"] = firewall_group_id
        if enable_ipv6:
            body["enable_ipv6"] = True
        answer = self._call("POST", "/v2/instances", json_body=body, create_label=label)
        try:
            return VInstance.from_api(_created(answer, "instance"))
        except VultrError as exc:
            # Accepted, but the answer is unreadable: the instance may exist.
            raise AmbiguousCreate(
                f"POST /v2/instances for {label!r} succeeded but the answer was unreadable.",
                label=label,
            ) from exc

    def delete_instance(self, instance_id: str) -> None:
        """DELETE (204). NotFound if already gone; InstanceLocked while pending or locked."""
        self._call("DELETE", f"/v2/instances/{_seg(instance_id)}", by_id=True)

    # --- snapshots ---------------------------------------------------------------------------

    def create_snapshot(self, instance_id: str, description: str = "") -> VSnapshot:
        """POST /v2/snapshots (201). NotFound when the instance is gone; AmbiguousCreate when
        the outcome is unknown: look the description up before creating again."""
        body = {"instance_id": instance_id, "description": description}
        # by_id: the request names an instance, so 400 "invalid instance ID" is NotFound.
        answer = self._call(
            "POST", "/v2/snapshots", json_body=body, by_id=True, create_label=description
        )
        try:
            return VSnapshot.from_api(_created(answer, "snapshot"))
        except VultrError as exc:
            raise AmbiguousCreate(
                "POST /v2/snapshots succeeded but the answer was unreadable.", label=description
            ) from exc

    def get_snapshot(self, snapshot_id: str) -> VSnapshot:
        """One snapshot. Raises NotFound."""
        body = self._call("GET", f"/v2/snapshots/{_seg(snapshot_id)}", by_id=True)
        return VSnapshot.from_api(_object(body, "snapshot"))

    def list_snapshots(self, description: str | None = None) -> list[VSnapshot]:
        """Every snapshot (all pages), optionally only those with ``description``."""
        params = {"description": description}
        return [VSnapshot.from_api(d) for d in self._paginate("/v2/snapshots", "snapshots", params)]

    def delete_snapshot(self, snapshot_id: str) -> None:
        """DELETE (204). NotFound if already gone."""
        self._call("DELETE", f"/v2/snapshots/{_seg(snapshot_id)}", by_id=True)

    # --- plans, regions, billing -------------------------------------------------------------

    def list_plans(self, plan_type: str | None = None) -> list[VPlan]:
        """Every plan (all pages) of ``plan_type`` (``vc2``, ``vhf``, ...; None: the API's
        default), as Vultr prices them now. Not cached here: how long a price may be trusted
        is the reconcile pass's decision (``read.PRICE_TTL``), and a client lives as long
        as ``reconcile --loop`` does."""
        items = self._paginate("/v2/plans", "plans", {"type": plan_type})
        return [VPlan.from_api(d) for d in items]

    def get_plan(self, plan_id: str) -> VPlan:
        """One plan, as listed now. Raises NotFound."""
        for plan in self.list_plans():
            if plan.id == plan_id:
                return plan
        raise NotFound(
            f"Vultr has no plan {plan_id!r}.",
            hint="Set fleet.plan to a plan id from GET /v2/plans, e.g. vc2-1c-2gb.",
        )

    def list_regions(self) -> list[VRegion]:
        """Every region (all pages)."""
        return [VRegion.from_api(d) for d in self._paginate("/v2/regions", "regions", {})]

    def region_availability(self, region: str) -> set[str]:
        """The plan ids that can be deployed in ``region`` now."""
        body = self._call("GET", f"/v2/regions/{_seg(region)}/availability")
        plans = body.get("available_plans") if isinstance(body, dict) else None
        return {str(p) for p in plans} if isinstance(plans, list) else set()

    def account(self) -> VAccount:
        """The account: name, email, balance, pending charges."""
        return VAccount.from_api(_object(self._call("GET", "/v2/account"), "account"))

    def pending_charges(self) -> list[VCharge]:
        """This month's unbilled charges, one line per product."""
        items = self._paginate("/v2/billing/pending-charges", "pending_charges", {}, per_page=None)
        return [VCharge.from_api(d) for d in items]

    # --- transport ---------------------------------------------------------------------------

    def _paginate(
        self,
        path: str,
        key: str,
        params: dict[str, Any],
        *,
        per_page: int | None = PER_PAGE,
    ) -> Iterator[dict[str, Any]]:
        """Items of every page: follow ``meta.links.next`` until it is empty."""
        query = {k: v for k, v in params.items() if v is not None}
        if per_page is not None:
            query["per_page"] = per_page
        seen: set[str] = set()
        while True:
            body = self._call("GET", path, params=query)
            items = body.get(key) if isinstance(body, dict) else None
            if not isinstance(items, list):
                raise VultrError(f"GET {path} returned no {key!r} list.", hint=_BAD_BODY_HINT)
            yield from (item for item in items if isinstance(item, dict))
            meta = body.get("meta")
            links = meta.get("links") if isinstance(meta, dict) else None
            cursor = links.get("next") if isinstance(links, dict) else None
            if not cursor:
                return
            # Each check ends a listing that would never end: a cursor seen before, one that
            # is not a string, a page with nothing on it yet a next one, too many pages.
            if not isinstance(cursor, str):
                raise VultrError(f"GET {path}: the page cursor is not a string.")
            if cursor in seen:
                raise VultrError(f"GET {path}: the API repeated a page cursor.")
            if not items:
                raise VultrError(f"GET {path}: the API sent an empty page with a next cursor.")
            if len(seen) + 1 >= MAX_PAGES:
                raise VultrError(f"GET {path}: more than {MAX_PAGES} pages; stopped there.")
            seen.add(cursor)
            query["cursor"] = cursor

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: dict[str, Any] | None = None,
        by_id: bool = False,
        create_label: str | None = None,
    ) -> Any:
        """One API call with retries; returns the decoded body (None for 204).

        ``by_id``: the path names a resource, so a 400 "invalid ... ID" means NotFound.
        ``create_label``: a non-idempotent create; its ambiguous failures raise AmbiguousCreate.
        """
        creating = create_label is not None
        started = self._monotonic()
        until, bound = self._until(started)
        floor = min(MIN_ATTEMPT_S, self.timeout)
        if until - started < floor:  # nothing was sent: not even a create is in doubt
            raise ApiUnreachable(
                f"{method} {path} not sent: {bound} has passed.", hint=_DEADLINE_HINT
            )
        out_of_time = _OutOfTime(self._monotonic, until - floor)
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retry),
            stop=tenacity.stop_after_attempt(self.max_attempts) | out_of_time,
            wait=self._wait,
            sleep=self._sleep,
            before_sleep=self._log_retry,
            reraise=True,
        )
        number = 0
        try:
            for attempt in retrying:
                with attempt:
                    number = attempt.retry_state.attempt_number
                    response = self._send(
                        method, path, params, json_body, number, create_label, until
                    )
                    return self._decode(method, path, response, by_id, creating, create_label)
        except _Retry as exc:
            exhausted = exc
        else:  # pragma: no cover
            raise AssertionError("unreachable: tenacity either returns or raises")
        error = exhausted.error
        if number < self.max_attempts:  # stopped by the clock, not by the count
            elapsed = self._monotonic() - started
            wait = out_of_time.wait
            after = f" (after a {wait:.3g}s wait)" if wait >= 1 else ""
            error = type(error)(
                f"{error.message} Gave up after {number} attempt(s) in {elapsed:.1f}s: another"
                f"{after} would end past {bound}.",
                status=error.status,
                api_message=error.api_message,
                hint=error.hint,
            )
        raise error from None  # the last attempt's error, without the retry wrapper

    def _until(self, now: float) -> tuple[float, str]:
        """When a call begun at ``now`` must end (``monotonic``), and what sets that end: the
        pass's deadline while one runs, else the call's own budget."""
        until, bound = now + CALL_BUDGET_S, f"the call's {CALL_BUDGET_S:g}s limit"
        left = self.deadline.remaining() if self.deadline is not None else None
        if left is not None and self.deadline is not None and now + left <= until:
            until, bound = now + left, f"the pass's {self.deadline.seconds:g}s deadline"
        return until, bound

    def _send(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None,
        json_body: dict[str, Any] | None,
        attempt: int,
        create_label: str | None,
        until: float,
    ) -> httpx.Response:
        """Send once, within ``timeout`` in all and by ``until``, when pacing lets it go;
        translate transport errors (which may carry request details) into ours."""
        self._paced(method, path, until)
        started = time.monotonic()
        # The sockets' end, on the real clock they wait on.
        self._limit.set(started + min(self.timeout, until - self._monotonic()))
        self.requests_made += 1
        try:
            response = self._http.request(method, path, params=params, json=json_body)
        except httpx.HTTPError as exc:  # transport errors, and a body that cannot be decoded
            failure = exc
        else:
            self._log_attempt(method, path, response.status_code, attempt, started)
            return response
        finally:
            self._limit.set(None)
        # Raised outside the except block, so the httpx exception (which holds the request and
        # its Authorization header) is neither the cause nor the context of ours; its type and
        # redacted text are in our message.
        name = type(failure).__name__
        detail = f"{name}: {self._redact(str(failure)) or 'no detail'}"
        self._log_attempt(method, path, name, attempt, started)
        if isinstance(failure, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            # The request never left this machine: repeating it is safe, even for a create.
            raise _Retry(
                ApiUnreachable(
                    f"{method} {path}: cannot connect to {mask_url(self.base_url)} ({detail})."
                )
            )
        if create_label is not None:
            # Sent, but no answer was read: the server may have acted on it.
            raise AmbiguousCreate(
                f"{method} {path} for {create_label!r}: no answer ({detail}); it may or may "
                "not have been created.",
                label=create_label,
            )
        raise _Retry(ApiUnreachable(f"{method} {path}: no answer ({detail})."))

    def _paced(self, method: str, path: str, until: float) -> None:
        """Wait for this request's slot of the pace. A slot later than the last moment an
        attempt may begin is given back and nothing is sent: the pass has more requests than
        its deadline leaves time for at Vultr's rate, and the next pass goes on."""
        if self._pace is None:
            return
        now, send = self._pace.reserve()
        if send <= now:
            return
        if send > until - min(MIN_ATTEMPT_S, self.timeout):
            self._pace.give_back()
            raise RateLimited(
                f"{method} {path} not sent: at {self._pace.rate:g} requests/s its turn "
                f"would come {send - now:.1f}s from now, past the time this call has left.",
                hint="The pass made more API calls than its deadline leaves time for at "
                "Vultr's rate; the next pass goes on where this one stopped.",
            )
        self.paced_seconds += send - now
        log.debug("%s %s paced: waiting %.3fs for its turn", method, path, send - now)
        self._sleep(send - now)

    def _decode(
        self,
        method: str,
        path: str,
        response: httpx.Response,
        by_id: bool,
        creating: bool,
        create_label: str | None,
    ) -> Any:
        status = response.status_code
        if 200 <= status < 300:
            if status == 204 or not response.content:
                return None
            try:
                return response.json()
            except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: too deep
                pass
            text = f"{method} {path}: the API answered {status} with a body that is not JSON"
            if creating:
                # Accepted, but we cannot tell what: the resource may exist.
                raise AmbiguousCreate(f"{text}.", label=create_label, status=status)
            raise VultrError(f"{text}.", status=status, hint=_BAD_BODY_HINT)
        self._raise_for(method, path, response, by_id, creating, create_label)

    def _raise_for(
        self,
        method: str,
        path: str,
        response: httpx.Response,
        by_id: bool,
        creating: bool,
        create_label: str | None,
    ) -> NoReturn:
        status = response.status_code
        message = _api_message(response, self._redact)
        text = f"{method} {path} failed: {status} {message}"
        if status == 401:
            raise AuthError(
                f"Vultr refused the API key ({status}: {message}).",
                status=status,
                api_message=message,
            )
        if status == 429:
            # A refusal: the server did nothing, so even a create may be repeated.
            raise _Retry(
                RateLimited(text, status=status, api_message=message), _retry_after(response)
            )
        if status >= 500 and _LOCKED.search(message):
            raise InstanceLocked(text, status=status, api_message=message)
        if creating and status >= 500:
            raise AmbiguousCreate(
                f"{text}; it may or may not have been created.",
                label=create_label,
                status=status,
                api_message=message,
            )
        if status in RETRY_STATUSES:
            raise _Retry(
                ServerError(text, status=status, api_message=message), _retry_after(response)
            )
        if status >= 500:
            raise ServerError(text, status=status, api_message=message)
        if status == 404 or (by_id and status == 400 and _GONE.search(message)):
            raise NotFound(text, status=status, api_message=message)
        kind = create_refusal(message) if creating and path == "/v2/instances" else BadRequest
        if kind is not BadRequest and 400 <= status < 500:
            # A refused create: sold out, not offered there, the account's limit
            # (docs/offerings.md); the pass tries the next offering or stops its creates.
            raise kind(text, status=status, api_message=message)
        hint = None
        if status == 403:
            hint = "The API key may lack the permission (ACL) for this action."
        elif 300 <= status < 400:
            where = response.headers.get("Location", "?")
            try:  # absolute, so that mask_url drops a user:password however it was written
                where = mask_url(str(httpx.URL(self.base_url).join(where)))
            except (httpx.InvalidURL, ValueError, TypeError):
                where = "(a Location that is not a URL)"
            hint = f"VULTR_API_URL redirects to {self._redact(where)}; use that."
        raise BadRequest(text, status=status, api_message=message, hint=hint)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Retry) and exc.retry_after is not None:
            return min(exc.retry_after, MAX_RETRY_AFTER)
        return float(self._backoff(state))

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        reason = exc.error.message if isinstance(exc, _Retry) else repr(exc)
        log.debug("retrying in %.2fs (attempt %d failed: %s)", delay, state.attempt_number, reason)

    def _log_attempt(
        self, method: str, path: str, status: int | str, attempt: int, started: float
    ) -> None:
        elapsed_ms = (time.monotonic() - started) * 1000
        log.debug(
            "%s %s -> %s (attempt %d/%d, %.0f ms)",
            method,
            path,
            status,
            attempt,
            self.max_attempts,
            elapsed_ms,
        )

    def _redact(self, text: str) -> str:
        return redact(text, secret_values([self._key.reveal(), http_userinfo(self.base_url)]))


_BAD_BODY_HINT = "A proxy or VULTR_API_URL may point at something other than the Vultr API."
_DEADLINE_HINT = (
    "Vultr (or a proxy on the way) answered too slowly or not at all; the next pass tries "
    "again. Check https://status.vultr.com and VULTR_API_URL."
)


def _object(body: Any, key: str) -> dict[str, Any]:
    """``body[key]`` as a dict, or a VultrError saying the answer was not what Vultr sends."""
    value = body.get(key) if isinstance(body, dict) else None
    if not isinstance(value, dict):
        raise VultrError(f"The API answer has no {key!r} object.", hint=_BAD_BODY_HINT)
    return value


def _created(body: Any, key: str) -> dict[str, Any]:
    """The object a create answered with; one with no id (whatever else it says) tells nothing
    of what was made, which the caller's AmbiguousCreate looks up."""
    value = _object(body, key)
    if not isinstance(value.get("id"), str) or not value["id"].strip():
        raise VultrError(f"The API answer's {key!r} object has no id.", hint=_BAD_BODY_HINT)
    return value


def _seg(value: str) -> str:
    """A path segment: ids are opaque, so refuse anything that would change the path or the
    request (``/``, ``?``, ``#``, ``%``, spaces, control characters): Vultr's ids are UUIDs and
    plan or region slugs, letters, digits, ``-``, ``_`` and ``.``."""
    if not _SEGMENT.fullmatch(value) or value in (".", ".."):
        raise UsageError(f"{value!r} is not a valid Vultr id.")
    return value


_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,128}")
