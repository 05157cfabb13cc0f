"""The whole configuration, resolved: the settings' sections, the secrets and the API's
address (:class:`Config`), and how it is shown with every secret masked."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from vultrscale.config.kinds import WaitTarget, spec_of
from vultrscale.config.schema import (
    SECTIONS,
    AccountConfig,
    BudgetConfig,
    DrainConfig,
    FleetConfig,
    PolicyConfig,
    QueueConfig,
    SimulateConfig,
    WorkerConfig,
)
from vultrscale.config.secrets import DEFAULT_API_URL, Secret, Secrets
from vultrscale.core.values import format_duration
from vultrscale.errors import UsageError
from vultrscale.redaction import mask_url, redact


@dataclass(frozen=True)
class Config:
    fleet: FleetConfig = field(default_factory=FleetConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    simulate: SimulateConfig = field(default_factory=SimulateConfig)
    account: AccountConfig = field(default_factory=AccountConfig)
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
        out = {section: _plain(getattr(self, section), secrets) for section in SECTIONS}
        # A key that stands in for others (fleet.offerings for region and plan) hides them:
        # they keep unused defaults.
        for section, cls in SECTIONS.items():
            for f in dataclasses.fields(cls):
                if getattr(getattr(self, section), f.name):
                    for replaced in spec_of(f).replaces:
                        out[section].pop(replaced, None)
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
