"""Which queue libraries' tables a database holds (`vultrscale queue detect`): each preset's
tables and columns looked up in the catalog, the library's own record of its schema version
where it keeps one, and the signals as a pass would read them. Read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from vultrscale.config import QueueConfig
from vultrscale.core.model import Signals
from vultrscale.db.presets import PRESETS
from vultrscale.db.signals import read_signals
from vultrscale.errors import DatabaseError

# One catalog query for every preset: the columns of each table (none: the table is missing).
# to_regclass reads an unqualified name through the search path, as the queries do.
_COLUMNS = """
SELECT t.name, a.attname
  FROM unnest(%s::text[]) AS t(name)
  LEFT JOIN pg_attribute a
    ON a.attrelid = to_regclass(t.name) AND a.attnum > 0 AND NOT a.attisdropped
"""


@dataclass(frozen=True)
class Detected:
    """One preset looked for: ``tables_found`` of its tables are there; ``missing`` names each
    missing table or column (empty: the preset can read this database); ``signals`` as a
    pass reads them (or ``error``), where it can."""

    preset: str
    tables_found: int
    missing: tuple[str, ...]
    version: str | None = None
    signals: Signals | None = None
    error: str | None = None

    @property
    def found(self) -> bool:
        return self.tables_found > 0 and not self.missing

    @property
    def partial(self) -> bool:
        """Some of its tables are here, not as the versions it reads make them."""
        return self.tables_found > 0 and bool(self.missing)

    def to_json(self) -> dict[str, Any]:
        preset = PRESETS[self.preset]
        return {
            "preset": self.preset,
            "library": preset.library,
            "versions": preset.versions,
            "found": self.found,
            "missing": list(self.missing),
            "schema_version": self.version,
            "signals": None if self.signals is None else self.signals.summary(),
            "signal_error": self.error,
            "history": preset.history is not None,
            "no_history": preset.no_history or None,
        }


def detect(conn: psycopg.Connection[Any], queue: QueueConfig) -> list[Detected]:
    """Every library preset (all but custom) as this database holds it, in docs/queues.md's order.
    ``queue``: the configured one (its ``queue.queue`` filters the configured preset's read;
    a custom preset's own read comes last). ``conn`` must have no transaction in progress."""
    library = [p for p in PRESETS.values() if p.tables and p.name != "custom"]
    tables = sorted({t for p in library for t in p.tables})
    columns: dict[str, set[str]] = {t: set() for t in tables}
    for table, column in conn.execute(_COLUMNS, (tables,)).fetchall():
        if column is not None:
            columns[table].add(column)
    out = []
    for p in library:
        missing: list[str] = []
        for table, wanted in p.tables.items():
            if not columns[table]:
                missing.append(f"table {table}")
            else:
                missing += [f"column {table}.{c}" for c in wanted if c not in columns[table]]
        found = Detected(p.name, sum(1 for t in p.tables if columns[t]), tuple(missing))
        if found.found:
            mine = queue if queue.preset == p.name else QueueConfig(preset=p.name)
            found = _read(conn, found, mine, p.version_sql)
        out.append(found)
    if queue.preset == "custom":  # the user's own queries: nothing to look for, only read
        out.append(_read(conn, Detected("custom", 1, ()), queue, None))
    return out


def _read(
    conn: psycopg.Connection[Any], found: Detected, queue: QueueConfig, version_sql: str | None
) -> Detected:
    version = None
    if version_sql:
        try:
            with conn.transaction():
                row = conn.execute(version_sql).fetchone()  # type: ignore[arg-type]
            version = None if row is None or row[0] is None else str(row[0])
        except psycopg.Error:
            version = None  # the signals below say what is wrong, if anything
    try:
        signals = read_signals(conn, queue)
    except DatabaseError as exc:
        return Detected(found.preset, found.tables_found, found.missing, version, None, str(exc))
    return Detected(found.preset, found.tables_found, found.missing, version, signals)
