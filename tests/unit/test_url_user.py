"""Which role a database URL or conninfo string logs in as: libpq's reading, nothing of ours."""

from __future__ import annotations

import pytest

from vultrscale.errors import url_user


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
