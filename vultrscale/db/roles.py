"""The workers' own database role: least privilege by default.

User-data is readable by any process on an instance, so the database login it carries must
be able to do what the worker runtime does and nothing more. ``vultrscale db init`` creates
(or updates) the role named by ``worker.db_role`` and grants it exactly ``WORKER_GRANTS``,
revoking anything else it holds on the schema's tables, on every run: an upgrade that adds a
statement to the runtime adds a line to ``WORKER_GRANTS`` and the next ``db init`` applies it.
The scaler's tables (``SCALER_TABLES``) are never granted.

The role's password comes from the environment like every secret: the password inside
``WORKER_DATABASE_URL`` when that URL logs in as the role. It is hashed on this side (libpq's
``PQencryptPasswordConn``) before it is sent, so not even the server's statement log sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from vultrscale.config import Config, worker_login
from vultrscale.db import pg, schema
from vultrscale.errors import DatabaseError, UsageError
from vultrscale.redaction import url_password, url_user


@dataclass(frozen=True)
class Grant:
    """Privileges on one table or view; ``columns`` limits them to those columns."""

    on: str
    privileges: tuple[str, ...]
    columns: tuple[str, ...] = ()


# What the worker runtime's statements need (vultrscale/db/queue.py, used by vultrscale/worker/):
# claim, lease renewal, complete, fail and dead-lettering, give back, reaping expired leases,
# steps, and registering/heartbeating in `workers`. Extend it here when the runtime gains a
# statement. FOR UPDATE / FOR SHARE need UPDATE on some column, which each locked table has.
WORKER_GRANTS: tuple[Grant, ...] = (
    Grant("jobs", ("SELECT",)),
    Grant(
        "jobs",
        ("UPDATE",),
        ("state", "attempts", "run_at", "finished_at", "last_error", "started_at"),
    ),
    Grant("job_leases", ("SELECT", "INSERT", "DELETE")),
    Grant("job_leases", ("UPDATE",), ("worker_id", "token", "leased_at", "expires_at")),
    Grant("job_steps", ("SELECT", "INSERT")),
    # save_step's ON CONFLICT DO UPDATE keeps the saved result (result = job_steps.result).
    Grant("job_steps", ("UPDATE",), ("result",)),
    Grant("workers", ("SELECT", "INSERT")),
    Grant(
        "workers",
        ("UPDATE",),
        ("instance_label", "started_at", "last_seen", "stopped_at", "draining"),
    ),
    # register_worker: is the scaler draining my instance? (schema v5; not fleet_instances)
    Grant("draining_instance_labels", ("SELECT",)),
)

SCALER_TABLES = (
    "fleet_instances",
    "fleet_events",
    "fleet_state",
    "fleet_snapshots",
    "plan_checks",
    "offering_marks",
    "forecast_profiles",
    "vultrscale_schema",
)
"""The scaler's own tables: the workers' role gets no privilege on them."""

_ROLE_HINT = (
    "The DATABASE_URL user must own the schema and have CREATEROLE; or set "
    'worker.db_role = "" and manage the workers\' role yourself.'
)


_OWN_ROLE = "Name a role of its own for the workers, e.g. vultrscale_worker."


def _check_role(conn: psycopg.Connection, role: str) -> bool:
    """Whether ``role`` exists; UsageError if it is the scaler's own, a superuser, a replication
    role, a member of another role, or an owner of tables here: no grant could limit it."""
    row = conn.execute("SELECT current_user").fetchone()
    if row and row[0] == role:
        raise UsageError(
            f"worker.db_role = {role} is the role DATABASE_URL logs in as (the scaler's own)",
            hint=_OWN_ROLE,
        )
    row = conn.execute(
        "SELECT rolsuper OR rolbypassrls OR rolreplication FROM pg_roles WHERE rolname = %s",
        (role,),
    ).fetchone()
    if row and row[0]:
        raise UsageError(
            f"worker.db_role = {role} is a superuser (or bypasses row security, or may "
            "replicate): no grant could limit it",
            hint=_OWN_ROLE,
        )
    # A member acts with its roles' privileges (inherited, or by SET ROLE): the scaler's own,
    # pg_write_all_data, ... Our grants cannot take that back; the membership must go.
    groups = [
        str(r[0])
        for r in conn.execute(
            "SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid"
            " JOIN pg_roles w ON w.oid = m.member WHERE w.rolname = %s ORDER BY 1",
            (role,),
        )
    ]
    if groups:
        raise UsageError(
            f"worker.db_role = {role} is a member of {', '.join(groups)}: it may act with "
            "their privileges, which no grant on the tables takes back",
            hint=f"REVOKE {', '.join(groups)} FROM {role}; or name a role of its own for the "
            "workers, e.g. vultrscale_worker.",
        )
    # What it owns here, in one read. Tables: revoking its grants would strip the owner. The
    # schema may be emptied by its owner, the database dropped by its owner (who from Postgres
    # 15 owns public, through pg_database_owner), and a function of its own could be what the
    # scaler's statements resolve to: no grant limits any of these.
    owns = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_class c WHERE c.relowner = r.oid"
        "               AND c.relnamespace = n.oid),"
        " r.oid = n.nspowner OR r.oid = d.datdba"
        " OR EXISTS (SELECT 1 FROM pg_proc p WHERE p.pronamespace = n.oid"
        "            AND p.proowner = r.oid)"
        " FROM pg_roles r, pg_namespace n, pg_database d WHERE r.rolname = %s"
        " AND n.oid = current_schema()::regnamespace AND d.datname = current_database()",
        (role,),
    ).fetchone()
    tables, schema_or_database = owns if owns else (False, False)
    if tables:
        raise UsageError(
            f"worker.db_role = {role} owns tables in this schema: revoking its grants would "
            "strip the owner",
            hint=_OWN_ROLE,
        )
    if schema_or_database:
        raise UsageError(
            f"worker.db_role = {role} owns this schema, this database or a function in the "
            "schema: it may drop or replace the scaler's tables, which no grant takes back",
            hint=_OWN_ROLE,
        )
    return row is not None


def apply_worker_role(conn: psycopg.Connection, role: str, password: str | None) -> bool:
    """Create or update ``role`` with exactly ``WORKER_GRANTS``; True if it was created.

    Runs in the caller's transaction (``db init`` holds the schema lock): all or nothing.
    """
    exists = _check_role(conn, role)
    ident = sql.Identifier(role)
    if not exists:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))  # NOCREATEROLE NOCREATEDB
    else:
        # No role or database of its own making: a CREATEROLE role could grant itself the
        # scaler's. Named only when set: from Postgres 16, a scaler without CREATEDB may not
        # even say NOCREATEDB.
        row = conn.execute(
            "SELECT rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = %s", (role,)
        ).fetchone()
        assert row is not None
        attributes = zip(("NOCREATEROLE", "NOCREATEDB"), row, strict=True)
        drop = [sql.SQL(a) for a, held in attributes if held]
        conn.execute(sql.SQL("ALTER ROLE {} LOGIN {}").format(ident, sql.SQL(" ").join(drop)))
    if password:
        hashed = conn.pgconn.encrypt_password(password.encode(), role.encode())
        conn.execute(
            sql.SQL("ALTER ROLE {} PASSWORD {}").format(ident, sql.Literal(hashed.decode()))
        )
    row = conn.execute("SELECT current_schema(), current_database()").fetchone()
    assert row is not None
    nsp, db = sql.Identifier(row[0]), sql.Identifier(row[1])
    # Usually PUBLIC has both already; granting only when missing needs no ownership.
    can = conn.execute(
        "SELECT has_database_privilege(%(r)s, current_database(), 'CONNECT'),"
        " has_schema_privilege(%(r)s, current_schema(), 'USAGE')",
        {"r": role},
    ).fetchone()
    assert can is not None
    if not can[0]:
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(db, ident))
    if not can[1]:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(nsp, ident))
    # Exactly the list: whatever an earlier version (or a person) granted goes first, on every
    # table, sequence and routine of the schema the scaler may manage (it owns it, or is a
    # member of its owner). One by one: REVOKE ... ON ALL TABLES IN SCHEMA failed outright on a
    # table of the app's that the scaler has no privilege on, and db init with it, every time.
    # Revoking a table's privileges revokes its column privileges too. CREATE on the schema goes
    # as well: with it the role could plant a function the scaler's statements resolve to.
    managed = conn.execute(
        "SELECT 'TABLE ' || c.oid::regclass::text FROM pg_class c"
        " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN"
        " ('r', 'p', 'v', 'm', 'f') AND pg_has_role(current_user, c.relowner, 'USAGE')"
        " UNION ALL SELECT 'SEQUENCE ' || c.oid::regclass::text FROM pg_class c"
        " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'S'"
        " AND pg_has_role(current_user, c.relowner, 'USAGE')"
        " UNION ALL SELECT 'ROUTINE ' || p.oid::regprocedure::text FROM pg_proc p"
        " WHERE p.pronamespace = current_schema()::regnamespace"
        " AND pg_has_role(current_user, p.proowner, 'USAGE')"
    ).fetchall()
    for (what,) in managed:
        kind, _, name = str(what).partition(" ")
        conn.execute(
            sql.SQL("REVOKE ALL ON {} {} FROM {} CASCADE").format(
                sql.SQL(kind), sql.SQL(name), ident
            )
        )
    conn.execute(sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(nsp, ident))
    for g in WORKER_GRANTS:
        privileges = sql.SQL(", ").join(
            sql.SQL(p + " ({})").format(sql.SQL(", ").join(map(sql.Identifier, g.columns)))
            if g.columns
            else sql.SQL(p)
            for p in g.privileges
        )
        conn.execute(
            sql.SQL("GRANT {} ON {} TO {}").format(privileges, sql.Identifier(g.on), ident)
        )
    return not exists


def init_database(database_url: str, cfg: Config) -> list[str]:
    """``vultrscale db init``: migrate the schema, then create or update the workers' role.

    Returns the lines to print; the password is never among them.
    """
    lines = [f"Schema is at version {schema.migrate(database_url)}."]
    role = cfg.worker.db_role
    if cfg.queue.preset != "vultrscale":
        # The workers are the app's own (Procrastinate, PgQueuer, ...): their role needs the
        # app's tables, and WORKER_GRANTS' revoke-all would strip it.
        return [
            *lines,
            f"queue.preset = {cfg.queue.preset}: your own workers run the jobs, so no role is "
            "managed for them (their role keeps the privileges your queue library needs).",
        ]
    if not role:
        return [
            *lines,
            'worker.db_role is "": no role managed for the workers. Grant theirs only what '
            "vultrscale.db.roles.WORKER_GRANTS lists.",
        ]
    worker_url = cfg.secrets.worker_database_url.reveal()
    password = url_password(worker_url) if url_user(worker_url) == role else None
    with schema.locked(database_url, f"setting up the workers' role {role}", _ROLE_HINT) as conn:
        created = apply_worker_role(conn, role, password)
    lines.append(
        f"Workers' role {role} {'created' if created else 'updated'}: it may claim, heartbeat, "
        "finish and give back jobs, save steps and register workers; it has no privilege on "
        f"{', '.join(SCALER_TABLES)}."
    )
    if password:
        lines.append(f"Its password was set from WORKER_DATABASE_URL (which logs in as {role}).")
    else:
        lines.append(
            f"To set its password: put it in WORKER_DATABASE_URL=postgresql://{role}:PASSWORD@"
            "HOST:5432/DB (an address the instances reach; in .env or the environment) and run "
            f"`vultrscale db init` again, or run \\password {role} in psql."
        )
    return lines


@dataclass(frozen=True)
class WorkerAccess:
    """What ``config check`` reports about the workers' database login."""

    role: str | None
    source: str
    warnings: tuple[str, ...]
    notes: tuple[str, ...] = ()


