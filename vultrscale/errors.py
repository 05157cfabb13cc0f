"""One rooted exception tree. Each error carries a hint for the user and an exit code.

Exit codes (docs/reference/cli.md, "Exit codes"): 0 success, 1 a runtime failure after which
nothing unsafe was done, 2 a usage or configuration error. Adapters translate library errors
into these with ``raise ... from``; the CLI turns them into one or two lines, once.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # the shell's code for SIGINT: Ctrl-C, in every command alike


class VultrscaleError(Exception):
    """Root of every error vultrscale raises on purpose."""

    exit_code: int = EXIT_RUNTIME
    default_hint: str = ""
    # The fleet_events id of the reconcile pass this error ended, when that pass was recorded
    # (set by reconcile.run_pass): the loop's log line names it, as `events` does.
    pass_id: int | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def __str__(self) -> str:
        return self.message


class UsageError(VultrscaleError):
    """The command line or the input is wrong; nothing was done."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """The configuration is invalid. ``problems`` lists every problem found, each naming its key."""

    def __init__(self, problems: list[str], *, hint: str | None = None) -> None:
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = f"Invalid configuration: {self.problems[0]}"
        else:
            message = "Invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(
            message,
            hint=hint or "Fix the keys named above, then run `vultrscale config check`.",
        )


class RuntimeFailure(VultrscaleError):
    """A runtime failure (API, database, SSH) after which nothing unsafe was done."""

    exit_code = EXIT_RUNTIME


class DatabaseError(RuntimeFailure):
    default_hint = "Check DATABASE_URL and that Postgres is reachable, then `vultrscale db init`."


class QueueSchemaError(DatabaseError):
    """A queue preset met a database without its library's tables, or with a version of them
    it does not read (a table or column missing): the configuration is wrong, not the
    database down, so exit 2. The scaler holds the fleet, as for any unreadable signal."""

    exit_code = EXIT_USAGE


class PassStuck(RuntimeFailure):
    """Another pass has held the fleet's lock past its deadline: it will not end by itself."""


class SSHError(RuntimeFailure):
    """An SSH transport failure (connect, auth, timeout)."""


class HostKeyMismatch(SSHError):
    """The host presented a key other than the pinned one; nothing was run on it."""


class HostUnreachable(SSHError):
    """The host did not answer within the connect timeout."""
