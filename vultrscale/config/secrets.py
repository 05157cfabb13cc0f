"""The secrets and the variables that are not settings: ``VULTR_API_KEY``, the database URLs
and ``VULTR_API_URL`` are read only from the environment or the ``.env`` next to the config
file, never from the TOML; each is checked here without ever being shown."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from vultrscale.errors import UsageError
from vultrscale.redaction import (
    conninfo_problem,
    http_userinfo,
    is_text,
    parse_conninfo,
    secret_values,
)

DEFAULT_API_URL = "https://api.vultr.com"
# The secrets, read only from the environment or the .env next to the config file.
SECRET_NAMES = ("VULTR_API_KEY", "DATABASE_URL", "WORKER_DATABASE_URL")

# Vultr's keys are 36 letters and digits; a proxy's token may be longer (a JWT is often 1-2 KB),
# but a header value is visible ASCII and servers refuse headers past about 8 KB (a raw 431 for
# a 1 MB key).
MAX_API_KEY = 4096


_API_URL_FORM = (
    "an http(s) URL such as https://api.vultr.com (a proxy with credentials: "
    "https://USER:PASSWORD@proxy.example:8443)"
)
# The userinfo ends at the last '@' (redaction.http_userinfo reads it alike): a password with an
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
class Secrets:
    api_key: Secret = field(default_factory=lambda: Secret(""))
    database_url: Secret = field(default_factory=lambda: Secret(""))
    worker_database_url: Secret = field(default_factory=lambda: Secret(""))
    # user:password of a VULTR_API_URL that carries them (a proxy with basic auth)
    api_url_userinfo: Secret = field(default_factory=lambda: Secret(""))
    # The secrets set but empty in the environment while the .env has a value: the environment
    # wins (docs/real-fleet.md, "Configuration"), so the .env's value is hidden, and saying "not
    # set" misleads.
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


class Variable:
    """A variable vultrscale reads that is not a ``VULTRSCALE_<SECTION>_<KEY>`` setting, as
    ``.env.example``, init's ``.env`` and the settings reference describe it. ``group``: where
    .env.example lists it ("secrets", "where", "worker", "tests"; "" not at all); ``example``:
    the value it shows there (never a real secret); ``commented``: shown commented out."""

    __slots__ = ("name", "group", "help", "example", "commented")

    def __init__(
        self, name: str, group: str, help: str, example: str = "", *, commented: bool = False
    ) -> None:
        self.name, self.group, self.help = name, group, help
        self.example, self.commented = example, commented


VARIABLES = (
    Variable(
        "VULTR_API_KEY",
        "secrets",
        "Vultr API key (my.vultr.com > Account > API). With an IP allow-list, allow the "
        "scaler's address.",
    ),
    Variable(
        "DATABASE_URL",
        "secrets",
        "The scaler's database: queue signals, the fleet ledger, the events. The schema's owner "
        "(and CREATEROLE, so that `vultrscale db init` can create the workers' role).",
        "postgresql://vultrscale:change-me@db.internal:5432/jobs",
    ),
    Variable(
        "WORKER_DATABASE_URL",
        "secrets",
        "The address and role the WORKERS use; it goes into every instance's user-data "
        "(readable there). Log in as [worker] db_role (default vultrscale_worker): `vultrscale "
        "db init` creates that role, grants it only what workers do and sets its password from "
        "this URL. A private/VPC address is best. Without it, new instances are refused unless "
        "[worker] use_scaler_database_url = true.",
        "postgresql://vultrscale_worker:another-change-me@10.1.0.5:5432/jobs",
    ),
    Variable(
        "VULTR_API_URL",
        "where",
        f"The Vultr API (default {DEFAULT_API_URL}). Point it at `vultrscale sim serve` to try "
        "things.",
        DEFAULT_API_URL,
    ),
    Variable(
        "VULTRSCALE_CONFIG",
        "where",
        "The config file (default ./vultrscale.toml; a file named here must exist).",
    ),
    Variable(
        "VULTRSCALE_WORKER_ID",
        "worker",
        "Its id in the workers table and leases; the instance label on fleet instances.",
        commented=True,
    ),
    Variable(
        "VULTRSCALE_INSTANCE_LABEL",
        "worker",
        "The instance label the scaler matches this worker to (default: the worker id).",
        commented=True,
    ),
    Variable(
        "VULTRSCALE_TEST_DATABASE_URL",
        "tests",
        "A Postgres the tests may create and drop databases on (else they start a throwaway "
        "server).",
    ),
    Variable(
        "VULTRSCALE_SPEC",
        "",
        "cloud-init/bake.sh, on the base instance being baked: what pip installs for "
        "vultrscale (required: a wheel built from your clone, a git+https URL, or a name your "
        "own package index serves).",
    ),
)
# VULTRSCALE_* variables that are not VULTRSCALE_<SECTION>_<KEY> settings.
NOT_SETTINGS = frozenset(v.name for v in VARIABLES if v.name.startswith("VULTRSCALE_"))
