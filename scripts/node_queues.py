#!/usr/bin/env python3
"""The graphile-worker and pg-boss presets against the real Node libraries and their workers.

Installs graphile-worker 0.18.0 and pg-boss 12.38.1 with npm into --dir (once; outside the
repository: nothing fetched is committed), then for each library, on an empty database:

1. its own migrations create its schema; 4 short jobs and 1 long one are enqueued with its API;
2. a worker process (its real worker, concurrency 2) runs the short ones and starts the long
   one: the preset counts it in flight (and, for pg-boss, the 4 finished ones);
3. the worker is killed (SIGKILL) mid-job: the preset counts the job stalled once the
   library's own timeout has passed (pg-boss: the queue's expireInSeconds, 4 s here;
   graphile-worker: its 4-hour lock timeout, which the script passes by moving the job's
   locked_at back 4 hours: the library hard-codes it);
4. a second worker's own recovery (pg-boss's supervisor, which expires jobs in its monitor step:
   every second here, every 60 s by default; graphile-worker's resetLockedAt sweep) gives the
   job back and runs it again: the preset counts nothing left;
5. a job running when the worker gets SIGTERM is finished before it exits (the drain), and
   recorded finished (graphile-worker: with completeJobBatchDelay 0; its default -1 left the
   job locked in every run here: COMPLETE_JOB_BATCH_DELAY=-1 shows it).

Each step checks the preset's numbers (read_signals) and prints them; exit 0 when all hold.

--dump-schemas writes tests/fixtures/<library>-<version>.schema.sql anew: the schema each
library's migrations create, dumped with pg_dump (the tests load these).

Postgres: --database-url (an empty database of yours), else a throwaway server is started.
Needs node and npm on PATH. tests/db/test_node_presets.py runs this wherever they are
(VULTRSCALE_TEST_NODE_QUEUES=0 turns that off).

    python scripts/node_queues.py                  # both libraries, a throwaway Postgres
    python scripts/node_queues.py --library pg-boss --database-url postgresql://...
    python scripts/node_queues.py --dump-schemas
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

VERSIONS = {"graphile-worker": "0.18.0", "pg-boss": "12.38.1"}
SCHEMAS = {"graphile-worker": "graphile_worker", "pg-boss": "pgboss"}
VERSION_TABLES = {"graphile-worker": "graphile_worker.migrations", "pg-boss": "pgboss.version"}
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
LONG_S = 60  # the long job: killed mid-way, run again (briefly) by the recovery

# One program per library: `node <file> migrate|add|worker URL [args]`. The task sleeps its
# payload's seconds on its first attempt, a tenth of a second on a retry.
GRAPHILE_JS = r"""
import { run, runMigrations, quickAddJob } from "graphile-worker";
const [cmd, url, ...rest] = process.argv.slice(2);
const pg = { connectionString: url };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
if (cmd === "migrate") {
  await runMigrations(pg);
} else if (cmd === "add") {
  const [seconds, n] = rest.map(Number);
  for (let i = 0; i < n; i++) await quickAddJob(pg, "work", { seconds });
} else if (cmd === "worker") {
  const runner = await run({
    ...pg,
    concurrency: 2,
    pollInterval: 200,
    // the lock sweep every 0.5 to 1 s instead of 8 to 10 minutes (its own settings)
    minResetLockedInterval: 500,
    maxResetLockedInterval: 1000,
    // 0, not the default -1: with -1 a completion is a query nobody awaits, and a job that
    // finishes during the SIGTERM drain stays locked (it runs again 4 hours later); a batch
    // (0 ms) is flushed before the pool exits. COMPLETE_JOB_BATCH_DELAY=-1 shows the default.
    preset: {
      worker: { completeJobBatchDelay: Number(process.env.COMPLETE_JOB_BATCH_DELAY ?? 0) },
    },
    taskList: {
      work: async (payload, helpers) => {
        const s = helpers.job.attempts > 1 ? 0.1 : payload.seconds;
        console.log(`start ${helpers.job.id} attempt ${helpers.job.attempts}`);
        await sleep(s * 1000);
        console.log(`done ${helpers.job.id}`);
      },
    },
  });
  console.log("ready");
  await runner.promise;
}
"""

PGBOSS_JS = r"""
import { PgBoss } from "pg-boss";
const [cmd, url, ...rest] = process.argv.slice(2);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// The supervisor expires jobs in its monitor step, every monitorIntervalSeconds (60 s by default).
const boss = new PgBoss({
  connectionString: url,
  superviseIntervalSeconds: 1,
  monitorIntervalSeconds: 1,
});
boss.on("error", (e) => console.error(e));
await boss.start();
if (cmd === "migrate") {
  await boss.createQueue("work", { expireInSeconds: 4, retryLimit: 3 });
  await boss.stop({ graceful: false });
} else if (cmd === "add") {
  const [seconds, n] = rest.map(Number);
  for (let i = 0; i < n; i++) await boss.send("work", { seconds });
  await boss.stop({ graceful: false });
} else if (cmd === "worker") {
  // pg-boss installs no signal handler: the application stops it, waiting for its jobs.
  process.on("SIGTERM", async () => {
    await boss.stop({ graceful: true, timeout: 20000 });
    console.log("stopped");
    process.exit(0);
  });
  await boss.work(
    "work",
    { pollingIntervalSeconds: 0.5, batchSize: 1, localConcurrency: 2 },
    async ([job]) => {
      const s = job.retryCount > 0 ? 0.1 : job.data.seconds;
      console.log(`start ${job.id} retry ${job.retryCount}`);
      await sleep(s * 1000);
      console.log(`done ${job.id}`);
    },
  );
  console.log("ready");
}
"""

HEADERS = {
    "graphile-worker": """\
