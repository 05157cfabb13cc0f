"""The queue presets, one module per library (``base`` says what a preset is made of).

``db.signals.read_signals`` reads a preset's signals; ``db.history`` its finished jobs;
``db.detect`` finds which presets' tables a database holds.
"""

from __future__ import annotations

from vultrscale.db.presets import builtin, custom, graphile, pgboss, pgqueuer, procrastinate
from vultrscale.db.presets.base import Preset

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        builtin.PRESET,
        procrastinate.PRESET,
        pgqueuer.PRESET,
        graphile.PRESET,
        pgboss.PRESET,
        custom.PRESET,
    )
}

__all__ = ["PRESETS", "Preset"]
