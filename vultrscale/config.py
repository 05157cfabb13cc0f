"""Typed, frozen configuration: ``load(path, env, flags)`` and a validation listing every problem.

Precedence: command-line flag > environment > config file > default (README "Configuration").
Secrets come only from the environment or a ``.env`` file next to the config file, never from the
TOML.
Settings can also be given in the environment as ``VULTRSCALE_<SECTION>_<KEY>``
(``VULTRSCALE_POLICY_MAX_INSTANCES=3``).
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import math
import os
import re
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from vultrscale.errors import (
    ConfigError,
    UsageError,
    conninfo_problem,
    http_userinfo,
    is_text,
    parse_conninfo,
    redact,
    secret_values,
    url_user,
)
from vultrscale.errors import mask_url as mask_url  # re-exported: part of config's contract
from vultrscale.errors import url_password as url_password
from vultrscale.forecast import POOLS as FORECAST_POOLS

DEFAULT_API_URL = "https://api.vultr.com"
# The secrets, read only from the environment or the .env next to the config file.
SECRET_NAMES = ("VULTR_API_KEY", "DATABASE_URL", "WORKER_DATABASE_URL")
DEFAULT_CONFIG_NAME = "vultrscale.toml"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
# The longest duration anything accepts: longer than any wait, cooldown or look-back that
# makes sense (a year), and far below timedelta's own limit, so no sum with "now" overflows.
MAX_DURATION = timedelta(days=366)
DURATION_FORM = "a duration like 90s, 5m, 1h or 2d (a bare number is seconds), at most 366d"
# Names and ids are matched whole, always with ``fullmatch``: ``$`` in ``re.match`` also
# matches before a final newline, and "x\n" made a second fleet, a role whose name ends in a
# newline, a queue no worker takes.
SERVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
_FLEET_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_LABEL_PREFIX = re.compile(r"[a-z0-9][a-z0-9-]{0,30}")
_APP = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
_SSH_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# The one rule for queue names: the worker's [worker] queue, `enqueue --queue`, `worker --queue`.
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
QUEUE_NAME_FORM = "1-64 letters, digits, '_', '.', ':' or '-'"
# Vultr region ids are short lowercase words ("ewr", "fra", "sjc"), plan ids lowercase words
# joined by '-' or '.' ("vc2-1c-2gb", "voc-c-2c-4gb-50s-amd", and the smallest plans
# "vc2-1c-0.5gb", "vc2-1c-0.5gb-v6"); both go into URL paths and queries.
_REGION = re.compile(r"[a-z][a-z0-9-]{1,15}")
_PLAN = re.compile(r"(?=.{2,64}\Z)[a-z0-9]+(?:[.-][a-z0-9]+)*", re.S)
PLAN_FORM = "lowercase letters and digits joined by '-' or '.', such as \"vc2-1c-2gb\""
# Vultr's ids for snapshots, VPCs and firewall groups are UUIDs (API notes: "string (UUID)";
# the OpenAPI example "cb676a46-66fd-4dfb-b839-443f2e6c0b60"); they go into URL paths.
VULTR_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
VULTR_ID_FORM = 'a Vultr id, a lowercase UUID such as "cb676a46-66fd-4dfb-b839-443f2e6c0b60"'
# Vultr's keys are 36 letters and digits; a proxy's token may be longer (a JWT is often 1-2 KB),
# but a header value is visible ASCII and servers refuse headers past about 8 KB (a raw 431 for
# a 1 MB key).
MAX_API_KEY = 4096

# Values quoted in messages are cut short: a 100 KB name is not echoed whole, and a deeply
# nested TOML array is not walked by repr.
_SHORT = reprlib.Repr()
_SHORT.maxstring = 80
_SHORT.maxother = 80
_SHORT.maxlevel = 2
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = 4


def shown(value: object) -> str:
    """``repr(value)``, cut short for a message."""
    return _SHORT.repr(value)


def queue_name_problem(name: str) -> str | None:
    """None if ``name`` is a queue name the worker can take jobs from, else what is allowed."""
    return None if QUEUE_NAME.fullmatch(name) else f"{shown(name)} must be {QUEUE_NAME_FORM}"


_API_URL_FORM = (
    "an http(s) URL such as https://api.vultr.com (a proxy with credentials: "
    "https://USER:PASSWORD@proxy.example:8443)"
)
# The userinfo ends at the last '@' (errors.http_userinfo reads it alike): a password with an
# unencoded '/' or '?' is then not taken for the host or the path.
_HTTP_URL_PARTS = re.compile(r"(?P<scheme>[A-Za-z][\w+.-]*)://(?:.*@)?(?P<rest>[^@]*)", re.S)
_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
# An [IPv6] host, whole, then an optional :PORT (checked as any port).
_BRACKETED_HOST = re.compile(r"\[(?P<ip>[^\[\]]*)\](?::[^\[\]]*)?")


def _http_host_ok(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return False
    labels = ascii_host.removesuffix(".").split(".")
    return len(ascii_host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


def api_url_problem(url: str) -> str | None:
    """None if ``url`` is an http(s) URL the client can send the API key to as it is, else what
    is wrong (never quoting the URL: it may hold a proxy's password). Parsed strictly: a port
    past 65535 wrapped modulo 65536 and sent the key to whatever listened there."""
    name = "VULTR_API_URL"
    if not is_text(url) or any(c.isspace() or not c.isprintable() for c in url):
        return f"{name} holds spaces or control characters; expected {_API_URL_FORM}"
    m = _HTTP_URL_PARTS.fullmatch(url)
    if m is None or m["scheme"].lower() not in ("http", "https"):
        return f"{name} is not {_API_URL_FORM}"
    bracket_problem = _bracketed_host_problem(m["rest"])
    if bracket_problem:
        return f"{name} {bracket_problem}"
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(f"http://{m['rest']}")
    except ValueError:  # what the checks above missed: never "unexpected ValueError", exit 1
        return f"{name} is not {_API_URL_FORM}"
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        return f"{name} has a port that is not a number from 1 to 65535; expected {_API_URL_FORM}"
    if not parts.hostname or not _http_host_ok(parts.hostname):
        return f"{name} names no valid host (a name, an IPv4 or an [IPv6] address)"
    if parts.query or parts.fragment or "?" in m["rest"] or "#" in m["rest"]:
        return f"{name} carries a query or fragment ('?...', '#...'); expected {_API_URL_FORM}"
    return None


def _bracketed_host_problem(rest: str) -> str | None:
    """What is wrong with the brackets of a URL's host (``rest``: from the host on), if any:
    urlsplit raised ValueError for some ('[::1/'), took others ('[::1]x') that httpx refuses."""
    host_port = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "[" not in host_port and "]" not in host_port:
        return None
    m = _BRACKETED_HOST.fullmatch(host_port)
    if m is None:
        return (
            "has a '[' or ']' out of place: an IPv6 host is written whole in brackets, then "
            "an optional :PORT (https://[2001:db8::5]:8443)"
        )
    try:
        ipaddress.IPv6Address(m["ip"])
    except ValueError:
        return (
            "has something other than an IPv6 address in its [brackets]: write an IPv4 address "
            "or a name without them (http://127.0.0.1:8080), an IPv6 one within (http://[2001:db8::5])"
        )
    return None


def _port_problem(conninfo: str, name: str) -> str | None:
    """A port outside 1-65535 in a connection string libpq reads (it fails only at connect)."""
    parsed = parse_conninfo(conninfo) or {}
    ports = [p for p in parsed.get("port", "").split(",") if p]
    if any(not 1 <= int(p) <= 65535 for p in ports):
        return f"{name} names a port outside 1-65535"
    return None


def to_duration(value: object) -> timedelta:
    """``90s``, ``5m``, ``1h``, ``1.5h``, ``250ms`` or a bare number of seconds, as a timedelta.

    Finite, not negative and at most MAX_DURATION, else ValueError saying what is allowed.
    """
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if seconds is None or not math.isfinite(seconds):
        raise ValueError(f"expected {DURATION_FORM}, got {shown(value)}")
    if not 0 <= seconds <= MAX_DURATION.total_seconds():
        raise ValueError(f"{shown(value)} is out of range: expected {DURATION_FORM}")
    return timedelta(seconds=seconds)


# A plain, unquoted Postgres identifier (63 bytes at most), so it needs no quoting anywhere.
_DB_ROLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def parse_duration(value: object, key: str = "duration") -> timedelta:
    """:func:`to_duration`, its ValueError naming ``key``."""
    try:
        return to_duration(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def toml_value(value: object) -> str:
    """A setting's value (as ``Config.settings`` gives it) written as TOML writes it inline: a
    quoted string, true or false, a number, a list or an inline table of them."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def format_duration(td: timedelta) -> str:
    seconds = td.total_seconds()
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


class Secret:
    """A string that never shows itself in repr, str or format."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    def __str__(self) -> str:
        return "***" if self._value else ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class Offering:
    """A place and size the fleet may create instances in: a Vultr region and plan.
    ``jobs_per_instance`` 0: the queue's (``queue.jobs_per_instance``). A fleet lists them in
    order of preference (``[[fleet.offerings]]``); without the list it has one, ``fleet.region``
    and ``fleet.plan`` (``vultrscale.offerings.of``)."""

    region: str
    plan: str
    jobs_per_instance: int = 0

    @property
    def name(self) -> str:
        """How status, the ledger and the metrics name it: ``region/plan``."""
        return f"{self.region}/{self.plan}"


@dataclass(frozen=True)
class FleetConfig:
    name: str = "workers"
    region: str = "ewr"
    plan: str = "vc2-1c-2gb"
    snapshot_id: str = ""
    tag: str = "vultrscale-workers"
    label_prefix: str = "worker"
    service: str = "worker"
    ssh_user: str = "worker"
    ssh_key: str = "~/.ssh/vultrscale_ed25519"
    ssh_port: int = 22
    ssh_address: str = "main_ip"
    vpc_ids: tuple[str, ...] = ()
    firewall_group_id: str = ""
    # In order of preference; empty: the one offering of region and plan above.
    offerings: tuple[Offering, ...] = ()
    # How long an offering whose create Vultr refused (sold out, not available) is skipped.
    unavailable_for: timedelta = timedelta(minutes=3)


@dataclass(frozen=True)
class WorkerConfig:
    app: str = "myjobs:handle"
    concurrency: int = 4
    drain_seconds: float = 20.0
    lease_seconds: float = 60.0
    queue: str = "default"
    # The database role the workers log in as; `vultrscale db init` creates it and grants it
    # only what the worker runtime uses. Empty: db init leaves roles alone (you manage them).
    db_role: str = "vultrscale_worker"
    # Opt-in: without WORKER_DATABASE_URL, put the scaler's own DATABASE_URL into user-data.
    # Off by default because user-data is readable by any process on the instance.
    use_scaler_database_url: bool = False
    # How long the database may stay unreachable before the worker exits 1; 0: the lease time.
    outage_seconds: float = 0.0


@dataclass(frozen=True)
class QueueConfig:
    preset: str = "vultrscale"
    jobs_per_instance: int = 4
    queue: str = ""  # empty: every queue of the preset's table
    ready_sql: str = ""
    in_flight_sql: str = ""
    oldest_ready_seconds_sql: str = ""
    # custom, optional (both or neither): the wait rule's history (db/presets/custom.py)
    recent_jobs_sql: str = ""
    recent_arrivals_sql: str = ""


#: The queue presets (db/presets/, one module each), in the order the README lists them.
QUEUE_PRESETS = ("vultrscale", "procrastinate", "pgqueuer", "graphile-worker", "pg-boss", "custom")


@dataclass(frozen=True)
class FloorConfig:
    cron: str
    timezone: str = "UTC"
    min_instances: int = 1


class WaitTarget:
    """``policy.target_wait``: a fixed duration, or "auto" (``fixed`` None): a share of the
    learned boot time (``waits.target``). "0s" is the depth rule alone."""

    __slots__ = ("fixed",)
    AUTO = "auto"

    def __init__(self, fixed: timedelta | None = None) -> None:
        object.__setattr__(self, "fixed", fixed)

    fixed: timedelta | None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("WaitTarget is immutable")

    def __reduce__(self) -> tuple[type[WaitTarget], tuple[timedelta | None]]:
        # Pickled through __init__: the default restores the slot with setattr, refused above
        # (simulate's worker processes get the config so, and died on it).
        return (WaitTarget, (self.fixed,))

    @classmethod
    def parse(cls, value: object, key: str = "policy.target_wait") -> WaitTarget:
        if isinstance(value, WaitTarget):
            return value
        if isinstance(value, str) and value.strip().lower() == cls.AUTO:
            return cls()
        try:
            return cls(to_duration(value))
        except ValueError as exc:
            raise ValueError(f'{key}: {exc}, or "auto" (a share of the boot time)') from None

    @property
    def off(self) -> bool:
        """0s: no wait rule, the depth rule alone."""
        return self.fixed is not None and not self.fixed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WaitTarget) and other.fixed == self.fixed

    def __hash__(self) -> int:
        return hash(self.fixed)

    def __str__(self) -> str:
        return self.AUTO if self.fixed is None else format_duration(self.fixed)

    def __repr__(self) -> str:
        return f"WaitTarget({str(self)!r})"


FORECAST_MODES = ("off", "observe", "scale")


@dataclass(frozen=True)
class ForecastConfig:
    """``[policy.forecast]``: the floor forecast from the queue's history (``forecast``)."""

    # off: not read at all; observe: computed and shown, never acted on (as AWS's predictive
    # scaling starts); scale: it raises the floor.
    mode: str = "observe"
    weeks: int = 4  # weeks of history looked back
    min_history: timedelta = timedelta(days=7)  # less history than this: no forecast
    slot: timedelta = timedelta(hours=1)  # the week is cut into slots this long
    quantile: float = 0.75  # the high value kept per slot across the weeks (nearest rank)
    refresh: timedelta = timedelta(hours=1)  # the cached profile is recomputed this often
    # A slot's load in instances (jobs at once / jobs_per_instance) has its fraction of an
    # instance rounded up from this much on, else down: 0 keeps an instance for any load (a
    # trickle of a job an hour kept one warm all day in simulate: +15% on a spiky week).
    round_up_from: float = 0.5
    # A slot's work must be done within this (0s: within the slot, its mean load). Bursts that
    # bring a slot's work in minutes need their instances warm, not the mean's one or two.
    clear_within: timedelta = timedelta(0)
    # "week": a slot learns from the same slot of past weeks; "weekday": from the same time of
    # every weekday (Saturday and Sunday apart), usable after a day (forecast.POOLS).
    pool: str = "week"


@dataclass(frozen=True)
class PolicyConfig:
    min_instances: int = 0
    max_instances: int = 5
    scale_up_cooldown: timedelta = timedelta(seconds=60)
    scale_down_cooldown: timedelta = timedelta(minutes=5)
    idle_before_scale_down: timedelta = timedelta(seconds=90)
    max_step_up: int = 0
    boot_timeout: timedelta = timedelta(minutes=15)
    billing_hour_aware: bool = True
    on_signal_error: str = "hold"
    floor: tuple[FloorConfig, ...] = ()
    # Work returns while an instance drains (its delete not sent): start its worker again
    # rather than boot a new one (README "The decision").
    revive: bool = True
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    # Boot only when it helps (vultrscale.waits): a create is made only if the queue's
    # estimated wait would pass this; "auto": a share of the learned boot time (the workload
    # suite, docs/policy.md); 0s turns the rule off (the plain depth rule).
    target_wait: WaitTarget = field(default_factory=WaitTarget)
    # Create to worker up, until the ledger holds enough boots to learn it (vultrscale.boottime).
    boot_time: timedelta = timedelta(minutes=12)


@dataclass(frozen=True)
class BudgetConfig:
    monthly_ceiling_usd: float = 50.0


@dataclass(frozen=True)
class DrainConfig:
    timeout: timedelta = timedelta(minutes=5)
    poll_interval: timedelta = timedelta(seconds=10)
    unreachable_grace: timedelta = timedelta(minutes=10)


@dataclass(frozen=True)
class SimulateConfig:
    """The world `vultrscale simulate` replays in (README "Tune before you deploy"); the pass
    never reads it. Kept in the fleet's file so a sweep varies it like any other key."""

    # Create to worker up: a duration or MIN..MAX (drawn uniformly). Snapshot restores take
    # 10 to 15 minutes at Vultr on top of provisioning (Vultr's snapshot docs).
    boot_time: str = "10m..15m"
    duration_scale: float = 1.0  # every job's run time times this (a slower or faster release)
    # Faults, each off at 0: stock-outs (creates refused as the plan runs out in the region),
    # 429 bursts (every API call refused), and instances that never boot.
    stockout_every: timedelta = timedelta(0)  # mean time between stock-outs
    stockout_for: timedelta = timedelta(minutes=30)
    throttle_every: timedelta = timedelta(0)  # mean time between 429 bursts
    throttle_for: timedelta = timedelta(minutes=2)
    dead_boot_share: float = 0.0  # share of creates that never boot (0 to 1)
    # The offering the stock-outs hit, REGION/PLAN; empty: the fleet's first (today its only)
    # one, fleet.region/fleet.plan. Another offering is never refused by them.
    stockout_offering: str = ""


_OFFERING = re.compile(r"[A-Za-z0-9._-]+/[A-Za-z0-9._-]+")


def duration_range(text: str, key: str) -> tuple[float, float]:
    """``12m`` (fixed) or ``10m..15m`` (a range) in seconds; ValueError naming ``key``."""
    lo_s, sep, hi_s = text.partition("..")
    lo = parse_duration(lo_s.strip(), key).total_seconds()
    hi = parse_duration(hi_s.strip(), key).total_seconds() if sep else lo
    if hi < lo:
        raise ValueError(f"{key}: {text!r} ends before it starts (write MIN..MAX, e.g. 10m..15m)")
    return lo, hi


@dataclass(frozen=True)
class Secrets:
    api_key: Secret = field(default_factory=lambda: Secret(""))
    database_url: Secret = field(default_factory=lambda: Secret(""))
    worker_database_url: Secret = field(default_factory=lambda: Secret(""))
    # user:password of a VULTR_API_URL that carries them (a proxy with basic auth)
    api_url_userinfo: Secret = field(default_factory=lambda: Secret(""))
    # The secrets set but empty in the environment while the .env has a value: the environment
    # wins (README "Configuration"), so the .env's value is hidden, and saying "not set" misleads.
    hidden_by_env: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Secrets:
        """The secrets as the environment gives them (VULTR_API_KEY, the database URLs)."""
        return cls(
            api_key=Secret(env.get("VULTR_API_KEY", "").strip()),
            database_url=Secret(env.get("DATABASE_URL", "").strip()),
            worker_database_url=Secret(env.get("WORKER_DATABASE_URL", "").strip()),
            api_url_userinfo=Secret(http_userinfo(env.get("VULTR_API_URL", "").strip()) or ""),
        )

    def missing(self, name: str, hint: str) -> UsageError:
        """The error for the secret ``name`` that a command needs and does not have: not set,
        or set but empty in the environment over a value in the .env."""
        if name in self.hidden_by_env:
            return UsageError(
                f"{name} is set but empty in the environment, which overrides its value in the "
                ".env.",
                hint=f"Unset it (`unset {name}`) to use the .env's value, or give it a value.",
            )
        return UsageError(f"{name} is not set.", hint=hint)

    def values(self) -> list[str]:
        """Every secret string, including the password inside the database URLs."""
        return secret_values(
            s.reveal()
            for s in (
                self.api_key,
                self.database_url,
                self.worker_database_url,
                self.api_url_userinfo,
            )
        )

    def problems(self) -> list[str]:
        """The database URLs libpq cannot read (each message says which form is expected), and
        an API key no server takes in a header (never shown: only what is wrong with it)."""
        named = (
            ("DATABASE_URL", self.database_url),
            ("WORKER_DATABASE_URL", self.worker_database_url),
        )
        found = []
        for name, secret in named:
            problem = conninfo_problem(secret.reveal(), name) if secret else None
            if problem is None and secret:
                problem = _port_problem(secret.reveal(), name)
            if problem:
                found.append(problem)
        key = self.api_key.reveal()
        if len(key) > MAX_API_KEY:
            found.append(
                f"VULTR_API_KEY is {len(key)} characters long, not an API key (Vultr's have 36; "
                f"at most {MAX_API_KEY} are taken): copy the key again from Vultr's "
                "Account > API page"
            )
        elif key and not re.fullmatch(r"[\x21-\x7e]+", key):
            found.append(
                "VULTR_API_KEY holds spaces, control characters or characters that are not "
                "ASCII, which no HTTP header carries: copy the key again from Vultr's "
                "Account > API page"
            )
        return found


@dataclass(frozen=True)
class Config:
    fleet: FleetConfig = field(default_factory=FleetConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    simulate: SimulateConfig = field(default_factory=SimulateConfig)
    secrets: Secrets = field(default_factory=Secrets)
    api_url: str = DEFAULT_API_URL
    source: str = "defaults"  # which file (if any) the values came from

    def worker_database_url(self) -> Secret:
        """The address the workers use (it goes into user-data): WORKER_DATABASE_URL, or the
        scaler's DATABASE_URL only with ``worker.use_scaler_database_url``. UsageError (exit 2)
        otherwise: user-data is readable on the instance, so the scaler's credentials are
        never put there unless the user asked for it."""
        if self.secrets.worker_database_url:
            return self.secrets.worker_database_url
        if "WORKER_DATABASE_URL" in self.secrets.hidden_by_env:
            raise self.secrets.missing("WORKER_DATABASE_URL", "")
        if not self.worker.use_scaler_database_url:
            raise UsageError(
                "WORKER_DATABASE_URL is not set: new instances would boot with the scaler's own "
                "DATABASE_URL, readable by any process on them",
                hint=(
                    f"Run `vultrscale db init` (it creates the role {self.worker.db_role or '...'}"
                    " for the workers) and set WORKER_DATABASE_URL=postgresql://"
                    f"{self.worker.db_role or 'ROLE'}:PASSWORD@HOST:5432/DB; or, knowingly, set"
                    " use_scaler_database_url = true in [worker]."
                ),
            )
        if "DATABASE_URL" in self.secrets.hidden_by_env:
            raise self.secrets.missing("DATABASE_URL", "")
        if not self.secrets.database_url:
            raise UsageError(
                "DATABASE_URL is not set: the worker would not know where its queue is",
                hint="Set WORKER_DATABASE_URL, the address and role the workers use.",
            )
        return self.secrets.database_url

    def settings(self, *, mask: bool = True) -> dict[str, dict[str, Any]]:
        """The settings' sections as plain data, every secret masked. ``mask=False`` only for
        a file ``load`` reads back (the demo's pass config, mode 0600): the masking of a
        secret's fragments also masks a setting that merely shares six characters with the
        key (the demo's key began "demo-", as every demo's fleet name does, and 1 demo in 16
        wrote its fleet name as "***..."). No secret is a setting, but a password pasted into
        one would be in that file as it is in the config the user wrote."""
        secrets = self.secrets.values() if mask else ()
        out = {
            section: _plain(getattr(self, section), secrets)
            for section in ("fleet", "worker", "queue", "policy", "budget", "drain", "simulate")
        }
        if self.fleet.offerings:  # they replace fleet.region and plan, which keep unused defaults
            del out["fleet"]["region"], out["fleet"]["plan"]
        return out

    def masked(self) -> dict[str, Any]:
        """The resolved configuration as plain data with every secret masked, for display."""
        out: dict[str, Any] = dict(self.settings())
        db = self.secrets.database_url.reveal()
        wdb = self.secrets.worker_database_url.reveal()
        scaler_url_ok = self.worker.use_scaler_database_url
        out["environment"] = {
            "VULTR_API_URL": mask_url(self.api_url),
            "VULTR_API_KEY": "*** (set)" if self.secrets.api_key else "(not set)",
            "DATABASE_URL": mask_url(db) if db else "(not set)",
            "WORKER_DATABASE_URL": mask_url(wdb) if wdb else _NO_WORKER_URL[scaler_url_ok],
        }
        for name in self.secrets.hidden_by_env:
            out["environment"][name] = _HIDDEN_BY_ENV
        out["source"] = self.source
        return out


_HIDDEN_BY_ENV = "(set but empty in the environment, which overrides its value in the .env)"
_NO_WORKER_URL = {
    True: "(not set: DATABASE_URL is used, worker.use_scaler_database_url = true)",
    False: "(not set: reconcile and cloud-init render refuse to create instances)",
}


@dataclass(frozen=True)
class WorkerLogin:
    """Which role the workers log in as, from where, and what is unsafe about it."""

    source: str  # the variable the workers' address comes from; "" when there is none
    role: str | None  # the user that address names; None when it names none
    warnings: tuple[str, ...]


def worker_login(cfg: Config) -> WorkerLogin:
    """What ``config check`` reports about the workers' database login (no I/O)."""
    wurl = cfg.secrets.worker_database_url.reveal()
    scaler_role = url_user(cfg.secrets.database_url.reveal())
    want = cfg.worker.db_role
    if not wurl and not cfg.worker.use_scaler_database_url:
        return WorkerLogin(
            "",
            None,
            (
                "WORKER_DATABASE_URL is not set: reconcile and cloud-init render refuse to create "
                f"instances; set it to the role {want or 'of your workers'} (`vultrscale db init`"
                " creates it)",
            ),
        )
    if not wurl:
        return WorkerLogin(
            "DATABASE_URL (worker.use_scaler_database_url = true)",
            scaler_role,
            (
                "workers get the scaler's own DATABASE_URL: any process on an instance can read "
                "it from user-data and write the scaler's tables; set WORKER_DATABASE_URL "
                f"to the role {want or 'of your workers'} instead",
            ),
        )
    role = url_user(wurl)
    warnings = []
    if role is not None and role == scaler_role:
        warnings.append(
            f"WORKER_DATABASE_URL logs in as {role}, the scaler's own role: workers can write the "
            f"scaler's tables; use the role {want or 'made for the workers'} instead"
        )
    elif want and role != want and cfg.queue.preset == "vultrscale":
        warnings.append(
            f"WORKER_DATABASE_URL logs in as {role or '(no user named)'}, but `vultrscale db "
            f"init` grants worker.db_role = {want}: name that role in the URL"
        )
    return WorkerLogin("WORKER_DATABASE_URL", role, tuple(warnings))


def queue_warnings(cfg: Config) -> tuple[str, ...]:
    """What ``config check`` warns about the queue the scaler counts (no I/O).

    With the built-in queue the fleet's workers take only ``worker.queue``, while the scaler
    counts ready jobs of ``queue.queue`` (empty: every queue of the table). Jobs counted there
    that no fleet worker takes are demand that never goes away: the fleet scales up to
    ``policy.max_instances`` and keeps paying. Only a warning: ``queue.queue`` keeps its
    documented meaning and default, so no existing fleet starts counting other jobs."""
    q, want = cfg.queue, cfg.worker.queue
    if q.preset != "vultrscale" or q.queue == want:
        return ()
    fix = f'set [queue] queue = "{want}"'
    if not q.queue:
        return (
            f'queue.queue is "" (every queue of the jobs table) but the fleet\'s workers take '
            f'only worker.queue = "{want}": jobs enqueued on any other queue count as demand no '
            f"worker takes, and the fleet scales up to policy.max_instances and stays there; {fix}",
        )
    return (
        f'queue.queue = "{q.queue}" but the fleet\'s workers take only worker.queue = "{want}": '
        f'the scaler counts jobs of "{q.queue}", which no worker takes (the fleet scales up to '
        f'policy.max_instances and stays there), and not those of "{want}"; {fix}',
    )


def _plain(value: Any, secrets: Sequence[str] = ()) -> Any:
    """``value`` as plain data; every string with ``secrets`` masked before anything formats
    it (a password pasted into another key was printed, and a repr escaped it past the
    redaction of the finished text)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), secrets) for f in dataclasses.fields(value)}
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, WaitTarget):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(v, secrets) for v in value]
    return redact(value, secrets) if isinstance(value, str) else value


# --- loading ---------------------------------------------------------------------------------

_SECTIONS: dict[str, type] = {
    "fleet": FleetConfig,
    "worker": WorkerConfig,
    "queue": QueueConfig,
    "policy": PolicyConfig,
    "budget": BudgetConfig,
    "drain": DrainConfig,
    "simulate": SimulateConfig,
}
# VULTRSCALE_* variables that are not VULTRSCALE_<SECTION>_<KEY> settings.
_ENV_NOT_SETTINGS = frozenset(
    {
        "VULTRSCALE_CONFIG",
        "VULTRSCALE_WORKER_ID",
        "VULTRSCALE_INSTANCE_LABEL",
        "VULTRSCALE_TEST_DATABASE_URL",
        "VULTRSCALE_SPEC",  # cloud-init/bake.sh: what pip installs on the base instance
    }
)
_BOM = "\ufeff"
_NESTED_HINT = "Flatten the value: TOML arrays and tables inside each other, thousands deep."


def resolve_config_path(explicit: str | None, env: Mapping[str, str]) -> tuple[Path, bool]:
    """The config file to read and whether it must exist (named explicitly)."""
    if explicit:
        return Path(explicit).expanduser(), True
    if env.get("VULTRSCALE_CONFIG"):
        return Path(env["VULTRSCALE_CONFIG"]).expanduser(), True
    return Path(DEFAULT_CONFIG_NAME), False


def read_dotenv(path: Path, *, strict: bool = True) -> dict[str, str]:
    """KEY=VALUE lines of a .env file (``export`` and quotes allowed); absent file: empty.
    ``strict``: a line python-dotenv cannot read is a ConfigError (else it is left out: for
    redacting what the readable lines hold, on an error path)."""
    if not _is_file(path, ".env file"):
        return {}
    import io

    from dotenv import dotenv_values
    from dotenv.parser import parse_stream

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError([f"cannot read {path}: {exc.strerror}"]) from None
    # Bytes that are not UTF-8 kept as the environment keeps them (lone surrogates): `load`
    # names the variable instead of failing on the whole file.
    text = raw.decode("utf-8", errors="surrogateescape")
    # A line python-dotenv cannot read was dropped with a log line: a DATABASE_URL with its
    # closing quote missing became "DATABASE_URL is not set". Named by its number, never shown.
    bad = [b.original.line for b in parse_stream(io.StringIO(text)) if b.error]
    if bad and strict:
        lines = ", ".join(str(n) for n in bad)
        raise ConfigError(
            [f"{path}: line(s) {lines} are not KEY=VALUE lines python-dotenv can read"],
            hint="Look for a quote left open or a line without '='; quote values with spaces.",
        )
    return {k: v for k, v in dotenv_values(stream=io.StringIO(text)).items() if v is not None}


def load(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    *,
    require_file: bool | None = None,
) -> Config:
    """Load and validate the configuration. Raises ConfigError listing every problem.

    ``path`` None means: ``$VULTRSCALE_CONFIG``, else ``./vultrscale.toml`` if present.
    ``flags`` maps dotted keys (``"policy.max_instances"``) to values given on the command line.
    """
    env = dict(os.environ if env is None else env)
    if path is None:
        cfg_path, must_exist = resolve_config_path(None, env)
    else:
        cfg_path, must_exist = Path(path).expanduser(), True
    if require_file is not None:
        must_exist = require_file

    data: dict[str, Any] = {}
    source = "defaults"
    if _is_file(cfg_path, "config file"):
        try:
            text = cfg_path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                [f"{cfg_path} is not UTF-8 text (byte {exc.start} cannot be read)"],
                hint="Save the config file as UTF-8.",
            ) from None
        except OSError as exc:
            raise ConfigError(
                [f"cannot read {cfg_path}: {exc.strerror}"],
                hint="Make the file readable by this user, or pass another with --config.",
            ) from None
        data = _parse_toml(text, str(cfg_path), "is")
        source = str(cfg_path)
    elif must_exist:
        if _exists(cfg_path):
            raise ConfigError(
                [f"config file {cfg_path} is not a file (a directory?)"],
                hint="Pass the path of a TOML file with --config.",
            )
        raise ConfigError(
            [f"config file {cfg_path} does not exist"],
            hint="Pass an existing file with --config, or unset VULTRSCALE_CONFIG to use defaults.",
        )

    # .env next to the config file (or in the working directory): weaker than the real env.
    dotenv = read_dotenv(cfg_path.parent / ".env" if source != "defaults" else Path(".env"))
    hidden = frozenset(
        n for n in SECRET_NAMES if n in env and not env[n].strip() and dotenv.get(n, "").strip()
    )
    return _resolve(data, {**dotenv, **env}, flags or {}, source, hidden)


def check_text(text: str, where: str) -> None:
    """ConfigError listing every problem ``config check`` would find in ``text`` as the config
    file ``where``, read on its own (no environment, no .env, no secrets); None if it loads."""
    _resolve(_parse_toml(text, where, "would be"), {}, {}, where)


def _parse_toml(text: str, where: str, verb: str) -> dict[str, Any]:
    """The TOML document ``text`` of the config file ``where``; ConfigError with a fix if it
    cannot be read."""
    import tomllib  # here: a command whose config is missing fails without it

    if text.startswith(_BOM):  # tomllib's words were "Invalid statement (at line 1, column 1)"
        raise ConfigError(
            [f"{where} starts with a UTF-8 byte-order mark (BOM), which TOML does not allow"],
            hint="Save the file as UTF-8 without a BOM (an editor's 'UTF-8', not 'UTF-8 with "
            "BOM'), or remove it: sed -i '1s/^\\xEF\\xBB\\xBF//' FILE",
        )
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            [f"{where} {verb} not valid TOML: {exc}"],
            hint="Fix the TOML syntax (strings in quotes, one key per line).",
        ) from None
    except RecursionError:
        raise ConfigError(
            [f"{where} {verb} nested too deeply to read (arrays or tables inside each other)"],
            hint=_NESTED_HINT,
        ) from None


def _is_file(path: Path, what: str) -> bool:
    """``path.is_file()``, a directory on the way that this user cannot search (which
    ``is_file`` raises for) a ConfigError saying so."""
    try:
        return path.is_file()
    except OSError as exc:
        raise _unreachable(path, what, exc) from None


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError as exc:
        raise _unreachable(path, "config file", exc) from None


def _unreachable(path: Path, what: str, exc: OSError) -> ConfigError:
    return ConfigError(
        [
            f"cannot look up the {what} {path}: {exc.strerror or exc} (a directory on its path "
            "cannot be searched by this user?)"
        ],
        hint="Give this user search (x) permission on every directory of the path, or move "
        "the file where it can read it.",
    )


def _resolve(
    data: dict[str, Any],
    merged_env: Mapping[str, str],
    flags: Mapping[str, Any],
    source: str,
    hidden: frozenset[str] = frozenset(),
) -> Config:
    """The config from a file's ``data``, the environment (.env merged in) and the flags;
    ConfigError listing every problem."""
    problems: list[str] = []
    # Every problem at once: a key whose value cannot be read (or that a misspelling left unset)
    # takes its default for the checks below, and their findings about that key are left out:
    # they would be about the default ("min_instances (10) is above max_instances (5)" when the
    # cap set is 20 under a misspelled name).
    failed: set[str] = set()
    # Bytes that are not UTF-8 reach os.environ as lone surrogates: no library takes them (libpq
    # and httpx raise UnicodeEncodeError). Said here by name, never by value (it may be a secret).
    undecodable = sorted(
        n
        for n, v in merged_env.items()
        if (n in _READ_AS_TEXT or n.startswith("VULTRSCALE_")) and not is_text(v)
    )
    problems.extend(f"{n} is not UTF-8 text (in the environment or .env)" for n in undecodable)
    failed.update(k for n in undecodable if (k := _setting_key(n)))
    merged_env = {n: v for n, v in merged_env.items() if n not in undecodable}
    if "secrets" in data or any(k in data for k in ("api_key", "database_url")):
        problems.append(
            "secrets are not read from the config file: set VULTR_API_KEY and DATABASE_URL "
            "in the environment or .env instead"
        )
        data = {k: v for k, v in data.items() if k not in ("secrets", "api_key", "database_url")}

    for key in data:
        if key not in _SECTIONS:
            problems.append(f"unknown section [{key}] (known: {', '.join(_SECTIONS)})")

    # Environment overrides: VULTRSCALE_<SECTION>_<KEY>.
    layered: dict[str, dict[str, Any]] = {
        s: dict(data.get(s, {})) if isinstance(data.get(s), dict) else {} for s in _SECTIONS
    }
    # The settings a misspelled variable or a section that is not a table was meant to set.
    meant_keys: set[str] = set()
    for s in _SECTIONS:
        if s in data and not isinstance(data[s], dict):
            problems.append(f"[{s}] must be a table")
            meant_keys.update(f"{s}.{f.name}" for f in dataclasses.fields(_SECTIONS[s]))
    for name, value in merged_env.items():
        if not name.startswith("VULTRSCALE_") or name in _ENV_NOT_SETTINGS:
            continue
        rest = name[len("VULTRSCALE_") :].lower()
        section, _, key = rest.partition("_")
        if section in _SECTIONS and key:
            layered[section][key] = _FromEnv(value)
        else:  # a misspelled section was ignored: VULTRSCALE_POLICIES_MAX_INSTANCES=1
            problem, meant = _unknown_variable(name)
            problems.append(problem)
            meant_keys.add(_setting_key(meant) or "")
    for dotted, value in flags.items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        layered.setdefault(section, {})[key] = value
    for dotted in meant_keys - {""}:
        section, _, key = dotted.partition(".")
        if key not in layered[section]:  # the key meant is at its default
            failed.add(dotted)

    built: dict[str, Any] = {}
    for section, cls in _SECTIONS.items():
        built[section] = _build_section(section, cls, layered[section], problems, failed)

    api_url = merged_env.get("VULTR_API_URL", "") or DEFAULT_API_URL
    url_problem = api_url_problem(api_url)
    if url_problem:
        problems.append(url_problem)
    secrets = dataclasses.replace(Secrets.from_env(merged_env), hidden_by_env=hidden)
    problems.extend(secrets.problems())
    cfg = Config(**built, secrets=secrets, api_url=api_url.rstrip("/"), source=source)
    problems.extend(p for p in validate(cfg) if not _names_any(p, failed))
    if problems:
        raise ConfigError(problems)
    return cfg


def _names_any(problem: str, keys: set[str]) -> bool:
    """Whether ``problem`` names one of the dotted ``keys`` (``policy.floor`` also names
    ``policy.floor[0].cron``)."""
    return any(re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", problem) for k in keys)


def setting_key_problem(dotted: str) -> str | None:
    """None if ``dotted`` names a setting (``policy.max_instances``), else what is wrong, with
    the nearest setting."""
    keys = setting_keys()
    if dotted in keys:
        return None
    close = difflib.get_close_matches(dotted, keys, n=1)
    guess = f"; did you mean {close[0]}?" if close else ""
    return f"{shown(dotted)} is not a setting (SECTION.KEY as in the config file){guess}"


def _env_name(section: str, key: str) -> str:
    """The variable that sets ``section.key``."""
    return f"VULTRSCALE_{section.replace('.', '_').upper()}_{key.upper()}"


def _setting_names() -> list[str]:
    return [
        _env_name(section, f.name)
        for section, cls in _SECTIONS.items()
        for f in dataclasses.fields(cls)
    ]


def _setting_key(name: str) -> str | None:
    """The dotted key (``policy.max_instances``) the variable ``name`` sets, if it is a setting."""
    if name in _ENV_NOT_SETTINGS or name not in _setting_names():
        return None
    section, _, key = name.removeprefix("VULTRSCALE_").lower().partition("_")
    return f"{section}.{key}"


def _unknown_variable(name: str) -> tuple[str, str]:
    """The problem with a VULTRSCALE_ variable that names no setting, and the nearest variable
    ("" if none is near)."""
    close = difflib.get_close_matches(name, [*_setting_names(), *_ENV_NOT_SETTINGS], n=1)
    guess = f"; did you mean {close[0]}?" if close else ""
    sections = ", ".join(s.upper() for s in _SECTIONS)
    problem = (
        f"{shown(name)[1:-1]} (in the environment or .env) is not a setting: settings are "
        f"VULTRSCALE_<SECTION>_<KEY> with a SECTION of {sections}{guess}"
    )
    return problem, close[0] if close else ""


# The variables read besides VULTRSCALE_*: the secrets and the API's address.
_READ_AS_TEXT = frozenset({*SECRET_NAMES, "VULTR_API_URL"})


class _FromEnv(str):
    """A setting as the environment gives it: text, read as a TOML value only for a setting that
    is not text (``VULTRSCALE_WORKER_QUEUE=2024`` is the queue "2024", not a number)."""


def _from_env(value: str) -> Any:
    """Environment values are strings; let TOML read numbers and booleans."""
    import tomllib

    try:
        return tomllib.loads(f"v = {value}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # not a value: said as the text it is
        return value


def _build_section(
    section: str, cls: type, raw: dict[str, Any], problems: list[str], failed: set[str]
) -> Any:
    """The section's value from ``raw``; each key that cannot be read is a problem, named in
    ``failed``, and takes its default."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    if cls is PolicyConfig:
        raw = _forecast_joined(raw)
    for key, value in raw.items():
        where = f"{section}.{key}"
        f = fields.get(key)
        if f is None:
            close = difflib.get_close_matches(key, list(fields), n=1)
            if close and close[0] not in raw:  # the key meant is at its default
                failed.add(f"{section}.{close[0]}")
            known = ", ".join(fields)
            guess = f"did you mean {close[0]}? " if close else ""
            named = f"{shown(where)[1:-1]}:"
            if isinstance(value, _FromEnv):  # named as set: the file does not have it
                variable = shown(_env_name(section, key))[1:-1]
                named = f"{variable} (in the environment or .env): {named[:-1]} is an"
                guess = f"did you mean {_env_name(section, close[0])}? " if close else ""
            problems.append(f"{named} unknown key ({guess}known in [{section}]: {known})")
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        if default is None and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        if isinstance(value, _FromEnv) and (
            key in ("floor", "offerings")
            or isinstance(default, bool | int | float | timedelta | tuple)
        ):
            value = _from_env(value)
        try:
            if key == "floor":
                kwargs[key] = _build_floors(value, problems)
            elif section == "fleet" and key == "offerings":
                kwargs[key] = _build_offerings(value, raw, problems)
            elif key == "forecast":
                if not isinstance(value, dict):
                    raise ValueError(
                        f"policy.forecast: expected a [policy.forecast] table, got {shown(value)}"
                    )
                kwargs[key] = _build_section(
                    "policy.forecast", ForecastConfig, value, problems, failed
                )
            else:
                kwargs[key] = _coerce(where, value, default)
        except ValueError as exc:
            problems.append(str(exc))
            failed.add(where)
    return cls(**kwargs)


def _forecast_joined(raw: dict[str, Any]) -> dict[str, Any]:
    """``[policy.forecast]`` keys set one at a time (``VULTRSCALE_POLICY_FORECAST_MODE``, a
    sweep's ``policy.forecast.mode``) joined to the table the file may give."""
    pieces = [k for k in raw if k.startswith(("forecast_", "forecast."))]
    if not pieces:
        return raw
    out = dict(raw)
    table = out.get("forecast")
    joined = dict(table) if isinstance(table, dict) else {}
    for k in pieces:
        joined[k[len("forecast_") :]] = out.pop(k)
    out["forecast"] = joined
    return out


def setting_keys() -> list[str]:
    """Every dotted setting key, those of the tables inside a section too
    (``policy.forecast.mode``)."""
    out = []
    for s, cls in _SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default_factory() if callable(f.default_factory) else f.default
            if dataclasses.is_dataclass(default) and not isinstance(default, type):
                out += [f"{s}.{f.name}.{g.name}" for g in dataclasses.fields(default)]
            else:
                out.append(f"{s}.{f.name}")
    return out


def _coerce(where: str, value: Any, default: Any) -> Any:
    if isinstance(default, WaitTarget):
        return WaitTarget.parse(value, where)
    if isinstance(default, timedelta):
        return parse_duration(value, where)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ValueError(f"{where}: expected true or false, got {shown(value)}")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"{where}: expected a whole number, got {shown(value)}")
    if isinstance(default, float):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if where.endswith("_seconds") and isinstance(value, str):
            # The worker's *_seconds keys take what their flags take (`--drain-seconds 2m`):
            # "2m" in the .env was "expected a number" where the README says durations are
            # written alike in the file, the environment and on the command line.
            return parse_duration(value, where).total_seconds()
        raise ValueError(f"{where}: expected a number, got {shown(value)}")
    if isinstance(default, tuple):
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ValueError(f"{where}: expected a list of strings, got {shown(value)}")
    if isinstance(value, str):
        return value
    raise ValueError(f"{where}: expected a string, got {shown(value)}")


def _build_floors(value: Any, problems: list[str]) -> tuple[FloorConfig, ...]:
    if not isinstance(value, list):
        raise ValueError(
            "policy.floor: expected [[policy.floor]] tables with cron and min_instances"
        )
    floors = []
    for i, item in enumerate(value):
        where = f"policy.floor[{i}]"
        if not isinstance(item, dict):
            problems.append(f"{where}: expected a table with cron, timezone, min_instances")
            continue
        unknown = set(item) - {"cron", "timezone", "min_instances"}
        for key in sorted(unknown):
            problems.append(f"{where}.{key}: unknown key (known: cron, timezone, min_instances)")
        cron = item.get("cron")
        if not isinstance(cron, str):
            problems.append(f'{where}.cron: required, e.g. "* 8-18 * * mon-fri"')
            continue
        tz = item.get("timezone", "UTC")
        n = item.get("min_instances", 1)
        if not isinstance(tz, str):
            problems.append(f'{where}.timezone: expected a name like "Europe/Berlin"')
            continue
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            problems.append(f"{where}.min_instances: expected a whole number >= 0, got {shown(n)}")
            continue
        floors.append(FloorConfig(cron=cron, timezone=tz, min_instances=n))
    return tuple(floors)


def _build_offerings(value: Any, raw: dict[str, Any], problems: list[str]) -> tuple[Offering, ...]:
    """``[[fleet.offerings]]``: each a table of region, plan and optionally jobs_per_instance.
    Given with ``fleet.region`` or ``fleet.plan`` it is a problem that says which to keep."""
    if not isinstance(value, list) or not value:
        raise ValueError(
            "fleet.offerings: expected [[fleet.offerings]] tables, each with region and plan"
        )
    both = [k for k in ("region", "plan") if k in raw]
    if both:
        keys = " and ".join(f"fleet.{k}" for k in both)
        problems.append(
            f"fleet.offerings: given together with {keys}: keep [[fleet.offerings]] and delete "
            f"{keys} (the first offering is the preferred one), or delete the offerings to "
            "keep one region and plan"
        )
    out = []
    for i, item in enumerate(value):
        where = f"fleet.offerings[{i}]"
        if not isinstance(item, dict):
            problems.append(f"{where}: expected a table with region, plan, jobs_per_instance")
            continue
        for key in sorted(set(item) - {"region", "plan", "jobs_per_instance"}):
            problems.append(f"{where}.{key}: unknown key (known: region, plan, jobs_per_instance)")
        region, plan, jobs = item.get("region"), item.get("plan"), item.get("jobs_per_instance", 0)
        bad = False
        for key, got in (("region", region), ("plan", plan)):
            if not isinstance(got, str):
                problems.append(f'{where}.{key}: required, a string such as "ewr" or "vc2-1c-2gb"')
                bad = True
        if not isinstance(jobs, int) or isinstance(jobs, bool):
            problems.append(
                f"{where}.jobs_per_instance: expected a whole number, got {shown(jobs)}"
            )
            bad = True
        if not bad:
            out.append(Offering(str(region), str(plan), int(jobs)))
    return tuple(out)


MAX_FLEET = 10_000

# The range of every number key. The upper bounds are far above any real fleet and only keep
# absurd values (a typo of a few extra digits) from reaching the API, the database or systemd.
NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "fleet.ssh_port": (1, 65535),
    "worker.concurrency": (1, 1024),
    "worker.drain_seconds": (0, 86400),
    "worker.lease_seconds": (3, 86400),
    "worker.outage_seconds": (0, 86400),
    "queue.jobs_per_instance": (1, 100_000),
    # Vultr publishes no fixed number of instances per account: each account has its own
    # limit, raised on request, and Vultr refuses a create past it. 10,000 is the largest fleet
    # measured here: the simulator's list is linear to it, the pass is benchmarked at 5,000.
    "policy.min_instances": (0, MAX_FLEET),
    "policy.max_instances": (0, MAX_FLEET),
    "policy.max_step_up": (0, MAX_FLEET),
    "budget.monthly_ceiling_usd": (0.01, 10_000_000),
    "simulate.duration_scale": (0.01, 100),
    "simulate.dead_boot_share": (0, 1),
}