-- graphile-worker 0.18.0's schema, as the library itself creates it: its own migrations
-- (000001..000020, `runMigrations` of graphile-worker@0.18.0 from npm, Node 20) run against
-- an empty PostgreSQL 15.18 database, then
--   pg_dump --schema-only --no-owner --no-privileges --schema=graphile_worker
-- plus the rows of graphile_worker.migrations (pg_dump --data-only --inserts), with pg_dump's
-- \\restrict lines (psql meta-commands) removed. graphile-worker is MIT-licensed
-- (Copyright (c) Benjie Gillam), https://github.com/graphile/worker. Regenerate with
-- scripts/node_queues.py --dump-schemas. Tests load it to check the graphile-worker preset.
""",
    "pg-boss": """\
-- pg-boss 12.38.1's schema, as the library itself creates it: `new PgBoss(url).start()` of
-- pg-boss@12.38.1 from npm (Node 20) against an empty PostgreSQL 15.18 database (its
-- migration to schema version 46), then
--   pg_dump --schema-only --no-owner --no-privileges --schema=pgboss
-- plus the row of pgboss.version (pg_dump --data-only --inserts), with pg_dump's \\restrict
-- lines (psql meta-commands) removed. pg-boss is MIT-licensed (Copyright (c) Tim Jones),
-- https://github.com/timgit/pg-boss. Regenerate with scripts/node_queues.py --dump-schemas.
-- Tests load it to check the pg-boss preset.
""",
}

PROGRAMS = {"graphile-worker": ("graphile.mjs", GRAPHILE_JS), "pg-boss": ("pgboss.mjs", PGBOSS_JS)}


def say(text: str) -> None:
    print(text, flush=True)


def install(directory: Path) -> None:
    """npm install the pinned versions into ``directory`` (skipped when they are there), one
    process at a time: the tests run the two libraries at once, each by a process of this."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # let go when the file closes
        _install(directory)


