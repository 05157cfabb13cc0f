"""The workers' database role, proved by Postgres itself: logged in as the role that
``vultrscale db init`` made, the real worker runtime does its whole job, and every statement
against the scaler's tables is refused."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import errors

from tests.e2e.worker_procs import jobs, steps, wait_for
from vultrscale import config as config_mod
from vultrscale.cli import main
from vultrscale.config import Offering
from vultrscale.core.model import PlanPrice
from vultrscale.db import ledger, roles
from vultrscale.db import queue as q
from vultrscale.errors import UsageError
from vultrscale.rules.offerings import Choice
from vultrscale.worker import Job
from vultrscale.worker.runtime import Worker, WorkerSettings

WORKER_PW = "w0rker-Pa55-" + uuid.uuid4().hex[:8]


def _as(url: str, user: str, password: str | None = None) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{user}:{password}@{host}" if password else f"{user}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _config(db_url: str, role: str, worker_url: str) -> config_mod.Config:
    env = {
        "DATABASE_URL": db_url,
        "WORKER_DATABASE_URL": worker_url,
        "VULTRSCALE_WORKER_DB_ROLE": role,
    }
    return config_mod.load(None, env, None, require_file=False)


@dataclass
class Role:
    name: str
    url: str  # logs in as the role, with its password (trust auth may ignore it)
    init_lines: list[str]


@pytest.fixture
def admin(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


@pytest.fixture
def worker_role(db_url: str, admin: psycopg.Connection) -> Iterator[Role]:
    """A role made by `db init` (roles are cluster-wide: a name of this test's own)."""
    name = f"vs_worker_{uuid.uuid4().hex[:10]}"
    url = _as(db_url, name, WORKER_PW)
    lines = roles.init_database(db_url, _config(db_url, name, url))
    try:
        yield Role(name, url, lines)
    finally:
        admin.execute(f"DROP OWNED BY {name}")
        admin.execute(f"DROP ROLE {name}")


@pytest.fixture
def wconn(worker_role: Role) -> Iterator[psycopg.Connection]:
    with psycopg.connect(worker_role.url, autocommit=True) as c:
        yield c


def test_db_init_creates_the_role_and_says_how_to_set_its_password_never_printing_it(
    worker_role: Role, admin: psycopg.Connection
) -> None:
    text = "\n".join(worker_role.init_lines)
    assert f"role {worker_role.name} created" in text
    assert "password was set from WORKER_DATABASE_URL" in text
    assert WORKER_PW not in text
    row = admin.execute(
        "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = %s",
        (worker_role.name,),
    ).fetchone()
    assert row == (True, False, False, False)
    superuser = admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    if superuser.fetchone() == (True,):  # pg_authid is readable by superusers only
        (stored,) = admin.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (worker_role.name,)
        ).fetchone() or (None,)
        assert stored and stored.startswith("SCRAM-SHA-256$") and WORKER_PW not in stored


def test_db_init_without_a_worker_url_prints_how_to_set_the_password(
    db_url: str, admin: psycopg.Connection
) -> None:
    name = f"vs_worker_{uuid.uuid4().hex[:10]}"
    cfg = config_mod.load(
        None,
        {"DATABASE_URL": db_url, "VULTRSCALE_WORKER_DB_ROLE": name},
        None,
        require_file=False,
    )
    try:
        text = "\n".join(roles.init_database(db_url, cfg))
        again = "\n".join(roles.init_database(db_url, cfg))
    finally:
        admin.execute(f"DROP OWNED BY {name}")
        admin.execute(f"DROP ROLE {name}")
    assert f"role {name} created" in text and f"role {name} updated" in again
    assert f"WORKER_DATABASE_URL=postgresql://{name}:PASSWORD@" in text


