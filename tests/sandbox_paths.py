"""The directories the units' sandbox hides, less the one this clone lies under: tests that
write units with the clone's own `vultrscale` in ExecStart pass wherever the clone is (a CI
clone under /tmp, a home directory), and every other hidden directory is still refused."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def clone_let_through(hidden: tuple[str, ...]) -> tuple[str, ...]:
    """``hidden`` without the directory this clone lies under."""
    here = str(REPO)
    return tuple(h for h in hidden if not (here == h or here.startswith(h + "/")))
