"""The simulator's requests and answers as a transport carries them, and the API's shapes of
them: JSON bodies, ``{"error", "status"}`` errors, base64 cursors and user-data."""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

JSON = dict[str, Any]


class SimRequest(NamedTuple):
    """A transport-neutral request. ``headers`` has lower-case names."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    client: str


@dataclass(frozen=True)
class SimResponse:
    """What to send back. ``drop`` means: close the connection without any response."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    drop: bool = False

    def json(self) -> Any:
        """The body decoded as JSON (test helper)."""
        return json.loads(self.body)


class RequestRecord(NamedTuple):
    """One handled request as the client saw it; ``status`` 0 means the connection dropped."""

    method: str
    path: str
    status: int


class SimulatorError(ValueError):
    """A test helper was called with something the simulated API would refuse."""


def iso(when: datetime) -> str:
    return when.replace(microsecond=0).isoformat()


def json_response(
    status: int, payload: Any, headers: Mapping[str, str] | None = None
) -> SimResponse:
    hdrs = {"Content-Type": "application/json"}
    hdrs.update(headers or {})
    return SimResponse(status, json.dumps(payload).encode(), hdrs)


def error(status: int, message: str, headers: Mapping[str, str] | None = None) -> SimResponse:
    """The API's error shape: ``{"error": message, "status": status}``."""
    return json_response(status, {"error": message, "status": status}, headers)


def no_content() -> SimResponse:
    return SimResponse(204)


def page_cursor(kind: str, item_id: str) -> str:
    return base64.b64encode(f"{kind}__{item_id}".encode()).decode()


def matches(rule_method: str, pattern: str, method: str, path: str) -> bool:
    return rule_method in ("*", method) and fnmatch.fnmatchcase(path, pattern)


def not_allowed(allowed: str) -> SimResponse:
    return error(405, f"Method not allowed. Must be one of: {allowed}")


def parse_body(raw: bytes) -> JSON | None:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def valid_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def decode_user_data(b64: str) -> str:
    return base64.b64decode(b64).decode("utf-8", errors="replace") if b64 else ""


def default_message(status: int) -> str:
    return {
        400: "Bad request.",
        401: "Invalid API token.",
        403: "You are not allowed to perform that action.",
        404: "Not found.",
        429: "rate limit exceeded",
        500: "Internal server error.",
        502: "Bad gateway.",
        503: "Service unavailable.",
        504: "Gateway timeout.",
    }.get(status, f"HTTP {status}")
