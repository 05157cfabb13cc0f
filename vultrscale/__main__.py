"""``python -m vultrscale``, and the ``vultrscale`` command (pyproject's entry point).

A Ctrl-C at any instant of the process ends it with exit 130 and ``Error: interrupted.``, never
by the signal (status -2, a traceback): the command line's guard (``vultrscale.cli.main``) is set
only once Typer and the rest are imported, a fraction of a second in, and this covers that."""

import signal
import sys

# Nothing else at the top, typing included: a Ctrl-C while this module is imported is
# still Python's own (a traceback, status -2), as in the interpreter's start-up before it.


def main() -> None:
    """Import the command line and run it; it exits with the command's code (SystemExit)."""
    try:
        from vultrscale.cli import main as command

        command()
    except KeyboardInterrupt:  # before the guard was set, or after it let go
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # nothing is left to interrupt
        print("Error: interrupted.", file=sys.stderr)
        if "--json" in sys.argv[1 : sys.argv.index("--") if "--" in sys.argv else None]:
            import json

            print(json.dumps({"error": "interrupted.", "hint": None, "exit_code": 130}, indent=2))
        sys.exit(130)  # errors.EXIT_INTERRUPTED, not imported: it may be what was cut short
    sys.exit(0)  # pragma: no cover - the command exits


if __name__ == "__main__":
    main()
