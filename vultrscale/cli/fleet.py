"""Fleet commands: reconcile, status, events, instances."""

from __future__ import annotations

import contextlib
import dataclasses
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vultrscale import params
from vultrscale.cli import passlog as passlog_mod
from vultrscale.cli._common import (
    JsonFlag,
    examples,
    group,
    load_config,
    load_fleets,
    print_json,
    shown,
)
from vultrscale.cli.passlog import LogFormat
from vultrscale.errors import RuntimeFailure, UsageError, VultrscaleError
from vultrscale.wiring import api_key, build_parts, database_url

if TYPE_CHECKING:
    from datetime import datetime

    from vultrscale import status
    from vultrscale.config import Config
    from vultrscale.config.fleets import Fleets
    from vultrscale.fleetloop import FleetRun
    from vultrscale.metrics import Families
    from vultrscale.reconcile import Parts, PassResult

app = group()


@app.command(
    "reconcile",
    epilog=examples(
        "vultrscale reconcile --dry-run",
        "vultrscale reconcile --loop --interval 30s --metrics-port 9108",
        "vultrscale reconcile --loop --log-format json",
    ),
)
def reconcile_cmd(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; change nothing.", show_default=False)
    ] = False,
    loop: Annotated[
        bool, typer.Option("--loop", help="Run passes until interrupted.", show_default=False)
    ] = False,
    every: Annotated[
        timedelta,
        typer.Option(
            "--interval",
            parser=params.duration(params.MIN_RECONCILE_INTERVAL),
            metavar="DURATION",
            show_default=False,
            help=shown("Time between passes with --loop (at least 5s).", "30s"),
        ),
    ] = timedelta(seconds=30),
    as_json: JsonFlag = False,
    metrics_file: Annotated[
        str | None,
        typer.Option(
            "--metrics-file",
            metavar="PATH",
            help="Write Prometheus metrics here (textfile collector).",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            parser=params.port_or_zero,
            metavar="PORT",
            help="With --loop, serve /metrics on 127.0.0.1:PORT (0: a free port, logged).",
        ),
    ] = None,
    log_format: Annotated[
        LogFormat | None,
        typer.Option(
            "--log-format",
            parser=passlog_mod.log_format,
            metavar="human|json",
            show_default=False,
            help=shown("With --loop, one line per pass: human or json (journald, Loki).", "human"),
        ),
    ] = None,
) -> int:
    """One reconcile pass (or a loop): observe, progress drains, decide, act, record."""
    if metrics_port is not None and not loop:
        raise UsageError(
            "--metrics-port needs --loop", hint="Use --metrics-file for single passes."
        )
    if log_format is not None and (not loop or as_json):
        raise UsageError(
            "--log-format needs --loop, without --json",
            hint="Drop it: a single pass prints the plan, --json prints a document per pass.",
        )
    fleets = load_fleets()  # a bad config fails before the pass's modules are even imported
    if fleets.directory:
        return _reconcile_fleets(
            fleets,
            dry_run=dry_run,
            loop=loop,
            every=every,
            as_json=as_json,
            metrics_file=metrics_file,
            metrics_port=metrics_port,
            line_format=log_format or LogFormat.HUMAN,
        )
    cfg = fleets.one()
    from vultrscale.cli import fail
    from vultrscale.reconcile import run_forever, run_pass

    parts = build_parts(cfg)
    metrics = None
    metrics_url = None
    if metrics_file or metrics_port is not None:
        from vultrscale import metrics as metrics_mod

        metrics = metrics_mod.Metrics.for_config(cfg)
        if metrics_file:
            target = metrics_file  # checked before each pass changes anything
            checks = (*parts.preflight, lambda: metrics_mod.check_textfile(target))
            parts = dataclasses.replace(parts, preflight=checks)
        if metrics_port is not None:
            metrics_url = f"http://127.0.0.1:{metrics.serve(metrics_port)}/metrics"

    from vultrscale.cli import passlog

    line_format = log_format or LogFormat.HUMAN
    secrets = cfg.secrets.values()
    if metrics_url is not None:  # on stderr: stdout holds the passes' lines (or documents) only
        at = parts.clock.now()
        typer.echo(passlog.metrics_line(metrics_url, at, cfg.fleet.name, line_format), err=True)
    # A pass in the metrics already whose textfile could not be written: its error is said,
    # but it is not counted again, nor are its figures taken for unread.
    unwritten: list[PassResult] = []

    def report(result: PassResult) -> None:
        # The metrics first: a failure to write them is then the one document --json prints.
        if metrics is not None and not result.lock_held:  # another pass's figures stand
            metrics.observe(result)
            if metrics_file:
                try:
                    metrics.write_textfile(metrics_file)
                except RuntimeFailure:
                    unwritten.append(result)
                    raise
        if as_json:
            print_json(result.to_json())
        elif loop:  # a log: one line per pass
            typer.echo(passlog.pass_line(result, cfg.fleet.name, line_format, secrets))
        else:
            from vultrscale.cli.views import print_pass  # rich: only to draw on a terminal

            print_pass(result)

    def report_error(exc: VultrscaleError) -> None:
        if metrics is not None and not unwritten:
            metrics.failed(exc.exit_code)
            if metrics_file:
                with contextlib.suppress(RuntimeFailure):  # the pass's own error is the one said
                    metrics.write_textfile(metrics_file)
        unwritten.clear()
        if as_json:
            fail(exc.message, exc.hint, exc.exit_code, as_json=as_json)
        else:
            at = parts.clock.now()
            line = passlog.error_line(exc, at, cfg.fleet.name, line_format, secrets)
            typer.echo(line, err=True)

    try:
        if not loop:
            result = run_pass(cfg, parts, dry_run=dry_run)
            report(result)
            return int(result.exit_code)
        return run_forever(
            cfg, parts, interval=every, dry_run=dry_run, on_result=report, on_error=report_error
        )
    finally:
        parts.close()


