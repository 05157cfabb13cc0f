"""One reconcile pass: lock -> check -> read -> decide -> apply -> record; and the loop.

- *Check*: every local precondition (``Parts.preflight``: the scaler's key file, the metrics
  target) and the plan's price are checked before anything is changed; a refused pass raises
  ``UsageError`` (exit 2) and its row in ``fleet_events`` is its only write. A plan or price
  that stops passing on a fleet that has instances refuses only creates: the pass drains and
  deletes as usual and ends with exit 2. A queue preset that does not match the database (its
  library's tables missing, or of another version) holds the fleet and ends with exit 2 too.
- *Read* (``vultrscale.read``) builds one complete, frozen ``Readings`` value through the
  ports (ledger rows, what Vultr lists, workers, queue signals, drain probes, prices, the
  forecast's profile) and changes nothing.
- *Decide* is pure (``vultrscale.rules.decision``): the lifecycle's transitions and drain verdicts,
  the plan, the steps in kill-safe order.
- *Apply* (``vultrscale.apply``) carries the steps out through the ports; a failure on one
  instance is that instance's error, and the rest of the fleet is still acted on.
- *Record*: every pass that held the lock writes its ``fleet_events`` row, failed ones too
  (a Ctrl-C as it writes it is raised after); the forecast's profile only a pass that succeeded.

The pass is level-triggered and safe to kill at any point: every irreversible step is preceded
by a ledger write that lets the next pass find it, and a pass never waits for a drain to finish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from vultrscale import interrupts
from vultrscale.apply import apply, record, remember, save_profile
from vultrscale.config import Config
from vultrscale.core.clock import Clock
from vultrscale.core.model import Action, ActionKind, Observation, PassEvent, Plan
from vultrscale.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    DatabaseError,
    RuntimeFailure,
    UsageError,
    VultrscaleError,
)
from vultrscale.ports import AccountLedger, Session
from vultrscale.ports import Parts as Parts  # re-exported: the pass's callers build them
from vultrscale.read import account as read_account
from vultrscale.read import read, snapshot
from vultrscale.redaction import redact
from vultrscale.rules.decision import Decision, decide
from vultrscale.rules.readings import Readings


@dataclass
class PassResult:
    """What one pass saw, decided, did and what went wrong."""

    exit_code: int
    at: datetime
    lock_held: bool = False
    dry_run: bool = False
    plan: Plan | None = None
    observation: Observation | None = None
    decision: Decision | None = None  # everything the pass decided (None: it never got there)
    results: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    pass_id: int | None = None  # its fleet_events id (the pass id `events` shows); None: unrecorded
    # Creates Vultr refused this pass: (offering name, "unavailable" | "unclassified" |
    # "instance_limit"), for the metrics.
    refusals: list[tuple[str, str]] = field(default_factory=list)

    @property
    def actions(self) -> tuple[Action, ...]:
        """The plan's actions, each with its reason (none when the pass never decided)."""
        return () if self.plan is None else self.plan.actions

    def action_rows(self) -> list[dict[str, Any]]:
        """The actions as ``--json`` and the ``fleet_events`` row show them."""
        return [{"kind": a.kind.value, "label": a.label, "reason": a.reason} for a in self.actions]

    def to_json(self) -> dict[str, Any]:
        obs = self.observation
        return {
            "at": self.at.isoformat(),
            "exit_code": self.exit_code,
            "dry_run": self.dry_run,
            "lock_held": self.lock_held,
            "inputs": obs.summary() if obs else None,
            "plan": self.plan.summary() if self.plan else None,
            "actions": self.action_rows(),
            "results": self.results,
            "errors": self.errors,
            "duration_s": round(self.duration_s, 3),
        }

    def note(self, label: str, what: str) -> None:
        self.results.append({"label": label, "result": what})

    def event(self) -> PassEvent:
        """The pass as its ``fleet_events`` row holds it."""
        return PassEvent(
            at=self.at,
            dry_run=False,
            observation=self.observation,
            plan=self.plan,
            actions=self.action_rows(),
            results=self.results,
            errors=self.errors,
            exit_code=self.exit_code,
        )


