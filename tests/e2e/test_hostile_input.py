# ruff: noqa: E501  (the case table keeps one case a line)
"""The hostile corpus: bad input from the config file, the environment, the flags and the
outside world (the API, the database), one row per case in CASES.

Each case runs the real CLI entry point in-process against the Vultr simulator over loopback
HTTP and a real Postgres, and asserts: the exit code; a message naming the problem; no
traceback; no secret (the API key, the database password); and nothing changed (no request
that changes anything at the simulator, no row written in any table).

Add a case by adding a row. ``toml`` is appended to a valid base config whose last table is
[fleet] (so ``ssh_port = 0`` without a header is a fleet key); ``env`` values may name
``{db}`` (the database URL with a password), ``{db_server}`` (that URL without its database
name), ``{api}`` (the simulator), ``{closed}`` (a port nothing listens on) or ``{empty_db}`` (a
database without the schema); None unsets. Arguments may name ``{tmp}`` (the case's own
directory) and ``{locked}`` (a directory there that the user running the case cannot search:
with ``as_nobody`` the case runs as the user nobody, as root does not heed permissions).
``bom`` writes the config file with a UTF-8 byte-order mark.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.cli_world import World, cli_world
from vultrscale.cli import main
from vultrscale.fake_vultr.app import Simulator

API_KEY = "VKEY-hostile-0123456789abcdefghijklm"
DB_PASSWORD = "pw-hostile-never-shown-77"
PROXY_PASSWORD = "proxy-pw-never-shown-55"
VID = "cb676a46-66fd-4dfb-b839-443f2e6c0b60"  # a well-formed Vultr id no instance has


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    code: int
    says: str  # found in the output, case-insensitive: the message names the problem
    toml: str = ""
    env: dict[str, str | None] = field(default_factory=dict)
    bom: bool = False
    as_nobody: bool = False
    writes: tuple[str, ...] = ()  # tables a failed pass may change besides fleet_events


def c(id: str, argv: str | tuple[str, ...], code: int, says: str, **kw: Any) -> Case:
    return Case(id, tuple(argv.split()) if isinstance(argv, str) else argv, code, says, **kw)


CHECK = "config check"
# fmt: off
CASES = [
    # --- the config file ---------------------------------------------------------------------
    c('cfg-drain-seconds-nan', CHECK, 2, 'worker.drain_seconds', toml='[worker]\ndrain_seconds = nan'),
    c('cfg-lease-seconds-nan', CHECK, 2, 'worker.lease_seconds', toml='[worker]\nlease_seconds = nan'),
    c('cfg-lease-seconds-inf', CHECK, 2, 'worker.lease_seconds', toml='[worker]\nlease_seconds = inf'),
    c('cfg-lease-seconds-too-short', CHECK, 2, 'worker.lease_seconds', toml='[worker]\nlease_seconds = 1'),
    c('cfg-drain-seconds-negative', CHECK, 2, 'worker.drain_seconds', toml='[worker]\ndrain_seconds = -1'),
    c('cfg-concurrency-zero', CHECK, 2, 'worker.concurrency', toml='[worker]\nconcurrency = 0'),
    c('cfg-concurrency-int64', CHECK, 2, 'worker.concurrency', toml='[worker]\nconcurrency = 9223372036854775807'),
    c('cfg-queue-name-injection', CHECK, 2, 'worker.queue', toml="[worker]\nqueue = 'a b;drop'"),
    c('cfg-max-instances-negative', CHECK, 2, 'policy.max_instances', toml='[policy]\nmax_instances = -1'),
    c('cfg-max-instances-huge', CHECK, 2, 'policy.max_instances', toml='[policy]\nmax_instances = 1000000000'),
    c('cfg-max-instances-string', CHECK, 2, 'policy.max_instances', toml="[policy]\nmax_instances = 'many'"),
    c('cfg-max-instances-bool', CHECK, 2, 'policy.max_instances', toml='[policy]\nmax_instances = true'),
    c('cfg-max-step-up-negative', CHECK, 2, 'policy.max_step_up', toml='[policy]\nmax_step_up = -2'),
    c('cfg-boot-timeout-overflow', CHECK, 2, 'policy.boot_timeout', toml="[policy]\nboot_timeout = '99999999999d'"),
    c('cfg-cooldown-negative', CHECK, 2, 'policy.scale_up_cooldown', toml="[policy]\nscale_up_cooldown = '-5m'"),
    c('cfg-cooldown-nan', CHECK, 2, 'policy.scale_down_cooldown', toml='[policy]\nscale_down_cooldown = nan'),
    c('cfg-cooldown-inf', CHECK, 2, 'policy.idle_before_scale_down', toml='[policy]\nidle_before_scale_down = inf'),
    c('cfg-duration-words', CHECK, 2, 'policy.boot_timeout', toml="[policy]\nboot_timeout = 'soon'"),
    c('cfg-floor-negative', CHECK, 2, 'policy.floor[0].min_instances', toml="[[policy.floor]]\ncron = '* * * * *'\nmin_instances = -1"),
    c('cfg-ceiling-nan', CHECK, 2, 'budget.monthly_ceiling_usd', toml='[budget]\nmonthly_ceiling_usd = nan'),
    c('cfg-ceiling-inf', CHECK, 2, 'budget.monthly_ceiling_usd', toml='[budget]\nmonthly_ceiling_usd = inf'),
    c('cfg-ceiling-negative', CHECK, 2, 'budget.monthly_ceiling_usd', toml='[budget]\nmonthly_ceiling_usd = -5'),
    c('cfg-poll-interval-zero', CHECK, 2, 'drain.poll_interval', toml="[drain]\npoll_interval = '0s'"),
    c('cfg-drain-timeout-overflow', CHECK, 2, 'drain.timeout', toml='[drain]\ntimeout = 1e300'),
    c('cfg-jobs-per-instance-zero', CHECK, 2, 'queue.jobs_per_instance', toml='[queue]\njobs_per_instance = 0'),
    c('cfg-ssh-port-zero', CHECK, 2, 'fleet.ssh_port', toml='ssh_port = 0'),
    c('cfg-ssh-port-too-big', CHECK, 2, 'fleet.ssh_port', toml='ssh_port = 70000'),
    c('cfg-region-path', CHECK, 2, 'fleet.region', toml="region = '../../v2/account'"),
    c('cfg-not-toml', CHECK, 2, 'not valid TOML', toml='[[[ oops'),
    c('cfg-secret-in-file', CHECK, 2, 'secrets are not read', toml=f"[secrets]\napi_key = '{API_KEY}'"),
    c('cfg-unknown-key', CHECK, 2, 'fleet.colour: unknown key', toml="colour = 'blue'"),
    c('cfg-file-missing', '--config /nonexistent/vs.toml config check', 2, 'does not exist'),
    # --- the environment -----------------------------------------------------------------------
    c('env-drain-seconds-nan', CHECK, 2, 'worker.drain_seconds', env={'VULTRSCALE_WORKER_DRAIN_SECONDS': 'nan'}),
    c('env-max-instances-inf', CHECK, 2, 'policy.max_instances', env={'VULTRSCALE_POLICY_MAX_INSTANCES': 'inf'}),
    c('env-cooldown-overflow', CHECK, 2, 'policy.scale_up_cooldown', env={'VULTRSCALE_POLICY_SCALE_UP_COOLDOWN': '99999999999d'}),
    c('env-unknown-setting', CHECK, 2, 'VULTRSCALE_POLICY_BOGUS (in the environment or .env): policy.bogus is an unknown key', env={'VULTRSCALE_POLICY_BOGUS': '1'}),
    c('env-config-missing', CHECK, 2, 'does not exist', env={'VULTRSCALE_CONFIG': '/nonexistent/vs.toml'}),
    c('env-api-url-not-http', CHECK, 2, 'VULTR_API_URL', env={'VULTR_API_URL': 'ftp://example.com'}),
    c('env-api-url-no-scheme-with-password', CHECK, 2, 'VULTR_API_URL', env={'VULTR_API_URL': f'user:{PROXY_PASSWORD}@proxy'}),
    c('env-database-url-junk', CHECK, 2, 'DATABASE_URL is not a Postgres connection string', env={'DATABASE_URL': 'junk'}),
    c('env-database-url-http', CHECK, 2, 'postgresql://USER:PASSWORD@HOST', env={'DATABASE_URL': f'https://u:{DB_PASSWORD}@h/db'}),
    c('env-database-url-unencoded-slash', CHECK, 2, 'percent-encode', env={'DATABASE_URL': f'postgresql://u:{DB_PASSWORD}/x?y@h/db'}),
    c('env-database-url-unencoded-at', CHECK, 2, 'DATABASE_URL is not', env={'DATABASE_URL': f'postgresql://u:{DB_PASSWORD}@x@h/db'}),
    c('env-worker-database-url-junk', CHECK, 2, 'WORKER_DATABASE_URL is not', env={'WORKER_DATABASE_URL': 'x y z'}),
    c('env-database-url-junk-db-init', 'db init', 2, 'DATABASE_URL is not', env={'DATABASE_URL': f'{DB_PASSWORD} junk'}),
    c('env-database-url-junk-enqueue', 'enqueue', 2, 'DATABASE_URL is not', env={'DATABASE_URL': 'postgresql://h/db?nonsense=1'}),
    c('env-database-url-missing', 'db init', 2, 'DATABASE_URL is not set', env={'DATABASE_URL': None}),
    c('env-api-key-missing', 'instances', 2, 'VULTR_API_KEY is not set', env={'VULTR_API_KEY': None}),
    c('env-api-key-wrong', 'instances', 2, 'VULTR_API_KEY', env={'VULTR_API_KEY': 'WRONG-key-0123456789abcdef'}),
    c('env-api-url-credentials-unreachable', 'instances', 1, 'cannot connect', env={'VULTR_API_URL': f'http://user:{PROXY_PASSWORD}@127.0.0.1:{{closed}}'}),
    # --- the flags ---------------------------------------------------------------------------
    c('flag-timeout-overflow', f'snapshot --from-instance {VID} --timeout 99999999999d', 2, '--timeout'),
    c('flag-timeout-nan', f'snapshot --from-instance {VID} --timeout nan', 2, '--timeout'),
    c('flag-timeout-zero', f'snapshot --from-instance {VID} --timeout 0s', 2, '--timeout'),
    c('flag-keep-zero', f'snapshot --from-instance {VID} --keep 0', 2, '--keep'),
    c('flag-snapshot-both-ids', f'snapshot --from-instance {VID} --resume {VID}', 2, 'exactly one'),
    c('flag-interval-zero', 'reconcile --loop --interval 0s', 2, 'at least 5s'),
    c('flag-interval-words', 'reconcile --loop --interval fast', 2, '--interval'),
    c('flag-interval-overflow', 'reconcile --loop --interval 1e999s', 2, '--interval'),
    c('flag-metrics-port-negative', 'reconcile --loop --metrics-port -1', 2, '--metrics-port'),
    c('flag-metrics-port-too-big', 'reconcile --loop --metrics-port 70000', 2, '--metrics-port'),
    c('flag-metrics-port-in-use', 'reconcile --loop --metrics-port {busy}', 2, 'cannot listen'),
    c('flag-metrics-port-without-loop', 'reconcile --metrics-port 9100', 2, 'needs --loop'),
    c('flag-status-every-zero', 'status --watch --every 0s', 2, '--every'),
    c('flag-status-every-words', 'status --watch --every often', 2, '--every'),
    c('flag-events-since-overflow', 'events --since 99999999999d', 2, '--since'),
    c('flag-events-since-negative', 'events --since -1h', 2, '--since'),
    c('flag-demo-duration-too-short', 'demo --duration 5s', 2, '--duration'),
    c('flag-demo-duration-overflow', 'demo --duration 99999999999d', 2, '--duration'),
    c('flag-demo-bursts-junk', 'demo --duration 2m --bursts nan:x', 2, '--bursts'),
    c('flag-demo-bursts-nan-time', 'demo --duration 2m --bursts nan:4', 2, '--bursts'),
    c('flag-demo-logs-a-file', 'demo --duration 2m --logs vultrscale.toml', 2, 'not a directory'),
    c('flag-enqueue-payload-nan', 'enqueue --payload NaN', 2, 'NaN and infinite'),
    c('flag-simulate-monthly-nan', 'simulate --days 1 --monthly-usd nan', 2, '--monthly-usd'),
    c('flag-simulate-days-huge', 'simulate --days 36500', 2, '--days'),
    c('flag-simulate-replay-huge', 'simulate --days 366 --jobs-per-day 100000', 2, 'more than a replay holds'),
    c('flag-simulate-sweep-grid-huge', 'simulate --days 1 --sweep policy.max_instances=' + ','.join(map(str, range(1, 200))) + ' --sweep policy.max_step_up=0,1', 2, '--sweep policy.max_instances (199 values) x'),
    c('flag-enqueue-queue-injection', ('enqueue', '--queue', 'a b;drop'), 2, '--queue'),
    c('flag-enqueue-queue-empty', ('enqueue', '--queue', ''), 2, '--queue'),
    c('flag-enqueue-count-zero', 'enqueue --count 0', 2, '--count'),
    c('flag-enqueue-count-huge', 'enqueue --count 99999999999999999999', 2, '--count'),
    c('flag-enqueue-max-attempts-zero', 'enqueue --max-attempts 0', 2, '--max-attempts'),
    c('flag-enqueue-payload-not-json', 'enqueue --payload {', 2, '--payload'),
    c('flag-worker-queue-injection', ('worker', '--queue', 'x y'), 2, '--queue'),
    c('flag-worker-drain-nan', 'worker --drain-seconds nan', 2, '--drain-seconds'),
    c('flag-worker-lease-inf', 'worker --lease-seconds inf', 2, '--lease-seconds'),
    c('flag-worker-concurrency-zero', 'worker --concurrency 0', 2, 'worker.concurrency'),
    c('flag-worker-backoff-negative', 'worker --backoff-seconds -1', 2, '--backoff-seconds'),
    c('flag-sim-port-negative', 'sim serve --port -1', 2, '--port'),
    c('flag-unknown-option', 'reconcile --bogus', 2, '--bogus'),
    c('flag-unknown-command', 'frobnicate', 2, 'frobnicate'),
    # --- outside data: the API and the database -----------------------------------------------
    c('api-unknown-region', 'reconcile --dry-run', 2, "fleet.region 'zzz' is not a Vultr region", env={'VULTRSCALE_FLEET_REGION': 'zzz'}),
    c('api-unknown-plan', 'reconcile --dry-run', 2, "fleet.plan 'vc9-nope'", env={'VULTRSCALE_FLEET_PLAN': 'vc9-nope'}),
    c('api-unknown-region-pass', 'reconcile', 2, 'is not a Vultr region', env={'VULTRSCALE_FLEET_REGION': 'zzz'}),
    c('api-snapshot-unknown-instance', f'snapshot --from-instance {VID}', 2, f'no instance {VID}'),
    c('api-resume-unknown-snapshot', f'snapshot --resume {VID}', 2, f'no snapshot {VID}'),
    c('api-unreachable', 'instances', 1, 'cannot connect', env={'VULTR_API_URL': 'http://127.0.0.1:{closed}'}),
    c('db-unreachable', 'events', 1, 'cannot read the events', env={'DATABASE_URL': f'postgresql://u:{DB_PASSWORD}@127.0.0.1:{{closed}}/db'}),
    c('db-unreachable-enqueue', 'enqueue', 1, 'cannot enqueue', env={'DATABASE_URL': f"host=127.0.0.1 port={{closed}} password='{DB_PASSWORD} x'"}),
    c('db-without-schema', 'enqueue', 1, 'db init', env={'DATABASE_URL': '{empty_db}'}),
    # A failed pass writes its fleet_events row, never the forecast's cache (forecast_profiles);
    # what else it may write (docs/reference/cli.md, "Exit codes"): the steps it carried out (here the queue's
    # idle time, read from Postgres), and the plan checks Vultr answered (stamped, 10 minutes).
    c('pass-api-unreachable', 'reconcile', 1, 'cannot connect', env={'VULTR_API_URL': 'http://127.0.0.1:{closed}'}, writes=('public.fleet_state',)),
    c('pass-snapshot-missing', 'reconcile', 2, f'snapshot {VID}', env={'VULTRSCALE_FLEET_SNAPSHOT_ID': VID, 'VULTRSCALE_POLICY_MIN_INSTANCES': '1', 'WORKER_DATABASE_URL': 'postgresql://vultrscale_worker:pw@127.0.0.1:{closed}/db'}, writes=('public.plan_checks',)),
]
DEEP = 20_000
CUSTOM_SQL = "[queue]\npreset = 'custom'\nin_flight_sql = 'select 0'\noldest_ready_seconds_sql = 'select 0'\n"
# Issue 27: inputs validated whole, every problem at once, the newcomer's findings.
CASES_WHOLE = [
    # --- names and ids, matched in full (a trailing newline passed `re.match(...$)`) ------------
    c('name-fleet-name-newline', CHECK, 2, 'fleet.name', toml='name = "x\\n"'),
    c('name-region-newline', CHECK, 2, 'fleet.region', toml='region = "ewr\\n"'),
    c('name-label-prefix-newline', CHECK, 2, 'fleet.label_prefix', toml='label_prefix = "worker\\n"'),
    c('name-service-newline', CHECK, 2, 'fleet.service', toml='service = "worker\\n"'),
    c('name-ssh-user-newline', CHECK, 2, 'fleet.ssh_user', toml='ssh_user = "worker\\n"'),
    c('name-tag-newline', CHECK, 2, 'fleet.tag', toml='tag = "vultrscale-workers\\n"'),
    c('name-plan-space', CHECK, 2, 'fleet.plan', toml='plan = "bad plan"'),
    c('name-worker-app-newline', CHECK, 2, 'worker.app', toml='[worker]\napp = "myjobs:handle\\n"'),
    c('name-worker-queue-newline', CHECK, 2, 'worker.queue', toml='[worker]\nqueue = "default\\n"'),
    c('name-worker-db-role-newline', CHECK, 2, 'worker.db_role', toml='[worker]\ndb_role = "vultrscale_worker\\n"'),
    c('name-queue-queue-newline', CHECK, 2, 'queue.queue', toml='[queue]\nqueue = "default\\n"'),
    c('name-fleet-name-env-newline', CHECK, 2, 'fleet.name', env={'VULTRSCALE_FLEET_NAME': 'x\n'}),
    c('name-enqueue-queue-newline', ('enqueue', '--queue', 'q\n'), 2, '--queue'),
    c('name-worker-flag-queue-newline', ('worker', '--queue', 'q\n'), 2, '--queue'),
    c('name-worker-flag-app-newline', ('worker', '--app', 'myjobs:handle\n'), 2, 'worker.app'),
    c('name-init-plan-space', ('--config', '{tmp}/new.toml', 'init', '--defaults', '--plan', 'bad plan'), 2, '--plan'),
    c('id-snapshot-path', CHECK, 2, 'fleet.snapshot_id', env={'VULTRSCALE_FLEET_SNAPSHOT_ID': '../../x'}),
    c('id-snapshot-newline', CHECK, 2, 'fleet.snapshot_id', env={'VULTRSCALE_FLEET_SNAPSHOT_ID': 'cb676a46-66fd-4dfb-b839-443f2e6c0b60\n'}),
    c('id-init-snapshot-path', ('--config', '{tmp}/new.toml', 'init', '--defaults', '--snapshot', '../../x'), 2, '--snapshot'),
    c('id-from-instance-path', 'snapshot --from-instance ../../account', 2, '--from-instance'),
    c('id-from-instance-newline', ('snapshot', '--from-instance', 'cb676a46-66fd-4dfb-b839-443f2e6c0b60\n'), 2, '--from-instance'),
    c('id-resume-path', 'snapshot --resume ../x', 2, '--resume'),
    c('id-firewall-group-path', CHECK, 2, 'fleet.firewall_group_id', toml='firewall_group_id = "../x"'),
    c('id-vpc-path', CHECK, 2, 'fleet.vpc_ids', toml='vpc_ids = ["../x"]'),
    # --- URLs parsed strictly --------------------------------------------------------------------
    c('url-api-port-out-of-range', 'instances', 2, 'VULTR_API_URL', env={'VULTR_API_URL': 'http://127.0.0.1:106469'}),
    c('url-api-port-zero', CHECK, 2, 'VULTR_API_URL', env={'VULTR_API_URL': 'http://127.0.0.1:0'}),
    c('url-api-port-not-a-number', CHECK, 2, 'VULTR_API_URL', env={'VULTR_API_URL': 'http://127.0.0.1:80a'}),
    c('url-api-no-host', CHECK, 2, 'VULTR_API_URL', env={'VULTR_API_URL': 'http://:8080'}),
    c('url-api-bad-host', CHECK, 2, 'VULTR_API_URL', env={'VULTR_API_URL': 'http://exa_mple..com'}),
    c('url-api-newline', 'instances', 2, 'VULTR_API_URL', env={'VULTR_API_URL': 'http://127.0.0.1:80\nX-Evil: 1'}),
    c('url-api-query', CHECK, 2, 'VULTR_API_URL', env={'VULTR_API_URL': 'https://api.vultr.com/?key=x'}),
    c('url-api-ipv6-unclosed', CHECK, 2, "VULTR_API_URL has a '[' or ']' out of place", env={'VULTR_API_URL': 'http://[::1/'}),
    c('url-api-ipv6-unclosed-pass', 'reconcile', 2, "VULTR_API_URL has a '[' or ']' out of place", env={'VULTR_API_URL': f'http://u:{PROXY_PASSWORD}@[::1'}),
    c('url-api-ipv6-not-an-address', 'instances', 2, 'VULTR_API_URL has something other than an IPv6 address', env={'VULTR_API_URL': 'http://[zz]/'}),
    c('url-api-ipv6-port-out-of-range', CHECK, 2, 'VULTR_API_URL has a port', env={'VULTR_API_URL': 'http://[::1]:99999/'}),
    c('url-database-port-out-of-range', 'enqueue', 2, 'DATABASE_URL names a port', env={'DATABASE_URL': 'postgresql://u:pw@127.0.0.1:106469/db'}),
    c('url-worker-database-port-zero', CHECK, 2, 'WORKER_DATABASE_URL names a port', env={'WORKER_DATABASE_URL': 'postgresql://u:pw@127.0.0.1:0/db'}),
    # --- the environment -------------------------------------------------------------------------
    c('env-unknown-section', CHECK, 2, 'VULTRSCALE_POLICY_MAX_INSTANCES', env={'VULTRSCALE_POLICIES_MAX_INSTANCES': '1'}),
    c('env-section-without-key', CHECK, 2, 'VULTRSCALE_POLICY', env={'VULTRSCALE_POLICY': '1'}),
    c('env-api-key-1mb', 'instances', 2, 'VULTR_API_KEY', env={'VULTR_API_KEY': 'K' * 1_000_000}),
    c('env-api-key-1mb-check', CHECK, 2, 'VULTR_API_KEY', env={'VULTR_API_KEY': 'K' * 1_000_000}),
    c('env-api-key-newline-inside', 'instances', 2, 'VULTR_API_KEY', env={'VULTR_API_KEY': 'VKEY-abc\nX-Evil: 1'}),
    c('env-value-nested-deeply', CHECK, 2, 'policy.max_instances', env={'VULTRSCALE_POLICY_MAX_INSTANCES': '[' * DEEP + ']' * DEEP}),
    # --- files ----------------------------------------------------------------------------------
    c('file-config-unsearchable-dir', '--config {locked}/vultrscale.toml config check', 2, 'permission', as_nobody=True),
    c('file-config-env-unsearchable-dir', CHECK, 2, 'permission', env={'VULTRSCALE_CONFIG': '{locked}/vultrscale.toml'}, as_nobody=True),
    c('file-toml-nested-arrays', CHECK, 2, 'nested', toml='deep = ' + '[' * DEEP + ']' * DEEP),
    c('file-toml-nested-tables', CHECK, 2, 'nested', toml='deep = ' + '{a=' * DEEP + '1' + '}' * DEEP),
    c('file-toml-bom', CHECK, 2, 'byte-order mark', bom=True),
    # --- custom SQL, combinations, long outside text --------------------------------------------
    c('sql-literal-percent', 'reconcile --dry-run', 2, '%%', toml=CUSTOM_SQL + "ready_sql = \"select count(*) from jobs where queue = %(queue)s and payload::text like '%x%'\""),
    c('sql-literal-percent-check', CHECK, 2, 'queue.ready_sql', toml=CUSTOM_SQL + "ready_sql = \"select count(*) from jobs where queue = %(queue)s and payload::text like '%x%'\""),
    c('sql-unknown-placeholder', CHECK, 2, 'queue.ready_sql', toml=CUSTOM_SQL + "ready_sql = \"select count(*) from jobs where queue = %(name)s\""),
    c('flag-simulate-from-db-with-workload', 'simulate --from-db --workload steady', 2, '--workload'),
    c('flag-simulate-since-without-from-db', 'simulate --since 3d', 2, '--since'),
    c('db-name-100kb', 'enqueue', 1, 'cannot enqueue', env={'DATABASE_URL': '{db_server}/' + 'd' * 100_000}),
    # --- every problem at once (a type error hid the range errors) -------------------------------
    c('all-at-once-type-and-range', CHECK, 2, 'policy.max_step_up', toml="[worker]\nconcurrency = 'four'\n[policy]\nmax_step_up = -1"),
    c('all-at-once-type-and-name', CHECK, 2, 'fleet.region', toml="region = 'EWR!'\n[policy]\nmax_instances = 'many'"),
    c('all-at-once-url-and-range', CHECK, 2, 'policy.max_instances', toml="[policy]\nmax_instances = -1", env={'VULTR_API_URL': 'ftp://x'}),
    # --- durations on every duration flag (accepted: the handler's import is what fails) -------
    c('duration-worker-drain-seconds', 'worker --drain-seconds 20s --app nosuchmodule_zz:handle', 2, 'nosuchmodule_zz'),
    c('duration-worker-lease-seconds', 'worker --lease-seconds 1m --app nosuchmodule_zz:handle', 2, 'nosuchmodule_zz'),
    c('duration-worker-outage-seconds', 'worker --outage-seconds 2m --app nosuchmodule_zz:handle', 2, 'nosuchmodule_zz'),
    c('duration-worker-drain-words', 'worker --drain-seconds soon', 2, '--drain-seconds'),
]
CASES += CASES_WHOLE
# fmt: on


@pytest.fixture(scope="module")
def world(
    pg_admin_url: str, _migrated_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    with cli_world(
        pg_admin_url, _migrated_template, tmp_path_factory.mktemp("hostile"), API_KEY, DB_PASSWORD
    ) as w:
        yield w


def _tables(db: str) -> dict[str, tuple[int, str]]:
    """Each table's row count and a digest of its rows: an upsert that rewrites a row (the
    forecast's cache did) changes no count."""
    with psycopg.connect(db, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT quote_ident(schemaname) || '.' || quote_ident(relname) "
                "FROM pg_stat_user_tables"
            )
        ]
        digest = "SELECT count(*), md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {} t"
        return {t: conn.execute(digest.format(t)).fetchone() for t in tables}  # type: ignore[misc]


