"""The status table at a terminal's width: long labels are cut, the figures are not."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

from rich.console import Console

from vultrscale.core.model import Instance, InstanceState
from vultrscale.status import fleet_table

NOW = datetime(2026, 5, 10, 12, 0, tzinfo=UTC)


def test_a_long_label_is_cut_and_the_figures_beside_it_are_whole() -> None:
    long = "unlabelled@4c566b1c-11a1-425c-a807-88c7e46a1006"  # one the scaler tracks
    inst = Instance(
        long,
        InstanceState.BOOTING,
        id="4c566b1c",
        created_at=NOW - timedelta(minutes=7),
        main_ip="203.0.113.77",
        billed_usd=12.34,
    )
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(fleet_table((inst,), NOW, "workers"))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if "unlabelled@" in line)
    assert "booting" in row and "203.0.113.77" in row and "12.34" in row and "7m" in row
    assert long not in row and "…" in row


def test_outside_text_cannot_reorder_or_split_a_row() -> None:
    from vultrscale.status import one_line, plain

    label = "evil\u202eabc\ndef\x1b]0;title\x07"
    assert one_line(label) == "evilabc def]0;title"
    assert plain(label).plain == "evilabc def]0;title"
