"""``vultrscale demo``: the whole loop on this machine (docs/index.md, "The demo").

Postgres (``DATABASE_URL``, else a throwaway server), the Vultr simulator on loopback over real
HTTP, simulated instances that boot from the rendered user-data (a real ``vultrscale worker``
process each and an SSH server holding the pinned host key, see ``vultrscale.fake_vultr.hosts``), a
bursty workload, and the real reconcile loop with the real SSH drain. The run ends when the
queue is empty and the fleet is back at its floor, or when the duration is up; the summary
says whether every job ended and the fleet came back down.

However the run ends, the fleet stops like a real one: each worker gets SIGTERM and its drain
time (it finishes its jobs or gives them back to the queue), then SIGKILL. Jobs given back or
never started are counted as waiting in the queue, not lost; lost are only jobs that ended
neither way (held by a worker that is gone).

With ``chaos`` (``vultrscale.fake_vultr.chaos``) faults are injected on the seed while it runs, and
every pass runs as its own ``vultrscale reconcile`` process so that some can be SIGKILLed.
Every job's steps append to an execution log, so a step that ran twice is counted.

Nothing here prints: the CLI shows the ``Tick`` after every pass and the ``Summary``.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import secrets
import socket
import string
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from vultrscale import config as config_mod
from vultrscale.core.clock import SystemClock
from vultrscale.errors import (
    RuntimeFailure,
    UsageError,
    VultrscaleError,
)
from vultrscale.fake_vultr.chaos import Fault
from vultrscale.reconcile import Parts, PassResult, run_forever
from vultrscale.redaction import mask_url
from vultrscale.vultr.refusals import Refusal
from vultrscale.wiring import user_data_renderer
from vultrscale.workerunit import timeout_stop_seconds

FLEET = "demo"
TAG = "vultrscale-demo"
PLAN, REGION = "vc2-1c-2gb", "ewr"
APP = "vultrscale.worker.examples:three_steps"  # three saved steps per job
TERMINAL = ("succeeded", "failed", "dead")
# How often the chaos thread looks for faults that are due: often enough to catch a worker
# in a job of a second or two.
FAULT_CHECK_SECONDS = 0.25
# The line a worker logs for each job it gives back when it stops (worker/draining.py).
GIVEN_BACK = re.compile(r"^.*job \d+: given back to the queue", re.MULTILINE)


@dataclass(frozen=True)
class Burst:
    """``jobs`` jobs enqueued ``at`` seconds into the run."""

    at: float
    jobs: int


DEFAULT_BURSTS = (Burst(0, 24), Burst(40, 12))


def parse_bursts(text: str) -> tuple[Burst, ...]:
    """``"0:24,40:12"`` -> bursts (seconds:jobs); UsageError naming the bad part."""
    out = []
    for part in text.split(","):
        at, sep, jobs = part.strip().partition(":")
        try:
            burst = Burst(float(at), int(jobs))
        except ValueError:
            burst = None
        if not sep or burst is None or not 0 <= burst.at < 1e6 or not 1 <= burst.jobs <= 100_000:
            raise UsageError(
                f"--bursts: {part.strip()!r} is not SECONDS:JOBS",
                hint='Write e.g. --bursts "0:24,40:12" (24 jobs at once, 12 more after 40 s).',
            )
        out.append(burst)
    return tuple(sorted(out, key=lambda b: b.at))


def parse_job_seconds(text: str) -> tuple[float, float]:
    """``"1:4"`` -> (1.0, 4.0), each job's length drawn between; UsageError when it is not."""
    lo, sep, hi = text.partition(":")
    try:
        span = (float(lo), float(hi or lo))
    except ValueError:
        span = (-1.0, -1.0)
    if not (0 < span[0] <= span[1] <= 3600):  # also refuses NaN
        raise UsageError(
            f"--job-seconds: {text!r} is not LOW:HIGH seconds (0 < LOW <= HIGH <= 3600)",
            hint="Write e.g. --job-seconds 1:4 (each job lasts 1 to 4 s, in three steps).",
        )
    return span