def _reconcile_fleets(
    fleets: Fleets,
    *,
    dry_run: bool,
    loop: bool,
    every: timedelta,
    as_json: bool,
    metrics_file: str | None,
    metrics_port: int | None,
    line_format: LogFormat,
) -> int:
    """`reconcile` of a directory of fleets: every fleet's passes at once, each in its thread
    with its own lock, deadline and connections (``fleetloop``); one metrics registry (and
    port, or textfile) for all, each series labelled by fleet; one line per pass naming its
    fleet. An invalid fleet file is said (and counted in the metrics) and the others run; a
    one-shot pass exits with the worst exit code of its fleets and names those that failed."""
    import threading

    from vultrscale import fleetloop
    from vultrscale.cli import fail, passlog
    from vultrscale.vultr.client import shared_pace

    if not fleets.configs:  # every file invalid: nothing can run
        refused = fleets.bad_error()
        assert refused is not None
        raise refused
    runs = _fleet_runs(fleets, shared_pace)
    families = None
    metrics: dict[str, Any] = {}
    if metrics_file or metrics_port is not None:
        from vultrscale import metrics as metrics_mod

        families = metrics_mod.Families()
        families.files_invalid.set(len(fleets.bad))
        families.account_ceiling.set(fleets.account.monthly_ceiling_usd)
        for run in runs:
            metrics[run.name] = metrics_mod.Metrics.for_config(run.cfg, families)
        if metrics_file:
            target = metrics_file  # checked before each pass changes anything
            runs = [
                dataclasses.replace(
                    r,
                    parts=dataclasses.replace(
                        r.parts,
                        preflight=(*r.parts.preflight, lambda: metrics_mod.check_textfile(target)),
                    ),
                )
                for r in runs
            ]
    secrets = sorted({v for r in runs for v in r.cfg.secrets.values()})
    say = threading.Lock()  # one fleet's line (or document) at a time
    clock = runs[0].parts.clock
    watch = _AccountWatch(fleets, runs, families, line_format, say)
    try:
        if metrics_port is not None and families is not None:
            url = f"http://127.0.0.1:{families.serve(metrics_port)}/metrics"
            names = ",".join(r.name for r in runs)
            typer.echo(passlog.metrics_line(url, clock.now(), names, line_format), err=True)
        for bad in fleets.bad if loop else ():  # a one-shot pass says them with its outcome
            line = passlog.invalid_line(
                bad.path.name, bad.problems, clock.now(), line_format, secrets
            )
            typer.echo(line, err=True)
        results: list[tuple[Config, PassResult | VultrscaleError]] = []

        def report(cfg: Config, result: PassResult) -> None:
            m = metrics.get(cfg.fleet.name)
            if m is not None and not result.lock_held:
                m.observe(result)
                if metrics_file:
                    m.write_textfile(metrics_file)  # a failure: this fleet's error
            with say:
                if not loop:
                    results.append((cfg, result))
                elif as_json:
                    print_json({"fleet": cfg.fleet.name, **result.to_json()})
                else:
                    typer.echo(passlog.pass_line(result, cfg.fleet.name, line_format, secrets))

        def report_error(cfg: Config, exc: VultrscaleError) -> None:
            m = metrics.get(cfg.fleet.name)
            if m is not None:
                m.failed(exc.exit_code)
                if metrics_file:
                    with contextlib.suppress(RuntimeFailure):  # the pass's own error is said
                        m.write_textfile(metrics_file)
            with say:
                if not loop:
                    results.append((cfg, exc))
                elif as_json:
                    fail(f"fleet {cfg.fleet.name}: {exc.message}", exc.hint, exc.exit_code, True)
                else:
                    at = clock.now()
                    line = passlog.error_line(exc, at, cfg.fleet.name, line_format, secrets)
                    typer.echo(line, err=True)

        if loop:
            stop = threading.Event()
            last = fleetloop.forever(
                runs,
                interval=every,
                dry_run=dry_run,
                stop=stop,
                on_result=report,
                on_error=report_error,
                tick=watch.tick,
            )
            return max(last.values())  # a stop (Ctrl-C: exit 130, raised above) or max passes
        codes = fleetloop.once(runs, dry_run=dry_run, on_result=report, on_error=report_error)
        watch.tick()
        if families is not None and metrics_file:
            families.write_textfile(metrics_file)
        _print_fleet_results(results, as_json, fleets, codes)
        said = passlog.failed_fleets(codes, [b.path.name for b in fleets.bad])
        if said is not None and not as_json:
            typer.echo(f"Error: {said}", err=True)
        return max([*codes.values(), 2 if fleets.bad else 0])
    finally:
        watch.close()
        for run in runs:
            run.parts.close()