def test_the_worker_runtime_does_its_whole_job_as_the_worker_role(
    worker_role: Role, admin: psycopg.Connection
) -> None:
    (stepped,) = q.enqueue(admin, [{"kind": "steps"}])
    (poison,) = q.enqueue(admin, [{"kind": "poison"}], max_attempts=1)
    (slow,) = q.enqueue(admin, [{"kind": "slow"}])
    given_back = threading.Event()

    def handle(job: Job) -> None:
        kind = job.payload["kind"]
        if kind == "poison":
            raise RuntimeError("poison")
        job.step("first", lambda: {"n": 1})
        if kind == "slow":
            wait_for(lambda: job.stopping, "the drain", 30)
            wait_for(given_back.is_set, "the give-back", 30)

    lines: list[str] = []
    settings = WorkerSettings(
        app="test:handle",
        concurrency=3,
        lease_seconds=3,
        drain_seconds=0.2,
        worker_id="w-role",
        instance_label="worker-1-role",
    )
    w = Worker(settings, worker_role.url, handle, say=lines.append)
    t = threading.Thread(target=w.run, name="role-worker", daemon=True)
    t.start()
    try:
        wait_for(
            lambda: (
                jobs(admin).get(stepped, ("",))[0] == "succeeded"
                and jobs(admin).get(poison, ("",))[0] == "dead"
            ),
            "the stepped job to succeed and the poison job to be dead-lettered",
            30,
        )
        # Heartbeats: the slow job's lease was renewed past its first term, and the worker
        # row was refreshed.
        wait_for(
            lambda: (
                admin.execute(
                    "SELECT expires_at - leased_at > interval '3.5 s' FROM job_leases"
                    " WHERE job_id = %s",
                    (slow,),
                ).fetchone()
                == (True,)
            ),
            "a lease renewal",
            30,
        )
        wait_for(
            lambda: (
                admin.execute(
                    "SELECT last_seen > started_at FROM workers WHERE worker_id = 'w-role'"
                ).fetchone()
                == (True,)
            ),
            "a worker heartbeat",
            30,
        )
        w.request_stop()
        wait_for(lambda: jobs(admin)[slow] == ("ready", 0), "the give-back", 30)
    finally:
        given_back.set()
        w.request_stop()
        t.join(30)
    assert not t.is_alive(), lines
    assert w.summary.succeeded == 1 and w.summary.dead == 1 and w.summary.given_back == 1, lines
    assert jobs(admin) == {
        stepped: ("succeeded", 1),
        poison: ("dead", 1),
        slow: ("ready", 0),  # given back with its attempt refunded
    }
    assert steps(admin) == {stepped: {"first": {"n": 1}}, slow: {"first": {"n": 1}}}
    row = admin.execute(
        "SELECT draining, stopped_at IS NOT NULL FROM workers WHERE worker_id = 'w-role'"
    ).fetchone()
    assert row == (True, True)  # marked draining, then stopped


def test_the_worker_role_reaps_expired_leases_and_sees_its_instance_draining(
    worker_role: Role, admin: psycopg.Connection, wconn: psycopg.Connection
) -> None:
    ready, poison = q.enqueue(admin, [{}]), q.enqueue(admin, [{}], max_attempts=1)
    assert len(q.claim(wconn, "ghost", "default", 2, 30)) == 2
    admin.execute("UPDATE job_leases SET expires_at = now() - interval '1 s'")
    assert q.reap_expired(wconn) == 2
    assert jobs(admin) == {ready[0]: ("ready", 1), poison[0]: ("dead", 1)}

    now = datetime.now(UTC)
    choice = Choice(Offering("r", "p"), PlanPrice("p", 5.0, 0.01), 1)
    ledger.insert_intent(admin, "f", "worker-9-abcd", choice, "", now)
    ledger.mark_draining(admin, "worker-9-abcd", now, fleet="f")
    q.register_worker(wconn, "w-9", "worker-9-abcd")
    q.register_worker(wconn, "w-other", "worker-other")
    assert q.worker_heartbeat(wconn, "w-9") is True
    assert q.worker_heartbeat(wconn, "w-other") is False


# Every kind of statement against each of the scaler's tables; Postgres must refuse each.
_REFUSED = (
    "SELECT * FROM {t}",
    "SELECT count(*) FROM {t}",
    "INSERT INTO {t} DEFAULT VALUES",
    "UPDATE {t} SET {c} = {c}",
    "DELETE FROM {t}",
    "TRUNCATE {t}",
    "DROP TABLE {t}",
    "ALTER TABLE {t} ADD COLUMN evil text",
    "LOCK TABLE {t}",
)
_FIRST_COLUMN = {
    "fleet_instances": "label",
    "fleet_events": "fleet",
    "fleet_state": "fleet",
    "fleet_snapshots": "fleet",
    "plan_checks": "plan",
    "offering_marks": "fleet",
    "forecast_profiles": "fleet",
    "vultrscale_schema": "version",
}


@pytest.mark.parametrize("table", roles.SCALER_TABLES)
def test_every_statement_against_the_scalers_tables_is_refused(
    table: str, worker_role: Role, wconn: psycopg.Connection
) -> None:
    for stmt in _REFUSED:
        text = stmt.format(t=table, c=_FIRST_COLUMN[table])
        with pytest.raises(errors.InsufficientPrivilege), wconn.transaction():
            wconn.execute(text)