@dataclass(frozen=True)
class Settings:
    """The demo's knobs (the CLI exposes the first three)."""

    duration: float = 120.0
    bursts: tuple[Burst, ...] = DEFAULT_BURSTS
    seed: int = 0
    max_instances: int = 4
    jobs_per_instance: int = 4
    interval: float = 2.0
    job_seconds: tuple[float, float] = (1.0, 4.0)
    boot_seconds: float = 6.0
    logs_dir: Path | None = None  # keep each instance's worker log here (else a temp dir)
    chaos: bool = False  # inject faults on the seed; passes run as processes


def demo_config(
    settings: Settings,
    *,
    api_url: str,
    api_key: str,
    db_url: str,
    ssh_key: str,
    ssh_port: int,
    queue: str,
    fleet: str,
) -> config_mod.Config:
    """The scaler's config for a short run: small cap, cool-downs of seconds, short drains.

    ``billing_hour_aware`` is off: with it on, an idle instance is kept until its paid hour is
    nearly over, so a two-minute demo would never scale in.
    """
    from vultrscale.config import (
        BudgetConfig,
        Config,
        DrainConfig,
        FleetConfig,
        PolicyConfig,
        QueueConfig,
        Secret,
        Secrets,
        WorkerConfig,
        validate,
    )

    cfg = Config(
        fleet=FleetConfig(
            name=fleet,
            region=REGION,
            plan=PLAN,
            tag=TAG,
            label_prefix="demo",
            service="worker",
            ssh_user="worker",
            ssh_key=ssh_key,
            ssh_port=ssh_port,
            # A refused create is remembered for 3 minutes on Vultr; the demo's minutes are
            # seconds (its stock-out lasts 5-8 s): as long as 3 minutes, it would outlast the run.
            unavailable_for=timedelta(seconds=5),
        ),
        # drain 5 s < TimeoutStopSec 15 s < drain.timeout 20 s (docs/worker.md)
        worker=WorkerConfig(
            app=APP,
            concurrency=settings.jobs_per_instance,
            drain_seconds=5.0,
            # A pause of the whole machine (a VM's: its wall clock, and so Postgres' now(),
            # jumps when it resumes) as long as the lease expires leases the workers still hold,
            # and their jobs rightly run again. 30 s leaves room for one; chaos keeps 15 s, as
            # its SIGKILLed workers' jobs come back by lease expiry and the run must stay short.
            lease_seconds=15.0 if settings.chaos else 30.0,
            queue=queue,
            # One machine, one throwaway database: the demo's workers share the scaler's login
            # (the documented opt-in; a real fleet gives them their own role).
            use_scaler_database_url=True,
        ),
        queue=QueueConfig(jobs_per_instance=settings.jobs_per_instance, queue=queue),
        policy=PolicyConfig(
            min_instances=0,
            max_instances=settings.max_instances,
            scale_up_cooldown=timedelta(seconds=5),
            # Short enough that a run ends soon after its work (the test suite runs five demos),
            # long enough that a pass or two of empty queue between bursts scales nothing in.
            scale_down_cooldown=timedelta(seconds=10),
            idle_before_scale_down=timedelta(seconds=5),
            boot_timeout=timedelta(seconds=60),
            billing_hour_aware=False,
            # The demo's clock runs minutes to seconds: a boot of seconds (the wait rule's
            # target, "auto", follows it).
            boot_time=timedelta(seconds=settings.boot_seconds),
        ),
        budget=BudgetConfig(monthly_ceiling_usd=100.0),
        drain=DrainConfig(
            timeout=timedelta(seconds=20),
            poll_interval=timedelta(seconds=settings.interval),
            unreachable_grace=timedelta(seconds=30),
        ),
        secrets=Secrets(api_key=Secret(api_key), database_url=Secret(db_url)),
        api_url=api_url,
        source="vultrscale demo",
    )
    problems = validate(cfg)
    if problems:  # a bug in the settings above, not the user's doing
        raise UsageError("the demo's config is invalid: " + "; ".join(problems))
    return cfg


# --- what the CLI shows ----------------------------------------------------------------------


