"""Text from outside (labels, tags, messages) is shown as text: never rich markup, never a
terminal escape; and rich paints no words of ours on its own."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.console import Console

from vultrscale import status
from vultrscale.cli import views


def _render(renderable: object) -> str:
    out = Console(width=120, record=True, force_terminal=True, highlight=False)
    out.print(renderable)
    return out.export_text()


def test_markup_and_escapes_in_outside_text_are_printed_as_text() -> None:
    hostile = "[bold red]evil[/] \x1b[2J\x07tag"
    rendered = _render(status.plain(hostile))
    assert "[bold red]evil[/]" in rendered
    assert "\x1b" not in rendered and "\x07" not in rendered


def test_an_events_table_shows_a_database_message_with_brackets_literally() -> None:
    table = status.events_table(
        [
            {
                "at": datetime(2026, 11, 30, tzinfo=UTC),
                "exit_code": 1,
                "plan": {"desired": 1, "target": 1},
                "actions": [],
                "results": [],
                "errors": ["relation [link=http://x]fleet[/link] \x1b]0;pwned\x07 missing"],
            }
        ]
    )
    text = _render(table)
    assert "[link=http://x]fleet[/link]" in text and "pwned" in text and "\x1b" not in text


def test_our_consoles_do_not_highlight_words() -> None:
    out = views.console()
    assert out._highlight is False  # noqa: SLF001 - the setting itself is what is promised
