"""How a setting is declared once: :func:`setting` puts its facts (type, range, pattern or
choices, the words for what is allowed, a one-line help) on a dataclass field, and the loader,
the checks, init's template, ``.env.example`` and the settings reference all read them there.

Also the value forms the settings share: names and ids (matched whole, always with
``fullmatch``: ``$`` in ``re.match`` also matches before a final newline, and "x\\n" made a
second fleet, a role whose name ends in a newline, a queue no worker takes), "auto" or a
duration (:class:`WaitTarget`), and the rules of one value that no pattern says (a cron
expression, a time zone, a custom query's placeholders)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from vultrscale.core.values import format_duration, parse_duration, shown, to_duration

SERVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
FLEET_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
LABEL_PREFIX = re.compile(r"[a-z0-9][a-z0-9-]{0,30}")
APP = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
SSH_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# The one rule for queue names: the worker's [worker] queue, `enqueue --queue`, `worker --queue`.
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
QUEUE_NAME_FORM = "1-64 letters, digits, '_', '.', ':' or '-'"
# Vultr region ids are short lowercase words ("ewr", "fra", "sjc"), plan ids lowercase words
# joined by '-' or '.' ("vc2-1c-2gb", "voc-c-2c-4gb-50s-amd", and the smallest plans
# "vc2-1c-0.5gb", "vc2-1c-0.5gb-v6"); both go into URL paths and queries.
REGION = re.compile(r"[a-z][a-z0-9-]{1,15}")
REGION_FORM = 'a Vultr region id (such as "ewr" or "fra")'
PLAN = re.compile(r"(?=.{2,64}\Z)[a-z0-9]+(?:[.-][a-z0-9]+)*", re.S)
PLAN_FORM = "lowercase letters and digits joined by '-' or '.', such as \"vc2-1c-2gb\""
# Vultr's ids for snapshots, VPCs and firewall groups are UUIDs (API notes: "string (UUID)";
# the OpenAPI example "cb676a46-66fd-4dfb-b839-443f2e6c0b60"); they go into URL paths.
VULTR_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
VULTR_ID_FORM = 'a Vultr id, a lowercase UUID such as "cb676a46-66fd-4dfb-b839-443f2e6c0b60"'
# A plain, unquoted Postgres identifier (63 bytes at most), so it needs no quoting anywhere.
DB_ROLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
OFFERING = re.compile(r"[A-Za-z0-9._-]+/[A-Za-z0-9._-]+")


def queue_name_problem(name: str) -> str | None:
    """None if ``name`` is a queue name the worker can take jobs from, else what is allowed."""
    return None if QUEUE_NAME.fullmatch(name) else f"{shown(name)} must be {QUEUE_NAME_FORM}"


# --- the types a setting may have ---------------------------------------------------------


# The helpers below are plain classes, not dataclasses: a dataclass is made by compiling its
# methods, which the cron pass would pay at every start for nothing.


class Kind:
    """A setting's type: its name in the reference, how a value is read (``read(value, key)``,
    ValueError naming ``key``), and whether a value from the environment, always text, is read
    as a TOML value first (``VULTRSCALE_WORKER_QUEUE=2024`` stays the text "2024")."""

    __slots__ = ("name", "read", "env_toml")

    def __init__(self, name: str, read: Callable[[Any, str], Any], env_toml: bool = True) -> None:
        self.name, self.read, self.env_toml = name, read, env_toml


def _read_text(value: Any, key: str) -> str:
    if isinstance(value, str):
        return value
    raise ValueError(f"{key}: expected a string, got {shown(value)}")


def _read_integer(value: Any, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"{key}: expected a whole number, got {shown(value)}")


def _read_number(value: Any, key: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"{key}: expected a number, got {shown(value)}")


def _read_seconds(value: Any, key: str) -> float:
    # The worker's *_seconds keys take what their flags take (`--drain-seconds 2m`): "2m" in
    # the .env was "expected a number" where the docs say durations are written alike in
    # the file, the environment and on the command line.
    if isinstance(value, str):
        return parse_duration(value, key).total_seconds()
    return _read_number(value, key)


def _read_boolean(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"{key}: expected true or false, got {shown(value)}")


def _read_text_list(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValueError(f"{key}: expected a list of strings, got {shown(value)}")


TEXT = Kind("string", _read_text, env_toml=False)
INTEGER = Kind("integer", _read_integer)
NUMBER = Kind("number", _read_number)
SECONDS = Kind("seconds (a number, or a duration)", _read_seconds)
BOOLEAN = Kind("boolean", _read_boolean)
DURATION = Kind("duration", lambda value, key: parse_duration(value, key))
TEXT_LIST = Kind("list of strings", _read_text_list)


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

    def __reduce__(self) -> tuple[type[WaitTarget], tuple[timedelta | None]]:
        # Pickled into simulate's replay processes: rebuilt by __init__, not set slot by slot.
        return (WaitTarget, (self.fixed,))


# Read from the environment as text: "15m" and "auto" are no TOML values, "90" is read as 90s.
AUTO_OR_DURATION = Kind('"auto" or a duration', lambda v, key: WaitTarget.parse(v, key), False)


class Tables(Kind):
    """An array of tables (``[[policy.floor]]``), each read with the fields of ``item``.
    ``nonempty``: an empty array is refused."""

    __slots__ = ("item", "nonempty")

    def __init__(self, item: type, *, nonempty: bool = False) -> None:
        super().__init__("array of tables", _unread)
        self.item, self.nonempty = item, nonempty


class Table(Kind):
    """A table inside a section (``[policy.forecast]``), read with the fields of ``item``; its
    keys may also be set one at a time (``VULTRSCALE_POLICY_FORECAST_MODE``)."""

    __slots__ = ("item",)

    def __init__(self, item: type) -> None:
        super().__init__("table", _unread, env_toml=False)
        self.item = item


def tables(item: type, *, nonempty: bool = False) -> Tables:
    return Tables(item, nonempty=nonempty)


def table(item: type) -> Table:
    return Table(item)


def _unread(value: Any, key: str) -> Any:  # the loader reads tables field by field
    raise ValueError(f"{key}: expected a table, got {shown(value)}")


# --- a setting's facts --------------------------------------------------------------------


class Spec:
    """What one setting is. ``bounds``: the inclusive range of a number or a duration (``above``:
    the low end excluded). ``allowed``: what is allowed in words, for the messages and the
    reference (else said from the bounds or the choices). ``empty``: what "" means for a text
    setting that may be empty (None: "" must match the pattern too). ``rule``: one more check of
    the value alone, returning what is wrong. ``example``: the TOML text init's template
    writes (else the default); ``commented``: the template shows it commented out."""

    __slots__ = (
        "kind", "help", "bounds", "above", "pattern", "choices", "allowed", "empty", "rule",
        "example", "commented", "replaces",
    )

    def __init__(
        self,
        kind: Kind,
        help: str,
        *,
        bounds: tuple[Any, Any] | None = None,
        above: bool = False,
        pattern: re.Pattern[str] | None = None,
        choices: tuple[str, ...] = (),
        allowed: str = "",
        empty: str | None = None,
        rule: Callable[[Any], str | None] | None = None,
        example: str = "",
        commented: bool = False,
        replaces: tuple[str, ...] = (),  # sibling keys it stands in for (offerings: region, plan)
    ) -> None:
        self.kind, self.help, self.bounds, self.above = kind, help, bounds, above
        self.pattern, self.choices, self.allowed, self.empty = pattern, choices, allowed, empty
        self.rule, self.example, self.commented, self.replaces = rule, example, commented, replaces

    def allowed_text(self) -> str:
        """What is allowed, in words ("" when anything of the type is)."""
        if self.allowed:
            return self.allowed
        if self.choices:
            *first, last = self.choices
            return f"{', '.join(first)} or {last}" if len(first) == 1 else (
                "one of " + ", ".join(self.choices)
            )
        if self.bounds is not None:
            low, high = self.bounds
            if not self.above and high is None:
                return f"at least {_said(low)}"
            if not self.above:
                return f"{_said(low)} to {_said(high)}"
            longer = "longer than" if isinstance(low, timedelta) else "above"
            at_most = f" and at most {_said(high)}" if high is not None else ""
            return f"{longer} {_said(low)}{at_most}"
        return ""


def _said(bound: Any) -> str:
    if isinstance(bound, timedelta):
        days = bound / timedelta(days=1)
        return f"{days:g}d" if days >= 1 and days.is_integer() else format_duration(bound)
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def setting(
    default: Any = dataclasses.MISSING, kind: Kind = TEXT, help: str = "", **facts: Any
) -> Any:
    """A dataclass field carrying its setting's facts (:class:`Spec`); no default: required."""
    return dataclasses.field(default=default, metadata={"spec": Spec(kind, help, **facts)})


