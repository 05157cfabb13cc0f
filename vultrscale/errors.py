"""One rooted exception tree. Each error carries a hint for the user and an exit code.

Exit codes (README "Commands"): 0 success, 1 a runtime failure after which nothing unsafe was done,
2 a usage or configuration error. Adapters translate library errors into these with
``raise ... from``; the CLI turns them into one or two lines, once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from vultrscale import pguri

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


# A run of this many characters of a key or a password is masked wherever it appears: a
# server that echoes part of the key, a message cut short or wrapped in the middle of one.
FRAGMENT = 6


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret of 4 characters or more replaced by ``***``, longest first
    (a password inside a URL that is itself a secret), in every spelling a formatter gives it
    (as written, ``repr``'s and JSON's escapes); and, of a key or a password (not of a whole
    connection string, whose host and database name are not secret), every run of
    ``FRAGMENT`` characters or more, in any of those spellings."""
    known = {s for s in secrets if s and len(s) >= 4}
    if not known:
        return text
    for spelled in sorted({sp for s in known for sp in _spellings(s)}, key=len, reverse=True):
        text = text.replace(spelled, "***")
    runs = {
        sp[i : i + FRAGMENT]
        for s in known
        if _is_key_material(s)
        for sp in _spellings(s)
        for i in range(len(sp) - FRAGMENT + 1)
    }
    return _mask_runs(text, runs) if runs else text


def _spellings(secret: str) -> set[str]:
    """``secret`` as written, and as ``repr`` (either quote) and JSON (ASCII or not) spell it
    inside a quoted string: a password pasted into a config key came back in a repr'd error
    with its quote or backslash escaped, which the redaction did not find."""
    import json

    out = {secret}
    for quote in ("'", '"'):
        out.add("".join(_repr_char(c, quote) for c in secret))
    for ascii_only in (True, False):
        out.add(json.dumps(secret, ensure_ascii=ascii_only)[1:-1])
    return {o for o in out if len(o) >= 4}


def _repr_char(c: str, quote: str) -> str:
    if c == "\\" or c == quote:
        return "\\" + c
    if c.isprintable():
        return c
    return repr(c)[1:-1]  # \n, \t, \x07, \u200b: as repr writes them inside a string


def _is_key_material(secret: str) -> bool:
    """An API key, a password or a user:password, not a whole URL or connection string."""
    if "://" in secret:
        return False
    return "=" not in secret or parse_conninfo(secret) is None  # base64 keys end in '='


def _mask_runs(text: str, runs: set[str]) -> str:
    """Every stretch of ``text`` covered by the FRAGMENT-character ``runs`` as one ``***``."""
    covered = [False] * len(text)
    for i in range(len(text) - FRAGMENT + 1):
        if text[i : i + FRAGMENT] in runs:
            covered[i : i + FRAGMENT] = [True] * FRAGMENT
    if not any(covered):
        return text
    out: list[str] = []
    for i, c in enumerate(text):
        if not covered[i]:
            out.append(c)
        elif i == 0 or not covered[i - 1]:
            out.append("***")
    return "".join(out)


# Secret masking lives here (config re-exports it) so that every module can mask without
# importing config. Connection strings are read as libpq reads them (a URI by libpq's own steps
# in pguri, key=value by libpq through psycopg.conninfo), so what is masked is exactly what
# libpq would send as the password, in either form libpq takes.

POSTGRES_URL_FORM = (
    "postgresql://USER:PASSWORD@HOST:5432/DBNAME (percent-encode '@', ':', '/', '?', '#', '%' "
    "and spaces in the password, e.g. '/' as %2F) or "
    "'host=HOST user=USER password=PASSWORD dbname=DBNAME'"
)
# The userinfo of an http(s) URL is taken to end at the last '@' anywhere: a password with an
# unencoded '/' or '?' would otherwise be read as the path and printed.
_HTTP_URL = re.compile(r"^(?P<scheme>https?://)(?P<rest>.*)$", re.I | re.S)
# Left as a last resort for free text (an error message quoting some URL we were not told about)
# and for strings libpq cannot parse at all.
_URL_USERINFO = re.compile(
    r"^(?P<scheme>[A-Za-z][\w+.-]*://)(?P<user>[^:@/]*):(?P<pw>.*)@(?P<rest>[^@]*)$"
)
_URL_USERINFO_IN_TEXT = re.compile(r"(?P<head>\b[A-Za-z][\w+.-]*://[^:@/\s]*:)\S*@")
_PASSWORD_PARAM = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]*)", re.IGNORECASE)
# A fragment libpq (or another parser) quotes back from a string it could not parse.
_QUOTED = re.compile(r""""([^"]*)"|'([^']*)'""")


