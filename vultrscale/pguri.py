"""libpq's reading of a ``postgresql://`` connection URI, in Python.

Masking a database password on an error path must not import psycopg: importing it costs more
than the whole of a failing command's start-up (a `reconcile --dry-run` with no config and
``DATABASE_URL`` set took 2.8x ``import typer``, most of it in psycopg). This is libpq's own
URI parser (``conninfo_uri_parse_options``, ``conninfo_uri_parse_params`` and
``conninfo_uri_decode`` in ``fe-connect.c``) step by step, so the password masked is the one
libpq would send; a unit test holds it to libpq's reading through psycopg on a corpus and on
generated strings. It does not check the query's keywords against libpq's list (that list
changes with the libpq version): ``redaction.conninfo_problem`` leaves that verdict to libpq.
"""

from __future__ import annotations

PREFIXES = ("postgresql://", "postgres://")  # libpq's, case and all; no leading blanks
_HEX = "0123456789abcdefABCDEF"


def is_uri(text: str) -> bool:
    """Whether libpq reads ``text`` as a URI (else as ``key=value`` pairs)."""
    return text.startswith(PREFIXES)


def read_uri(text: str) -> dict[str, str] | None:
    """The keywords and values libpq reads from the URI ``text`` (only those it names), or
    None where libpq refuses it, its bytes are not UTF-8 or a value does not decode as UTF-8
    (psycopg's reading then fails too). Query keywords are not checked against libpq's list."""
    try:
        raw = text.encode()  # as psycopg hands it to libpq
    except UnicodeError:
        return None
    raw = raw.partition(b"\x00")[0]  # libpq reads a C string: it ends at the first NUL
    prefix = next((p for p in PREFIXES if raw.startswith(p.encode())), None)
    if prefix is None:
        return None
    out: dict[str, bytes] = {}
    if not _parse(raw[len(prefix) :], out):
        return None
    try:
        return {k: v.decode() for k, v in out.items()}
    except UnicodeError:
        return None


def _decode(value: bytes) -> bytes | None:
    """``conninfo_uri_decode``: %XX escapes, refused when malformed or %00; spaces around the
    value dropped and a space inside it refused (libpq 18; before, spaces were kept as they
    were, so a password with spaces reads None here and is masked by ``errors``' fallback)."""
    value, _, after = value.lstrip(b" ").partition(b" ")
    if after.strip(b" "):
        return None  # "unexpected spaces found ..., use percent-encoded spaces (%20) instead"
    out = bytearray()
    i = 0
    while i < len(value):
        c = value[i]
        if c != ord("%"):
            out.append(c)
            i += 1
            continue
        pair = value[i + 1 : i + 3].decode("latin-1")
        if len(pair) != 2 or any(ch not in _HEX for ch in pair):
            return None
        byte = int(pair, 16)
        if byte == 0:
            return None
        out.append(byte)
        i += 3
    return bytes(out)


def _store(out: dict[str, bytes], keyword: str, value: bytes) -> bool:
    decoded = _decode(value)
    if decoded is None:
        return False
    out[keyword] = decoded
    return True


def _scan(s: bytes, i: int, stops: bytes) -> int:
    """The index of the first byte of ``stops`` at or after ``i`` (``len(s)`` if none)."""
    while i < len(s) and s[i] not in stops:
        i += 1
    return i


def _parse(s: bytes, out: dict[str, bytes]) -> bool:
    """``conninfo_uri_parse_options`` on what follows the prefix."""
    i = _scan(s, 0, b"@/")
    if i < len(s) and s[i] == ord("@"):  # user[:password]@
        colon = _scan(s, 0, b":@")
        if colon > 0 and not _store(out, "user", s[:colon]):
            return False
        if s[colon] == ord(":") and i > colon + 1 and not _store(out, "password", s[colon + 1 : i]):
            return False
        i += 1
    else:
        i = 0
    hosts: list[bytes] = []
    ports: list[bytes] = []
    while True:  # host[:port], comma-separated
        if i < len(s) and s[i] == ord("["):  # an IPv6 address
            end = _scan(s, i + 1, b"]")
            if end == len(s) or end == i + 1:
                return False  # no closing ']', or an empty address
            host = s[i + 1 : end]
            i = end + 1
            if i < len(s) and s[i] not in b":/?,":
                return False
        else:
            end = _scan(s, i, b":/?,")
            host = s[i:end]
            i = end
        hosts.append(host)
        port = b""
        if i < len(s) and s[i] == ord(":"):
            end = _scan(s, i + 1, b"/?,")
            port = s[i + 1 : end]
            i = end
        ports.append(port)
        if i < len(s) and s[i] == ord(","):
            i += 1
            continue
        break
    host_list, port_list = b",".join(hosts), b",".join(ports)
    if host_list and not _store(out, "host", host_list):
        return False
    if port_list and not _store(out, "port", port_list):
        return False
    if i < len(s) and s[i] == ord("/"):  # /dbname
        end = _scan(s, i + 1, b"?")
        if end > i + 1 and not _store(out, "dbname", s[i + 1 : end]):
            return False
        i = end
    if i < len(s):  # ?params
        return _params(s[i + 1 :], out)
    return True


def _params(s: bytes, out: dict[str, bytes]) -> bool:
    """``conninfo_uri_parse_params``: ``key=value`` pairs joined by ``&``, each decoded; a
    later value of a keyword replaces an earlier one (the userinfo's password too)."""
    i = 0
    while i < len(s):
        end = _scan(s, i, b"&")
        pair, i = s[i:end], end + 1  # a '&' at the very end closes the last pair
        if pair.count(b"=") != 1:
            return False  # no '=', or a second one
        key_raw, value_raw = pair.split(b"=")
        key_bytes, value = _decode(key_raw), _decode(value_raw)
        if key_bytes is None or value is None:
            return False
        try:
            keyword = key_bytes.decode()
        except UnicodeError:
            return False  # not a keyword libpq knows
        if keyword == "ssl" and value == b"true":  # JDBC's spelling
            keyword, value = "sslmode", b"require"
        if keyword == "requiressl":  # conninfo_storeval's backward compatibility
            keyword, value = "sslmode", (b"require" if value[:1] == b"1" else b"prefer")
        out[keyword] = value
    return True
