"""The settings, each declared once: its section, type, default, range, pattern or choices and
a one-line help (``kinds.setting``), on the frozen dataclass of its section.

The section order and each section's field order are the order of the config file, of
``config check`` and of the generated references; a setting's variable is
``VULTRSCALE_<SECTION>_<KEY>`` (``VULTRSCALE_POLICY_FORECAST_MODE`` for ``policy.forecast.mode``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from vultrscale.config.kinds import (
    APP,
    AUTO_OR_DURATION,
    BOOLEAN,
    DB_ROLE,
    DURATION,
    FLEET_NAME,
    INTEGER,
    LABEL_PREFIX,
    NUMBER,
    OFFERING,
    PLAN,
    PLAN_FORM,
    QUEUE_NAME,
    QUEUE_NAME_FORM,
    REGION,
    REGION_FORM,
    SECONDS,
    SERVICE_NAME,
    SSH_USER,
    TEXT_LIST,
    VULTR_ID,
    VULTR_ID_FORM,
    Spec,
    Table,
    WaitTarget,
    cron_problem,
    custom_sql_problem,
    db_role_problem,
    duration_range_problem,
    quantile_problem,
    round_up_problem,
    service_problem,
    setting,
    slot_problem,
    spec_of,
    table,
    tables,
    tag_problem,
    timezone_problem,
)
from vultrscale.core.forecast import POOLS as FORECAST_POOLS

# Vultr publishes no fixed number of instances per account: each account has its own limit,
# raised on request, and Vultr refuses a create past it. 10,000 is the largest fleet measured
# here: the simulator's list is linear to it, the pass is benchmarked at 5,000. The other upper
# bounds are far above any real fleet too and only keep absurd values (a typo of a few extra
# digits) from reaching the API, the database or systemd.
MAX_FLEET = 10_000
MAX_JOBS_PER_INSTANCE = 100_000
_DAY = 86_400
#: The queue presets (db/presets/, one module each), in the order docs/queues.md lists them.
PRESETS = ("vultrscale", "procrastinate", "pgqueuer", "graphile-worker", "pg-boss", "custom")
FORECAST_MODES = ("off", "observe", "scale")
_CUSTOM_SQL = "custom preset only: a query returning one number"


@dataclass(frozen=True)
class Offering:
    """A place and size the fleet may create instances in: a Vultr region and plan.
    ``jobs_per_instance`` 0: the queue's (``queue.jobs_per_instance``). A fleet lists them in
    order of preference (``[[fleet.offerings]]``); without the list it has one, ``fleet.region``
    and ``fleet.plan`` (``vultrscale.rules.offerings.of``)."""

    region: str = setting(
        help="the Vultr region", pattern=REGION, allowed=REGION_FORM, example='"ewr"'
    )
    plan: str = setting(
        help="the Vultr plan", pattern=PLAN, allowed=f"a Vultr plan id ({PLAN_FORM})",
        example='"vc2-1c-2gb"',
    )
    jobs_per_instance: int = setting(
        0, INTEGER, "optional: jobs at once on one instance of it; 0: queue.jobs_per_instance",
        bounds=(0, MAX_JOBS_PER_INSTANCE), example="4",
    )

    @property
    def name(self) -> str:
        """How status, the ledger and the metrics name it: ``region/plan``."""
        return f"{self.region}/{self.plan}"


@dataclass(frozen=True)
class FleetConfig:
    name: str = setting(
        "workers", help="one fleet per name; several fleets may share a database",
        pattern=FLEET_NAME, allowed="1-64 letters, digits, '.', '_' or '-'",
    )
    region: str = setting(
        "ewr", help="the region new instances are created in (or [[fleet.offerings]])",
        pattern=REGION, allowed=REGION_FORM,
    )
    plan: str = setting(
        "vc2-1c-2gb", help="the plan of new instances (or [[fleet.offerings]])", pattern=PLAN,
        allowed=f"a Vultr plan id ({PLAN_FORM}; https://api.vultr.com/v2/plans lists them)",
    )
    snapshot_id: str = setting(
        "", help="the snapshot new instances boot from; empty: the one `vultrscale snapshot` "
        "recorded", pattern=VULTR_ID, allowed=VULTR_ID_FORM,
        empty="the one `vultrscale snapshot` records",
    )
    tag: str = setting(
        "vultrscale-workers", help="every instance we own carries it; we list by it",
        rule=tag_problem, allowed="at most 255 printable characters, no spaces at either end",
    )
    label_prefix: str = setting(
        "worker", help="labels are <prefix>-<unix-ts>-<4 random chars>", pattern=LABEL_PREFIX,
        allowed="lowercase letters, digits and '-', at most 31, not starting with '-'",
    )
    service: str = setting(
        "worker", help="the systemd unit of the worker on the instance (without .service)",
        pattern=SERVICE_NAME, allowed="a valid systemd unit name", rule=service_problem,
    )
    ssh_user: str = setting(
        "worker", help="the user the scaler logs in as to drain an instance", pattern=SSH_USER,
        allowed="a valid user name: lowercase letters, digits, '_' and '-', at most 32",
    )
    ssh_key: str = setting(
        "~/.ssh/vultrscale_ed25519", help="mode 0600; its .pub is authorized on new instances"
    )
    ssh_port: int = setting(22, INTEGER, "sshd's port on the instances", bounds=(1, 65535))
    ssh_address: str = setting(
        "main_ip", help='or "internal_ip" when the scaler reaches workers over a VPC',
        choices=("main_ip", "internal_ip"),
    )
    vpc_ids: tuple[str, ...] = setting(
        (), TEXT_LIST, "VPCs attached at create (attach_vpc)", pattern=VULTR_ID,
        allowed=VULTR_ID_FORM,
    )
    firewall_group_id: str = setting(
        "", help="the firewall group new instances join; empty: none", pattern=VULTR_ID,
        allowed=VULTR_ID_FORM, empty="none",
    )
    # In order of preference; empty: the one offering of region and plan above.
    offerings: tuple[Offering, ...] = setting(
        (), tables(Offering, nonempty=True), "where the fleet may run, in order of preference "
        "(a create refused there, sold out say, goes to the next): instead of region and plan",
        commented=True, replaces=("region", "plan"),
    )
    # How long an offering whose create Vultr refused (sold out, not available) is skipped.
    unavailable_for: timedelta = setting(
        timedelta(minutes=3), DURATION, "how long an offering whose create was refused is skipped",
        bounds=(timedelta(0), timedelta(days=1)), above=True,
    )


@dataclass(frozen=True)
class WorkerConfig:
    app: str = setting(
        "myjobs:handle", help="MODULE:FUNC for `vultrscale worker`: your handler", pattern=APP,
        allowed="MODULE:FUNC, e.g. myjobs:handle",
    )
    concurrency: int = setting(
        4, INTEGER, "jobs at once per worker; should equal queue.jobs_per_instance",
        bounds=(1, 1024),
    )
    drain_seconds: float = setting(
        20.0, SECONDS, "a stopping worker's wait for its jobs (< the unit's TimeoutStopSec < "
        "drain.timeout)", bounds=(0, _DAY),
    )
    lease_seconds: float = setting(
        60.0, SECONDS, "a job's lease; heartbeats renew it every third of it", bounds=(3, _DAY)
    )
    queue: str = setting(
        "default", help="the queue the fleet's workers take jobs from", pattern=QUEUE_NAME,
        allowed=QUEUE_NAME_FORM,
    )
    # The database role the workers log in as; `vultrscale db init` creates it and grants it
    # only what the worker runtime uses. Empty: db init leaves roles alone (you manage them).
    db_role: str = setting(
        "vultrscale_worker", help="the workers' database role: `db init` creates it and grants "
        'it only what the worker runtime uses; "" = you manage the role', pattern=DB_ROLE,
        allowed="lowercase letters, digits and '_', at most 63, not starting with a digit",
        empty="you manage the workers' role yourself", rule=db_role_problem,
    )
    # Opt-in: without WORKER_DATABASE_URL, put the scaler's own DATABASE_URL into user-data.
    # Off by default because user-data is readable by any process on the instance.
    use_scaler_database_url: bool = setting(
        False, BOOLEAN, "true: without WORKER_DATABASE_URL, user-data carries the scaler's "
        "DATABASE_URL (its password readable on the instance)",
    )
    outage_seconds: float = setting(
        0.0, SECONDS, "ride out an unreachable database this long before exit 1; 0: "
        "lease_seconds", bounds=(0, _DAY),
    )


@dataclass(frozen=True)
class QueueConfig:
    preset: str = setting(
        "vultrscale", help="whose tables the signals are read from", choices=PRESETS
    )
    jobs_per_instance: int = setting(
        4, INTEGER, "jobs at once per instance (the workers' concurrency)",
        bounds=(1, MAX_JOBS_PER_INSTANCE),
    )
    queue: str = setting(
        "", help='only this queue of the preset\'s table; "" = all. With the vultrscale preset, '
        "keep it worker.queue (config check warns)", pattern=QUEUE_NAME, allowed=QUEUE_NAME_FORM,
        empty="every queue", example='"default"',
    )
    ready_sql: str = setting(
        "", help=f"{_CUSTOM_SQL}: the ready jobs", rule=custom_sql_problem, commented=True,
        example='"SELECT count(*) FROM my_jobs WHERE status = \'ready\'"',
    )
    in_flight_sql: str = setting(
        "", help=f"{_CUSTOM_SQL}: the jobs running", rule=custom_sql_problem, commented=True,
        example='"SELECT count(*) FROM my_jobs WHERE status = \'running\'"',
    )
    oldest_ready_seconds_sql: str = setting(
        "", help=f"{_CUSTOM_SQL}: the oldest ready job's wait in seconds",
        rule=custom_sql_problem, commented=True, example='"SELECT 0"',
    )
    # custom, optional (both or neither): the wait rule's history (db/presets/custom.py)
    recent_jobs_sql: str = setting(
        "", help="custom preset only, for the wait rule (with recent_arrivals_sql): one row of "
        "the recent finished jobs' count and mean run seconds", rule=custom_sql_problem,
        commented=True,
        example='"SELECT count(*), avg(extract(epoch FROM finished_at - started_at)) FROM '
        'my_jobs WHERE finished_at > now() - make_interval(days => 1)"',
    )
    recent_arrivals_sql: str = setting(
        "", help="custom preset only, for the wait rule (with recent_jobs_sql): the jobs "
        "enqueued in the last 10 minutes", rule=custom_sql_problem, commented=True,
        example='"SELECT count(*) FROM my_jobs WHERE created_at > now() - make_interval(mins '
        '=> 10)"',
    )


@dataclass(frozen=True)
class FloorConfig:
    cron: str = setting(
        help="minute hour day month weekday, matched per minute", rule=cron_problem,
        allowed='a five-field cron expression, e.g. "* 8-18 * * mon-fri"',
        example='"* 8-18 * * mon-fri"',
    )
    timezone: str = setting(
        "UTC", help="the time zone the cron is read in", rule=timezone_problem,
        allowed='a time zone name like "Europe/Berlin"', example='"Europe/Berlin"',
    )
    min_instances: int = setting(
        1, INTEGER, "the floor while the cron matches", bounds=(0, MAX_FLEET)
    )


@dataclass(frozen=True)
class ForecastConfig:
    """``[policy.forecast]``: the floor forecast from the queue's history (``forecast``)."""

    # off: not read at all; observe: computed and shown, never acted on (as AWS's predictive
    # scaling starts); scale: it raises the floor.
    mode: str = setting(
        "observe", help="off | observe (say what it would do) | scale (raise the floor)",
        choices=FORECAST_MODES, allowed='off, observe or scale ("observe" shows what the '
        'forecast would do, "scale" acts on it)',
    )
    weeks: int = setting(4, INTEGER, "weeks of history looked back", bounds=(1, 52))
    min_history: timedelta = setting(
        timedelta(days=7), DURATION, "less history than this: no forecast",
        allowed="1m to the weeks looked back",
    )
    slot: timedelta = setting(
        timedelta(hours=1), DURATION, "the week is cut into slots this long (UTC)",
        rule=slot_problem, allowed="5m to 1d, cutting the week into whole slots",
    )
    quantile: float = setting(
        0.75, NUMBER, "per slot, a high week's load, not the highest (nearest rank)",
        rule=quantile_problem, allowed="above 0, at most 1",
    )
    refresh: timedelta = setting(
        timedelta(hours=1), DURATION, "the cached profile is recomputed this often",
        bounds=(timedelta(minutes=1), None),
    )
    # A slot's load in instances (jobs at once / jobs_per_instance) has its fraction of an
    # instance rounded up from this much on, else down: 0 keeps an instance for any load (a
    # trickle of a job an hour kept one warm all day in simulate: +15% on a spiky week).
    round_up_from: float = setting(
        0.5, NUMBER, "a slot asks for an instance from this share of one's work on",
        rule=round_up_problem, allowed="0 to below 1",
    )
    # A slot's work must be done within this (0s: within the slot, its mean load). Bursts that
    # bring a slot's work in minutes need their instances warm, not the mean's one or two.
    clear_within: timedelta = setting(
        timedelta(0), DURATION, "a slot's work done within this (0s: the slot's mean load)",
        bounds=(timedelta(0), None),
    )
    # "week": a slot learns from the same slot of past weeks; "weekday": from the same time of
    # every weekday (Saturday and Sunday apart), usable after a day (forecast.POOLS).
    pool: str = setting(
        "week", help="week | weekday (a slot of the day learns from every weekday)",
        choices=FORECAST_POOLS, allowed='week or weekday ("weekday": the slots of a day learn '
        "from every weekday, Saturday and Sunday apart)",
    )