def _changes(sim: Simulator) -> int:
    return sum(1 for r in sim.request_log if r.method in ("POST", "PUT", "PATCH", "DELETE"))


def _fill(text: str, w: World, tmp: Path) -> str:
    return (
        text.replace("{db}", w.db)
        .replace("{db_server}", w.db.rsplit("/", 1)[0])
        .replace("{tmp}", str(tmp))
        .replace("{locked}", str(tmp / "locked"))
        .replace("{api}", w.server.url)
        .replace("{closed}", str(w.closed))
        .replace("{empty_db}", w.empty_db)
        .replace("{busy}", str(w.busy.getsockname()[1]))
    )


@contextlib.contextmanager
def _as_nobody(on: bool) -> Iterator[None]:
    """Run as the user nobody when root runs the suite: root searches any directory, so a
    directory it may not search exists only for another user. Another user is denied already."""
    if not on or os.geteuid() != 0:
        yield
        return
    os.seteuid(pwd.getpwnam("nobody").pw_uid)
    try:
        yield
    finally:
        os.seteuid(0)


def _params() -> list[Any]:
    return [pytest.param(case, id=case.id) for case in CASES]


def test_the_corpus_has_at_least_sixty_distinct_cases() -> None:
    assert len({case.id for case in CASES}) == len(CASES) >= 60


