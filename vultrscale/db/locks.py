"""The fleet's advisory-lock key, shared by the pass lock (``db.ledger``) and the snapshot
lock (``db.snapshots``): each takes it in a namespace of its own."""

from __future__ import annotations

import zlib


def lock_key(fleet: str) -> int:
    """A stable 32-bit key per fleet for pg_try_advisory_lock(int, int)."""
    return zlib.crc32(fleet.encode()) & 0x7FFFFFFF
