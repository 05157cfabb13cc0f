"""The database schema: a versioned list of migrations applied under an advisory lock.

``migrate`` is idempotent and safe to run from several processes at once: the first takes a
transaction-scoped advisory lock, applies what is missing and records each version in
``vultrscale_schema``; the others wait for the lock and find nothing to do.

All lease and liveness times are the database's ``now()`` (docs/queues.md).
The partial indexes cover only the rows the hot queries read (ready jobs, live leases), so claims
and the scaler's counts stay fast when the table holds millions of finished rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from vultrscale.db import pg
from vultrscale.redaction import mask_url

# Any constant unique to this project: hashtext('vultrscale.schema') would need a round trip.
_LOCK_KEY = 0x76_73_63_68_65_6D  # "vschem"

_V1 = """
CREATE TABLE jobs (
    id bigserial PRIMARY KEY,
    queue text NOT NULL DEFAULT 'default',
    state text NOT NULL DEFAULT 'ready'
        CHECK (state IN ('ready', 'leased', 'succeeded', 'failed', 'dead')),
    attempts int NOT NULL DEFAULT 0,
    max_attempts int NOT NULL DEFAULT 3,
    run_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    payload jsonb NOT NULL DEFAULT '{}',
    last_error text
);
-- The claim walks this index in order; the scaler counts due rows from it.
CREATE INDEX jobs_ready_idx ON jobs (queue, run_at, id) WHERE state = 'ready';
-- Oldest ready age across every queue (the scaler may watch all queues).
CREATE INDEX jobs_ready_run_at_idx ON jobs (run_at) WHERE state = 'ready';
-- Depth by state without touching the finished rows.
CREATE INDEX jobs_active_state_idx ON jobs (state) WHERE state IN ('ready', 'leased');

CREATE TABLE job_leases (
    job_id bigint PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    worker_id text NOT NULL,
    leased_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    token uuid NOT NULL
);
CREATE INDEX job_leases_expires_idx ON job_leases (expires_at);
CREATE INDEX job_leases_worker_idx ON job_leases (worker_id);

CREATE TABLE job_steps (
    job_id bigint REFERENCES jobs (id) ON DELETE CASCADE,
    name text NOT NULL,
    result jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_id, name)
);

CREATE TABLE workers (
    worker_id text PRIMARY KEY,
    instance_label text,
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen timestamptz NOT NULL DEFAULT now(),
    draining boolean NOT NULL DEFAULT false,
    stopped_at timestamptz
);
CREATE INDEX workers_instance_label_idx ON workers (instance_label);

CREATE TABLE fleet_instances (
    label text PRIMARY KEY,
    fleet text NOT NULL,
    instance_id text UNIQUE,
    state text NOT NULL,
    plan text,
    region text,
    hourly_rate double precision,
    monthly_cost double precision,
    host_key text,
    main_ip text,
    internal_ip text,
    created_at timestamptz NOT NULL,
    posted_at timestamptz,
    active_at timestamptz,
    running_at timestamptz,
    draining_at timestamptz,
    deleting_at timestamptz,
    gone_at timestamptz,
    state_since timestamptz NOT NULL,
    delete_attempts int NOT NULL DEFAULT 0,
    last_error text
);
CREATE INDEX fleet_instances_fleet_state_idx ON fleet_instances (fleet, state);

CREATE TABLE fleet_events (
    id bigserial PRIMARY KEY,
    fleet text NOT NULL,
    at timestamptz NOT NULL,
    dry_run boolean NOT NULL DEFAULT false,
    inputs jsonb,
    plan jsonb,
    actions jsonb,
    results jsonb,
    errors jsonb,
    exit_code int
);
CREATE INDEX fleet_events_fleet_at_idx ON fleet_events (fleet, at);

CREATE TABLE fleet_state (
    fleet text PRIMARY KEY,
    snapshot_id text,
    last_scale_up timestamptz,
    last_scale_down timestamptz,
    idle_since timestamptz,
    updated_at timestamptz
);

CREATE TABLE fleet_snapshots (
    snapshot_id text PRIMARY KEY,
    fleet text NOT NULL,
    description text,
    created_at timestamptz NOT NULL,
    status text
);
"""

# v2: jobs_active_state_idx served no query (EXPLAIN of the claim, the reaper and the
# scaler's signal queries: they use jobs_ready_idx, jobs_ready_run_at_idx and the lease
# indexes), so it only cost a write on every state change.
_V2 = """
DROP INDEX IF EXISTS jobs_active_state_idx;
"""

# v4 (v3 is another branch's): the plan's price and region check, cached for every pass (a
# one-shot pass from cron would otherwise ask Vultr three times instead of once). Only checks
# that passed are kept: a refused plan must be seen again as soon as the config is fixed.
_V4 = """
CREATE TABLE plan_checks (
    plan text NOT NULL,
    region text NOT NULL,
    monthly_cost double precision NOT NULL,
    hourly_cost double precision,
    checked_at timestamptz NOT NULL,
    PRIMARY KEY (plan, region)
);
"""

# v5: a worker registering itself must know whether the scaler is draining its instance, but
# the workers' role has no privilege on the scaler's tables. This view (run with its owner's
# rights) shows a worker that much and nothing else of fleet_instances.
_V5 = """
CREATE VIEW draining_instance_labels AS
    SELECT label FROM fleet_instances WHERE state IN ('draining', 'deleting');