def test_the_scalers_own_operations_are_refused_to_the_worker_role(
    worker_role: Role, wconn: psycopg.Connection
) -> None:
    now = datetime.now(UTC)
    for op in (
        lambda: ledger.rows(wconn, "f"),
        lambda: ledger.fleet_state(wconn, "f"),
        lambda: ledger.mark_draining(wconn, "worker-1", now, fleet="workers"),
        lambda: ledger.record_event(
            wconn,
            fleet="f",
            at=now,
            dry_run=False,
            inputs={},
            plan={},
            actions=[],
            results=[],
            errors=[],
            exit_code=0,
        ),  # fmt: skip
        lambda: ledger.save_fleet_state(
            wconn, "f", now, last_scale_up=None, last_scale_down=None, idle_since=None
        ),
    ):
        with pytest.raises(errors.InsufficientPrivilege), wconn.transaction():
            op()


def test_the_worker_role_cannot_enqueue_rewrite_or_delete_jobs(
    worker_role: Role, admin: psycopg.Connection, wconn: psycopg.Connection
) -> None:
    (job,) = q.enqueue(admin, [{}])
    for text in (
        "INSERT INTO jobs (payload) VALUES ('{}')",
        f"UPDATE jobs SET payload = '{{}}' WHERE id = {job}",
        f"UPDATE jobs SET max_attempts = 100 WHERE id = {job}",
        f"DELETE FROM jobs WHERE id = {job}",
        "DELETE FROM workers",
        "TRUNCATE jobs",
    ):
        with pytest.raises(errors.InsufficientPrivilege), wconn.transaction():
            wconn.execute(text)


def test_db_init_takes_back_what_was_granted_by_hand(
    db_url: str, worker_role: Role, admin: psycopg.Connection
) -> None:
    admin.execute(f"GRANT ALL ON fleet_instances, jobs TO {worker_role.name}")
    cfg = _config(db_url, worker_role.name, worker_role.url)
    assert roles.scaler_tables_writable(db_url, worker_role.name) == ["fleet_instances"]
    warnings = roles.worker_access(cfg).warnings
    assert any("can write the scaler's tables (fleet_instances)" in w for w in warnings)

    lines = roles.init_database(db_url, cfg)
    assert f"role {worker_role.name} updated" in "\n".join(lines)
    assert roles.scaler_tables_writable(db_url, worker_role.name) == []
    assert roles.worker_access(cfg).warnings == ()
    granted = admin.execute(
        "SELECT privilege_type FROM information_schema.table_privileges"
        " WHERE grantee = %s AND table_name = 'jobs' ORDER BY 1",
        (worker_role.name,),
    ).fetchall()
    assert granted == [("SELECT",)]  # UPDATE only on its columns, never DELETE


def test_config_check_names_the_workers_role_and_warns_about_the_scalers_own(
    db_url: str, worker_role: Role
) -> None:
    ok = roles.worker_access(_config(db_url, worker_role.name, worker_role.url))
    assert (ok.role, ok.source, ok.warnings) == (worker_role.name, "WORKER_DATABASE_URL", ())

    shared = roles.worker_access(_config(db_url, worker_role.name, db_url))
    assert shared.role == "postgres"
    assert any("the scaler's own role" in w for w in shared.warnings)

    opted = config_mod.load(
        None,
        {"DATABASE_URL": db_url, "VULTRSCALE_WORKER_USE_SCALER_DATABASE_URL": "true"},
        None,
        require_file=False,
    )
    assert any("scaler's own DATABASE_URL" in w for w in roles.worker_access(opted).warnings)

    missing = roles.worker_access(_config(db_url, "vs_nobody", _as(db_url, "vs_nobody")))
    assert any("does not exist yet" in w for w in missing.warnings)


def test_db_init_refuses_to_make_the_scalers_own_role_the_workers(
    db_url: str, admin: psycopg.Connection
) -> None:
    cfg = _config(db_url, "postgres", db_url)
    with pytest.raises(UsageError, match="scaler's own"):
        roles.init_database(db_url, cfg)