def _fleet_runs(fleets: Fleets, shared_pace: Any) -> list[FleetRun]:
    """Each fleet's parts (``build_parts``): one API pace per key for the process, at the
    share of ``account.scalers``."""
    from vultrscale.fleetloop import FleetRun

    paces: dict[tuple[str, str], Any] = {}
    runs: list[FleetRun] = []
    try:
        for cfg in fleets.configs:
            key = (cfg.api_url, cfg.secrets.api_key.reveal())
            pace = paces.setdefault(key, shared_pace(cfg.account.scalers))
            runs.append(FleetRun(cfg, build_parts(cfg, pace)))
    except BaseException:
        for run in runs:
            run.parts.close()
        raise
    return runs


def _print_fleet_results(
    results: list[tuple[Config, PassResult | VultrscaleError]],
    as_json: bool,
    fleets: Fleets,
    codes: dict[str, int],
) -> None:
    """The one-shot pass of every fleet, printed once all have ended, by fleet name."""
    from vultrscale.redaction import redact

    results.sort(key=lambda r: r[0].fleet.name)
    if as_json:
        docs = []
        for cfg, got in results:
            secrets = cfg.secrets.values()
            if isinstance(got, VultrscaleError):
                docs.append(
                    {
                        "fleet": cfg.fleet.name,
                        "exit_code": got.exit_code,
                        "error": redact(got.message, secrets),
                        "hint": redact(got.hint, secrets) or None,
                    }
                )
            else:
                docs.append({"fleet": cfg.fleet.name, **got.to_json()})
        print_json(
            {
                "fleets": docs,
                "invalid": [
                    {"file": str(b.path), "fleet": b.name, "problems": list(b.problems)}
                    for b in fleets.bad
                ],
                "exit_code": max([*codes.values(), 2 if fleets.bad else 0]),
            }
        )
        return
    from vultrscale.cli import fail
    from vultrscale.cli.views import console, print_pass

    out = console()
    for cfg, got in results:
        out.print(f"fleet {cfg.fleet.name}:", style="bold", markup=False, highlight=False)
        if isinstance(got, VultrscaleError):
            fail(f"fleet {cfg.fleet.name}: {got.message}", got.hint, got.exit_code)
        else:
            print_pass(got)
    for bad in fleets.bad:
        fail(bad.error().message, bad.hint, 2)