@dataclass(frozen=True)
class PolicyConfig:
    min_instances: int = setting(0, INTEGER, "the fleet's floor", bounds=(0, MAX_FLEET))
    max_instances: int = setting(
        5, INTEGER, "the cap: at most your Vultr account's instance limit", bounds=(0, MAX_FLEET)
    )
    scale_up_cooldown: timedelta = setting(
        timedelta(seconds=60), DURATION, "at least this long between two scale-ups"
    )
    scale_down_cooldown: timedelta = setting(
        timedelta(minutes=5), DURATION, "at least this long between two scale-ins; 2-3x the "
        "longest job"
    )
    idle_before_scale_down: timedelta = setting(
        timedelta(seconds=90), DURATION, "queue empty and no live lease this long before a "
        "scale-in"
    )
    max_step_up: int = setting(
        0, INTEGER, "instances created per pass at most; 0 = no limit", bounds=(0, MAX_FLEET)
    )
    boot_timeout: timedelta = setting(
        timedelta(minutes=15), DURATION, "pending/booting longer than this: replaced",
        bounds=(timedelta(0), None), above=True,
    )
    billing_hour_aware: bool = setting(
        True, BOOLEAN, "keep an idle, already paid instance until its hour is nearly over"
    )
    on_signal_error: str = setting(
        "hold", help="when the queue cannot be read: hold the fleet, or bring it to the floor",
        choices=("hold", "floor"),
    )
    floor: tuple[FloorConfig, ...] = setting(
        (), tables(FloorConfig), 'scheduled floors ("one warm worker in business hours")',
        commented=True,
    )
    # Work returns while an instance drains (its delete not sent): start its worker again
    # rather than boot a new one (docs/policy.md, "Revive before you boot").
    revive: bool = setting(
        True, BOOLEAN, "start a draining instance's worker again before booting one"
    )
    forecast: ForecastConfig = setting(
        ForecastConfig(), table(ForecastConfig),
        "a floor learned from the queue's history (`vultrscale forecast`)",
    )
    # Boot only when it helps (vultrscale.rules.waits): a create is made only if the queue's
    # estimated wait would pass this; "auto": a share of the learned boot time (the workload
    # suite, docs/policy.md); 0s turns the rule off (the plain depth rule).
    target_wait: WaitTarget = setting(
        WaitTarget(), AUTO_OR_DURATION, 'the wait worth a boot; "auto": half the boot time, at '
        'most 1m; "0s": the depth rule alone',
    )
    # Create to worker up, until the ledger holds enough boots to learn it
    # (vultrscale.core.boottime).
    boot_time: timedelta = setting(
        timedelta(minutes=12), DURATION, "create to worker up until the ledger has 5 boots to "
        "learn it", bounds=(timedelta(0), None), above=True,
    )


