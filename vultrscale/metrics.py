"""Prometheus metrics of the reconcile loop: a textfile for node_exporter, or /metrics.

The registry is our own (not the global default), so tests and several fleets do not mix.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    start_http_server,
    write_to_textfile,
)

from vultrscale.core.limits import Limit
from vultrscale.core.model import AccountSpend, ActionKind, InstanceState
from vultrscale.errors import RuntimeFailure, UsageError
from vultrscale.reconcile import PassResult

if TYPE_CHECKING:
    from vultrscale.config import Config

# What a gauge shows for a figure the pass could not read (the queue, the price).
_UNKNOWN = float("nan")
# The exit codes a pass ends with (docs/reference/cli.md, "Exit codes"): each series exists from
# the start, at 0, so that an alert's increase() sees the first failure too (a series born at 1
# shows none).
_EXIT_CODES = ("0", "1", "2")
# How a create can be refused (``PassResult.refusals``).
_REFUSAL_KINDS = ("unavailable", "unclassified", "instance_limit")
# The states a drain runs through until the instance is gone.
_DRAINING = (InstanceState.DRAINING, InstanceState.DELETING)


class Families:
    """Every metric of the scaler in one registry (our own, not the global default): one per
    process, each fleet's series told apart by their ``fleet`` label (``Metrics``), and the
    account's figures, which belong to no one fleet."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r, lbl = self.registry, ["fleet"]
        self.instances = Gauge(
            "vultrscale_instances",
            "Fleet instances by ledger state",
            ["fleet", "state"],
            registry=r,
        )
        self.desired = Gauge(
            "vultrscale_desired_instances", "Instances demand asks for", lbl, registry=r
        )
        self.target = Gauge(
            "vultrscale_target_instances",
            "Instances after floor, cap, cool-downs, budget",
            lbl,
            registry=r,
        )
        self.ready = Gauge("vultrscale_queue_ready", "Jobs ready and due", lbl, registry=r)
        self.in_flight = Gauge(
            "vultrscale_queue_in_flight", "Jobs with a live lease", lbl, registry=r
        )
        self.expired = Gauge(
            "vultrscale_queue_expired_leases", "Leases expired, not reaped", lbl, registry=r
        )
        self.oldest = Gauge(
            "vultrscale_queue_oldest_ready_seconds", "Age of the oldest ready job", lbl, registry=r
        )
        self.month_to_date = Gauge(
            "vultrscale_budget_month_to_date_usd", "Fleet cost this UTC month", lbl, registry=r
        )
        self.duration = Gauge(
            "vultrscale_pass_duration_seconds", "Last pass wall time", lbl, registry=r
        )
        self.last_pass = Gauge(
            "vultrscale_last_pass_timestamp_seconds", "When the last pass ran", lbl, registry=r
        )
        self.passes = Counter(
            "vultrscale_passes", "Reconcile passes by exit code", ["fleet", "exit_code"], registry=r
        )
        self.actions = Counter("vultrscale_actions", "Actions taken", ["fleet", "kind"], registry=r)
        self.clamps = Counter(
            "vultrscale_clamps",
            "Passes a limit held back, by kind (cap, budget_monthly, cooldown_up, max_step_up, "
            "idle_window, billing_hour, ...)",
            ["fleet", "kind"],
            registry=r,
        )
        self.committed = Gauge(
            "vultrscale_budget_committed_usd",
            "This UTC month's bill if the fleet ran as it is to the month's end",
            lbl,
            registry=r,
        )
        self.ceiling = Gauge(
            "vultrscale_budget_ceiling_usd", "budget.monthly_ceiling_usd", lbl, registry=r
        )
        self.draining_oldest = Gauge(
            "vultrscale_drain_oldest_seconds",
            "Time since the oldest drain still under way began (0: none)",
            lbl,
            registry=r,
        )
        self.drain_deadline = Gauge(
            "vultrscale_drain_deadline_seconds",
            "drain.timeout and its margin: a drain older than this is past its deadline",
            lbl,
            registry=r,
        )
        self.refusals = Counter(
            "vultrscale_create_refusals",
            "Creates Vultr refused, by offering (region/plan) and kind: unavailable (sold out, "
            "not offered), unclassified (words not recognised), instance_limit",
            ["fleet", "offering", "kind"],
            registry=r,
        )
        self.unavailable = Gauge(
            "vultrscale_offering_unavailable_seconds",
            "Time left on a remembered refusal of the offering (0: usable or not refused)",
            ["fleet", "offering"],
            registry=r,
        )
        self.usable = Gauge(
            "vultrscale_offering_usable",
            "1 when the offering can take a create now, 0 when it is skipped",
            ["fleet", "offering"],
            registry=r,
        )
        self.forecast_floor = Gauge(
            "vultrscale_forecast_floor",
            "The floor the forecast from the queue's history asks (acted on only with "
            "policy.forecast.mode = scale; NaN: off, or too little history)",
            lbl,
            registry=r,
        )
        self.wait_estimate = Gauge(
            "vultrscale_wait_estimate_seconds",
            "The wait rule's estimate of the longest wait, queued and arriving jobs counted "
            "(NaN: not estimated: the rule off, too little job history, the queue unread)",
            lbl,
            registry=r,
        )
        self.arrival_rate = Gauge(
            "vultrscale_queue_arrival_rate",
            "Jobs a second arriving, as the wait rule counted them (the recent rate, or the "
            "forecast's where higher and acting; NaN: not estimated)",
            lbl,
            registry=r,
        )
        self.boot_time = Gauge(
            "vultrscale_boot_time_seconds",
            "Create to worker up, as the policy plans with it: learned from the ledger's boots, "
            "else policy.boot_time",
            lbl,
            registry=r,
        )
        # The account's, set by `reconcile --loop` of a directory of fleets (docs/fleets.md);
        # each series exists from the start, so an alert sees it.
        self.files_invalid = Gauge(
            "vultrscale_fleet_files_invalid",
            "Fleet files of the config directory that cannot run (config check names them)",
            registry=r,
        )
        self.orphans = Gauge(
            "vultrscale_orphan_instances",
            "Instances the ledger holds for fleets no config file describes (nothing deletes "
            "them; status lists them)",
            registry=r,
        )
        self.account_month_to_date = Gauge(
            "vultrscale_account_month_to_date_usd",
            "Every fleet's cost this UTC month (NaN: not read)",
            registry=r,
        )
        self.account_committed = Gauge(
            "vultrscale_account_committed_usd",
            "This UTC month's bill of every fleet if each ran as it is to the month's end "
            "(NaN: not read)",
            registry=r,
        )
        self.account_ceiling = Gauge(
            "vultrscale_account_ceiling_usd",
            "account.monthly_ceiling_usd (0: none)",
            registry=r,
        )
        self.account_month_to_date.set(_UNKNOWN)
        self.account_committed.set(_UNKNOWN)
        self._writing = threading.Lock()

    def set_account(self, total: AccountSpend | None, ceiling: float) -> None:
        """Every fleet's spend this month and the account's ceiling (None: not read: NaN)."""
        self.account_ceiling.set(ceiling)
        self.account_month_to_date.set(_UNKNOWN if total is None else total.month_to_date_usd)
        self.account_committed.set(_UNKNOWN if total is None else total.committed_usd)

    def write_textfile(self, path: str) -> None:
        """Write the Prometheus text format atomically (temp file + rename); one fleet's
        thread at a time."""
        try:
            with self._writing:
                write_to_textfile(str(Path(path).expanduser()), self.registry)
        except OSError as exc:
            raise RuntimeFailure(
                f"cannot write metrics to {path}: {exc.strerror or exc}",
                hint="Check that the --metrics-file directory exists and is writable.",
            ) from None

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve /metrics on addr:port, or on a free port the system picks for port 0; the
        port bound. A port in use or refused is a UsageError (exit 2)."""
        try:
            server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise UsageError(
                f"--metrics-port {port}: cannot listen on {addr}:{port}: {exc.strerror or exc}",
                hint="Pick a free port (`ss -ltn` lists those in use) or drop --metrics-port.",
            ) from None
        return int(server.server_port)


class Metrics:
    """One fleet's series in the process's ``Families`` (its own, made here, when not given);
    a family's collectors are reached as this object's attributes (``m.passes``)."""

    def __init__(self, fleet: str, families: Families | None = None) -> None:
        self.fleet = fleet
        self.families = families or Families()
        self.registry = self.families.registry
        self._series()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.families, name)

    def write_textfile(self, path: str) -> None:
        """Write the registry (every fleet's series, the process's one) to ``path``."""
        self.families.write_textfile(path)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve the registry (every fleet's series) on /metrics; the port bound."""
        return self.families.serve(port, addr)

    def _series(self) -> None:
        """Each fleet's counters exist from the start, at 0: increase() sees the first one."""
        fleet = self.fleet
        for code in _EXIT_CODES:
            self.passes.labels(fleet, code)
        for kind in ActionKind:
            self.actions.labels(fleet, kind.value)
        for limit in Limit:
            self.clamps.labels(fleet, limit.value)

    @classmethod
    def for_config(cls, cfg: Config, families: Families | None = None) -> Metrics:
        """The metrics of ``cfg``'s fleet, with the settings the alert rules compare to."""
        from vultrscale.rules.lifecycle import DRAIN_MARGIN

        m = cls(cfg.fleet.name, families)
        m.account_ceiling.set(cfg.account.monthly_ceiling_usd)
        m.ceiling.labels(m.fleet).set(cfg.budget.monthly_ceiling_usd)
        deadline = cfg.drain.timeout + DRAIN_MARGIN
        m.drain_deadline.labels(m.fleet).set(deadline.total_seconds())
        from vultrscale.rules.offerings import of

        for o in of(cfg):  # each series from the start, at 0: increase() sees the first one
            for kind in _REFUSAL_KINDS:
                m.refusals.labels(m.fleet, o.name, kind)
        return m

    def observe(self, result: PassResult) -> None:
        f = self.fleet
        self.passes.labels(f, str(result.exit_code)).inc()
        self.duration.labels(f).set(result.duration_s)
        self.last_pass.labels(f).set(result.at.timestamp())
        for offering, kind in result.refusals:
            self.refusals.labels(f, offering, kind).inc()
        if result.decision is not None:
            for v in result.decision.offerings:
                left = (v.until - result.at).total_seconds() if v.until else 0.0
                self.unavailable.labels(f, v.offering.name).set(max(left, 0.0))
                self.usable.labels(f, v.offering.name).set(1 if v.usable else 0)
        obs, plan = result.observation, result.plan
        if obs is not None:
            for state in InstanceState:
                if state is InstanceState.GONE:
                    continue
                self.instances.labels(f, state.value).set(
                    sum(1 for i in obs.instances if i.state is state)
                )
            since = [i.draining_since for i in obs.instances if i.state in _DRAINING]
            started = [t for t in since if t is not None]
            age = (result.at - min(started)).total_seconds() if started else 0.0
            self.draining_oldest.labels(f).set(max(age, 0.0))
            if obs.boot_time is not None:
                self.boot_time.labels(f).set(obs.boot_time.estimate.total_seconds())
            s = obs.signals
            # Unread this pass: NaN, not the last figures (a stale queue depth looks healthy).
            for gauge, value in (
                (self.ready, s.ready if s else _UNKNOWN),
                (self.in_flight, s.in_flight if s else _UNKNOWN),
                (self.expired, s.expired_leases if s else _UNKNOWN),
                (self.oldest, s.oldest_ready_seconds if s else _UNKNOWN),
            ):
                gauge.labels(f).set(value)
        if plan is not None:
            self.desired.labels(f).set(plan.desired)
            self.target.labels(f).set(plan.target)
            mtd = plan.month_to_date_usd
            self.month_to_date.labels(f).set(_UNKNOWN if mtd is None else mtd)
            committed = plan.committed_usd
            self.committed.labels(f).set(_UNKNOWN if committed is None else committed)
            fc = plan.forecast_floor
            self.forecast_floor.labels(f).set(_UNKNOWN if fc is None else fc)
            for gauge, estimated in (
                (self.wait_estimate, plan.wait_estimate),
                (self.arrival_rate, plan.arrival_rate),
            ):
                gauge.labels(f).set(_UNKNOWN if estimated is None else estimated)
            if not result.dry_run:
                for action in plan.actions:
                    self.actions.labels(f, action.kind.value).inc()
                for clamp in plan.clamps:
                    self.clamps.labels(f, clamp.kind.value).inc()

    def failed(self, exit_code: int) -> None:
        """A pass that ended in an error before it had a result (the database down, say): the
        queue and the month's bill are unread, NaN like any figure a pass could not read."""
        f = self.fleet
        self.passes.labels(f, str(exit_code)).inc()
        unread = (
            self.ready,
            self.in_flight,
            self.expired,
            self.oldest,
            self.month_to_date,
            self.wait_estimate,
            self.arrival_rate,
        )
        for gauge in (*unread, self.committed):
            gauge.labels(f).set(_UNKNOWN)


def check_textfile(path: str) -> None:
    """A textfile target the pass can write: its directory exists and is writable. Checked
    before a pass changes anything, so a bad --metrics-file refuses the pass (exit 2)."""
    target = Path(path).expanduser()
    directory = target.parent
    hint = (
        "Point --metrics-file into an existing writable directory (node_exporter's textfile one)."
    )
    try:
        is_dir, parent_is_dir = target.is_dir(), directory.is_dir()
    except OSError as exc:  # PermissionError: a directory on the way cannot be searched
        raise UsageError(
            f"--metrics-file {path}: {exc.strerror or exc} (a directory on its path cannot be "
            "searched by this user)",
            hint=hint,
        ) from None
    if is_dir:
        raise UsageError(f"--metrics-file {path} is a directory", hint=hint)
    if not parent_is_dir:
        raise UsageError(f"--metrics-file {path}: directory {directory} does not exist", hint=hint)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"--metrics-file {path}: directory {directory} is not writable", hint=hint)