class _AccountWatch:
    """What belongs to no one fleet, looked at between passes: every fleet's spend this month
    against the account's ceiling, and the instances the ledger holds for fleets no file
    describes (said when their count changes; nothing deletes them)."""

    def __init__(
        self,
        fleets: Fleets,
        runs: list[FleetRun],
        families: Families | None,
        line_format: LogFormat,
        say: Any,
    ) -> None:
        self.fleets, self.runs, self.families = fleets, runs, families
        self.line_format, self.say = line_format, say
        self.seen: dict[str, int] = {}
        self._conn: Any = None  # kept from tick to tick: a connect costs more than the reads

    def tick(self) -> None:
        from vultrscale.cli import passlog
        from vultrscale.db import pg

        cfg = self.runs[0].cfg
        try:
            if self._conn is None or self._conn.closed:
                url = database_url(cfg)
                self._conn = pg.connect(
                    url, doing="reading the account's fleets", statement_timeout_s=pg.PASS_STALL_S
                )
            with pg.translated("reading the account's fleets"):
                total, orphans = read_account(cfg, list(self.fleets.described), self._conn)
        except RuntimeFailure:
            self.close()
            if self.families is not None:
                self.families.set_account(None, self.fleets.account.monthly_ceiling_usd)
            return  # the fleets' own passes say what is wrong with the database
        if self.families is not None:
            self.families.set_account(total, self.fleets.account.monthly_ceiling_usd)
            self.families.orphans.set(sum(o.instances for o in orphans))
        now = self.runs[0].parts.clock.now()
        counts = {o.fleet: o.instances for o in orphans}
        for fleet, n in sorted(counts.items()):
            if self.seen.get(fleet) != n:
                with self.say:
                    typer.echo(passlog.orphans_line(fleet, n, now, self.line_format), err=True)
        self.seen = counts

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def read_account(cfg: Config, known: list[str], conn: Any = None) -> tuple[Any, list[Any]]:
    """Every fleet's spend this month in the database (``budget.account_spend`` over every
    ledger row), and the orphans: instances of fleets not in ``known`` (on ``conn``, else a
    connection of its own)."""
    from datetime import UTC, datetime

    from vultrscale.db import account, pg
    from vultrscale.rules import budget

    now = datetime.now(UTC)
    with contextlib.ExitStack() as stack:
        if conn is None:
            url = database_url(cfg)
            conn = stack.enter_context(pg.session(url, "cannot read the account's fleets"))
        rows = account.others(conn, "", budget.month_bounds(now)[0])  # no fleet is named ""
        orphans = account.orphans(conn, known)
    return budget.account_spend(rows, cfg.account.monthly_ceiling_usd, now), orphans


