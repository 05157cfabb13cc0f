"""pguri reads a postgresql:// URI as libpq does, so the password masked without psycopg is the
one libpq would send: held to libpq's own reading (psycopg.conninfo) on a corpus of the URIs
that trip parsers and on generated ones."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import ProgrammingError, pq
from psycopg.conninfo import conninfo_to_dict

from vultrscale import config
from vultrscale.pguri import read_uri
from vultrscale.redaction import conninfo_problem, first_line, mask_url, parse_conninfo, url_user


def libpq(text: str) -> dict[str, str] | None:
    try:
        return conninfo_to_dict(text)
    except (ProgrammingError, UnicodeError):
        return None


# The keywords this libpq knows: a URI naming another is refused by libpq and read by pguri,
# which leaves the keywords to libpq (redaction.conninfo_problem asks it).
KNOWN = {o.keyword.decode() for o in pq.Conninfo.get_defaults()}


def assert_read_as_libpq(uri: str) -> None:
    mine, theirs = read_uri(uri), libpq(uri)
    if mine is not None and set(mine) - KNOWN:
        assert theirs is None
    else:
        assert mine == theirs


CORPUS = [
    "postgresql://",
    "postgres://h",
    "postgresql://u:p@h:5432/db",
    "postgresql://u@h/db",
    "postgresql://:p@h/db",  # a password and no user
    "postgresql://u:@h/db",  # an empty password is no password
    "postgresql://u:p:q@h/db",  # a ':' in the password
    "postgresql://u:p@ss@h/db",  # an unencoded '@': the rest is the host
    "postgresql://u:p/w@h/db",  # an unencoded '/': no userinfo at all
    "postgresql://u:p?w@h/db",
    "postgresql://u:p%40ss%2Fw@h/db",
    "postgresql://u:p%zz@h/db",  # a bad escape
    "postgresql://u:p%4@h/db",
    "postgresql://u:p%00@h/db",  # %00 is refused
    "postgresql://u:p%C3%A9@h/db",  # UTF-8 é
    "postgresql://u:p%FF@h/db",  # not UTF-8
    "postgresql://u:pé@h/db",
    "postgresql://h1:5432,h2:5433,h3/db",
    "postgresql://h1,,h2/db",
    "postgresql://,/db",
    "postgresql://:5433/db",
    "postgresql://[::1]:5432/db",
    "postgresql://[::1]/db",
    "postgresql://[::1],[fe80::2]:6/db",
    "postgresql://[::1]x/db",
    "postgresql://[]/db",
    "postgresql://[::1",
    "postgresql://%2Fvar%2Frun%2Fpostgresql/db",
    "postgresql://h/db?password=fromquery",
    "postgresql://u:p@h/db?password=q&user=v",
    "postgresql://h/db?sslmode=require&application_name=a%20b",
    "postgresql://h/db?ssl=true",
    "postgresql://h/db?ssl=false",  # JDBC's "ssl" is known only as "ssl=true"
    "postgresql://h/db?no_such_option=1",
    "postgresql://h/db?%70assword=x",  # an escaped keyword
    "postgresql://h/db?requiressl=1",
    "postgresql://h/db?requiressl=0",
    "postgresql://h/db?",
    "postgresql://h/db?&",
    "postgresql://h/db?a",
    "postgresql://h/db?password=a=b",
    "postgresql://h/db?password=x&",
    "postgresql://h/db?password=x&&",
    "postgresql://h/db?host=%2Ftmp",
    "postgresql://h?dbname=d",
    "postgresql://h/d%2Fb/c",
    "postgresql://h:port/db",
    "postgresql://u:p@h/db\x00?password=tail",  # libpq reads up to the NUL
    "postgresql://u:p\x00w@h/db",
    "postgresql://u:p@h/db?sslpassword=kp",
]


@pytest.mark.parametrize("uri", CORPUS)
def test_a_uri_is_read_as_libpq_reads_it(uri: str) -> None:
    assert_read_as_libpq(uri)


# Every character that moves a field boundary, an escape or two, and a few ordinary ones.
_PIECES = st.sampled_from(
    [":", "@", "/", "?", ",", "&", "=", "[", "]", "%", "%2F", "%40", "%3A", "%zz", "%00",
     "%C3%A9", "%ff", "é", "a", "b", "1", "5432", "::1", " ", "'", "\\", "\x00"]
)  # fmt: skip
_KEYWORDS = st.sampled_from(
    ["password", "user", "host", "port", "dbname", "sslmode", "sslpassword", "ssl",
     "requiressl", "application_name", "options"]
)  # fmt: skip
_VALUES = st.lists(_PIECES, max_size=6).map("".join)
_QUERY = st.lists(st.tuples(_KEYWORDS, _VALUES), max_size=3).map(
    lambda pairs: "&".join(f"{k}={v}" for k, v in pairs)
)


@settings(max_examples=400, deadline=None)
@given(
    prefix=st.sampled_from(["postgresql://", "postgres://"]),
    body=st.lists(_PIECES, max_size=14).map("".join),
    query=st.one_of(st.just(""), _QUERY.map(lambda q: "?" + q)),
)
def test_generated_uris_are_read_as_libpq_reads_them(prefix: str, body: str, query: str) -> None:
    assert_read_as_libpq(prefix + body + query)


def test_a_query_keyword_libpq_does_not_know_is_left_to_libpq() -> None:
    # The URI reading does not keep libpq's keyword list (it changes with libpq's version):
    # the password is still read, and the configuration check still refuses the string.
    uri = "postgresql://u:hunter2x@h/db?no_such_option=1"
    assert libpq(uri) is None
    assert read_uri(uri) == {"user": "u", "password": "hunter2x", "host": "h", "dbname": "db",
                             "no_such_option": "1"}  # fmt: skip
    assert conninfo_problem(uri) is not None


def test_masking_a_uris_password_does_not_import_psycopg(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: every masking function imported psycopg to read the URI (about 110 ms of a
    # failing command's start-up). With psycopg unimportable they still mask.
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.setitem(sys.modules, "psycopg.conninfo", None)
    url = "postgresql://scaler:Hu%2Fnter2-pw@db.example:5432/jobs"
    env = {"DATABASE_URL": url, "VULTR_API_KEY": "K" * 36}
    assert "Hu/nter2-pw" in config.Secrets.from_env(env).values()
    line = first_line(RuntimeError(f"auth failed for Hu/nter2-pw at {url}"), [url])
    assert "nter2" not in line
    assert mask_url(url) == "postgresql://scaler:***@db.example:5432/jobs"
    assert url_user(url) == "scaler"
    assert parse_conninfo(url) is not None
