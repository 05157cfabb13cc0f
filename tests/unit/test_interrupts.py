"""Ctrl-C held off over a block that must finish (a pass's record of itself): raised after it,
or at once when pressed again. Real SIGINTs, raised in this (the main) thread."""

from __future__ import annotations

import signal
import threading

import pytest

from vultrscale import interrupts


def test_a_ctrl_c_in_the_block_is_raised_once_the_block_is_done() -> None:
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt), interrupts.held_off():
        signal.raise_signal(signal.SIGINT)
        done.append("the rest of the block")
    assert done == ["the rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_pressed_twice_it_is_raised_at_once_and_only_once() -> None:
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt), interrupts.held_off():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        done.append("never")
    assert done == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_the_main_thread_the_block_runs_as_it_is() -> None:
    seen: list[object] = []

    def block() -> None:
        with interrupts.held_off():
            seen.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=block)
    t.start()
    t.join()
    assert seen == [signal.default_int_handler]