@pytest.mark.parametrize("case", _params())
def test_hostile_input_is_refused_cleanly(
    case: Case,
    world: World,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "vultrscale.toml"
    config.write_text(("\ufeff" if case.bom else "") + world.config.read_text() + case.toml + "\n")
    (tmp_path / "locked").mkdir(mode=0o000)
    env: dict[str, str | None] = {
        "VULTRSCALE_CONFIG": str(config),
        "VULTR_API_KEY": API_KEY,
        "VULTR_API_URL": world.server.url,
        "DATABASE_URL": world.db,
        "WORKER_DATABASE_URL": None,
        "COLUMNS": "200",
        **case.env,
    }
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, _fill(value, world, tmp_path))
    monkeypatch.chdir(tmp_path)
    if case.as_nobody:  # what a failing command imports lazily, imported while it can be
        main(["--config", "/nonexistent/vultrscale.toml", "config", "check"])
        capsys.readouterr()
    rows_before, changes_before = _tables(world.db), _changes(world.sim)

    try:
        with _as_nobody(case.as_nobody):
            code: int | str = main([_fill(a, world, tmp_path) for a in case.argv])
    except BaseException as exc:  # noqa: BLE001 - the corpus reports what escaped instead
        code = f"raised {type(exc).__name__}"
    out = capsys.readouterr()
    text = out.out + out.err

    assert code == case.code, text[:5000]
    # Outside text (a 100 KB database name, a 1 MB key) is never echoed whole.
    assert len(text) < 10_000, text[:5000]
    assert case.says.lower() in text.lower(), text
    assert "Traceback" not in text
    for secret in (API_KEY, DB_PASSWORD, PROXY_PASSWORD):
        assert secret not in text
    assert _changes(world.sim) == changes_before
    rows_after = _tables(world.db)
    # A refused or failed reconcile pass records itself (its fleet_events row, with the
    # reason) and writes nothing else; every other command writes nothing at all.
    recorded = rows_after.pop("public.fleet_events")[0] - rows_before.pop("public.fleet_events")[0]
    for table in case.writes:
        rows_after.pop(table), rows_before.pop(table)
    assert rows_after == rows_before
    a_pass_ran = case.argv[:1] == ("reconcile",) and "--dry-run" not in case.argv
    assert recorded in ((0, 1) if a_pass_ran else (0,))