def parse_conninfo(text: str) -> dict[str, str] | None:
    """libpq's reading of a connection string (URL or key=value); None if it is not one.

    A reading with an '@' in the host, port or database name, or a port that is not a number,
    counts as not one: libpq took part of a password for one of those fields.
    """
    if not text.strip():
        return None
    # A URI is read by libpq's own steps in Python (pguri): masking a password on an error
    # path must not cost psycopg's import. key=value strings are read by libpq itself.
    if pguri.is_uri(text):
        parsed = pguri.read_uri(text)
    elif "=" in text:
        parsed = _libpq_reading(text)
    else:  # libpq refuses a key=value string with no '=' at all (an API key, a password)
        return None
    if parsed is None:
        return None
    # libpq reads "postgresql://u:p/w@h/db" as host "u", port "p", dbname "w@h/db": an
    # unencoded '/', '?' or '@' in a password moves it into fields that are printed.
    # '[0-9]', not '\d': libpq reads ASCII digits only ('\u0665\u0664' passed, failed at connect).
    if any("@" in parsed.get(k, "") for k in ("host", "port", "dbname")) or not re.fullmatch(
        r"[0-9,]*", parsed.get("port", "")
    ):
        return None
    return parsed


def _libpq_reading(text: str) -> dict[str, str] | None:
    """libpq's own reading of ``text`` (through psycopg), None if libpq refuses it."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        return {k: str(v) for k, v in conninfo_to_dict(text).items() if v is not None}
    except (psycopg.Error, UnicodeError):  # bytes that are not UTF-8: not a string libpq reads
        return None


def conninfo_problem(text: str, name: str = "DATABASE_URL") -> str | None:
    """None if libpq can read ``text`` and its hosts are host names, else a message (without
    any of ``text``) on the form."""
    parsed = parse_conninfo(text)
    # libpq has the last word: the URI reading leaves the query's keywords to it.
    if parsed is not None and _libpq_reading(text) is None:
        parsed = None
    if parsed is None:
        return (
            f"{name} is not a Postgres connection string libpq can read; expected "
            f"{POSTGRES_URL_FORM}"
        )
    for host in parsed.get("host", "").split(","):
        if not is_host_name(host):
            return (
                f"{name} names a host that is not a valid host name (an empty or overlong label?)"
            )
    return None


def is_host_name(host: str) -> bool:
    """Whether a resolver takes ``host``: empty (the default), a socket directory, an IP
    address, or a name IDNA encodes. One it refuses ('db..example.com', a label of 64
    characters) raised UnicodeError out of every connect, 'unexpected UnicodeError'."""
    if not host or host.startswith("/") or host.startswith("@") or ":" in host:
        return True
    try:
        host.encode("idna")
    except UnicodeError:
        return False
    return True


# The libpq connection keywords whose values are secrets: the password, and the passphrase of
# the client's SSL key.
_LIBPQ_SECRETS = ("password", "sslpassword")


def http_userinfo(url: str) -> str | None:
    """The ``user:password`` part of an http(s) URL, if it has one."""
    m = _HTTP_URL.match(url)
    if m and "@" in m["rest"]:
        return m["rest"].rpartition("@")[0]
    return None


def url_password(url: str) -> str | None:
    """The password inside a database URL or conninfo string (as libpq reads it), if any.

    For an http(s) URL: its userinfo. For a string libpq cannot read: whatever sits where a
    password would, so that it is still redacted from error text.
    """
    if _HTTP_URL.match(url):
        return http_userinfo(url)
    parsed = parse_conninfo(url)
    if parsed is not None:
        return parsed.get("password") or None
    m = _URL_USERINFO.match(url)
    if m and m["pw"]:
        return m["pw"]
    p = _PASSWORD_PARAM.search(url)
    return p.group(2).strip("'") if p and p.group(2) else None


def url_user(url: str) -> str | None:
    """The user a database URL or conninfo string logs in as, if it names one, as libpq reads
    it (None for a string libpq cannot read). A pattern of our own found ``user=`` inside a
    quoted password (``password='pw user=tail'``) and printed that part of it as the role."""
    parsed = parse_conninfo(url)
    return (parsed.get("user") or None) if parsed is not None else None


def mask_url(url: str) -> str:
    """A URL or connection string safe to print.

    http(s): the userinfo is dropped. Postgres: libpq's own reading, rebuilt by libpq in the
    key=value form with the password as ``***``. A string libpq cannot read is not shown at all.
    """
    m = _HTTP_URL.match(url)
    if m:
        after = m["rest"].rpartition("@")[2]
        return f"{m['scheme']}{'***@' if '@' in m['rest'] else ''}{after}"
    parsed = parse_conninfo(url)
    if parsed is None:
        return "(a connection string libpq cannot read)"
    for key in _LIBPQ_SECRETS:
        if parsed.get(key):
            parsed[key] = "***"
    if url.lstrip().lower().startswith(("postgresql://", "postgres://")):
        return _as_url(parsed)
    from psycopg.conninfo import make_conninfo

    # libpq's reading, in the order the user wrote the keys (only the order comes from the text)
    ordered = sorted(
        parsed, key=lambda k: (url.find(f"{k}="), k) if f"{k}=" in url else (1 << 30, k)
    )
    return make_conninfo("", **{k: parsed[k] for k in ordered})


def _as_url(parsed: dict[str, str]) -> str:
    """libpq's reading of a connection URL written back as a URL (values re-encoded)."""
    from itertools import zip_longest
    from urllib.parse import quote, urlencode

    rest = dict(parsed)
    user, password = rest.pop("user", ""), rest.pop("password", "")
    userinfo = quote(user, safe="") + (f":{password}" if password else "")
    hosts = rest.pop("host", "")
    ports = rest.pop("port", "")
    netloc = ""
    if hosts.startswith("/"):  # a socket directory goes in the query
        rest["host"] = hosts
    else:
        netloc = ",".join(
            (f"[{h}]" if ":" in h else quote(h, safe=".-")) + (f":{p}" if p else "")
            for h, p in zip_longest(
                hosts.split(","), ports.split(",") if ports else [], fillvalue=""
            )
        )
    dbname = quote(rest.pop("dbname", ""), safe="")
    query = urlencode(rest, safe="*")  # a masked value reads ***, not %2A%2A%2A
    return (
        f"postgresql://{userinfo + '@' if userinfo else ''}{netloc}"
        f"{'/' + dbname if dbname else ''}{'?' + query if query else ''}"
    )