@dataclass(frozen=True)
class BudgetConfig:
    monthly_ceiling_usd: float = setting(
        50.0, NUMBER, "hard: no scale-up that could take this month's bill past it",
        bounds=(0.01, 10_000_000),
    )


@dataclass(frozen=True)
class AccountConfig:
    """``[account]``: what every fleet paid from one Vultr account shares (docs/fleets.md). One
    fact for the account: in a directory of fleets, the files that set a key must agree (set
    it once, in the directory's .env as ``VULTRSCALE_ACCOUNT_<KEY>``, or in one file)."""

    # Enforced across every fleet in the database, by every scaler process: creates take the
    # account's lock from reading its spend to writing their intents (vultrscale.apply).
    monthly_ceiling_usd: float = setting(
        0.0, NUMBER, "hard, across every fleet in the database: no scale-up of any fleet that "
        "could take the account's bill this month past it; 0: none", bounds=(0, 10_000_000),
    )
    # Vultr's rate limit is per key: each scaler process paces its requests at a share of it.
    scalers: int = setting(
        1, INTEGER, "scaler processes (hosts) using this API key at once: each sends at most "
        "1/scalers of the 25 requests/s the client keeps to", bounds=(1, 10),
    )


@dataclass(frozen=True)
class DrainConfig:
    timeout: timedelta = setting(
        timedelta(minutes=5), DURATION, ">= the unit's TimeoutStopSec (drain_seconds + margin)"
    )
    poll_interval: timedelta = setting(
        timedelta(seconds=10), DURATION, "how often a draining worker is asked if it stopped",
        bounds=(timedelta(0), None), above=True,
    )
    unreachable_grace: timedelta = setting(
        timedelta(minutes=10), DURATION, "a draining instance SSH cannot reach this long is "
        "deleted once its worker holds no lease",
    )


