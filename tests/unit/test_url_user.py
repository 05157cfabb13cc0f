"""Connection strings: the role one logs in as (libpq's reading, nothing of ours) and hosts
no resolver takes."""

from __future__ import annotations

import pytest

from vultrscale.errors import UsageError
from vultrscale.redaction import conninfo_problem, url_user
from vultrscale.vultr.client import VultrClient


@pytest.mark.parametrize(
    ("url", "user"),
    [
        pytest.param("postgresql://bob:pw@h/db", "bob", id="url"),
        pytest.param("postgresql://b%40b:p@h/d", "b@b", id="url-encoded"),
        pytest.param("postgresql://h/db?user=al", "al", id="url-query"),
        pytest.param("user='x y' host=h", "x y", id="keyword-quoted"),
        pytest.param("host=h dbname=d", None, id="none-named"),
        # A pattern of ours found user= inside the quoted password and config check printed
        # 'TopSecretTail', a part of the password, as the workers' role.
        pytest.param("host=h password='hunter2 user=TopSecretTail' dbname=vs", None, id="in-pw"),
        pytest.param("postgresql://u:pa/ss?wd@h/db", None, id="unreadable"),
    ],
)
def test_the_role_is_libpqs_reading_and_never_a_part_of_the_password(
    url: str, user: str | None
) -> None:
    assert url_user(url) == user


@pytest.mark.parametrize(
    "url",
    ["postgresql://u:pw@a..b:5432/db", "host=a..b password=pw", f"host={'a' * 64}.com"],
)
def test_a_host_the_resolver_refuses_is_a_config_problem_not_a_crash(url: str) -> None:
    """'unexpected UnicodeError' (exit 1) out of every connect; the password never in it."""
    problem = conninfo_problem(url)
    assert problem is not None and "not a valid host name" in problem and "pw" not in problem
    assert conninfo_problem("postgresql://u:pw@[::1]:5432/db") is None
    assert conninfo_problem("host=/var/run/postgresql dbname=d") is None


@pytest.mark.parametrize("base", ["http://a..b", "http://xn--zz.invalid", f"http://{'a' * 64}.com"])
def test_an_api_url_whose_host_is_not_valid_is_refused_at_once(base: str) -> None:
    with pytest.raises(UsageError, match="Vultr API URL"):
        VultrClient("k" * 20, base)
