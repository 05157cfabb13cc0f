"""Wiring: the real parts of a reconcile pass, built from the config, for the CLI and the demo.

Also the two secrets every fleet command needs, read from the config (the environment, else the
.env next to the config file) in one place, with the hints said when one is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vultrscale.config import Config
    from vultrscale.core.clock import Deadline
    from vultrscale.core.model import Plan
    from vultrscale.ports import JobHistory, Parts, UserDataRenderer

DB_HINT = (
    "Set DATABASE_URL=postgresql://user:password@host/db in the environment or in the .env next "
    "to vultrscale.toml, then run `vultrscale db init`."
)
API_KEY_HINT = (
    "Set VULTR_API_KEY (my.vultr.com > Account > API) in the environment or in the .env next to "
    "vultrscale.toml; or point VULTR_API_URL at `vultrscale sim serve` and set any key."
)


def require(cfg: Config, value: str, name: str, hint: str) -> str:
    """A secret the command cannot run without; exit 2 with ``hint`` when it is missing."""
    if not value:
        raise cfg.secrets.missing(name, hint)
    return value


def database_url(cfg: Config, *, worker: bool = False) -> str:
    """The scaler's DATABASE_URL (``worker``: WORKER_DATABASE_URL first) as the config read it;
    exit 2 when it is not set."""
    s = cfg.secrets
    if worker and "WORKER_DATABASE_URL" in s.hidden_by_env:  # not DATABASE_URL behind its back
        raise s.missing("WORKER_DATABASE_URL", DB_HINT)
    url = (s.worker_database_url.reveal() if worker else "") or s.database_url.reveal()
    return require(cfg, url, "DATABASE_URL", DB_HINT)


def api_key(cfg: Config) -> str:
    """VULTR_API_KEY as the config read it; exit 2 when it is not set."""
    return require(cfg, cfg.secrets.api_key.reveal(), "VULTR_API_KEY", API_KEY_HINT)


def user_data_renderer(cfg: Config, scaler_public: str | None = None) -> UserDataRenderer:
    """``render(label, host private, host public) -> user-data`` for new instances; the
    scaler's public key line is read from ``fleet.ssh_key`` at each create unless given (a key
    replaced while ``--loop`` runs is the one new instances authorize)."""

    def render(label: str, private: str, public: str, concurrency: int | None = None) -> str:
        from vultrscale import cloudinit, ssh

        scaler_key = scaler_public or ssh.public_key_line(cfg.fleet.ssh_key)
        return cloudinit.render_user_data(
            cfg, label, private, public, scaler_key, show_secrets=True, concurrency=concurrency
        )

    return render


class _LazyDrain:
    """The SSH drain transport, built on first use so a pass with no drain never imports
    paramiko nor reads the key; closed after every pass (connections live within one pass)."""

    def __init__(
        self,
        key_path: str,
        deadline: Deadline | None = None,
        make: Callable[[str], Any] | None = None,
    ) -> None:
        self.key_path = key_path
        self.deadline = deadline  # the pass's, paused while the hosts are asked
        self._make = make
        self._drain: Any = None

    def _get(self) -> Any:
        if self._drain is None:
            if self._make is None:
                from vultrscale.ssh import SSHDrain

                self._make = SSHDrain
            self._drain = self._make(self.key_path)
        return self._drain

    def _paused(self) -> AbstractContextManager[None]:
        return self.deadline.paused() if self.deadline is not None else nullcontext()

    def stop_many(self, targets: list[Any]) -> Any:
        drain = self._get()
        with self._paused():
            return drain.stop_many(targets)

    def start_many(self, targets: list[Any]) -> Any:
        drain = self._get()
        with self._paused():
            return drain.start_many(targets)

    def is_active_many(self, targets: list[Any]) -> Any:
        drain = self._get()
        with self._paused():
            return drain.is_active_many(targets)

    def close(self) -> None:
        if self._drain is not None:
            self._drain.close()
            self._drain = None


def build_parts(cfg: Config, pace: Any = None) -> Parts:
    """The real parts of a pass: the Vultr client, Postgres, SSH, cloud-init, the system clock,
    and the local check of the scaler's key made before a pass changes anything. The owner
    closes them (``Parts.close``) after its last pass. ``pace``: the API pacing this fleet's
    client shares with the other fleets' of the process (``vultr.client.shared_pace``); None:
    its own, at ``1/account.scalers`` of the client's rate."""
    from vultrscale.core.clock import PASS_DEADLINE_S, Deadline, SystemClock
    from vultrscale.db.store import PgStore
    from vultrscale.ports import Parts
    from vultrscale.vultr.client import VultrClient, shared_pace

    db_url = database_url(cfg)
    # One deadline per pass, armed by the store's session (the pass) and read by the client:
    # each fleet has its own, so a slow fleet's pass never eats another's time.
    deadline = Deadline(PASS_DEADLINE_S)
    pace = pace if pace is not None else shared_pace(cfg.account.scalers)
    client = VultrClient(api_key(cfg), cfg.api_url, deadline=deadline, pace=pace)

    def keygen() -> tuple[str, str]:
        from vultrscale.ssh import generate_host_key

        return generate_host_key()

    def key_usable() -> None:
        """Every pass, before it changes anything: the key is present, a regular file, the
        scaler's own and 0600, else the pass refuses (exit 2). Only ``stat``: parsing a key
        (an RSA-4096 one costs ~0.8 s of CPU) is left to a pass that uses it."""
        from vultrscale.ssh import check_key_file

        check_key_file(cfg.fleet.ssh_key)

    def key_loads(plan: Plan) -> None:
        """A pass that drains (the private half signs the login) or creates (the public half is
        authorized on the new instance, and a fleet is not grown with a key that could never
        drain it) loads the key before its first change: one that does not load refuses the
        pass (exit 2) having changed nothing. Parsed once per process while the file is
        unchanged (``ssh.load_private_key``)."""
        if plan.creates or plan.drains:
            from vultrscale.ssh import load_private_key

            load_private_key(cfg.fleet.ssh_key)

    return Parts(
        cloud=client,
        store=PgStore(db_url, keep=True, deadline=deadline),
        drain=_LazyDrain(cfg.fleet.ssh_key, deadline),
        clock=SystemClock(),
        keygen=keygen,
        render_user_data=user_data_renderer(cfg),
        preflight=(key_usable,),
        before_changes=key_loads,
        overlap_reads=True,
        history=job_history(cfg, db_url),
    )


def job_history(cfg: Config, db_url: str) -> JobHistory | None:
    """The queue's history for the floor forecast, from the preset's tables (the built-in
    queue's ``jobs``, Procrastinate's events, PgQueuer's log, pg-boss's jobs); None with the
    forecast off or a preset whose library keeps no finished jobs (graphile-worker, custom)."""
    if cfg.policy.forecast.mode == "off":
        return None
    from vultrscale.db.history import PgHistory, has_history

    if not has_history(cfg.queue.preset):
        return None
    return PgHistory(db_url, cfg.queue.queue, cfg.queue.preset)
