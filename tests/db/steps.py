"""Reading a job's saved steps, for the tests: the worker reads one step at a time
(``queue.load_step``), so the package has no use for all of them at once."""

from __future__ import annotations

from typing import Any

import psycopg


def load_steps(conn: psycopg.Connection, job_id: int) -> dict[str, Any]:
    """Every saved step result of a job, by name."""
    rows = conn.execute(
        "SELECT name, result FROM job_steps WHERE job_id = %s", (job_id,)
    ).fetchall()
    return {str(r[0]): r[1] for r in rows}