def test_db_init_command_prints_the_role_and_never_the_password(
    db_url: str,
    admin: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    name = f"vs_worker_{uuid.uuid4().hex[:10]}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VULTRSCALE_CONFIG", raising=False)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("WORKER_DATABASE_URL", _as(db_url, name, WORKER_PW))
    monkeypatch.setenv("VULTRSCALE_WORKER_DB_ROLE", name)
    try:
        code = main(["db", "init"])
    finally:
        admin.execute(f"DROP OWNED BY {name}")
        admin.execute(f"DROP ROLE IF EXISTS {name}")
    out = capsys.readouterr()
    assert code == 0, out.err
    assert f"role {name} created" in out.out
    assert WORKER_PW not in out.out + out.err


def test_config_check_command_reports_the_workers_role_and_warns(
    db_url: str,
    worker_role: Role,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VULTRSCALE_CONFIG", raising=False)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("VULTRSCALE_WORKER_DB_ROLE", worker_role.name)
    monkeypatch.setenv("WORKER_DATABASE_URL", worker_role.url)
    monkeypatch.setenv("VULTRSCALE_QUEUE_QUEUE", "default")  # no warning about the queue either
    assert main(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert f"Workers log in as {worker_role.name} (from WORKER_DATABASE_URL)" in out
    assert "warning" not in out and WORKER_PW not in out

    monkeypatch.setenv("WORKER_DATABASE_URL", db_url)  # the scaler's own login
    assert main(["config", "check", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["worker_access"]["role"] == "postgres"
    assert any("the scaler's own role" in w for w in doc["worker_access"]["warnings"])


def test_db_init_refuses_a_role_that_owns_the_tables(
    db_url: str, admin: psycopg.Connection
) -> None:
    name = f"vs_owner_{uuid.uuid4().hex[:10]}"
    admin.execute(f"CREATE ROLE {name}")
    try:
        admin.execute(f"ALTER TABLE fleet_events OWNER TO {name}")
        with pytest.raises(UsageError, match="owns tables"):
            roles.init_database(db_url, _config(db_url, name, _as(db_url, name)))
    finally:
        admin.execute("ALTER TABLE fleet_events OWNER TO current_user")
        admin.execute(f"DROP OWNED BY {name}")
        admin.execute(f"DROP ROLE {name}")


def test_with_a_foreign_queue_db_init_leaves_the_apps_worker_role_alone(
    db_url: str, admin: psycopg.Connection
) -> None:
    """Procrastinate's (or PgQueuer's) workers are the app's: their role needs the app's tables.
    Following config check's advice to name it in worker.db_role must not strip it."""
    name = f"vs_app_{uuid.uuid4().hex[:10]}"
    admin.execute(f"CREATE ROLE {name} LOGIN")
    try:
        admin.execute("CREATE TABLE app_jobs (id int)")
        admin.execute(f"GRANT SELECT, UPDATE ON app_jobs TO {name}")
        env = {
            "DATABASE_URL": db_url,
            "WORKER_DATABASE_URL": _as(db_url, name, WORKER_PW),
            "VULTRSCALE_WORKER_DB_ROLE": name,
            "VULTRSCALE_QUEUE_PRESET": "procrastinate",
        }
        cfg = config_mod.load(None, env, None, require_file=False)
        assert not any("name that role" in w for w in config_mod.worker_login(cfg).warnings)

        lines = "\n".join(roles.init_database(db_url, cfg))
        assert "no role is managed" in lines
        kept = admin.execute(
            "SELECT has_table_privilege(%(r)s, 'app_jobs', 'SELECT'),"
            " has_table_privilege(%(r)s, 'app_jobs', 'UPDATE')",
            {"r": name},
        ).fetchone()
        assert kept == (True, True)
    finally:
        admin.execute(f"DROP OWNED BY {name}")
        admin.execute(f"DROP ROLE {name}")


@pytest.mark.parametrize("grant", ["membership", "createrole"])
def test_db_init_leaves_the_workers_role_no_way_to_the_scalers_privileges(
    db_url: str, worker_role: Role, admin: psycopg.Connection, grant: str
) -> None:
    cfg = _config(db_url, worker_role.name, worker_role.url)
    if grant == "membership":  # it could SET ROLE to the scaler's own and write its tables
        (scaler,) = admin.execute("SELECT current_user").fetchone() or ("",)
        admin.execute(f'GRANT "{scaler}" TO {worker_role.name}')
        with pytest.raises(UsageError, match=f"is a member of {scaler}") as refused:
            roles.init_database(db_url, cfg)
        assert f"REVOKE {scaler} FROM {worker_role.name}" in (refused.value.hint or "")
        admin.execute(f'REVOKE "{scaler}" FROM {worker_role.name}')
    else:  # it could grant itself any role, the scaler's own included
        admin.execute(f"ALTER ROLE {worker_role.name} CREATEROLE CREATEDB")
        roles.init_database(db_url, cfg)
    attributes = admin.execute(
        "SELECT rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = %s", (worker_role.name,)
    ).fetchone()
    assert attributes == (False, False)
    member_of = admin.execute(
        "SELECT count(*) FROM pg_auth_members m JOIN pg_roles w ON w.oid = m.member"
        " WHERE w.rolname = %s",
        (worker_role.name,),
    ).fetchone()
    assert member_of == (0,)


@pytest.mark.parametrize("owns", ["schema", "database"])
def test_db_init_refuses_a_role_that_owns_the_schema_or_the_database(
    db_url: str, admin: psycopg.Connection, owns: str
) -> None:
    """Accepted, it printed 'no privilege on the scaler's tables', and logged in as it the
    reviewer dropped fleet_events and jobs: an owner of the schema (or of the database, which
    owns public from Postgres 15) may drop every table in it."""
    name = f"vs_owner_{uuid.uuid4().hex[:10]}"
    db = urlsplit(db_url).path.lstrip("/")
    admin.execute(f"CREATE ROLE {name}")
    target = "SCHEMA public" if owns == "schema" else f'DATABASE "{db}"'
    before = admin.execute(
        "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'public'"
        if owns == "schema"
        else "SELECT datdba::regrole::text FROM pg_database WHERE datname = current_database()"
    ).fetchone()
    assert before is not None
    try:
        admin.execute(f"ALTER {target} OWNER TO {name}")
        with pytest.raises(UsageError, match="owns this schema, this database"):
            roles.init_database(db_url, _config(db_url, name, _as(db_url, name)))
    finally:
        admin.execute(f"ALTER {target} OWNER TO {before[0]}")
        admin.execute(f"DROP OWNED BY {name}")
        admin.execute(f"DROP ROLE {name}")


def test_db_init_takes_back_create_on_the_schema(
    db_url: str, worker_role: Role, admin: psycopg.Connection
) -> None:
    """Kept, it let the role plant a function (public.unnest(text[])) that the scaler's own
    check then ran with the scaler's rights: the role granted itself the scaler's tables."""
    admin.execute(f"GRANT CREATE ON SCHEMA public TO {worker_role.name}")
    roles.init_database(db_url, _config(db_url, worker_role.name, worker_role.url))
    row = admin.execute(
        "SELECT has_schema_privilege(%s, 'public', 'CREATE')", (worker_role.name,)
    ).fetchone()
    assert row == (False,)


def test_db_init_works_beside_an_apps_table_the_scaler_may_not_touch(
    pg_admin_url: str,
) -> None:
    """REVOKE ... ON ALL TABLES IN SCHEMA failed outright on it ('permission denied for table
    app_t'), and so did every db init of a scaler that shares its database with the app."""
    tag = uuid.uuid4().hex[:8]
    scaler, app, worker, db = f"vs_s_{tag}", f"vs_app_{tag}", f"vs_w_{tag}", f"vs_shared_{tag}"
    with psycopg.connect(pg_admin_url, autocommit=True) as root:
        root.execute(f"CREATE ROLE {scaler} LOGIN CREATEROLE PASSWORD 'pw-{tag}'")
        root.execute(f"CREATE ROLE {app}")
        root.execute(f"CREATE DATABASE {db} OWNER {scaler}")
        try:
            with psycopg.connect(_with_user(pg_admin_url, db), autocommit=True) as in_db:
                in_db.execute(f"ALTER SCHEMA public OWNER TO {scaler}")
                in_db.execute("CREATE TABLE app_t (id int)")
                in_db.execute(f"ALTER TABLE app_t OWNER TO {app}")
                in_db.execute("REVOKE ALL ON app_t FROM PUBLIC")
            url = _as(_with_user(pg_admin_url, db), scaler, f"pw-{tag}")
            lines = roles.init_database(url, _config(url, worker, _as(url, worker)))
            assert any(f"role {worker}" in line for line in lines), lines
        finally:
            root.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            for role in (worker, app, scaler):
                root.execute(f"DROP ROLE IF EXISTS {role}")


def _with_user(admin_url: str, db: str) -> str:
    parts = urlsplit(admin_url)
    return urlunsplit(parts._replace(path=f"/{db}"))