def number_problems(cfg: Config) -> list[str]:
    """Every number key that is not finite or outside NUMBER_RANGES, with what is allowed."""
    p = []
    for dotted, (low, high) in NUMBER_RANGES.items():
        section, _, key = dotted.partition(".")
        value = getattr(getattr(cfg, section), key)
        if not low <= value <= high:  # also false for NaN
            p.append(f"{dotted}: {value!r} is out of range: allowed {low:g} to {high:g}")
    return p


def validate(cfg: Config) -> list[str]:
    """Every problem with a built config, each naming its key. Empty list: valid."""
    p: list[str] = number_problems(cfg)
    f, w, q, pol, d = cfg.fleet, cfg.worker, cfg.queue, cfg.policy, cfg.drain
    if not _FLEET_NAME.fullmatch(f.name):
        p.append(f"fleet.name: {shown(f.name)} must be 1-64 letters, digits, '.', '_' or '-'")
    if not _REGION.fullmatch(f.region):
        p.append(
            f'fleet.region: {shown(f.region)} is not a Vultr region id (such as "ewr" or "fra")'
        )
    if not f.plan:
        p.append('fleet.plan: required (a Vultr plan id such as "vc2-1c-2gb")')
    elif not _PLAN.fullmatch(f.plan):
        p.append(
            f"fleet.plan: {shown(f.plan)} is not a Vultr plan id ({PLAN_FORM}; "
            "https://api.vultr.com/v2/plans lists them)"
        )
    if not f.tag:
        p.append("fleet.tag: required: every instance the fleet owns carries it")
    elif len(f.tag) > 255 or f.tag != f.tag.strip() or not f.tag.isprintable():
        p.append(
            f"fleet.tag: {shown(f.tag)} must be at most 255 printable characters, without "
            "spaces at either end"
        )
    if not _LABEL_PREFIX.fullmatch(f.label_prefix):
        p.append(
            f"fleet.label_prefix: {shown(f.label_prefix)} must be lowercase letters, digits, '-'"
        )
    if not SERVICE_NAME.fullmatch(f.service):
        p.append(f"fleet.service: {shown(f.service)} is not a valid systemd unit name")
    elif f.service.endswith(".service"):  # cloud-init adds it: worker.service.service
        p.append(
            f"fleet.service: {shown(f.service)}: name the unit without '.service' "
            f"({f.service.removesuffix('.service')!r})"
        )
    if not _SSH_USER.fullmatch(f.ssh_user):
        p.append(f"fleet.ssh_user: {shown(f.ssh_user)} is not a valid user name")
    if f.ssh_address not in ("main_ip", "internal_ip"):
        p.append(f"fleet.ssh_address: {shown(f.ssh_address)} must be main_ip or internal_ip")
    seen: set[tuple[str, str]] = set()
    for i, o in enumerate(f.offerings):
        where = f"fleet.offerings[{i}]"
        if not _REGION.fullmatch(o.region):
            p.append(f'{where}.region: {shown(o.region)} is not a Vultr region id (such as "ewr")')
        if not _PLAN.fullmatch(o.plan):
            p.append(f"{where}.plan: {shown(o.plan)} is not a Vultr plan id ({PLAN_FORM})")
        if o.jobs_per_instance and not 1 <= o.jobs_per_instance <= 100_000:
            p.append(
                f"{where}.jobs_per_instance: {o.jobs_per_instance} is out of range: allowed 1 "
                "to 100000 (or leave it out: queue.jobs_per_instance)"
            )
        if (o.region, o.plan) in seen:
            p.append(f"{where}: {o.name} is listed twice; keep the first")
        seen.add((o.region, o.plan))
    if f.vpc_ids and len({o.region for o in f.offerings}) > 1:
        p.append(
            "fleet.vpc_ids: a VPC belongs to one region, and the fleet.offerings are in "
            f"{len({o.region for o in f.offerings})} regions (a create elsewhere would be "
            "refused): keep the offerings in the VPCs' region, or empty vpc_ids"
        )
    if not timedelta(0) < f.unavailable_for <= timedelta(days=1):
        p.append(
            f"fleet.unavailable_for: {format_duration(f.unavailable_for)} is out of range: "
            "allowed 1s to 1d (how long a refused offering is skipped)"
        )
    if f.snapshot_id and not VULTR_ID.fullmatch(f.snapshot_id):
        p.append(
            f"fleet.snapshot_id: {shown(f.snapshot_id)} is not {VULTR_ID_FORM} (or empty: "
            "the one `vultrscale snapshot` records)"
        )
    if f.firewall_group_id and not VULTR_ID.fullmatch(f.firewall_group_id):
        p.append(
            f"fleet.firewall_group_id: {shown(f.firewall_group_id)} is not {VULTR_ID_FORM} "
            "(or empty)"
        )
    for i, vpc in enumerate(f.vpc_ids):
        if not VULTR_ID.fullmatch(vpc):
            p.append(f"fleet.vpc_ids[{i}]: {shown(vpc)} is not {VULTR_ID_FORM}")
    if not _APP.fullmatch(w.app):
        p.append(f"worker.app: {shown(w.app)} must be MODULE:FUNC, e.g. myjobs:handle")
    queue_problem = queue_name_problem(w.queue)
    if queue_problem:
        p.append(f"worker.queue: {queue_problem}")
    if w.db_role and not _DB_ROLE.fullmatch(w.db_role):
        p.append(
            f"worker.db_role: {shown(w.db_role)} must be lowercase letters, digits and '_' "
            "(at most 63, not starting with a digit), or empty to manage roles yourself"
        )
    elif w.db_role == "public" or w.db_role.startswith("pg_"):
        p.append(
            f"worker.db_role: {shown(w.db_role)} is reserved by Postgres (public, pg_*): name a "
            "role of its own, e.g. vultrscale_worker"
        )
    if q.preset not in QUEUE_PRESETS:
        p.append(f"queue.preset: {shown(q.preset)} must be one of {', '.join(QUEUE_PRESETS)}")
    if q.queue and (problem := queue_name_problem(q.queue)):
        p.append(f"queue.queue: {problem} (or empty: every queue)")
    if q.preset == "custom":
        for key in ("ready_sql", "in_flight_sql", "oldest_ready_seconds_sql"):
            text = getattr(q, key)
            if not text.strip():
                p.append(
                    f'queue.{key}: required with preset = "custom" (a query returning one number)'
                )
            elif problem := _custom_sql_problem(text):
                p.append(f"queue.{key}: {problem}")
        history = [k for k in ("recent_jobs_sql", "recent_arrivals_sql") if getattr(q, k).strip()]
        for key in history:
            if problem := _custom_sql_problem(getattr(q, key)):
                p.append(f"queue.{key}: {problem}")
        if len(history) == 1:
            other = ({"recent_jobs_sql", "recent_arrivals_sql"} - set(history)).pop()
            p.append(
                f"queue.{other}: required with queue.{history[0]} (the wait rule needs the "
                "finished jobs and the arrivals both)"
            )
    if pol.min_instances > pol.max_instances:
        p.append(
            f"policy.min_instances ({pol.min_instances}) is above policy.max_instances "
            f"({pol.max_instances}): raise the cap or lower the floor"
        )
    if pol.on_signal_error not in ("hold", "floor"):
        p.append(f"policy.on_signal_error: {shown(pol.on_signal_error)} must be hold or floor")
    if pol.boot_timeout <= timedelta(0):
        p.append("policy.boot_timeout: must be longer than 0s")
    if pol.boot_time <= timedelta(0):
        p.append("policy.boot_time: must be longer than 0s (create to worker up, e.g. 12m)")
    for i, fl in enumerate(pol.floor):
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # only a config with floors

        where = f"policy.floor[{i}]"
        try:
            ZoneInfo(fl.timezone)
        except (ZoneInfoNotFoundError, ValueError, OSError):  # "Europe": a directory of zones
            p.append(
                f'{where}.timezone: unknown time zone {shown(fl.timezone)} (e.g. "Europe/Berlin")'
            )
        problem = cron_problem(fl.cron)
        if problem:
            p.append(f"{where}.cron: {problem}")
        if fl.min_instances > pol.max_instances:
            p.append(
                f"{where}.min_instances ({fl.min_instances}) is above policy.max_instances "
                f"({pol.max_instances})"
            )
    p += _forecast_problems(pol)
    if d.poll_interval <= timedelta(0):
        p.append("drain.poll_interval: must be longer than 0s")
    try:
        duration_range(cfg.simulate.boot_time, "simulate.boot_time")
    except ValueError as exc:
        p.append(str(exc))
    if cfg.simulate.stockout_offering and not _OFFERING.fullmatch(cfg.simulate.stockout_offering):
        p.append(
            f"simulate.stockout_offering: {shown(cfg.simulate.stockout_offering)} is not "
            'REGION/PLAN (e.g. "ewr/vc2-1c-2gb")'
        )
    stop = timeout_stop_seconds(w) if math.isfinite(w.drain_seconds) else 0
    if d.timeout.total_seconds() < stop:
        p.append(
            f"drain.timeout ({format_duration(d.timeout)}) is shorter than the unit's "
            f"TimeoutStopSec ({stop}s, from worker.drain_seconds = {w.drain_seconds:g}): "
            "the scaler would give up before systemd does; raise drain.timeout"
        )
    return p