def _status_once(cfg: Config, parts: Parts) -> tuple[PassResult, datetime]:
    from vultrscale.reconcile import run_pass

    result = run_pass(cfg, parts, dry_run=True, take_lock=False)
    return result, parts.clock.now()


def _unreadable(
    cfg: Config, exc: RuntimeFailure, now: datetime, every: timedelta
) -> status.RenderableType:
    """What `status --watch` shows for a refresh that failed: the error, not stale figures."""
    from rich.console import Group

    from vultrscale.config import format_duration
    from vultrscale.redaction import redact
    from vultrscale.status import plain

    secrets = cfg.secrets.values()
    lines = [
        plain(f"fleet {cfg.fleet.name}: cannot refresh at {now:%H:%M:%S} UTC", style="bold"),
        plain(f"Error: {redact(exc.message, secrets)}", style="red"),
    ]
    if exc.hint:
        lines.append(plain(f"Fix: {redact(exc.hint, secrets)}"))
    lines.append(plain(f"trying again every {format_duration(every)} (Ctrl-C to stop)"))
    return Group(*lines)


@app.command(
    "status",
    epilog=examples("vultrscale status", "vultrscale status --watch --every 10"),
)
def status_cmd(
    as_json: JsonFlag = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="Refresh every few seconds.", show_default=False)
    ] = False,
    every: Annotated[
        timedelta,
        typer.Option(
            "--every",
            parser=params.duration(params.MIN_WATCH_EVERY),
            metavar="DURATION",
            show_default=False,
            help=shown("Time between refreshes with --watch.", "5s"),
        ),
    ] = timedelta(seconds=5),
) -> int:
    """The fleet: every instance, the queue, desired count and why, budget used. With
    --watch, redrawn in place on a terminal; elsewhere (a pipe, --json) printed in turn."""
    import time

    from vultrscale import status
    from vultrscale.cli import fail
    from vultrscale.cli.views import console

    fleets = load_fleets()
    if fleets.directory:
        return _status_fleets(fleets, as_json=as_json, watch=watch, every=every)
    cfg = fleets.one()
    parts = build_parts(cfg)
    ceiling = cfg.budget.monthly_ceiling_usd

    def view(result: PassResult, now: datetime) -> status.RenderableType:
        assert result.observation is not None and result.plan is not None
        offered = result.decision.offerings if result.decision else ()
        return status.render(result.observation, result.plan, now, ceiling, cfg.fleet.name, offered)

    def show(result: PassResult, now: datetime) -> None:
        """One refresh printed after the last: a document with --json, else the tables."""
        if as_json:
            assert result.observation is not None and result.plan is not None
            offered = result.decision.offerings if result.decision else ()
            doc = status.status_document(result.observation, result.plan, now, ceiling, offered)
            print_json(doc)
        else:
            out.print(view(result, now))

    out = console()
    try:
        result, now = _status_once(cfg, parts)
        if not watch or as_json or not out.is_terminal:
            show(result, now)
        if not watch:
            return int(result.exit_code)
        if as_json or not out.is_terminal:
            # No screen to redraw (a pipe, a log, --json): each refresh printed in turn, with
            # --json one document each (a stream `jq` reads); a refresh that fails said, the
            # next one tried, as on a terminal.
            while True:
                time.sleep(every.total_seconds())
                try:
                    result, now = _status_once(cfg, parts)
                except RuntimeFailure as exc:
                    fail(exc.message, exc.hint, exc.exit_code, as_json=as_json)
                    continue
                show(result, now)
        from rich.live import Live

        with Live(view(result, now), console=out, auto_refresh=False) as live:
            while True:
                time.sleep(every.total_seconds())
                try:
                    result, now = _status_once(cfg, parts)
                except RuntimeFailure as exc:  # Postgres restarting, say: said, tried again
                    live.update(_unreadable(cfg, exc, parts.clock.now(), every), refresh=True)
                    continue
                live.update(view(result, now), refresh=True)
    finally:
        parts.close()


