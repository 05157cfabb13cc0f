"""`reconcile --loop`'s log: one line per pass, for a terminal, journald or Loki.

A line carries the pass id that `vultrscale events` shows (the pass's ``fleet_events`` row), so
a line in the journal leads to the pass's whole record. ``human`` is a line a person reads;
``json`` is one JSON object per line (journald keeps it as the message, Loki's ``| json``
parses it). Every line is redacted of the config's secrets and is one line whatever the text
from outside (a label, an API message) holds.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from vultrscale.redaction import redact

if TYPE_CHECKING:
    from vultrscale.errors import VultrscaleError
    from vultrscale.reconcile import PassResult


class LogFormat(enum.StrEnum):
    HUMAN = "human"
    JSON = "json"


def log_format(value: object) -> LogFormat:
    """``--log-format``'s parser (``human`` or ``json``, any case): our own, so the flag needs
    no validation library at start-up (see ``vultrscale.cli._lean_coercion``)."""
    import typer

    if isinstance(value, LogFormat):
        return value
    try:
        return LogFormat(str(value).lower())
    except ValueError:
        raise typer.BadParameter(f"{str(value)[:40]!r} is not one of 'human', 'json'") from None


def _level(exit_code: int, errors: bool) -> str:
    if exit_code == 0 and not errors:
        return "info"
    return "warning" if exit_code == 0 else "error"


def _when(at: datetime) -> str:
    return at.isoformat(timespec="seconds").replace("+00:00", "Z")


def pass_record(result: PassResult, fleet: str) -> dict[str, Any]:
    """The figures of one pass that its line shows, as the JSON line holds them."""
    record: dict[str, Any] = {
        "time": _when(result.at),
        "level": _level(result.exit_code, bool(result.errors)),
        "msg": "pass",
        "fleet": fleet,
        "pass_id": result.pass_id,
        "exit_code": result.exit_code,
        "dry_run": result.dry_run,
        "lock_held": result.lock_held,
        "duration_s": round(result.duration_s, 3),
    }
    obs, plan = result.observation, result.plan
    if obs is not None:
        summary = obs.summary()
        record["instances"] = summary["instances"]
        record["queue"] = summary["signals"]
        record["month_to_date_usd"] = summary["month_to_date_usd"]
    if plan is not None:
        record["desired"], record["target"] = plan.desired, plan.target
        record["clamps"] = [c.describe() for c in plan.clamps]
    record["actions"] = [_action(a) for a in result.action_rows()]
    record["errors"] = list(result.errors)
    return record


def _action(action: dict[str, Any]) -> str:
    label = f" {action['label']}" if action.get("label") else ""
    return f"{action['kind']}{label}: {action['reason']}"


def pass_line(result: PassResult, fleet: str, fmt: LogFormat, secrets: Iterable[str]) -> str:
    """One pass as one line."""
    record = pass_record(result, fleet)
    if fmt is LogFormat.JSON:
        return _json_line(record, secrets)
    return _one_line(_human(record), secrets)


def error_line(
    exc: VultrscaleError, at: datetime, fleet: str, fmt: LogFormat, secrets: Iterable[str]
) -> str:
    """A pass that ended in an error before it had a result (the database down, say), with
    the pass id `events` shows when the pass could be recorded (``exc.pass_id``)."""
    record = {
        "time": _when(at),
        "level": "error",
        "msg": "pass failed",
        "fleet": fleet,
        "pass_id": exc.pass_id,
        "exit_code": exc.exit_code,
        "error": exc.message,
        "hint": exc.hint or None,
    }
    if fmt is LogFormat.JSON:
        return _json_line(record, secrets)
    fix = f" Fix: {exc.hint}" if exc.hint else ""
    named = "" if exc.pass_id is None else f" {exc.pass_id}"
    text = (
        f"{record['time']} fleet {fleet} pass{named} failed: exit {exc.exit_code}: "
        f"{exc.message}{fix}"
    )
    return _one_line(text, secrets)


def metrics_line(url: str, at: datetime, fleet: str, fmt: LogFormat) -> str:
    """Where the loop serves /metrics, said once at its start: with ``--metrics-port 0`` the
    port is the one the system picked, and this line is how a scraper (or a test) learns it."""
    record = {"time": _when(at), "level": "info", "msg": "metrics", "fleet": fleet, "url": url}
    if fmt is LogFormat.JSON:
        return _json_line(record, ())
    return f"{record['time']} fleet {fleet} serves metrics at {url}"


def _human(r: dict[str, Any]) -> str:
    pass_id = "-" if r["pass_id"] is None else str(r["pass_id"])
    head = f"{r['time']} fleet {r['fleet']} pass {pass_id}"
    if r["lock_held"]:
        return f"{head}: another pass holds the fleet's lock, nothing to do"
    parts = [f"exit {r['exit_code']} in {r['duration_s']:.1f}s" + (" (dry run)" * r["dry_run"])]
    if "instances" in r:
        counts = r["instances"]
        shown = ", ".join(f"{n} {state}" for state, n in counts.items()) or "none"
        parts.append(f"instances {sum(counts.values())} ({shown})")
        q = r["queue"]
        parts.append(
            "queue unread"
            if q is None
            else f"queue {q['ready']} ready, {q['in_flight']} in flight, "
            f"oldest {q['oldest_ready_seconds']:g}s"
        )
    if "desired" in r:
        parts.append(f"desired {r['desired']} target {r['target']}")
    parts += [f"clamp: {c}" for c in r.get("clamps", [])]
    parts += r["actions"]
    parts += [f"error: {e}" for e in r["errors"]]
    return f"{head}: " + "; ".join(parts)


def _json_line(record: dict[str, Any], secrets: Iterable[str]) -> str:
    # Redacted field by field: a secret replaced inside the encoded text could cut an escape.
    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return redact(value, secrets)
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    secrets = list(secrets)
    return json.dumps(clean(record), default=str)  # non-ASCII escaped: one line, always


def _one_line(text: str, secrets: Iterable[str]) -> str:
    from vultrscale.status import one_line

    # one_line drops control characters; splitlines also breaks at U+2028 and its kin.
    return " ".join(one_line(redact(text, secrets)).splitlines())


def invalid_line(
    file: str, problems: Iterable[str], at: datetime, fmt: LogFormat, secrets: Iterable[str]
) -> str:
    """A fleet file of the directory that cannot run, said once as the loop starts (the other
    fleets run; `vultrscale_fleet_files_invalid` counts it)."""
    said = list(problems)
    record = {
        "time": _when(at),
        "level": "error",
        "msg": "fleet file invalid",
        "file": file,
        "problems": said,
        "hint": "Fix it (`vultrscale config check` lists every problem); the other fleets run.",
    }
    if fmt is LogFormat.JSON:
        return _json_line(record, secrets)
    return _one_line(
        f"{record['time']} fleet file {file} is invalid, not run: {'; '.join(said)}. "
        f"Fix: {record['hint']}",
        secrets,
    )


def orphans_line(fleet: str, instances: int, at: datetime, fmt: LogFormat) -> str:
    """Instances the ledger holds for a fleet no config file describes: nothing deletes them."""
    record = {
        "time": _when(at),
        "level": "warning",
        "msg": "orphan instances",
        "fleet": fleet,
        "instances": instances,
        "hint": "Put the fleet's file back, or drain and delete them by hand (`vultrscale "
        "status` lists them).",
    }
    if fmt is LogFormat.JSON:
        return _json_line(record, ())
    return _one_line(
        f"{record['time']} fleet {fleet}: {instances} instance(s) in the ledger, but no config "
        f"file describes the fleet: nothing scales or deletes them. Fix: {record['hint']}",
        (),
    )


def failed_fleets(codes: dict[str, int], invalid: Iterable[str]) -> str | None:
    """The one-shot pass of a directory: which fleets failed, and how (None: none did)."""
    bad = list(invalid)
    failed = [f"{name} (exit {code})" for name, code in sorted(codes.items()) if code]
    failed += [f"{file} (invalid, not run)" for file in bad]
    if not failed:
        return None
    total = len(codes) + len(bad)
    return f"{len(failed)} of {total} fleet(s) failed: {', '.join(failed)}"
