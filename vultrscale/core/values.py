"""Values as text and back: durations (``90s``, ``5m``, ``1h``), a value quoted short in a
message, and a setting's value written as TOML writes it inline."""

from __future__ import annotations

import json
import math
import re
import reprlib
from datetime import timedelta

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
# The longest duration anything accepts: longer than any wait, cooldown or look-back that
# makes sense (a year), and far below timedelta's own limit, so no sum with "now" overflows.
MAX_DURATION = timedelta(days=366)
DURATION_FORM = "a duration like 90s, 5m, 1h or 2d (a bare number is seconds), at most 366d"

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


def parse_duration(value: object, key: str = "duration") -> timedelta:
    """:func:`to_duration`, its ValueError naming ``key``."""
    try:
        return to_duration(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def format_duration(td: timedelta) -> str:
    seconds = td.total_seconds()
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def duration_range(text: str, key: str) -> tuple[float, float]:
    """``12m`` (fixed) or ``10m..15m`` (a range) in seconds; ValueError naming ``key``."""
    lo_s, sep, hi_s = text.partition("..")
    lo = parse_duration(lo_s.strip(), key).total_seconds()
    hi = parse_duration(hi_s.strip(), key).total_seconds() if sep else lo
    if hi < lo:
        raise ValueError(f"{key}: {text!r} ends before it starts (write MIN..MAX, e.g. 10m..15m)")
    return lo, hi


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