"""

# v6: when a job's last attempt started, written by the worker at claim: `simulate --from-db`
# replays a job's own run time (finished - started) instead of finished - due, which held the
# time it waited in the fleet. Rows from before stay NULL and are replayed the old way.
_V6 = """
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS started_at timestamptz;
"""

# v7: offerings (docs/offerings.md). A plan check now also remembers a plan its region's
# availability does not list (an offering skipped, not a refused pass: asked again after the
# TTL, not on every pass). offering_marks: a create Vultr refused on a region and plan, skipped
# by every pass of the fleet until ``until``; ``refusals`` counts them all (never reset).
_V7 = """
ALTER TABLE plan_checks ADD COLUMN listed boolean NOT NULL DEFAULT true;
CREATE TABLE offering_marks (
    fleet text NOT NULL,
    region text NOT NULL,
    plan text NOT NULL,
    until timestamptz NOT NULL,
    reason text NOT NULL,
    refusals bigint NOT NULL DEFAULT 1,
    PRIMARY KEY (fleet, region, plan)
);
"""

# v8: the floor forecast (docs/policy.md, "The floor forecast"). Its per-slot profile, computed
# from weeks of jobs, is cached per fleet for every pass of every process (a pass runs every
# 30 s; the profile is recomputed once per policy.forecast.refresh). The history read selects
# jobs by created_at: a BRIN index is a few pages and costs the queue's inserts almost nothing
# (created_at grows with the table).
_V8 = """
CREATE TABLE forecast_profiles (
    fleet text PRIMARY KEY,
    computed_at timestamptz NOT NULL,
    profile jsonb NOT NULL
);
CREATE INDEX jobs_created_at_brin ON jobs USING brin (created_at);
"""

# v9: every pass reads the queue's newest finished jobs (their mean run time: the wait rule,
# vultrscale.rules.waits) and the fleet's newest boots (vultrscale.core.boottime); without
# these indexes each read would scan every finished job and every ledger row ever kept.
_V9 = """
CREATE INDEX IF NOT EXISTS jobs_finished_at_idx ON jobs (finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS fleet_instances_boots_idx ON fleet_instances (fleet, created_at)
    WHERE posted_at IS NOT NULL AND running_at IS NOT NULL;
"""

# v10: an instance whose worker refused to start again (a revive's `systemctl start` failed)
# is never revived again: a column, where it was the head of last_error's free text (which a
# later transition overwrites). Rows marked so before keep their meaning.
_V10 = """
ALTER TABLE fleet_instances ADD COLUMN IF NOT EXISTS never_revive boolean NOT NULL DEFAULT false;
UPDATE fleet_instances SET never_revive = true WHERE last_error LIKE 'systemctl start failed%';
"""

# v11: several fleets share the database (docs/fleets.md): a pass with
# account.monthly_ceiling_usd reads every other fleet's live rows and those gone this month
# (db.account), and `status` the live rows of fleets no file describes; without these the
# read would scan every row the ledger ever kept, of every fleet.
_V11 = """
CREATE INDEX IF NOT EXISTS fleet_instances_live_idx ON fleet_instances (fleet)
    WHERE state <> 'gone';
CREATE INDEX IF NOT EXISTS fleet_instances_gone_idx ON fleet_instances (gone_at)
    WHERE state = 'gone';
"""

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (1, _V1),
    (2, _V2),
    (4, _V4),
    (5, _V5),
    (6, _V6),
    (7, _V7),
    (8, _V8),
    (9, _V9),
    (10, _V10),
    (11, _V11),
)
"""(version, SQL) in order. Append new versions; never edit one that has shipped. Versions
are applied when missing, not only when above the highest applied one, so versions numbered
apart on parallel branches all land after a merge."""

LATEST = MIGRATIONS[-1][0]


def current_version(conn: psycopg.Connection) -> int:
    """The highest applied version, 0 for a database without the schema."""
    row = conn.execute("SELECT to_regclass('vultrscale_schema') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM vultrscale_schema").fetchone()
    return int(row[0]) if row else 0


@contextmanager
def locked(conninfo: str, doing: str, hint: str) -> Iterator[psycopg.Connection]:
    """A connection in a transaction holding the schema lock; psycopg errors become
    DatabaseError naming ``doing`` (secrets masked), with ``hint`` unless the database is
    unreachable (then the one hint for that)."""
    conn = pg.connect(conninfo, autocommit=False)
    try:
        with conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            yield conn
    except psycopg.Error as exc:
        err = pg.translate(exc, f"{doing} at {mask_url(conninfo)} failed", conninfo)
        if not isinstance(exc, psycopg.OperationalError):
            err.hint = hint
        raise err from None
    finally:
        conn.close()


def migrate(conninfo: str) -> int:
    """Create or upgrade the schema; return the version the database is at afterwards."""
    with locked(
        conninfo, "migrating the schema", "Check that the user may create tables in this database."
    ) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS vultrscale_schema ("
            " version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        have = {int(r[0]) for r in conn.execute("SELECT version FROM vultrscale_schema")}
        for version, sql in MIGRATIONS:
            if version in have:
                continue
            conn.execute(sql.encode())
            conn.execute("INSERT INTO vultrscale_schema (version) VALUES (%s)", (version,))
        return current_version(conn)