def is_text(value: str) -> bool:
    """Whether ``value`` is Unicode text: bytes that were not UTF-8 (on the command line, in
    the environment) reach Python as lone surrogates, which no encoder, libpq or YAML takes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def secret_values(values: Iterable[str | None]) -> list[str]:
    """Every non-empty value, each followed by the password inside it (as given, as libpq
    reads it and as a URL spells it) when it is a connection string or an http(s) URL."""
    from urllib.parse import quote

    out: list[str] = []
    for value in values:
        if value:
            out.append(value)
            parsed = None if _HTTP_URL.match(value) else parse_conninfo(value)
            ssl = parsed.get("sslpassword") if parsed else None  # the client key's passphrase
            for pw in (url_password(value), ssl):
                if pw:
                    # surrogateescape: bytes that were not UTF-8 spelled as a URL spells them
                    spelled = [quote(pw, safe="", errors="surrogateescape")]
                    spelled.append(quote(pw, errors="surrogateescape"))
                    out.extend(dict.fromkeys([pw, *spelled]))
    return out


def _quoted_secret(m: re.Match[str], known: list[str]) -> str:
    fragment = m[1] if m[1] is not None else m[2]
    if len(fragment) >= 3 and any(fragment in s for s in known):
        return m[0][0] + "***" + m[0][0]
    return m[0]


def first_line(exc: BaseException | str, secrets: Iterable[str | None] = ()) -> str:
    """The first line of an error (or of a library's message text), safe to show.

    Each of ``secrets`` is redacted, and so is the password inside any of them that is a
    database URL or conninfo string; a quoted fragment of a secret (libpq quotes the part of
    a connection string it could not parse) is redacted too, and a URL password or
    ``password=`` left in the text is masked. An exception without text gives its class name.
    """
    text = str(exc).strip()
    if text:
        line = text.splitlines()[0]
    else:
        line = type(exc).__name__ if isinstance(exc, BaseException) else "unknown error"
    known = secret_values(secrets)
    line = redact(line, known)
    # Fragments come back only from strings libpq could not read (a readable one is quoted
    # back only as its host or database name, which are not secret).
    unreadable = [s for s in known if parse_conninfo(s) is None]
    line = _QUOTED.sub(lambda m: _quoted_secret(m, unreadable), line)
    line = _URL_USERINFO_IN_TEXT.sub(lambda m: m["head"] + "***@", line)
    return _PASSWORD_PARAM.sub(lambda p: p.group(1) + "***", line)