@dataclass
class Tick:
    """After each pass: the pass, and the run around it."""

    elapsed: float
    result: PassResult | None
    error: str | None
    config: config_mod.Config
    jobs: dict[str, int]  # by state, this run's queue
    enqueued: int
    fleet: int  # tagged instances at the simulator now
    notes: list[str]  # what happened since the last tick (bursts, boots, drains)
    # The fleet by state as the last pass that observed it saw it (a pass process's too, which
    # has no ``result``); None: not given (the view counts the result's instances).
    instances: dict[str, int] | None = None


@dataclass
class Summary:
    """The closing figures. ``ok``: no job lost, fleet back at the floor, cap never passed."""

    wall_seconds: float
    enqueued: int
    succeeded: int
    failed: int
    dead: int
    lost: int  # enqueued jobs neither ended nor back in the queue when the run ended
    waiting: int  # jobs in the queue at the end (never started, or given back)
    given_back: int  # jobs workers gave back to the queue as they stopped
    steps_run_twice: int  # step executions beyond the first, by the execution log
    retried: int  # jobs that needed more than one attempt
    max_instances: int
    peak: int
    final: int  # instances left at the simulator at the end
    created: int
    scale_ups: int
    scale_ins: int
    instance_seconds: float
    always_on_seconds: float
    booted: int
    worker_clean_exits: int
    worker_failed_exits: int
    killed_at_power_off: int
    ssh: dict[str, int]
    database: str
    ended_by: str  # "done" (work done, fleet down), "duration" or "interrupted"
    problems: list[str] = field(default_factory=list)
    chaos: bool = False
    faults: list[Fault] = field(default_factory=list)
    refused_creates: int = 0  # creates the simulator refused for a sold-out offering

    @property
    def finished(self) -> bool:
        return self.ended_by == "done"

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.steps_run_twice == 0
            and self.final == 0
            and self.peak <= self.max_instances
        )

    @property
    def saved_pct(self) -> float:
        if self.always_on_seconds <= 0:
            return 0.0
        return 100.0 * (1 - self.instance_seconds / self.always_on_seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "finished": self.finished,
            "ended_by": self.ended_by,
            "wall_seconds": round(self.wall_seconds, 1),
            "jobs": {
                "enqueued": self.enqueued,
                "succeeded": self.succeeded,
                "failed": self.failed,
                "dead": self.dead,
                "lost": self.lost,
                "waiting": self.waiting,
                "given_back": self.given_back,
                "retried": self.retried,
                "steps_run_twice": self.steps_run_twice,
            },
            "fleet": {
                "max_instances": self.max_instances,
                "peak": self.peak,
                "final": self.final,
                "created": self.created,
                "scale_ups": self.scale_ups,
                "scale_ins": self.scale_ins,
                "refused_creates": self.refused_creates,
            },
            "instance_seconds": round(self.instance_seconds, 1),
            "always_on_instance_seconds": round(self.always_on_seconds, 1),
            "saved_pct": round(self.saved_pct, 1),
            "hosts": {
                "booted": self.booted,
                "worker_clean_exits": self.worker_clean_exits,
                "worker_failed_exits": self.worker_failed_exits,
                "killed_at_power_off": self.killed_at_power_off,
                "ssh": self.ssh,
            },
            "database": self.database,
            "chaos": self.chaos,
            "faults": [f.to_json() for f in self.faults],
            "problems": self.problems,
        }


# --- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassSeen:
    """What the demo takes from a pass, in process or from a pass process's ``--json``."""

    creates: int  # the instances the plan asked for (each create's result says how it went)
    drains: tuple[str, ...]  # labels
    # The instances in the ledger (not gone) by state; None: the pass did not observe.
    instances: dict[str, int] | None
    lines: tuple[str, ...] = ()  # its results and errors, for a pass run as a process

    @property
    def ledger(self) -> int | None:
        return None if self.instances is None else sum(self.instances.values())

    @classmethod
    def of(cls, result: PassResult) -> PassSeen:
        plan, obs = result.plan, result.observation
        return cls(
            creates=plan.creates if plan else 0,
            drains=tuple(str(a.label) for a in plan.drains) if plan else (),
            instances=obs.summary()["instances"] if obs else None,
        )

    @classmethod
    def of_json(cls, doc: dict[str, Any]) -> PassSeen:
        """A pass process's ``--json``. ValueError for the answer of a command that failed
        before its pass (``{"error": ..., "hint": ...}``): read as a pass, it showed nothing,
        and a demo whose every pass refused its config sat silent for its whole duration."""
        if "error" in doc:
            raise ValueError(str(doc["error"]).splitlines()[0] if doc["error"] else "failed")
        actions = doc.get("actions") or []
        inputs = doc.get("inputs") or {}
        results = [f"{r['label']}: {r['result']}" for r in doc.get("results") or []]
        return cls(
            creates=sum(1 for a in actions if a.get("kind") == "create"),
            drains=tuple(str(a.get("label")) for a in actions if a.get("kind") == "drain"),
            instances=dict(inputs.get("instances") or {}) if inputs else None,
            lines=(*results, *(f"error: {e}" for e in doc.get("errors") or [])),
        )