def spec_of(f: dataclasses.Field[Any]) -> Spec:
    return f.metadata["spec"]  # type: ignore[no-any-return]


def value_problems(spec: Spec, key: str, value: Any) -> list[str]:
    """What is wrong with ``value`` for the setting ``key`` by its own facts, each naming it."""
    if spec.kind is TEXT_LIST:
        return [p for i, v in enumerate(value) for p in _one(spec, f"{key}[{i}]", v)]
    return _one(spec, key, value)


def _one(spec: Spec, key: str, value: Any) -> list[str]:
    allowed = spec.allowed_text()
    if isinstance(value, str) and not value and spec.empty is not None:
        return []
    if spec.bounds is not None:
        low, high = spec.bounds
        ok = (low < value if spec.above else low <= value) and (high is None or value <= high)
        if not ok:  # also for NaN
            said = format_duration(value) if isinstance(value, timedelta) else repr(value)
            if spec.above or high is None:
                return [f"{key}: {said} must be {allowed}"]
            return [f"{key}: {said} is out of range: allowed {allowed}"]
    if spec.pattern is not None and not spec.pattern.fullmatch(value):
        if not value:
            return [f"{key}: required, {allowed}"]
        verb = "is not" if allowed.startswith(("a ", "an ")) else "must be"
        empty = f" (or empty: {spec.empty})" if spec.empty else ""
        return [f"{key}: {shown(value)} {verb} {allowed}{empty}"]
    if spec.choices and value not in spec.choices:
        return [f"{key}: {shown(value)} must be {allowed}"]
    problem = spec.rule(value) if spec.rule is not None else None
    return [f"{key}: {problem}"] if problem else []