# The one placeholder a custom query takes (signals runs it with {"queue": queue.queue}).
_QUEUE_PLACEHOLDER = "%(queue)s"
_NAMED_PLACEHOLDER = re.compile(r"%\((\w*)\)s")


def _forecast_problems(pol: PolicyConfig) -> list[str]:
    fc, p = pol.forecast, []
    if fc.mode not in FORECAST_MODES:
        p.append(
            f"policy.forecast.mode: {shown(fc.mode)} must be off, observe or scale "
            '("observe" shows what the forecast would do, "scale" acts on it)'
        )
    if not 1 <= fc.weeks <= 52:
        p.append(f"policy.forecast.weeks: {fc.weeks} is out of range: allowed 1 to 52")
    minute, week = timedelta(minutes=1), timedelta(days=7)
    if not (timedelta(minutes=5) <= fc.slot <= timedelta(days=1)) or week % fc.slot:
        p.append(
            f"policy.forecast.slot: {format_duration(fc.slot)} must be from 5m to 1d and cut "
            "the week into whole slots, e.g. 15m, 30m, 1h, 2h, 4h, 6h, 12h or 1d"
        )
    if fc.min_history < minute or fc.min_history > fc.weeks * week:
        p.append(
            f"policy.forecast.min_history: {format_duration(fc.min_history)} must be from 1m to "
            f"the {fc.weeks} week(s) looked back (policy.forecast.weeks), e.g. 7d: one "
            "whole week of jobs before the forecast acts"
        )
    if not 0 < fc.quantile <= 1:  # also false for NaN
        p.append(
            f"policy.forecast.quantile: {fc.quantile!r} must be above 0 and at most 1 (0.75 "
            "keeps a high week's load per slot, 1 the highest week's)"
        )
    if not 0 <= fc.round_up_from < 1:
        p.append(
            f"policy.forecast.round_up_from: {fc.round_up_from!r} must be from 0 to below 1 "
            "(0: any load asks for an instance; 0.5: half an instance's work or more)"
        )
    if fc.pool not in FORECAST_POOLS:
        p.append(
            f'policy.forecast.pool: {shown(fc.pool)} must be week or weekday ("weekday": '
            "the slots of a day learn from every weekday, Saturday and Sunday apart)"
        )
    elif fc.pool == "weekday" and timedelta(days=1) % fc.slot:
        p.append(
            f"policy.forecast.slot: {format_duration(fc.slot)} must cut the day into whole "
            'slots with pool = "weekday", e.g. 15m, 30m, 1h, 2h'
        )
    if fc.clear_within < timedelta(0):
        p.append(
            f"policy.forecast.clear_within: {format_duration(fc.clear_within)} must be 0s (the "
            "slot's mean load) or a duration, e.g. 10m: a slot's work done within 10 minutes"
        )
    if fc.refresh < minute:
        p.append(f"policy.forecast.refresh: {format_duration(fc.refresh)} must be at least 1m")
    return p