@dataclass(frozen=True)
class SimulateConfig:
    """The world `vultrscale simulate` replays in (docs/simulate.md); the pass
    never reads it. Kept in the fleet's file so a sweep varies it like any other key."""

    # Snapshot restores take 10 to 15 minutes at Vultr on top of provisioning (Vultr's docs).
    boot_time: str = setting(
        "10m..15m", help="create to worker up: a duration or MIN..MAX (drawn uniformly)",
        rule=duration_range_problem, allowed="a duration, or MIN..MAX",
    )
    duration_scale: float = setting(
        1.0, NUMBER, "every job's run time times this (a slower or faster release)",
        bounds=(0.01, 100),
    )
    # Faults, each off at 0: stock-outs (creates refused as the plan runs out in the region),
    # 429 bursts (every API call refused), and instances that never boot.
    stockout_every: timedelta = setting(
        timedelta(0), DURATION, "mean time between stock-outs (creates refused); 0s: none"
    )
    stockout_for: timedelta = setting(
        timedelta(minutes=30), DURATION, "how long a stock-out lasts"
    )
    throttle_every: timedelta = setting(
        timedelta(0), DURATION, "mean time between bursts of 429s (every API call); 0s: none"
    )
    throttle_for: timedelta = setting(timedelta(minutes=2), DURATION, "how long a burst lasts")
    dead_boot_share: float = setting(
        0.0, NUMBER, "share of creates that never boot", bounds=(0, 1)
    )
    # Another offering is never refused by the stock-outs.
    stockout_offering: str = setting(
        "", help="the offering the stock-outs hit, REGION/PLAN; empty: the fleet's first",
        pattern=OFFERING, allowed='REGION/PLAN (e.g. "ewr/vc2-1c-2gb")',
        empty="the fleet's first offering",
    )


