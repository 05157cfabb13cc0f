"""Ctrl-C held off over the few statements that must finish once begun (a pass's record of
itself): noted while they run, raised as it came once they are done."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def held_off() -> Iterator[None]:
    """Run the block with SIGINT noted, not raised; once it is done, a SIGINT that came meanwhile
    is raised again, to the handler that was there (``KeyboardInterrupt``, exit 130 at the CLI).
    Pressed twice, it is raised at once: a block stuck on a network is not waited out.

    Only the main thread has signal handlers: in another thread (a pass run there) no SIGINT
    lands, and the block runs as it is; nor is a handler Python did not install replaced."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:
        yield
        return

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)
        if len(noted) == 2 and callable(previous):  # pressed again: delivered now
            previous(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if len(noted) == 1 or (noted and not callable(previous)):
            signal.raise_signal(signal.SIGINT)  # to SIG_IGN or SIG_DFL as to a handler
