"""Every problem with a built config (:func:`validate`), and what ``config check`` warns about.

A setting's own range, pattern, choices and rule come from the schema (``kinds.value_problems``
on each field); the rules written here relate several settings, so no field can say them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from vultrscale.config.kinds import INTEGER, NUMBER, SECONDS, Table, Tables, spec_of, value_problems
from vultrscale.config.schema import SECTIONS
from vultrscale.core.values import format_duration
from vultrscale.redaction import url_user
from vultrscale.workerunit import timeout_stop_seconds

if TYPE_CHECKING:
    from vultrscale.config.model import Config


def validate(cfg: Config) -> list[str]:
    """Every problem with a built config, each naming its key. Empty list: valid.

    The numbers out of range first (a typo of a few extra digits), then every other setting
    that its own facts refuse, then the rules that relate several settings."""
    ranges: list[str] = []
    others: list[str] = []
    for section, cls in SECTIONS.items():
        _field_problems(section, cls, getattr(cfg, section), ranges, others)
    return ranges + others + _related_problems(cfg)


_NUMBERS = (INTEGER, NUMBER, SECONDS)


def _field_problems(
    where: str, cls: type, value: Any, ranges: list[str], others: list[str]
) -> None:
    for f in dataclasses.fields(cls):
        spec, key, got = spec_of(f), f"{where}.{f.name}", getattr(value, f.name)
        if isinstance(spec.kind, Table):
            _field_problems(key, spec.kind.item, got, ranges, others)
        elif isinstance(spec.kind, Tables):
            for i, item in enumerate(got):
                _field_problems(f"{key}[{i}]", spec.kind.item, item, ranges, others)
        else:
            found = value_problems(spec, key, got)
            (ranges if spec.kind in _NUMBERS and spec.bounds else others).extend(found)


def _related_problems(cfg: Config) -> list[str]:
    """The rules that relate several settings (or the entries of one list)."""
    p: list[str] = []
    f, w, q, pol, d = cfg.fleet, cfg.worker, cfg.queue, cfg.policy, cfg.drain
    seen: set[tuple[str, str]] = set()
    for i, o in enumerate(f.offerings):
        if (o.region, o.plan) in seen:
            p.append(f"fleet.offerings[{i}]: {o.name} is listed twice; keep the first")
        seen.add((o.region, o.plan))
    regions = len({o.region for o in f.offerings})
    if f.vpc_ids and regions > 1:
        p.append(
            "fleet.vpc_ids: a VPC belongs to one region, and the fleet.offerings are in "
            f"{regions} regions (a create elsewhere would be refused): keep the offerings in "
            "the VPCs' region, or empty vpc_ids"
        )
    if q.preset == "custom":
        for key in ("ready_sql", "in_flight_sql", "oldest_ready_seconds_sql"):
            if not getattr(q, key).strip():
                p.append(
                    f'queue.{key}: required with preset = "custom" (a query returning one number)'
                )
        history = [k for k in ("recent_jobs_sql", "recent_arrivals_sql") if getattr(q, k).strip()]
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
    for i, fl in enumerate(pol.floor):
        if fl.min_instances > pol.max_instances:
            p.append(
                f"policy.floor[{i}].min_instances ({fl.min_instances}) is above "
                f"policy.max_instances ({pol.max_instances})"
            )
    fc = pol.forecast
    if fc.min_history < timedelta(minutes=1) or fc.min_history > fc.weeks * timedelta(days=7):
        p.append(
            f"policy.forecast.min_history: {format_duration(fc.min_history)} must be from 1m to "
            f"the {fc.weeks} week(s) looked back (policy.forecast.weeks), e.g. 7d: one "
            "whole week of jobs before the forecast acts"
        )
    if fc.pool == "weekday" and timedelta(days=1) % fc.slot:
        p.append(
            f"policy.forecast.slot: {format_duration(fc.slot)} must cut the day into whole "
            'slots with pool = "weekday", e.g. 15m, 30m, 1h, 2h'
        )
    stop = timeout_stop_seconds(w) if math.isfinite(w.drain_seconds) else 0
    if d.timeout.total_seconds() < stop:
        p.append(
            f"drain.timeout ({format_duration(d.timeout)}) is shorter than the unit's "
            f"TimeoutStopSec ({stop}s, from worker.drain_seconds = {w.drain_seconds:g}): "
            "the scaler would give up before systemd does; raise drain.timeout"
        )
    return p


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
