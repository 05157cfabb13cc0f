"""What the Vultr API returns, as frozen values.

``from_api`` takes the JSON object as sent and tolerates unknown and missing fields (Vultr adds
fields over time; old and new bodies differ). Each value keeps the body in ``raw``, which is
left out of ``repr`` and equality.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from vultrscale.core.model import PlanPrice, frozen_from


def _str(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if type(value) is str:  # the common case first: no conversion
        return value
    return "" if value is None else str(value)


def _int(data: dict[str, Any], key: str) -> int:
    value = data.get(key)
    if type(value) is int:  # the common case first (bool is not int here)
        return value
    if isinstance(value, bool):
        return int(value)
    try:
        return int(value) if value is not None and value != "" else 0
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(1e999), int(inf)
        return 0


def _float(data: dict[str, Any], key: str) -> float:
    value = _opt_float(data, key)
    return 0.0 if value is None else value


def _opt_float(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _opt_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(1e999), int(inf)
        return None


def _strings(data: dict[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key)
    if isinstance(value, (list, tuple)):  # noqa: UP038 (the tuple form is faster)
        return tuple([v if type(v) is str else str(v) for v in value if v is not None])
    return ()


def parse_time(value: object) -> datetime | None:
    """An API timestamp (``2021-09-14T13:22:20+00:00``, or the older ``2013-12-19 14:45:41``,
    read as UTC) as an aware datetime; None when absent or unreadable."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())  # Python >= 3.11 reads a "Z" too
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class VInstance:
    """An instance (``GET /v2/instances/{id}``): the fields the scaler reads.

    A pass parses every instance of the fleet, so only what some code reads is a field (the
    pass, ``status`` and ``instances``); the rest of the object (``os``, ``ram``, ``hostname``,
    the create response's ``default_password``, fields Vultr adds later) stays in ``raw``."""

    id: str
    label: str = ""
    status: str = ""  # pending | active | suspended | resizing
    power_status: str = ""  # running | stopped
    server_status: str = ""  # none | locked | installingbooting | ok
    main_ip: str = ""
    internal_ip: str = ""
    region: str = ""
    plan: str = ""
    date_created: datetime | None = None
    tags: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> VInstance:
        """Build from the API object, which becomes ``raw`` (not copied: the caller hands over
        a body it decoded and no longer changes)."""
        tags = _strings(data, "tags")
        if not tags and data.get("tag"):  # the deprecated single tag of older responses
            tags = (str(data["tag"]),)
        return frozen_from(
            cls,
            {
                "id": _str(data, "id"),
                "label": _str(data, "label"),
                "status": _str(data, "status"),
                "power_status": _str(data, "power_status"),
                "server_status": _str(data, "server_status"),
                "main_ip": _str(data, "main_ip"),
                "internal_ip": _str(data, "internal_ip"),
                "region": _str(data, "region"),
                "plan": _str(data, "plan"),
                "date_created": parse_time(data.get("date_created")),
                "tags": tags,
                "raw": data,
            },
        )

    @property
    def has_address(self) -> bool:
        """True once Vultr has assigned a routable IPv4 (pending instances show 0.0.0.0)."""
        return self.main_ip not in ("", "0.0.0.0")


@dataclass(frozen=True)
class VSnapshot:
    """A snapshot (``GET /v2/snapshots/{id}``); ``status`` goes pending -> complete."""

    id: str
    description: str = ""
    status: str = ""
    size: int = 0  # bytes
    compressed_size: int = 0  # bytes
    date_created: datetime | None = None
    os_id: int | None = None
    app_id: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> VSnapshot:
        """Build from the API object; unknown fields are kept only in ``raw``."""
        return cls(
            id=_str(data, "id"),
            description=_str(data, "description"),
            status=_str(data, "status"),
            size=_int(data, "size"),
            compressed_size=_int(data, "compressed_size"),
            date_created=parse_time(data.get("date_created")),
            os_id=_opt_int(data, "os_id"),
            app_id=_opt_int(data, "app_id"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class VPlan:
    """A plan (``GET /v2/plans``). ``hourly_cost`` is None when the API does not send it."""

    id: str
    vcpu_count: int = 0
    ram: int = 0  # MB
    disk: int = 0  # GB
    bandwidth: int = 0  # GB per month
    monthly_cost: float = 0.0
    hourly_cost: float | None = None
    type: str = ""
    locations: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def price(self) -> PlanPrice | None:
        """The plan's price; None when Vultr lists none usable. No price is not a price of
        zero: a monthly_cost absent, null or unreadable (parsed as 0.0), read as $0, would pass
        every ceiling, and the budget would limit nothing."""
        monthly, hourly = self.monthly_cost, self.hourly_cost
        if not (math.isfinite(monthly) and monthly > 0) or (
            hourly is not None and not (math.isfinite(hourly) and hourly > 0)
        ):
            return None
        return PlanPrice(self.id, monthly, hourly)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> VPlan:
        """Build from the API object; unknown fields are kept only in ``raw``."""
        return cls(
            id=_str(data, "id"),
            vcpu_count=_int(data, "vcpu_count"),
            ram=_int(data, "ram"),
            disk=_int(data, "disk"),
            bandwidth=_int(data, "bandwidth"),
            monthly_cost=_float(data, "monthly_cost"),
            hourly_cost=_opt_float(data, "hourly_cost"),
            type=_str(data, "type"),
            locations=_strings(data, "locations"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class VRegion:
    """A region (``GET /v2/regions``)."""

    id: str
    city: str = ""
    country: str = ""
    continent: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> VRegion:
        """Build from the API object; unknown fields are kept only in ``raw``."""
        return cls(
            id=_str(data, "id"),
            city=_str(data, "city"),
            country=_str(data, "country"),
            continent=_str(data, "continent"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class VAccount:
    """The account (``GET /v2/account``). A negative ``balance`` is credit."""

    name: str = ""
    email: str = ""
    balance: float = 0.0
    pending_charges: float = 0.0  # unbilled charges of this month, USD
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> VAccount:
        """Build from the API object; unknown fields are kept only in ``raw``."""
        return cls(
            name=_str(data, "name"),
            email=_str(data, "email"),
            balance=_float(data, "balance"),
            pending_charges=_float(data, "pending_charges"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class VCharge:
    """One line of ``GET /v2/billing/pending-charges``."""

    description: str = ""
    start_date: datetime | None = None
    end_date: datetime | None = None
    units: float = 0.0
    unit_type: str = ""  # "hours", ...
    unit_price: float = 0.0
    total: float = 0.0
    product: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> VCharge:
        """Build from the API object; unknown fields are kept only in ``raw``."""
        return cls(
            description=_str(data, "description"),
            start_date=parse_time(data.get("start_date")),
            end_date=parse_time(data.get("end_date")),
            units=_float(data, "units"),
            unit_type=_str(data, "unit_type"),
            unit_price=_float(data, "unit_price"),
            total=_float(data, "total"),
            product=_str(data, "product"),
            raw=dict(data),
        )
