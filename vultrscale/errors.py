"""One rooted exception tree. Each error carries a hint for the user and an exit code.

Exit codes (DESIGN §2): 0 success, 1 a runtime failure after which nothing unsafe was done,
2 a usage or configuration error. Adapters translate library errors into these with
``raise ... from``; the CLI turns them into one or two lines, once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2


class VultrscaleError(Exception):
    """Root of every error vultrscale raises on purpose."""

    exit_code: int = EXIT_RUNTIME
    default_hint: str = ""

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


class SSHError(RuntimeFailure):
    """An SSH transport failure (connect, auth, timeout)."""


class HostKeyMismatch(SSHError):
    """The host presented a key other than the pinned one; nothing was run on it."""


class HostUnreachable(SSHError):
    """The host did not answer within the connect timeout."""


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """Replace every non-empty secret in ``text`` with ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


# Secret masking lives here (config re-exports it) so that every module can mask without
# importing config.
_URL_USERINFO = re.compile(
    r"^(?P<scheme>[A-Za-z][\w+.-]*://)(?P<user>[^:@/]*):(?P<pw>.*)@(?P<rest>[^@]*)$"
)
_URL_USERINFO_IN_TEXT = re.compile(r"(?P<head>\b[A-Za-z][\w+.-]*://[^:@/\s]*:)\S*@")
_USER_PARAM = re.compile(r"(?:^|\s)user\s*=\s*('(?:[^'\\]|\\.)*'|\S*)")
_PASSWORD_PARAM = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]*)", re.IGNORECASE)


def url_password(url: str) -> str | None:
    """The password inside a database URL or conninfo string, if there is one."""
    m = _URL_USERINFO.match(url)
    if m and m["pw"]:
        return m["pw"]
    p = _PASSWORD_PARAM.search(url)
    return p.group(2).strip("'") if p and p.group(2) else None


def url_user(url: str) -> str | None:
    """The user a database URL or conninfo string logs in as, if it names one."""
    if "://" in url:
        from urllib.parse import parse_qs, unquote, urlsplit

        parts = urlsplit(url)
        if parts.username:
            return unquote(parts.username)
        users = parse_qs(parts.query).get("user")
        return users[0] if users else None
    p = _USER_PARAM.search(url)
    return p.group(1).strip("'") if p and p.group(1) else None


def mask_url(url: str) -> str:
    """A database URL or conninfo string with its password replaced by ``***``.

    Done by pattern, not by a URL parser: a password with an unescaped ``#``, ``/`` or ``?``
    would end up in the parser's fragment or path and be printed.
    """
    m = _URL_USERINFO.match(url)
    if m:
        url = f"{m['scheme']}{m['user']}:***@{m['rest']}"
    return _PASSWORD_PARAM.sub(lambda p: p.group(1) + "***", url)


def secret_values(values: Iterable[str | None]) -> list[str]:
    """Every non-empty value, each followed by the password inside it if it is a database URL."""
    out: list[str] = []
    for value in values:
        if value:
            out.append(value)
            pw = url_password(value)
            if pw:
                out.append(pw)
    return out


def first_line(exc: BaseException | str, secrets: Iterable[str | None] = ()) -> str:
    """The first line of an error (or of a library's message text), safe to show.

    Each of ``secrets`` is redacted, and so is the password inside any of them that is a
    database URL or conninfo string; a URL password or ``password=`` left in the text is
    masked too. An exception without text gives its class name.
    """
    text = str(exc).strip()
    if text:
        line = text.splitlines()[0]
    else:
        line = type(exc).__name__ if isinstance(exc, BaseException) else "unknown error"
    line = redact(line, secret_values(secrets))
    line = _URL_USERINFO_IN_TEXT.sub(lambda m: m["head"] + "***@", line)
    return _PASSWORD_PARAM.sub(lambda p: p.group(1) + "***", line)