def worker_access(cfg: Config) -> WorkerAccess:
    """Which role the workers use; warnings when it can write the scaler's tables (asked of
    the database at DATABASE_URL when it is set and reachable)."""
    login = worker_login(cfg)
    scaler_url = cfg.secrets.database_url.reveal()
    if not login.role or not scaler_url or login.role == url_user(scaler_url):
        return WorkerAccess(login.role, login.source, login.warnings)
    try:
        writable = scaler_tables_writable(scaler_url, login.role)
    except DatabaseError as exc:
        note = f"could not check what {login.role} may do: {exc.message}"
        return WorkerAccess(login.role, login.source, login.warnings, (note,))
    if writable is None:
        return WorkerAccess(
            login.role,
            login.source,
            (*login.warnings, f"role {login.role} does not exist yet: run `vultrscale db init`"),
        )
    extra = (
        (
            f"role {login.role} can write the scaler's tables ({', '.join(writable)}): run "
            "`vultrscale db init` to limit a role it manages, or revoke those grants",
        )
        if writable
        else ()
    )
    return WorkerAccess(login.role, login.source, (*login.warnings, *extra))


def scaler_tables_writable(database_url: str, role: str) -> list[str] | None:
    """The scaler's tables ``role`` may change (INSERT, UPDATE, DELETE or TRUNCATE) at
    ``database_url``; None if the role does not exist there."""
    with pg.session(database_url, "checking what the workers' role may change") as conn:
        found = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        if found is None:
            return None
        rows = conn.execute(
            """
            SELECT t FROM unnest(%(tables)s::text[]) AS t
            WHERE to_regclass(t) IS NOT NULL
              AND (has_table_privilege(%(role)s, t, 'DELETE, TRUNCATE')
                   OR has_any_column_privilege(%(role)s, t, 'INSERT, UPDATE'))
            """,
            {"tables": list(SCALER_TABLES), "role": role},
        ).fetchall()
    return [str(r[0]) for r in rows]