def _install(directory: Path) -> None:
    wanted = {name: version for name, version in VERSIONS.items()}
    manifest = directory / "package.json"
    current = json.loads(manifest.read_text()) if manifest.exists() else {}
    installed = all(
        (directory / "node_modules" / name / "package.json").exists()
        and json.loads((directory / "node_modules" / name / "package.json").read_text())["version"]
        == version
        for name, version in wanted.items()
    )
    if current.get("dependencies") != wanted or not installed:
        manifest.write_text(json.dumps({"private": True, "dependencies": wanted}, indent=2))
        say(f"npm install {' '.join(f'{n}@{v}' for n, v in wanted.items())} in {directory}")
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=directory
        )
        if done.returncode != 0:
            raise SystemExit(
                f"npm install failed (exit {done.returncode}; is npm's registry reachable?); "
                "VULTRSCALE_TEST_NODE_QUEUES=0 runs the tests without the live Node workers"
            )
    for filename, text in PROGRAMS.values():
        program = directory / filename
        if not program.exists() or program.read_text() != text:  # never under a running node
            program.write_text(text)


def node(directory: Path, library: str, *args: str) -> None:
    filename = PROGRAMS[library][0]
    subprocess.run(["node", filename, *args], cwd=directory, check=True, timeout=120)


@contextmanager
def worker(directory: Path, library: str, url: str, log: Path) -> Iterator[subprocess.Popen[str]]:
    """The library's worker in a process of its own (its output in ``log``); killed at the
    end if it still runs."""
    out = log.open("a")
    proc = subprocess.Popen(
        ["node", PROGRAMS[library][0], "worker", url],
        cwd=directory,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: "ready" in log.read_text(), f"{library} worker to start", 60)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        out.close()


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def live(library: str, url: str, directory: Path) -> None:
    """The scenario of the module docstring against ``url`` (an empty database)."""
    import psycopg

    from vultrscale.config import QueueConfig
    from vultrscale.db.signals import read_signals

    cfg = QueueConfig(preset=library)
    # A log of this run's own: another run (a test, this script by hand) may share the directory.
    fd, name = tempfile.mkstemp(prefix=f"{library}-worker-", suffix=".log", dir=directory)
    os.close(fd)
    log = Path(name)

    def signals() -> Any:
        s = read_signals(url, cfg)
        say(
            f"    preset reads: ready {s.ready}, in flight {s.in_flight}, stalled "
            f"{s.expired_leases}, finished {s.recent_jobs}, arrivals {s.recent_arrivals}"
        )
        return s

    def sql(query: str) -> Any:
        with psycopg.connect(url, autocommit=True) as conn:
            return conn.execute(query).fetchall()  # type: ignore[arg-type]

    say(f"{library} {VERSIONS[library]}: migrate, enqueue 4 short jobs and 1 of {LONG_S} s")
    say(f"  the workers' output: {log} (removed when every step holds)")
    node(directory, library, "migrate", url)
    node(directory, library, "add", url, "0.2", "4")
    node(directory, library, "add", url, str(LONG_S), "1")
    s = signals()
    assert (s.ready, s.in_flight, s.expired_leases) == (5, 0, 0), s
    if library == "pg-boss":
        assert s.recent_arrivals == 5, s

    with worker(directory, library, url, log) as first:
        say("  worker A runs the short jobs and starts the long one")
        wait_for(lambda: log.read_text().count("done ") == 4, "the 4 short jobs")
        wait_for(lambda: log.read_text().count("start ") == 5, "the long job to start")
        s = signals()
        assert (s.ready, s.in_flight, s.expired_leases) == (0, 1, 0), s
        if library == "pg-boss":
            assert s.recent_jobs == 4 and s.recent_job_seconds is not None, s
        else:
            assert len(s.leases_by_worker) == 1, s
        say("  worker A killed (SIGKILL) mid-job")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    if library == "pg-boss":
        say("  the job's expireInSeconds (4 s) passes")
        wait_for(lambda: read_signals(url, cfg).expired_leases == 1, "the job to expire", 30)
    else:
        say("  4 hours pass for the job's lock (locked_at moved back: the timeout is fixed)")
        sql(
            "UPDATE graphile_worker._private_jobs SET locked_at = now() - interval '4 hours 1 "
            "minute' WHERE locked_at IS NOT NULL RETURNING id"
        )
    s = signals()
    assert (s.ready, s.in_flight, s.expired_leases) == (0, 0, 1), s

    with worker(directory, library, url, log) as second:
        say("  worker B's own recovery gives the job back, and runs it again")
        wait_for(lambda: log.read_text().count("done ") == 5, "the killed job to run again", 90)
        again = [line for line in log.read_text().splitlines() if line.startswith("start ")][-1]
        assert again.endswith(("attempt 2", "retry 1")), again
        wait_for(
            lambda: (lambda x: (x.ready, x.in_flight, x.expired_leases) == (0, 0, 0))(
                read_signals(url, cfg)
            ),
            "the queue to be empty",
            30,
        )
        s = signals()

        say("  a 3 s job runs when worker B gets SIGTERM: it is finished, then B exits")
        node(directory, library, "add", url, "3", "1")
        wait_for(lambda: log.read_text().count("start ") == 7, "the job to start")
        second.send_signal(signal.SIGTERM)
        second.wait(30)
        text = log.read_text()
        assert text.count("done ") == 6, text[-2000:]
        say(f"    worker B exited with {second.returncode} after finishing it")
        s = signals()
        assert (s.ready, s.in_flight, s.expired_leases) == (0, 0, 0), s
    say(f"{library}: every step as the preset reads it")
    log.unlink()  # kept when a step fails, for its workers' output


