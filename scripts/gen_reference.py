#!/usr/bin/env python3
"""Write the files generated from the code: .env.example (every variable vultrscale reads) and
docs/reference/settings.md (a table per section: key, type, default, what is allowed, the
variable, help) from the config's schema, and docs/reference/cli.md (every command, its options
and examples) from the command tree. Each setting is declared once, in
vultrscale/config/schema.py, each command's help beside the command in vultrscale/cli: edit it
there, then run this script. `vultrscale init` writes its commented vultrscale.toml from the
same schema when it runs, so that file is not kept here.

    scripts/gen_reference.py            write the files that changed
    scripts/gen_reference.py --check    write nothing; exit 1 naming each stale file

Exit codes: 0 written, or (--check) up to date; 1 (--check) a file is stale; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vultrscale.cli import reference as cli_reference  # noqa: E402  (after the path: a clone)
from vultrscale.config import reference  # noqa: E402


def generated() -> dict[Path, str]:
    """Each generated file of the repository and the text it should hold."""
    return {
        ROOT / ".env.example": reference.env_example(),
        ROOT / "docs" / "reference" / "settings.md": reference.settings_page(),
        ROOT / "docs" / "reference" / "cli.md": cli_reference.cli_page(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=Path(__file__).name,
        description=__doc__.split("\n\n")[0],
        epilog="Exit codes: 0 written or up to date; 1 (--check) a file is stale; 2 bad arguments.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is stale"
    )
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in stale:
        name = path.relative_to(ROOT)
        if args.check:
            print(f"{name} is stale: run scripts/gen_reference.py", file=sys.stderr)
        else:
            print(f"wrote {name}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