def _custom_sql_problem(text: str) -> str | None:
    """What psycopg would refuse in a custom query, on every pass: a placeholder other than
    %(queue)s, or, in a query that takes %(queue)s, a literal '%' not written '%%'."""
    others = sorted({name for name in _NAMED_PLACEHOLDER.findall(text) if name != "queue"})
    if others:
        return (
            f"%({others[0]})s is not a placeholder it takes: only {_QUEUE_PLACEHOLDER} "
            "(queue.queue); write a literal '%' as '%%'"
        )
    if _QUEUE_PLACEHOLDER in text and "%" in text.replace(_QUEUE_PLACEHOLDER, "").replace("%%", ""):
        return (
            f"the query takes {_QUEUE_PLACEHOLDER}, so every other '%' is read as a "
            "placeholder: write a literal '%' as '%%' (LIKE 'a%%')"
        )
    return None


def cron_problem(expr: str) -> str | None:
    """None if ``expr`` is a valid five-field cron expression, else what is wrong."""
    from croniter import CroniterBadDateError, croniter

    if len(expr.split()) != 5:
        return f"{expr!r} must have five fields: minute hour day month weekday"
    if not croniter.is_valid(expr):
        return f"{expr!r} is not a valid cron expression"
    try:  # valid fields that no date has ("0 0 31 2 *"): simulate's next match never comes
        croniter(expr, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterBadDateError:
        return f"{expr!r} matches no date (e.g. a day the month never has)"
    return None


# worker.service: RestartSec=5 and StartLimitBurst=5 (the unit file says why).
RESTART_SECONDS = 5
START_LIMIT_BURST = 5


def outage_budget(outage_seconds: float, lease_seconds: float) -> float:
    """How long a worker rides out an unreachable database: outage_seconds, else the lease."""
    return outage_seconds or lease_seconds


def start_limit_interval_seconds(worker: WorkerConfig) -> int:
    """StartLimitIntervalSec for the unit. A worker that gives up on a long outage has waited
    its whole outage budget (running, or at start-up), so its restarts are at least budget +
    RestartSec apart: START_LIMIT_BURST + 1 starts span more than this interval and an outage
    of any length never trips the start limit, while a worker failing faster than that (a
    crash, not an outage) does, and stays failed for an operator to see."""
    budget = outage_budget(worker.outage_seconds, worker.lease_seconds)
    return int(START_LIMIT_BURST * (budget + RESTART_SECONDS)) - 1


def timeout_stop_seconds(worker: WorkerConfig) -> int:
    """TimeoutStopSec for the unit: the drain time plus a margin for giving jobs back."""
    return int(worker.drain_seconds + max(10.0, worker.drain_seconds * 0.5))