# The sections of the file, in its order.
SECTIONS: dict[str, type] = {
    "fleet": FleetConfig,
    "worker": WorkerConfig,
    "queue": QueueConfig,
    "policy": PolicyConfig,
    "budget": BudgetConfig,
    "drain": DrainConfig,
    "simulate": SimulateConfig,
    "account": AccountConfig,
}

# What each section is for, in a line: the template's and the reference's headings (a table
# inside a section has its field's help).
SECTION_HELP = {
    "fleet": "the instances: where they run, what they boot, how the scaler reaches them",
    "worker": "what the user-data tells the worker on each instance",
    "queue": "where the scaler counts the jobs",
    "policy": "when to scale, and how far",
    "budget": "the monthly ceiling",
    "drain": "how an instance is drained before it is deleted",
    "simulate": "the world `vultrscale simulate` replays in; the pass never reads it",
    "account": "the Vultr account every fleet shares: one ceiling, one API rate",
}


class Setting:
    """One setting as the schema declares it: ``policy.forecast.mode`` is in section
    ``policy.forecast``, key ``mode``."""

    __slots__ = ("section", "key", "spec", "default")

    def __init__(self, section: str, key: str, spec: Spec, default: Any) -> None:
        self.section, self.key, self.spec, self.default = section, key, spec, default

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"

    @property
    def env(self) -> str:
        return env_name(self.section, self.key)


def env_name(section: str, key: str) -> str:
    """The variable that sets ``section.key``."""
    return f"VULTRSCALE_{section.replace('.', '_').upper()}_{key.upper()}"


def default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def settings_of(section: str, cls: type) -> Iterator[Setting]:
    """The settings of a section's class, those of its tables too (``policy.forecast``)."""
    for f in dataclasses.fields(cls):
        spec = spec_of(f)
        if isinstance(spec.kind, Table):
            yield from settings_of(f"{section}.{f.name}", spec.kind.item)
        else:
            yield Setting(section, f.name, spec, default_of(f))


def all_settings() -> Iterator[Setting]:
    """Every setting, in the file's order."""
    for section, cls in SECTIONS.items():
        yield from settings_of(section, cls)


def setting_keys() -> list[str]:
    """Every dotted setting key, those of the tables inside a section too
    (``policy.forecast.mode``)."""
    return [s.dotted for s in all_settings()]
