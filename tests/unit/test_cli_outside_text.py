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


def test_an_events_row_shows_each_action_result_and_error_on_a_line_of_its_own() -> None:
    table = status.events_table(
        [
            {
                "at": datetime(2026, 11, 30, tzinfo=UTC),
                "exit_code": 1,
                "plan": {"desired": 2, "target": 2, "clamps": ["cap 2"]},
                "actions": [{"kind": "create", "label": "w-1", "reason": "queue 8"}],
                "results": [{"label": "w-1", "result": "created"}],
                "errors": ["w-0: host\nkey changed"],  # a newline inside one detail stays inside
            }
        ]
    )
    lines = [line.rstrip() for line in _render(table).splitlines()]
    cells = [line.rsplit("│", 2)[-2].strip() for line in lines if line.count("│") >= 4]
    assert [c for c in cells if c][-4:] == [
        "clamp: cap 2",
        "create w-1: queue 8",
        "w-1: created",
        "error: w-0: host key changed",
    ]


def test_our_consoles_do_not_highlight_words() -> None:
    out = views.console()
    assert out._highlight is False  # noqa: SLF001 - the setting itself is what is promised
