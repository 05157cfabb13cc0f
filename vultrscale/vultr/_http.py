"""httpx, imported without its command-line client.

httpx's ``__init__`` imports ``httpx._main`` (its `httpx` command: click, pygments and rich)
whenever those are installed, as they are beside Typer, and the scaler never runs it: about
35 ms of every cron pass's CPU, a tenth of it. httpx itself falls back to a stub ``main`` when
that import fails, which a ``None`` in ``sys.modules`` makes it do; the entry is taken away
again at once, so a later ``import httpx._main`` works as usual. An httpx that could not load
without its CLI module is imported whole instead.
"""

from __future__ import annotations

import sys


def _import_without_cli() -> None:
    if "httpx" in sys.modules:
        return
    sys.modules["httpx._main"] = None  # type: ignore[assignment]
    try:
        import httpx  # noqa: F401
    except ImportError:
        pass  # imported whole below
    finally:
        if "httpx._main" in sys.modules and sys.modules["httpx._main"] is None:
            del sys.modules["httpx._main"]


_import_without_cli()

import httpx as httpx  # noqa: E402 - after the import above, which it completes or repeats
