"""The outage rules without a database: which errors are worth waiting for, and the clock."""

from __future__ import annotations

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from vultrscale.core.clock import FakeClock
from vultrscale.worker.outage import Outage, OutageTooLong, is_transient


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (psycopg.OperationalError("connection failed: Connection refused"), True),
        (psycopg.OperationalError("FATAL: the database system is starting up"), True),
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), True),
        (psycopg.errors.TooManyConnections("too many clients"), True),
        (PoolTimeout("couldn't get a connection after 5 sec"), True),
        (psycopg.OperationalError('FATAL: password authentication failed for user "u"'), False),
        (psycopg.OperationalError('FATAL: database "jobs" does not exist'), False),
        (psycopg.OperationalError("FATAL: no pg_hba.conf entry for host"), False),
        (psycopg.errors.UndefinedTable('relation "jobs" does not exist'), False),
        (psycopg.ProgrammingError("invalid percent-encoded token"), False),
        (ValueError("not a database error"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_only_errors_that_waiting_can_fix_are_transient(
    exc: BaseException, transient: bool
) -> None:
    assert is_transient(exc) is transient


def test_the_outage_clock_starts_at_the_first_failure_and_only_the_recheck_ends_it() -> None:
    clock = FakeClock()
    outage = Outage(10.0, clock=clock.monotonic)
    assert outage.checked.is_set() and outage.seconds == 0
    assert outage.begin(psycopg.OperationalError("refused")) is True  # announce once
    clock.advance(4)
    assert outage.begin(psycopg.OperationalError("refused again")) is False
    assert not outage.checked.is_set() and outage.poke.is_set()
    assert outage.seconds == 4 and not outage.over_budget()
    clock.advance(6.5)
    assert outage.over_budget()
    with pytest.raises(OutageTooLong, match=r"outage budget \(10 s\).*refused again"):
        outage.wait_checked()
    assert outage.end() == 10.5
    assert outage.checked.is_set() and outage.seconds == 0 and not outage.over_budget()


def test_the_exit_line_names_the_budget_and_hides_the_password() -> None:
    outage = Outage(3.0)
    url = "postgresql://u:pw-secret@db.example:5432/jobs"
    outage.begin(psycopg.OperationalError(f"connection to {url} failed"))
    exc = outage.too_long(url)
    assert "u:***@db.example" in exc.message and "(3 s)" in exc.message
    assert "pw-secret" not in f"{exc.message} {exc.hint}"