def dump_schemas(url: str, directory: Path) -> None:
    """tests/fixtures/<library>-<version>.schema.sql from the libraries' own migrations."""
    import psycopg

    from vultrscale.db import throwaway

    for library, version in VERSIONS.items():
        with throwaway.scratch_database(url, prefix="vs_dump_") as db:
            node(directory, library, "migrate", db)
            if library == "pg-boss":  # the queue the migrate step made is not the library's
                with psycopg.connect(db, autocommit=True) as conn:
                    conn.execute("DELETE FROM pgboss.queue")
            schema = subprocess.run(
                ["pg_dump", "--schema-only", "--no-owner", "--no-privileges",
                 f"--schema={SCHEMAS[library]}", db],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            rows = subprocess.run(
                ["pg_dump", "--data-only", "--inserts", f"--table={VERSION_TABLES[library]}", db],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
        # pg_dump's \restrict lines are psql meta-commands: the tests load it with psycopg.
        keep = [line for line in schema.splitlines() if not line.startswith("\\")]
        keep += [line for line in rows.splitlines() if line.startswith("INSERT")]
        path = FIXTURES / f"{library}-{version}.schema.sql"
        path.write_text(HEADERS[library] + "\n".join(keep) + "\n")
        say(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--library", choices=[*VERSIONS, "all"], default="all")
    parser.add_argument("--database-url", help="an empty database (default: a throwaway one)")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("TMPDIR", "/tmp")) / "vultrscale-node-queues",
        help="where npm installs the libraries (default: %(default)s)",
    )
    parser.add_argument("--dump-schemas", action="store_true", help="rewrite the fixtures")
    args = parser.parse_args(argv)
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        print(f"error: {' and '.join(missing)} not on PATH", file=sys.stderr)
        return 2
    install(args.dir)
    from vultrscale.db import throwaway

    libraries = list(VERSIONS) if args.library == "all" else [args.library]
    if args.database_url and len(libraries) == 1 and not args.dump_schemas:
        live(libraries[0], args.database_url, args.dir)  # the empty database given
        return 0
    # A database of its own for each library, on the server given or a throwaway one.
    with throwaway.given_or_throwaway(args.database_url) as server:
        if args.dump_schemas:
            dump_schemas(server, args.dir)
            return 0
        for library in libraries:
            with throwaway.scratch_database(server) as url:
                live(library, url, args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
