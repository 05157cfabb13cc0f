"""The example commands of the README and the docs run as shown.

Every ```console block's ``$ vultrscale ...`` line (and ``$ sudo vultrscale ...``) is an
example. Each page's examples run in order, in the process (``vultrscale.cli.main``), in a
directory of the page's own: each must exit 0, and the first line the page shows under it must
be among the lines it prints. The world they run in is what the docs tell a reader to make: a
scaler key at ``~/.ssh/vultrscale_ed25519`` and the secrets in the environment (as the
``.env`` would give them, at addresses nothing answers). A page that needs a config shows the
``vultrscale init`` that writes it.

A block that cannot run here (it needs Postgres, a Vultr account, root or minutes) is marked
``<!-- not run: why -->`` on the line before it; each of its commands is listed by
``test_an_example_not_run_here`` as skipped with that reason (``-ra`` shows them), never left
out silently. docs/reference/ is generated from the code and holds usage lines, not examples.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from vultrscale.cli import main

ROOT = Path(__file__).resolve().parents[2]
_MARK = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->$")
_COMMAND = re.compile(r"^\$ (sudo )?vultrscale( |$)")


@dataclass(frozen=True)
class Example:
    page: str  # relative to the repository
    line: int
    command: str  # as shown, without the prompt
    first: str | None  # the first line shown under it, if any
    not_run: str | None  # the reason its block is not run here

    @property
    def argv(self) -> list[str]:
        words = shlex.split(self.command)
        return words[2:] if words[0] == "sudo" else words[1:]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.command}"


def pages() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts)
    return [ROOT / "README.md", *docs]


def examples(path: Path) -> list[Example]:
    """The examples of one page, in the order they appear."""
    page = str(path.relative_to(ROOT))
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```console":
            i += 1
            continue
        before = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        mark = _MARK.match(before)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        block = lines[i + 1 : end]
        for k, text in enumerate(block):
            if not _COMMAND.match(text):
                continue
            shown = []
            for out in block[k + 1 :]:
                if out.startswith("$ "):
                    break
                shown.append(out.rstrip())
            first = next((s for s in shown if s.strip() and s.strip() != "..."), None)
            found.append(Example(page, i + 2 + k, text[2:], first, mark.group(1) if mark else None))
        i = end + 1
    return found


ALL = [e for p in pages() for e in examples(p)]
NOT_RUN = [e for e in ALL if e.not_run]
RUN_PAGES = sorted({e.page for e in ALL if not e.not_run})


def test_the_docs_have_examples_to_run_and_every_sudo_one_is_marked() -> None:
    assert len(ALL) - len(NOT_RUN) >= 8, [str(e) for e in ALL]
    unmarked = [str(e) for e in ALL if e.command.startswith("sudo ") and not e.not_run]
    assert not unmarked, f"mark these <!-- not run: ... -->: {unmarked}"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_process: None) -> Path:
    """A home with the scaler's key, the secrets in the environment, nothing else set; a
    simulate's rows replayed on this process (the unit tier starts none)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "vultrscale_ed25519"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    key.chmod(0o600)
    for name in list(os.environ):
        if name.startswith(("VULTRSCALE_", "VULTR_")) or name.endswith("DATABASE_URL"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("VULTR_API_KEY", "VKEY-docs-0123456789abcdefghijklmnop")
    # Port 9 on loopback: a command that connects is refused at once, never waits.
    monkeypatch.setenv("DATABASE_URL", "postgresql://vultrscale:scaler-pw@127.0.0.1:9/jobs")
    monkeypatch.setenv(
        "WORKER_DATABASE_URL", "postgresql://vultrscale_worker:worker-pw@127.0.0.1:9/jobs"
    )
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


@pytest.mark.parametrize("page", RUN_PAGES)
def test_a_pages_examples_run_and_print_what_it_shows(
    page: str, world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for example in examples(ROOT / page):
        if example.not_run:
            continue
        code = main(example.argv)
        out, err = capsys.readouterr()
        assert code == 0, f"{example}: exit {code}\n{out}{err}"
        if example.first is not None:
            printed = [ln.strip() for ln in (out + err).splitlines()]
            assert example.first.strip() in printed, (
                f"{example}: shows {example.first!r}, which it did not print:\n{out}{err}"
            )


@pytest.mark.parametrize("example", NOT_RUN, ids=str)
def test_an_example_not_run_here(example: Example) -> None:
    command = example.argv[2:3] if example.argv[0] == "--config" else example.argv[:1]
    assert main([*command, "--help"]) == 0, f"{example}: no such command"
    pytest.skip(f"not run: {example.not_run}: {example}")