def _status_fleets(fleets: Fleets, *, as_json: bool, watch: bool, every: timedelta) -> int:
    """`status` of a directory of fleets: every fleet's table (a dry run each, at once, none
    taking a lock), the account's spend against its ceiling, the instances of fleets no file
    describes and the files that cannot run. Exit: the worst of the fleets' (2 with a file
    that cannot run)."""
    import time

    from rich.console import Group

    from vultrscale import fleetloop, status
    from vultrscale.cli import fail
    from vultrscale.cli.views import console
    from vultrscale.redaction import redact
    from vultrscale.vultr.client import shared_pace

    if not fleets.configs:  # every file invalid: nothing to show
        refused = fleets.bad_error()
        assert refused is not None
        raise refused
    runs = _fleet_runs(fleets, shared_pace)
    account = fleets.account
    clock = runs[0].parts.clock

    def refresh() -> tuple[int, dict[str, Any], status.RenderableType]:
        results: dict[str, PassResult] = {}
        errors: dict[str, VultrscaleError] = {}
        codes = fleetloop.once(
            runs,
            dry_run=True,
            take_lock=False,
            on_result=lambda c, r: results.__setitem__(c.fleet.name, r),
            on_error=lambda c, e: errors.__setitem__(c.fleet.name, e),
        )
        try:
            total, orphans = read_account(runs[0].cfg, list(fleets.described))
        except RuntimeFailure:
            total, orphans = None, []
        now = clock.now()
        docs: list[dict[str, Any]] = []
        views: list[status.RenderableType] = []
        for run in runs:
            cfg, name = run.cfg, run.name
            got = results.get(name)
            if got is not None and got.observation is not None and got.plan is not None:
                offered = got.decision.offerings if got.decision else ()
                ceiling = cfg.budget.monthly_ceiling_usd
                doc = status.status_document(got.observation, got.plan, now, ceiling, offered)
                docs.append({"fleet": name, "exit_code": got.exit_code, **doc})
                views.append(status.render(got.observation, got.plan, now, ceiling, name, offered))
                continue
            exc = errors.get(name)
            message = redact(exc.message if exc else "no result", cfg.secrets.values())
            docs.append({"fleet": name, "exit_code": codes[name], "error": message})
            views.append(status.plain(f"fleet {name}: cannot show it: {message}", style="red"))
        views += status.account_lines(total, account.monthly_ceiling_usd, orphans, now)
        for bad in fleets.bad:
            views.append(
                status.plain(
                    f"invalid fleet file {bad.path.name}, not run: {'; '.join(bad.problems)}",
                    style="red",
                )
            )
        doc = {
            "at": now.isoformat(),
            "fleets": docs,
            "account": status.account_document(total, account.monthly_ceiling_usd, orphans),
            "invalid": [
                {"file": str(b.path), "fleet": b.name, "problems": list(b.problems)}
                for b in fleets.bad
            ],
        }
        code = max([*codes.values(), 2 if fleets.bad else 0])
        return code, doc, Group(*views)

    out = console()

    def show(doc: dict[str, Any], shown: status.RenderableType) -> None:
        if as_json:
            print_json(doc)
        else:
            out.print(shown)

    try:
        code, doc, shown = refresh()
        if not watch or as_json or not out.is_terminal:
            show(doc, shown)
        if not watch:
            failed = [
                f"{d['fleet']} (exit {d['exit_code']})" for d in doc["fleets"] if d["exit_code"]
            ]
            failed += [f"{b.path.name} (invalid)" for b in fleets.bad]
            if failed and not as_json:
                fail(f"not every fleet could be shown: {', '.join(failed)}", "", code)
            return code
        if as_json or not out.is_terminal:
            while True:
                time.sleep(every.total_seconds())
                code, doc, shown = refresh()
                show(doc, shown)
        from rich.live import Live

        with Live(shown, console=out, auto_refresh=False) as live:
            while True:
                time.sleep(every.total_seconds())
                code, doc, shown = refresh()
                live.update(shown, refresh=True)
    finally:
        for run in runs:
            run.parts.close()


