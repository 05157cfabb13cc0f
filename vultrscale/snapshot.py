"""Bake the fleet's base image: snapshot an instance, wait until complete, record it, prune.

``bake`` checks the instance and the database before it sends anything, POSTs the snapshot
once (an ambiguous outcome is resolved by looking the snapshot up by its description, never by
posting again), and polls with a growing interval until Vultr says ``complete``. The snapshot
is listed in ``fleet_snapshots`` as ``pending`` right after the POST, so an interrupted or
timed-out bake is never lost track of; it becomes the fleet's snapshot
(``fleet_state.snapshot_id``) only once complete. Then older complete snapshots of this fleet
(only those recorded in ``fleet_snapshots``) beyond ``keep`` are deleted at Vultr, never the new
one, the fleet's previous one (a reconcile pass may still be creating from it), the one named
in ``fleet.snapshot_id``, nor a pending one (Vultr may still be making it).

``resume`` picks up a snapshot that is still pending (after ``--no-wait`` or a timeout): it
waits, records and prunes exactly as a bake does, without creating anything.

Time comes from a Clock so tests advance a FakeClock instead of sleeping.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from vultrscale.config import Config, format_duration
from vultrscale.core.clock import Clock, SystemClock
from vultrscale.db import snapshots as store
from vultrscale.errors import EXIT_INTERRUPTED, DatabaseError, RuntimeFailure, UsageError
from vultrscale.vultr.errors import (
    AmbiguousCreate,
    ApiUnreachable,
    NotFound,
    RateLimited,
    ServerError,
    VultrError,
)
from vultrscale.vultr.models import VInstance, VSnapshot

DEFAULT_KEEP = 3
DEFAULT_TIMEOUT = timedelta(minutes=60)
# Packer polls every ~3 s, Terraform up to 10 s; a big disk takes 20+ minutes, so grow to 30 s.
FIRST_POLL = 3.0
MAX_POLL = 30.0
POLL_GROWTH = 1.5
# A snapshot may not be visible for a moment after the POST (like an instance's 404 after
# create); only after this long does a 404 mean it is gone.
NOT_VISIBLE_GRACE = 60.0
# After an ambiguous POST: how often, and how far apart, to look the snapshot up.
LOOKUP_ATTEMPTS = 3
LOOKUP_INTERVAL = 5.0
FAILED_STATUSES = frozenset({"deleted", "failed", "error"})


class SnapshotApi(Protocol):
    """The part of ``VultrClient`` a bake uses (the simulator's transport serves it too)."""

    def get_instance(self, instance_id: str) -> VInstance: ...
    def create_snapshot(self, instance_id: str, description: str = "") -> VSnapshot: ...
    def get_snapshot(self, snapshot_id: str) -> VSnapshot: ...
    def list_snapshots(self, description: str | None = None) -> list[VSnapshot]: ...
    def delete_snapshot(self, snapshot_id: str) -> None: ...


@dataclass(frozen=True)
class Progress:
    """What a waiting bake reports after each poll (the CLI shows it next to a spinner)."""

    snapshot_id: str
    status: str
    elapsed: float  # seconds since the wait began
    next_poll: float  # seconds until the next poll
    note: str = ""  # e.g. a transient API error that the next poll retries


@dataclass(frozen=True)
class BakeResult:
    """The outcome of a bake or resume."""

    fleet: str
    snapshot_id: str
    description: str
    status: str  # "complete", or "pending" after --no-wait
    instance_id: str  # empty for a resume
    elapsed: float  # seconds spent waiting for complete
    size: int = 0  # bytes, as Vultr reports it
    previous: str | None = None  # the fleet's recorded snapshot before this one
    deleted: tuple[str, ...] = ()  # older fleet snapshots deleted by the prune
    delete_errors: tuple[str, ...] = ()  # "<id>: <why>" for each one that could not be deleted
    kept: tuple[str, ...] = field(default=())  # fleet snapshots still recorded, newest first

    @property
    def is_complete(self) -> bool:
        return self.status == store.COMPLETE


class SnapshotFailed(RuntimeFailure):
    """The snapshot disappeared or reached a failure state at Vultr."""

    def __init__(self, message: str, *, snapshot_id: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.snapshot_id = snapshot_id


class SnapshotTimeout(RuntimeFailure):
    """The snapshot was still pending when the wait ran out; it is not the fleet's snapshot."""

    def __init__(self, message: str, *, snapshot_id: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.snapshot_id = snapshot_id


class SnapshotInterrupted(RuntimeFailure):
    """Ctrl-C while waiting: the snapshot goes on at Vultr; ``--resume`` picks it up."""

    exit_code = EXIT_INTERRUPTED


def resume_command(snapshot_id: str) -> str:
    """The command that waits for ``snapshot_id`` again and records it."""
    return f"vultrscale snapshot --resume {snapshot_id}"


ProgressFn = Callable[[Progress], None]


def default_description(fleet: str, now: datetime) -> str:
    """A description unique per fleet and second, so an ambiguous POST can be looked up by it."""
    return f"{fleet}-{now.strftime('%Y%m%dT%H%M%SZ')}"


def bake(
    client: SnapshotApi,
    database_url: str,
    cfg: Config,
    instance_id: str,
    *,
    description: str | None = None,
    keep: int = DEFAULT_KEEP,
    wait: bool = True,
    timeout: timedelta = DEFAULT_TIMEOUT,
    clock: Clock | None = None,
    on_progress: ProgressFn | None = None,
) -> BakeResult:
    """Snapshot ``instance_id`` as the fleet's base image; see the module docstring.

    Raises UsageError (exit 2, nothing created) for an unknown instance or bad arguments,
    SnapshotFailed when the snapshot disappears or fails, SnapshotTimeout past ``timeout``.
    With ``wait=False`` it returns right after the POST with status ``pending``: the snapshot
    is listed for the fleet but is not its snapshot until ``resume`` sees it complete.
    """
    clock = clock or SystemClock()
    fleet = cfg.fleet.name
    instance_id = instance_id.strip()
    _check_args(keep, timeout)
    if not instance_id:
        raise UsageError("--from-instance is empty", hint="Pass an id from `vultrscale instances`.")

    # The database first: a wrong DATABASE_URL must fail before anything exists at Vultr.
    with store.connect(database_url) as conn:
        previous = store.recorded_snapshot(conn, fleet)

    try:
        client.get_instance(instance_id)
    except NotFound as exc:
        raise _no_instance(instance_id) from exc

    description = description or default_description(fleet, clock.now())
    # Snapshots that already carry this description are not ours if the POST is ambiguous.
    existing = {s.id for s in client.list_snapshots(description=description)}
    made: str | None = None
    try:
        try:
            snap = client.create_snapshot(instance_id, description=description)
        except NotFound as exc:  # deleted between the check and the POST
            raise _no_instance(instance_id) from exc
        except AmbiguousCreate as exc:
            snap = _find_created(client, description, existing, clock, exc)
        made = snap.id
        created_at = snap.date_created or clock.now()
        _record(database_url, fleet, snap.id, description, created_at, store.PENDING)
    except KeyboardInterrupt:
        # Ctrl-C between the POST and its record: the snapshot may exist at Vultr, listed
        # nowhere of ours, and no prune would ever delete it. Say what to look for.
        raise _interrupted_unrecorded(made, description) from None

    if not wait and snap.status != store.COMPLETE:
        return BakeResult(
            fleet=fleet,
            snapshot_id=snap.id,
            description=description,
            status=store.PENDING,
            instance_id=instance_id,
            elapsed=0.0,
            previous=previous,
        )
    return _finish(
        client,
        database_url,
        cfg,
        snap.id,
        created_at,
        description,
        instance_id,
        previous,
        keep=keep,
        timeout=timeout,
        clock=clock,
        on_progress=on_progress,
    )


def resume(
    client: SnapshotApi,
    database_url: str,
    cfg: Config,
    snapshot_id: str,
    *,
    keep: int = DEFAULT_KEEP,
    timeout: timedelta = DEFAULT_TIMEOUT,
    clock: Clock | None = None,
    on_progress: ProgressFn | None = None,
) -> BakeResult:
    """Wait for an existing snapshot (after ``--no-wait`` or a timeout), record it, prune.

    Nothing is created. The snapshot joins the fleet's list if it was not in it yet (a bake
    whose POST had an unclear outcome, or whose record failed, is finished this way), and so
    may be pruned by a later bake; one recorded for another fleet is refused (exit 2).
    """
    clock = clock or SystemClock()
    fleet = cfg.fleet.name
    snapshot_id = snapshot_id.strip()
    _check_args(keep, timeout)
    with store.connect(database_url) as conn:
        previous = store.recorded_snapshot(conn, fleet)
        owner = store.snapshot_fleet(conn, snapshot_id)
    if owner is not None and owner != fleet:
        raise UsageError(
            f"snapshot {snapshot_id} is recorded for fleet {owner!r}, not {fleet!r}; nothing "
            "was changed",
            hint=f"Resume it with that fleet's config. Booting {fleet!r} from it with "
            f"fleet.snapshot_id works, but {owner!r}'s bakes may prune it: bake {fleet!r} a "
            "snapshot of its own.",
        )
    try:
        snap = client.get_snapshot(snapshot_id)
    except NotFound as exc:
        raise UsageError(
            f"no snapshot {snapshot_id}",
            hint="check the id in the Vultr console (Orchestration > Snapshots).",
        ) from exc
    created_at = snap.date_created or clock.now()
    with store.connect(database_url) as conn:
        recorded = {s.snapshot_id for s in store.fleet_snapshots(conn, fleet)}
    if snapshot_id not in recorded:
        _record(database_url, fleet, snapshot_id, snap.description, created_at, store.PENDING)
    return _finish(
        client,
        database_url,
        cfg,
        snapshot_id,
        created_at,
        snap.description,
        "",
        previous,
        keep=keep,
        timeout=timeout,
        clock=clock,
        on_progress=on_progress,
    )


def _interrupted_unrecorded(snapshot_id: str | None, description: str) -> SnapshotInterrupted:
    if snapshot_id:
        return SnapshotInterrupted(
            f"interrupted before snapshot {snapshot_id} was recorded; Vultr keeps making it, "
            "but it is not the fleet's snapshot",
            hint=f"Run `{resume_command(snapshot_id)}` to wait for it and record it (or delete "
            "it in the Vultr console, Orchestration > Snapshots).",
        )
    return SnapshotInterrupted(
        f"interrupted while asking Vultr for the snapshot {description!r}; Vultr may have made "
        "it, and nothing recorded it",
        hint=f"Look for the description {description!r} in the Vultr console (Orchestration > "
        "Snapshots): run `vultrscale snapshot --resume <ID>` to record it, or delete it.",
    )


def _no_instance(instance_id: str) -> UsageError:
    return UsageError(
        f"no instance {instance_id}",
        hint="check the id with `vultrscale instances`; nothing was created.",
    )


def _record(
    database_url: str,
    fleet: str,
    snapshot_id: str,
    description: str,
    created_at: datetime,
    status: str,
) -> None:
    """Record the snapshot; a database failure names the snapshot so it is not lost."""
    try:
        with store.connect(database_url) as conn:
            store.record_snapshot(conn, fleet, snapshot_id, description, created_at, status)
    except DatabaseError as exc:
        raise _unrecorded(snapshot_id, exc) from exc


def _unrecorded(snapshot_id: str, exc: DatabaseError, how: str = "exists") -> DatabaseError:
    """The database failed before ``snapshot_id`` was recorded: its id, and how to resume."""
    return DatabaseError(
        f"snapshot {snapshot_id} {how} at Vultr but could not be recorded: {exc.message}",
        hint=f"{exc.hint} Once the database works, run `{resume_command(snapshot_id)}`.".strip(),
    )


def _check_args(keep: int, timeout: timedelta) -> None:
    if keep < 1:
        raise UsageError(
            f"--keep must be at least 1, got {keep}",
            hint="The new and the previous fleet snapshot are always kept; --keep 1 deletes "
            "every other older one.",
        )
    if timeout.total_seconds() <= 0:
        raise UsageError("--timeout must be positive", hint="For example --timeout 60m.")


def _find_created(
    client: SnapshotApi,
    description: str,
    existing: set[str],
    clock: Clock,
    cause: AmbiguousCreate,
) -> VSnapshot:
    """After an ambiguous POST: the snapshot it made, found by description, or a clear failure."""
    for attempt in range(LOOKUP_ATTEMPTS):
        if attempt:
            clock.sleep(LOOKUP_INTERVAL)
        try:
            found = [  # the filter's matching rules are not documented: compare it ourselves
                s
                for s in client.list_snapshots(description=description)
                if s.id not in existing and s.description == description
            ]
        except (ServerError, ApiUnreachable, RateLimited):
            continue
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            ids = ", ".join(s.id for s in found)
            raise RuntimeFailure(
                f"the snapshot request had an unclear outcome and {len(found)} new snapshots "
                f"carry the description {description!r}: {ids}",
                hint="Keep one (delete the others in the Vultr console), then run "
                "`vultrscale snapshot --resume <id>`.",
            ) from cause
    raise RuntimeFailure(
        f"the snapshot request had an unclear outcome ({cause.message}) and no snapshot with "
        f"the description {description!r} has appeared",
        hint="Check the Vultr console (Orchestration > Snapshots) in a minute: if it is there, "
        "run `vultrscale snapshot --resume <id>`; if not, run the same command again.",
    ) from cause


def _finish(
    client: SnapshotApi,
    database_url: str,
    cfg: Config,
    snapshot_id: str,
    created_at: datetime,
    description: str,
    instance_id: str,
    began_with: str | None,
    *,
    keep: int,
    timeout: timedelta,
    clock: Clock,
    on_progress: ProgressFn | None,
) -> BakeResult:
    """Wait, then record and prune. ``began_with``: the fleet's snapshot when the command
    began, kept by the prune as well as the one it has just before recording."""
    fleet = cfg.fleet.name
    try:
        snap, elapsed = _wait_complete(
            client, database_url, snapshot_id, timeout, clock, on_progress
        )
    except KeyboardInterrupt:
        # Ctrl-C: Vultr goes on making the snapshot, which stays recorded as pending.
        raise SnapshotInterrupted(
            f"interrupted while waiting for snapshot {snapshot_id}; Vultr keeps making it, "
            "but it is not the fleet's snapshot yet",
            hint=f"Run `{resume_command(snapshot_id)}` to wait for it again and record it.",
        ) from None
    with contextlib.ExitStack() as stack:
        try:
            conn = stack.enter_context(store.connect(database_url))
            stack.enter_context(store.fleet_lock(conn, fleet))
            # The fleet's snapshot now as well as when this command began: another bake or
            # resume may have recorded one meanwhile, and a pass may still create from either.
            previous = store.recorded_snapshot(conn, fleet)
        except DatabaseError as exc:
            raise _unrecorded(snapshot_id, exc, "is complete") from exc
        except KeyboardInterrupt:  # waiting for another bake's record and prune
            raise SnapshotInterrupted(
                f"interrupted before snapshot {snapshot_id}, complete at Vultr, was recorded",
                hint=f"Run `{resume_command(snapshot_id)}` to record it.",
            ) from None
        _record(database_url, fleet, snapshot_id, description, created_at, store.COMPLETE)
        # The previous fleet snapshots too: a reconcile pass that read one of them before this
        # bake may be creating instances from it right now.
        keeping = (cfg.fleet.snapshot_id, previous, began_with)
        protect = {snapshot_id, *(s for s in keeping if s)}
        deleted, errors, kept = prune(client, database_url, fleet, keep, protect)
    return BakeResult(
        fleet=fleet,
        snapshot_id=snapshot_id,
        description=description,
        status=store.COMPLETE,
        instance_id=instance_id,
        elapsed=elapsed,
        size=snap.size,
        previous=previous,
        deleted=tuple(deleted),
        delete_errors=tuple(errors),
        kept=tuple(kept),
    )


def _wait_complete(
    client: SnapshotApi,
    database_url: str,
    snapshot_id: str,
    timeout: timedelta,
    clock: Clock,
    on_progress: ProgressFn | None,
) -> tuple[VSnapshot, float]:
    """Poll until ``complete``; returns the snapshot and the seconds waited."""
    start = clock.monotonic()
    deadline = start + timeout.total_seconds()
    interval = FIRST_POLL
    status = "pending"
    while True:
        note = ""
        try:
            snap = client.get_snapshot(snapshot_id)
        except NotFound as exc:
            if clock.monotonic() - start >= NOT_VISIBLE_GRACE:
                with store.connect(database_url) as conn:
                    store.forget_snapshot(conn, snapshot_id)
                raise SnapshotFailed(
                    f"snapshot {snapshot_id} disappeared at Vultr while it was {status}",
                    snapshot_id=snapshot_id,
                    hint="Someone may have deleted it, or Vultr dropped it; run the command "
                    "again to bake a new one.",
                ) from exc
            note = "not visible yet"
        except (ServerError, ApiUnreachable, RateLimited) as exc:
            # The client already retried; a long wait outlives a short API outage.
            note = f"API error, will retry: {exc.message}"
        else:
            status = snap.status or status
            if status == store.COMPLETE:
                return snap, clock.monotonic() - start
            if status in FAILED_STATUSES:
                # Of no use to anyone: deleted (best effort) and forgotten, or it stayed
                # recorded as pending, which no prune touches, and at Vultr for good.
                gone = _discard(client, database_url, snapshot_id)
                raise SnapshotFailed(
                    f"snapshot {snapshot_id} is {status!r} at Vultr; it was not made the "
                    f"fleet's snapshot{gone}",
                    snapshot_id=snapshot_id,
                    hint="Check the instance (disk, state) and run the command again.",
                )
        now = clock.monotonic()
        if now >= deadline:
            raise SnapshotTimeout(
                f"snapshot {snapshot_id} is still {status} at Vultr after "
                f"{format_duration(timeout)}; it was not made the fleet's snapshot",
                snapshot_id=snapshot_id,
                hint="Big disks take a while. Vultr keeps working on it: run "
                f"`{resume_command(snapshot_id)}` to wait again and record it "
                "(or check it in the Vultr console, Orchestration > Snapshots).",
            )
        pause = min(interval, deadline - now)
        if on_progress:
            on_progress(Progress(snapshot_id, status, now - start, pause, note))
        clock.sleep(pause)
        interval = min(interval * POLL_GROWTH, MAX_POLL)


def _delete_at_vultr(client: SnapshotApi, snapshot_id: str) -> str | None:
    """DELETE the snapshot; None once it is gone (already gone counts), else why not."""
    try:
        client.delete_snapshot(snapshot_id)
    except NotFound:
        pass  # already gone at Vultr: forgetting it is all that is left to do
    except VultrError as exc:
        return exc.message
    return None


def _discard(client: SnapshotApi, database_url: str, snapshot_id: str) -> str:
    """Delete a failed snapshot at Vultr and forget it; what became of it, for the message."""
    why = _delete_at_vultr(client, snapshot_id)
    if why is not None:
        return f" (deleting it failed: {why}; delete it in the Vultr console)"
    try:
        with store.connect(database_url) as conn:
            store.forget_snapshot(conn, snapshot_id)
    except DatabaseError:
        return " and was deleted at Vultr"
    return " and was deleted"


def prune(
    client: SnapshotApi,
    database_url: str,
    fleet: str,
    keep: int,
    protect: set[str],
) -> tuple[list[str], list[str], list[str]]:
    """Delete this fleet's complete snapshots beyond the newest ``keep``, except ``protect``.

    Only ``complete`` snapshots listed in ``fleet_snapshots`` for ``fleet`` are candidates and
    counted toward ``keep``: a pending one may still be in the making at Vultr (``--resume``
    finishes it), and snapshots made by hand or for another fleet are never touched. One that
    cannot be deleted stays recorded (the next bake tries again). Returns (deleted ids,
    "<id>: <why>" errors, kept ids).
    """
    deleted: list[str] = []
    errors: list[str] = []
    kept: list[str] = []
    try:
        with store.connect(database_url) as conn:
            rows = [r for r in store.fleet_snapshots(conn, fleet) if r.status == store.COMPLETE]
            for row in rows[keep:]:
                if row.snapshot_id in protect:
                    continue
                why = _delete_at_vultr(client, row.snapshot_id)
                if why is not None:
                    errors.append(f"{row.snapshot_id}: {why}")
                    continue
                store.forget_snapshot(conn, row.snapshot_id)
                deleted.append(row.snapshot_id)
            kept = [s.snapshot_id for s in store.fleet_snapshots(conn, fleet)]
    except DatabaseError as exc:
        # The bake itself is done and recorded: a prune the database cuts short is a warning
        # (the next bake prunes again; one deleted but still listed is then forgotten), not a
        # failure that sends the user to bake, and pay for, the same image again.
        errors.append(f"the rest of the older snapshots: the database failed ({exc.message})")
    return deleted, errors, kept