# --- the rules of one value that no pattern says -------------------------------------------


def tag_problem(tag: str) -> str | None:
    if not tag:
        return "required: every instance the fleet owns carries it"
    if len(tag) > 255 or tag != tag.strip() or not tag.isprintable():
        return (
            f"{shown(tag)} must be at most 255 printable characters, without spaces at either end"
        )
    return None


def service_problem(service: str) -> str | None:
    if service.endswith(".service"):  # cloud-init adds it: worker.service.service
        bare = service.removesuffix(".service")
        return f"{shown(service)}: name the unit without '.service' ({bare!r})"
    return None


def db_role_problem(role: str) -> str | None:
    if role == "public" or role.startswith("pg_"):
        return (
            f"{shown(role)} is reserved by Postgres (public, pg_*): name a role of its own, e.g. "
            "vultrscale_worker"
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


def timezone_problem(name: str) -> str | None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # only a config with floors

    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # "Europe": a directory of zones
        return f'unknown time zone {shown(name)} (e.g. "Europe/Berlin")'
    return None


# The one placeholder a custom query takes (signals runs it with {"queue": queue.queue}).
_QUEUE_PLACEHOLDER = "%(queue)s"
_NAMED_PLACEHOLDER = re.compile(r"%\((\w*)\)s")


def custom_sql_problem(text: str) -> str | None:
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


def duration_range_problem(text: str) -> str | None:
    """``12m`` or ``10m..15m``, what is wrong with it (``values.duration_range``)."""
    from vultrscale.core.values import duration_range

    try:
        duration_range(text, "")
    except ValueError as exc:
        return str(exc).removeprefix(": ")
    return None


def slot_problem(slot: timedelta) -> str | None:
    """policy.forecast.slot: from 5m to 1d, and the week cut into whole slots."""
    if timedelta(minutes=5) <= slot <= timedelta(days=1) and not timedelta(days=7) % slot:
        return None
    return (
        f"{format_duration(slot)} must be from 5m to 1d and cut the week into whole slots, "
        "e.g. 15m, 30m, 1h, 2h, 4h, 6h, 12h or 1d"
    )


def quantile_problem(q: float) -> str | None:
    if 0 < q <= 1:  # also false for NaN
        return None
    return (
        f"{q!r} must be above 0 and at most 1 (0.75 keeps a high week's load per slot, 1 the "
        "highest week's)"
    )


def round_up_problem(share: float) -> str | None:
    if 0 <= share < 1:
        return None
    return (
        f"{share!r} must be from 0 to below 1 (0: any load asks for an instance; 0.5: half an "
        "instance's work or more)"
    )