# --- the pass ----------------------------------------------------------------------------------


def run_pass(
    cfg: Config, parts: Parts, *, dry_run: bool = False, take_lock: bool = True
) -> PassResult:
    """One reconcile pass. Raises UsageError (exit 2) for bad input before changing anything,
    DatabaseError (exit 1) when Postgres fails; other failures are in the result.

    ``take_lock=False`` is for read-only views (``status``): they must work while a pass runs,
    and only a dry run may skip the lock."""
    if not take_lock and not dry_run:
        raise ValueError("only a dry run may skip the fleet lock")
    started = time.monotonic()
    result = PassResult(EXIT_OK, parts.clock.now(), dry_run=dry_run)
    try:
        with parts.store.session(cfg) as session:
            if take_lock and not session.ledger.lock():
                result.lock_held = True
                return result
            checks = parts.preflight if take_lock else ()  # a read-only view acts on nothing
            _checked_pass(cfg, parts, checks, session, result)
    except VultrscaleError as exc:
        exc.pass_id = result.pass_id  # recorded (or None) before the error left the pass
        raise
    finally:
        parts.drain.close()  # connections are reused within a pass, not across passes
        result.duration_s = time.monotonic() - started
    return result


def _checked_pass(
    cfg: Config,
    parts: Parts,
    checks: Sequence[Callable[[], object]],
    session: Session,
    result: PassResult,
) -> None:
    """Check, read, decide, apply; record the pass whatever happens (dry runs excepted)."""
    ledger, dry_run = session.ledger, result.dry_run
    failed = True
    try:
        for check in checks:
            check()
        reads = read(cfg, parts, session, result.at, probe=not dry_run)
        if not dry_run:
            remember(cfg, ledger, parts.cache, reads)
        with contextlib.ExitStack() as account_held:
            decision = decide(reads, cfg)
            if not dry_run:
                reads, decision = _account_checked(cfg, session, reads, decision, account_held)
            if decision.refused_outright and reads.refused is not None:  # nothing to wind down
                raise reads.refused
            result.decision = decision
            result.observation, result.plan = decision.observation, decision.plan
            result.errors.extend(decision.errors)
            if not dry_run:
                # Bad input (no snapshot, or one not complete) stops the pass before any change.
                if decision.creates:  # exit 2 now, not a user-data with the scaler's credentials
                    cfg.worker_database_url()
                boot_from = snapshot(cfg, parts, ledger) if decision.creates else ""
                parts.before_changes(decision.plan)
                apply(cfg, parts, ledger, decision, boot_from, result)
        result.exit_code = (
            EXIT_USAGE
            if decision.refused or decision.misconfigured
            else EXIT_RUNTIME
            if result.errors
            else EXIT_OK
        )
        # The forecast's profile is saved by a pass that succeeded only: a failed one (the API
        # down, no snapshot, a refusal) changes nothing but its fleet_events row and the steps
        # it carried out. The profile stays in this process's cache for its next pass to save.
        if reads.new_profile is not None and result.exit_code == EXIT_OK and not dry_run:
            save_profile(ledger, reads.new_profile)
        failed = False
    except VultrscaleError as exc:
        result.exit_code = exc.exit_code
        result.errors.append(exc.message)
        raise
    except Exception as exc:  # a bug: the CLI reports it; its ledger row must not say "ok"
        result.exit_code = EXIT_RUNTIME
        result.errors.append(f"unexpected {type(exc).__name__}: {exc}")
        raise
    except KeyboardInterrupt:  # Ctrl-C mid-pass (`--loop`): nor must this one's
        result.exit_code = EXIT_INTERRUPTED  # as the CLI exits with
        result.errors.append("interrupted (SIGINT) before the pass finished")
        raise
    finally:
        # A Ctrl-C now is raised once the pass is recorded: it cut the row's write, and a pass
        # that ran (and created) left none.
        with interrupts.held_off():
            if result.errors:
                # Belt and braces: whatever an adapter put in an error, no secret reaches the
                # ledger.
                secrets = cfg.secrets.values()
                result.errors = [redact(e, secrets) for e in result.errors]
            if not dry_run:
                result.pass_id = record(ledger, result.event(), quiet=failed)