# The most passes `events` lists: the newest ones of the window (a day of a 30 s loop is 2,880).
_EVENTS = 1000


@app.command(
    "events",
    epilog=examples("vultrscale events", "vultrscale events --since 2d --json"),
)
def events_cmd(
    window: Annotated[
        timedelta,
        typer.Option(
            "--since",
            parser=params.duration(),
            metavar="DURATION",
            show_default=False,
            help=shown("How far back (e.g. 30m, 2d).", "1h"),
        ),
    ] = timedelta(hours=1),
    as_json: JsonFlag = False,
) -> None:
    """The decision ledger: every pass, its inputs, the clamps, actions and results."""
    from datetime import UTC, datetime

    from vultrscale.config import format_duration
    from vultrscale.db import ledger, pg

    since = format_duration(window)
    fleets = load_fleets()
    if not fleets.configs:
        refused = fleets.bad_error()
        assert refused is not None
        raise refused
    cfg = fleets.configs[0]
    names = fleets.names
    with pg.session(database_url(cfg), "cannot read the events") as conn:
        # One more than is shown, to know whether older passes of the window are left out.
        rows = []
        for name in names:
            got = ledger.events(conn, name, datetime.now(UTC) - window, _EVENTS + 1)
            rows += [{"fleet": name, **r} for r in got] if fleets.directory else got
    rows.sort(key=lambda r: (r["at"], r["id"]))
    truncated = len(rows) > _EVENTS
    rows = rows[-_EVENTS:]
    if as_json:
        named: dict[str, Any] = {"fleets": names} if fleets.directory else {"fleet": cfg.fleet.name}
        print_json({**named, "since": since, "events": rows, "truncated": truncated})
        return
    from vultrscale.cli.views import console
    from vultrscale.status import events_table

    if not rows:
        which = f"fleet {cfg.fleet.name}" if len(names) == 1 else f"fleets {', '.join(names)}"
        typer.echo(f"No passes recorded for {which} in the last {since}.")
        return
    console().print(events_table(rows))
    if truncated:
        typer.echo(
            f"The newest {_EVENTS} passes of the last {since}; older ones are left out "
            "(a shorter --since shows all of its passes)."
        )


@app.command("instances", epilog=examples("vultrscale instances", "vultrscale instances --json"))
def instances_cmd(as_json: JsonFlag = False) -> None:
    """The fleet's instances as the Vultr API reports them (no database needed)."""
    cfg = load_config()
    from vultrscale.core.clock import PASS_DEADLINE_S, Deadline
    from vultrscale.redaction import mask_url
    from vultrscale.vultr.client import VultrClient

    deadline = Deadline(PASS_DEADLINE_S)  # every page of the listing, as a pass lists them
    with VultrClient(api_key(cfg), cfg.api_url, deadline=deadline) as client, deadline.running():
        found = client.list_instances(tag=cfg.fleet.tag)
    found.sort(key=lambda i: (i.date_created is None, i.date_created, i.label))
    from vultrscale.cli import views

    if as_json:
        print_json(
            {
                "fleet": cfg.fleet.name,
                "tag": cfg.fleet.tag,
                "api_url": mask_url(cfg.api_url),
                "count": len(found),
                "instances": [views.instance_json(i) for i in found],
            }
        )
        return
    out = views.console()
    where = f"fleet {cfg.fleet.name!r}, tag {cfg.fleet.tag!r}"
    if not found:
        out.print(
            views.plain(
                f"No instances carry the tag ({where}) at {mask_url(cfg.api_url)}; the key works."
            )
        )
        return
    out.print(views.instances_table(found, out.width))
    out.print(views.plain(f"{len(found)} instance(s): {where}\nAPI: {mask_url(cfg.api_url)}"))