def config_toml(cfg: config_mod.Config) -> str:
    """The config's settings as a TOML file ``load`` reads back (secrets are not settings:
    they stay in the environment). A value is a string, number, bool, a list of values, or a
    table of them (``policy.forecast``, an offering), written inline (``config.toml_value``)."""
    lines: list[str] = []
    for section, values in cfg.settings(mask=False).items():
        lines.append(f"[{section}]")
        lines += [
            f"{key} = {config_mod.toml_value(value)}"
            for key, value in values.items()
            if value != [] and value is not None
        ]
    return "\n".join(lines) + "\n"


def count_repeats(log: Path) -> int:
    """Executions beyond the first of the same job step, in an execution log."""
    try:
        text = log.read_text()
    except FileNotFoundError:
        return 0
    return sum(n - 1 for n in Counter(text.splitlines()).values() if n > 1)


def count_given_back(logs: Collection[Path]) -> int:
    """Jobs given back by stopping workers, as their logs tell."""
    total = 0
    for path in logs:
        with contextlib.suppress(OSError):
            total += len(GIVEN_BACK.findall(path.read_text(errors="replace")))
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Run:
    def __init__(
        self,
        settings: Settings,
        on_tick: Callable[[Tick], None],
        say: Callable[[str], None],
        stop: threading.Event,
    ) -> None:
        self.settings = settings
        self.on_tick = on_tick
        self.say = say
        self.stop = stop
        self.rng = random.Random(settings.seed)
        self.notes: list[str] = []
        self.notes_lock = threading.Lock()
        self.peak = 0
        self.fleet_now = 0
        # the fleet by state as the last pass that observed it saw it: a pass killed or failed
        # says nothing of it, and "none" would read as an empty fleet
        self.fleet_seen: dict[str, int] = {}
        self.pending_bursts = list(settings.bursts)
        self.enqueued = 0
        self.scale_ups = self.scale_ins = 0
        self.ended_by = ""  # set when the run decides to end; empty: stopped from outside
        self.started = 0.0
        self.queue_name = ""
        self.execution_log = Path()
        self.faults_noted = 0

    def note(self, text: str) -> None:
        with self.notes_lock:
            self.notes.append(text)

    def take_notes(self) -> list[str]:
        with self.notes_lock:
            out, self.notes = self.notes, []
        return out

    def run(self, database_url: str | None) -> Summary:
        from vultrscale import ssh
        from vultrscale.db import pg, schema
        from vultrscale.db.store import PgStore
        from vultrscale.fake_vultr import Simulator, Timings, start_server
        from vultrscale.fake_vultr.hosts import Hosts, LoopbackIps
        from vultrscale.vultr.client import VultrClient

        s = self.settings
        with contextlib.ExitStack() as stack:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vultrscale-demo-")))
            if database_url:
                db_url = database_url
                where = mask_url(database_url)  # a URL or a libpq "key=value" string
                self.say(f"Postgres: {where} (DATABASE_URL)")
            else:
                from vultrscale.db import throwaway

                self.say("Postgres: starting a throwaway server ...")
                server_pg = throwaway.start()
                stack.callback(server_pg.stop)
                db_url, where = server_pg.url, "throwaway"
                self.say(f"Postgres: throwaway server on 127.0.0.1:{server_pg.port}")
            schema.migrate(db_url)
            # one queue and fleet per run: a DATABASE_URL you use for other things is left alone
            run_id = f"{int(time.time())}-{secrets.token_hex(2)}"
            queue_name, fleet = f"demo-{run_id}", f"demo-{run_id}"

            key_path = tmp / "scaler_ed25519"
            private, public = ssh.generate_host_key()
            key_path.touch(mode=0o600)
            key_path.write_text(private)
            key_path.with_name(key_path.name + ".pub").write_text(public + "\n")

            # Vultr's form (36 capitals and digits), capitals only: a key that began "demo-",
            # as every demo name does, had six characters in common with the fleet name 1 run
            # in 16, and the masking of a key's fragments masked that name in every output.
            api_key = "".join(secrets.choice(string.ascii_uppercase) for _ in range(36))
            sim = Simulator(
                api_key,
                clock=SystemClock(),
                seed=s.seed,
                timings=Timings(
                    boot_pending=s.boot_seconds,
                    boot_ready=3.0,
                    visible_after=1.0,
                    snapshot_complete=1.0,
                ),
                ip_allocator=LoopbackIps(),
            )

            def alive() -> set[str]:
                instances = sim.instances
                fleet_now = sum(1 for i in instances.values() if TAG in i["tags"])
                self.fleet_now = fleet_now
                self.peak = max(self.peak, fleet_now)
                return set(instances)

            ssh_port = _free_port()
            logs = s.logs_dir or tmp / "hosts"
            # chaos: a killed worker's unit restarts soon, so the run stays short
            hosts = Hosts(logs, ssh_port, alive, tag=TAG, restart_seconds=1.0 if s.chaos else 5.0)
            stack.callback(hosts.close)
            sim.on_instance_ready = hosts.on_instance_ready
            server = start_server(sim)
            stack.callback(server.stop)
            self.say(f"Vultr simulator: {server.url}; instances get 127.0.0.x, SSH port {ssh_port}")
            client = VultrClient(api_key, server.url, timeout=10)
            stack.callback(client.close)

            cfg = demo_config(
                s,
                api_url=server.url,
                api_key=api_key,
                db_url=db_url,
                ssh_key=str(key_path),
                ssh_port=ssh_port,
                queue=queue_name,
                fleet=fleet,
            )
            snapshot = self.bake(sim, client)
            cfg = replace(cfg, fleet=replace(cfg.fleet, snapshot_id=snapshot))

            logs.mkdir(parents=True, exist_ok=True)
            self.execution_log = logs / "executions.log"  # kept with the logs: `--logs`
            self.queue_name = queue_name
            parts = Parts(
                cloud=client,
                store=PgStore(db_url),
                drain=ssh.SSHDrain(str(key_path), connect_timeout=5, command_timeout=5),
                clock=SystemClock(),
                keygen=ssh.generate_host_key,
                render_user_data=user_data_renderer(cfg, public),
                rng=random.Random(s.seed),
            )
            conn = pg.connect(db_url)
            stack.callback(conn.close)

            self.say(
                f"Workload: {', '.join(f'{b.jobs} jobs at {b.at:g}s' for b in s.bursts)}; "
                f"fleet 0..{s.max_instances}, {s.jobs_per_instance} jobs per instance; "
                f"ends when all is done or after {s.duration:g}s"
            )
            self.started = time.monotonic()
            self.enqueue_due(conn, queue_name)

            def after_pass(result: PassResult) -> None:
                self.after_pass(conn, cfg, PassSeen.of(result), result, None)

            def after_error(exc: VultrscaleError) -> None:
                self.after_pass(conn, cfg, None, None, exc.message)

            chaos = None
            if s.chaos:
                from vultrscale.fake_vultr.chaos import Chaos, schedule

                chaos = Chaos(schedule(s.seed), sim, hosts, s.seed, offering=(REGION, PLAN))
                chaos.arm(0.0)
                self.note_faults(chaos)
                injector = threading.Thread(
                    target=self.inject_faults, args=(chaos, db_url), name="chaos", daemon=True
                )
                injector.start()
                try:
                    command = self.pass_command(cfg, tmp, api_key, db_url)
                    self.pass_processes(conn, cfg, chaos, command)
                finally:
                    self.stop.set()
                    injector.join(timeout=10)
            else:
                run_forever(
                    cfg,
                    parts,
                    interval=timedelta(seconds=s.interval),
                    stop=self.stop,
                    on_result=after_pass,
                    on_error=after_error,
                )
            summary = self.summary(conn, cfg, hosts, sim, where, logs, chaos)
        return summary

    def pass_command(
        self, cfg: config_mod.Config, tmp: Path, api_key: str, db_url: str
    ) -> tuple[list[str], dict[str, str]]:
        """``vultrscale reconcile --json`` as its own process: the config in a file (0600),
        the secrets in its environment only."""
        from vultrscale.fake_vultr.hosts import unit_environment

        path = tmp / "vultrscale.toml"
        path.touch(mode=0o600)
        path.write_text(config_toml(cfg))
        env = unit_environment(
            {
                "VULTRSCALE_CONFIG": str(path),
                "VULTR_API_URL": cfg.api_url,
                "VULTR_API_KEY": api_key,
                "DATABASE_URL": db_url,
            }
        )
        return [sys.executable, "-m", "vultrscale.cli", "reconcile", "--json"], env

    def pass_processes(
        self,
        conn: Any,
        cfg: config_mod.Config,
        chaos: Any,
        command: tuple[list[str], dict[str, str]],
    ) -> None:
        """The reconcile loop of a chaos run: each pass a process, some SIGKILLed."""
        argv, env = command
        while not self.stop.is_set():
            began = time.monotonic()
            run = chaos.run_pass(argv, env, began - self.started)
            self.keep_pass(began - self.started, run)
            seen, error = None, None
            if run.code is not None:
                try:
                    seen = PassSeen.of_json(json.loads(run.stdout))
                except (ValueError, TypeError, KeyError, AttributeError):
                    # its first line says what (a config refused: "Invalid configuration:")
                    lines = run.stderr.strip().splitlines() or ["(no output)"]
                    error = f"the pass exited {run.code}: " + " ".join(lines[:3])
            drains = seen.drains if seen is not None else ()
            if not drains and run.code is None:
                # A pass killed after it marked instances draining reports nothing of it, and
                # the next may find their workers already stopped: ask the ledger.
                drains = _draining(conn, cfg.fleet.name)
            if drains:
                chaos.on_drains(time.monotonic() - self.started, drains)
            self.note_faults(chaos)
            self.after_pass(conn, cfg, seen, None, error)
            remaining = self.settings.interval - (time.monotonic() - began)
            if remaining > 0:
                self.stop.wait(remaining)

    def keep_pass(self, elapsed: float, run: Any) -> None:
        """A chaos pass's exit and its ``--json`` answer (the plan, its reasons and clamps),
        a line each in ``passes.jsonl`` beside the hosts' logs: the progress lines show only
        what a pass did, and a pass that did nothing must still say why."""
        with (self.execution_log.parent / "passes.jsonl").open("a") as out:
            out.write(
                json.dumps(
                    {
                        "at": round(elapsed, 1),
                        "code": run.code,
                        "stdout": run.stdout,
                        "stderr": run.stderr[-2000:],
                    }
                )
                + "\n"
            )

    def note_faults(self, chaos: Any) -> None:
        faults = chaos.injected()
        for fault in faults[self.faults_noted :]:
            self.note(f"chaos: {fault.kind}: {fault.target}")
        self.faults_noted = len(faults)

    def inject_faults(self, chaos: Any, db_url: str) -> None:
        """The chaos thread: the faults whose time has come, checked a few times a second
        (on a connection of its own), so that a worker is killed while it holds a job."""
        from vultrscale.db import pg

        try:
            with pg.session(db_url, "the chaos thread lost its database") as conn:
                while not self.stop.wait(FAULT_CHECK_SECONDS):
                    # the workers (by id: the instance label) holding a lease on this run's jobs
                    rows = conn.execute(
                        "SELECT DISTINCT l.worker_id FROM job_leases l JOIN jobs j "
                        "ON j.id = l.job_id WHERE j.queue = %s",
                        (self.queue_name,),
                    ).fetchall()
                    chaos.inject_due(time.monotonic() - self.started, {str(r[0]) for r in rows})
        except VultrscaleError as exc:  # the main loop meets the same database and says so
            self.note(f"chaos: stopped injecting: {exc.message}")

    def bake(self, sim: Any, client: Any) -> str:
        """The fleet's base image: a snapshot of a (simulated) Debian instance."""
        base = sim.create_instance(region=REGION, plan=PLAN, os_id=2136, label="demo-base")
        snap = client.create_snapshot(base["id"], "vultrscale demo base image")
        deadline = time.monotonic() + 30
        while client.get_snapshot(snap.id).status != "complete":
            if time.monotonic() > deadline:
                raise RuntimeFailure("the simulator's snapshot did not complete in 30 s")
            self.stop.wait(0.2)
        return str(snap.id)

    def enqueue_due(self, conn: Any, queue_name: str) -> None:
        from vultrscale.db import queue

        elapsed = time.monotonic() - self.started
        lo, hi = self.settings.job_seconds
        while self.pending_bursts and self.pending_bursts[0].at <= elapsed:
            burst = self.pending_bursts.pop(0)
            payloads = [
                {
                    "step_seconds": round(self.rng.uniform(lo, hi) / 3, 2),
                    "execution_log": str(self.execution_log),
                }
                for _ in range(burst.jobs)
            ]
            queue.enqueue(conn, payloads, queue=queue_name)
            self.enqueued += burst.jobs
            self.note(f"burst: {burst.jobs} jobs enqueued")

    def job_states(self, conn: Any, queue_name: str) -> dict[str, int]:
        rows = conn.execute(
            "SELECT state, count(*) FROM jobs WHERE queue = %s GROUP BY state", (queue_name,)
        ).fetchall()
        return {str(state): int(n) for state, n in rows}

    def after_pass(
        self,
        conn: Any,
        cfg: Any,
        seen: PassSeen | None,
        result: PassResult | None,
        error: str | None,
    ) -> None:
        from vultrscale.db import pg

        elapsed = time.monotonic() - self.started
        if seen is not None and seen.instances is not None:
            self.fleet_seen = seen.instances
        if seen is not None:
            if seen.ledger is not None:
                # the ledger's view too, besides the simulator's sampled one
                self.peak = max(self.peak, seen.ledger)
            if seen.creates:
                self.scale_ups += 1
                # asked for: the lines below say which Vultr created and which it refused
                self.note(f"scale up: {seen.creates} instance(s) asked for")
            if seen.drains:
                self.scale_ins += 1
                self.note(f"scale in: {len(seen.drains)} instance(s) draining")
            for line in seen.lines:
                self.note(line)
        with pg.translated("the demo lost its database"):
            self.enqueue_due(conn, self.queue_name)
            jobs = self.job_states(conn, self.queue_name)
        open_jobs = self.enqueued - sum(jobs.get(s, 0) for s in TERMINAL)
        ledger_left = 1 if seen is None or seen.ledger is None else seen.ledger
        if not self.pending_bursts and open_jobs == 0 and ledger_left == 0 and not self.fleet_now:
            self.ended_by = "done"
            self.stop.set()
        elif elapsed >= self.settings.duration:
            self.ended_by = "duration"
            self.note(f"duration of {self.settings.duration:g}s is up")
            self.stop.set()
        self.on_tick(
            Tick(
                elapsed,
                result,
                error,
                cfg,
                jobs,
                self.enqueued,
                self.fleet_now,
                self.take_notes(),
                instances=self.fleet_seen,
            )
        )

    def summary(
        self, conn: Any, cfg: Any, hosts: Any, sim: Any, where: str, logs: Path, chaos: Any
    ) -> Summary:
        wall = time.monotonic() - self.started
        now = datetime.now(UTC)
        final = sum(1 for i in sim.instances.values() if TAG in i["tags"])
        # Stop what is left like a real fleet (after an interrupt or the duration): each worker
        # gets SIGTERM and, as systemd gives it, TimeoutStopSec (its drain time plus a margin
        # to give back its jobs), then SIGKILL. Only then are the jobs counted, so that what was
        # given back is counted as such.
        hosts.close(grace=timeout_stop_seconds(cfg.worker))
        st = hosts.stats
        jobs = self.job_states(conn, self.queue_name)
        retried = conn.execute(
            "SELECT count(*) FROM jobs WHERE queue = %s AND attempts > 1", (self.queue_name,)
        ).fetchone()[0]
        created, seconds = conn.execute(
            "SELECT count(*), coalesce(sum(extract(epoch FROM coalesce(gone_at, %s) - "
            "created_at)), 0) FROM fleet_instances WHERE fleet = %s AND instance_id IS NOT NULL",
            (now, cfg.fleet.name),
        ).fetchone()
        done = sum(jobs.get(s, 0) for s in TERMINAL)
        waiting = jobs.get("ready", 0)
        lost = self.enqueued - done - waiting
        given_back = count_given_back(sorted(logs.glob("*/worker.log")))
        twice = count_repeats(self.execution_log)
        problems = [f"boot failed: {text}" for text in st.boot_failures]
        problems += st.failures
        if lost:
            problems.append(
                f"{lost} job(s) lost (neither ended nor back in the queue): "
                + ", ".join(f"{n} {s}" for s, n in jobs.items() if s not in (*TERMINAL, "ready"))
            )
        if waiting:
            problems.append(
                f"{waiting} job(s) still in the queue ({given_back} given back by stopping "
                "workers, none lost)"
            )
        if twice:
            problems.append(f"{twice} job step(s) ran more than once (see the execution log)")
        if final:
            problems.append(f"{final} instance(s) still up when the run ended")
        if self.peak > cfg.policy.max_instances:
            problems.append(f"the fleet reached {self.peak}, above max_instances")
        if chaos is not None and not chaos.create_lost_fired():
            problems.append("chaos: the create whose answer was to be lost never came")
        refused = sim.refused[Refusal.UNAVAILABLE]
        if chaos is not None and chaos.offering is not None and not refused:
            problems.append("chaos: the stock-out refused no create (no pass tried one in it)")
        ended_by = self.ended_by or "interrupted"
        if ended_by == "duration":
            problems.append(
                f"the duration ({self.settings.duration:g}s) ran out before the queue was empty "
                "and the fleet back at zero"
            )
        elif ended_by == "interrupted":
            problems.append("interrupted before the run finished")
        return Summary(
            wall_seconds=wall,
            enqueued=self.enqueued,
            succeeded=jobs.get("succeeded", 0),
            failed=jobs.get("failed", 0),
            dead=jobs.get("dead", 0),
            lost=lost,
            waiting=waiting,
            given_back=given_back,
            steps_run_twice=twice,
            retried=int(retried),
            max_instances=cfg.policy.max_instances,
            peak=self.peak,
            final=final,
            created=int(created),
            scale_ups=self.scale_ups,
            scale_ins=self.scale_ins,
            instance_seconds=float(seconds),
            always_on_seconds=cfg.policy.max_instances * wall,
            booted=st.booted,
            worker_clean_exits=st.clean_exits,
            worker_failed_exits=st.failed_exits,
            killed_at_power_off=st.killed_at_power_off,
            ssh={
                "stop": st.ssh.stop,
                "is_active": st.ssh.is_active,
                "start": st.ssh.start,  # revives
                "refused_commands": st.ssh.refused_commands,
                "refused_logins": st.ssh.refused_logins,
            },
            database=where,
            ended_by=ended_by,
            problems=problems,
            chaos=chaos is not None,
            faults=sorted(chaos.injected(), key=lambda f: f.at) if chaos is not None else [],
            refused_creates=refused,
        )


def run(
    settings: Settings,
    *,
    database_url: str | None = None,
    on_tick: Callable[[Tick], None] = lambda t: None,
    say: Callable[[str], None] = lambda line: None,
    stop: threading.Event | None = None,
) -> Summary:
    """Run the demo to its end and return the summary; everything it started is stopped again,
    also on an exception or KeyboardInterrupt. Setting ``stop`` ends the run after its pass."""
    return _Run(settings, on_tick, say, stop or threading.Event()).run(database_url)


def _draining(conn: Any, fleet: str) -> tuple[str, ...]:
    """The labels of the fleet's instances the ledger has draining."""
    from vultrscale.core.model import InstanceState
    from vultrscale.db import ledger

    return tuple(r.label for r in ledger.rows(conn, fleet) if r.state is InstanceState.DRAINING)