# How long a pass that creates waits for the account's lock (another fleet's pass holds it
# while it writes its create intents and POSTs them: a second or two a create).
ACCOUNT_LOCK_WAIT_S = 10.0


def _account_checked(
    cfg: Config,
    session: Session,
    reads: Readings,
    decision: Decision,
    held: contextlib.ExitStack,
) -> tuple[Readings, Decision]:
    """A pass that spends (creates, or revives a draining instance) under
    ``account.monthly_ceiling_usd`` takes the account's lock (kept by ``held`` until its last
    create intent is written and POSTed) and reads the other fleets' spend again: what
    another fleet created since this pass read it counts, and the decision is made again on
    it. The lock not had in time: decided again on an account that may not grow (nothing is
    created on a guess; the rest of the pass goes on)."""
    account = session.ledger.account
    if reads.account is None or account is None or not _spends(decision):
        return reads, decision
    if account.lock(ACCOUNT_LOCK_WAIT_S):
        held.callback(_unlock, account)
        fresh = read_account(cfg, session, reads.now)
    else:
        fresh = dataclasses.replace(
            reads.account,
            unknown=f"another pass held the account's lock past {ACCOUNT_LOCK_WAIT_S:g}s",
        )
    if fresh == reads.account:
        return reads, decision
    reads = dataclasses.replace(reads, account=fresh)
    return reads, decide(reads, cfg)


def _spends(decision: Decision) -> bool:
    return bool(decision.creates) or any(a.kind is ActionKind.REVIVE for a in decision.plan.actions)


def _unlock(account: AccountLedger) -> None:
    with contextlib.suppress(DatabaseError):  # the session's end frees it in any case
        account.unlock()


# --- the loop ----------------------------------------------------------------------------------


def run_forever(
    cfg: Config,
    parts: Parts,
    *,
    interval: timedelta,
    dry_run: bool = False,
    stop: threading.Event | None = None,
    on_result: Callable[[PassResult], None] = lambda r: None,
    on_error: Callable[[VultrscaleError], None] = lambda e: None,
    max_passes: int | None = None,
    refuse_early: bool = True,
) -> int:
    """Run passes every ``interval`` until ``stop`` is set. A runtime failure (of a pass, or
    of ``on_result``) is reported and the loop goes on. A usage error before a first pass ran
    to its result (bad config, a plan Vultr refuses from the start) ends it with exit 2; after
    one (the
    price rose past the ceiling, the snapshot was deleted) it is reported and the loop goes on,
    so the fleet comes back when the condition clears: a refused fleet that wound down to
    nothing used to end the loop there. Without ``refuse_early`` (one fleet of several, whose
    others run on) a usage error before a first pass is reported and the loop goes on too."""
    stop = stop or threading.Event()
    passes = 0
    ran = False  # a pass has run to its result (not one that found the lock held, or failed)
    last = EXIT_OK
    while not stop.is_set():
        began = parts.clock.monotonic()
        try:
            result = run_pass(cfg, parts, dry_run=dry_run)
            ran = ran or not result.lock_held
            last = result.exit_code
            on_result(result)
        except UsageError as exc:
            if not ran and refuse_early:
                raise
            last = exc.exit_code
            on_error(exc)
        except RuntimeFailure as exc:
            last = exc.exit_code
            on_error(exc)
        passes += 1
        if max_passes is not None and passes >= max_passes:
            break
        remaining = interval.total_seconds() - (parts.clock.monotonic() - began)
        if remaining > 0:
            _wait(parts.clock, stop, remaining)
    return last


def _wait(clock: Clock, stop: threading.Event, seconds: float) -> None:
    from vultrscale.core.clock import SystemClock

    if isinstance(clock, SystemClock):
        stop.wait(seconds)
    else:
        clock.sleep(seconds)
