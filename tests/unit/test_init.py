"""`vultrscale init`: the files it writes load with the config loader once the secrets are filled
in, it never overwrites without --force, and its questions list Vultr's choices (from the
in-process simulator) or take typed values when the API fails."""

from __future__ import annotations

import errno
import itertools
import os
import re
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vultrscale import config, scaffold
from vultrscale.cli import main
from vultrscale.core.clock import FakeClock
from vultrscale.fake_vultr import SimTransport, Simulator, Timings
from vultrscale.vultr.client import VultrClient

UUID = "cb676a46-66fd-4dfb-b839-443f2e6c0b60"

KEY = "init-test-key-0123456789ABCDEFGHIJKLMNOP"
FILLED = {
    "VULTR_API_KEY": "FILLEDKEY0123456789ABCDEFGHIJKLMNOPQ",
    "DATABASE_URL": "postgresql://vultrscale:pw1@db.internal:5432/jobs",
    "WORKER_DATABASE_URL": "postgresql://vultrscale_worker:pw2@10.1.0.5:5432/jobs",
}
ROOT = Path(__file__).resolve().parents[2]
REAL_FLEET = ROOT / "docs" / "real-fleet.md"  # the page with the annotated configuration


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("VULTRSCALE_CONFIG", "VULTR_API_URL", *scaffold.SECRETS):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _fill(env_file: Path) -> None:
    """What the user does next: a value after each placeholder."""
    text = env_file.read_text()
    for name, value in FILLED.items():
        text, n = re.subn(rf"^{name}=$", f"{name}={value}", text, flags=re.M)
        assert n == 1, f"no placeholder line for {name}"
    env_file.write_text(text)


def test_defaults_write_both_files_and_they_load_once_the_secrets_are_filled(
    here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VULTR_API_KEY", "REALKEYFROMTHEENVIRONMENT0123456789AB")
    assert main(["init", "--defaults"]) == 0
    said = capsys.readouterr().out
    assert "VULTR_API_KEY, DATABASE_URL, WORKER_DATABASE_URL" in said
    toml, env = here / "vultrscale.toml", here / ".env"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    # placeholders only: not even the key the environment holds
    assert "REALKEYFROMTHEENVIRONMENT" not in env.read_text()
    assert all(re.search(rf"^{name}=$", env.read_text(), re.M) for name in scaffold.SECRETS)

    _fill(env)
    cfg = config.load(toml, env={})
    assert cfg.source == str(toml)
    assert (cfg.fleet.region, cfg.fleet.plan, cfg.fleet.snapshot_id) == ("ewr", "vc2-1c-2gb", "")
    assert cfg.secrets.api_key.reveal() == FILLED["VULTR_API_KEY"]
    assert cfg.secrets.database_url.reveal() == FILLED["DATABASE_URL"]
    assert cfg.secrets.worker_database_url.reveal() == FILLED["WORKER_DATABASE_URL"]
    monkeypatch.delenv("VULTR_API_KEY")
    assert main(["config", "check"]) == 0
    checked = capsys.readouterr().out
    assert "Configuration is valid (from vultrscale.toml)" in checked
    # the scaler counts the queue the workers take: a fresh config has nothing to warn about
    assert (cfg.queue.queue, config.queue_warnings(cfg)) == ("default", ())
    assert "warning" not in checked


def test_options_go_into_the_file_without_questions(here: Path) -> None:
    args = ["--config", "prod/fleet.toml", "init", "--defaults", "--region", "fra"]
    assert (
        main([*args, "--plan", "vc2-2c-4gb", "--snapshot", "cb676a46-66fd-4dfb-b839-443f2e6c0b60"])
        == 0
    )
    cfg = config.load(here / "prod" / "fleet.toml", env={})
    assert (cfg.fleet.region, cfg.fleet.plan, cfg.fleet.snapshot_id) == (
        "fra",
        "vc2-2c-4gb",
        "cb676a46-66fd-4dfb-b839-443f2e6c0b60",
    )
    assert (here / "prod" / ".env").is_file()  # next to the config: where the loader reads it


@pytest.mark.parametrize("existing", ["vultrscale.toml", ".env"])
def test_an_existing_file_is_not_overwritten_without_force(
    here: Path, existing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (here / existing).write_text("# mine\n")
    assert main(["init", "--defaults"]) == 2
    assert f"{existing} exists" in capsys.readouterr().err
    assert (here / existing).read_text() == "# mine\n"
    assert sorted(p.name for p in here.iterdir()) == [existing]  # nothing else written

    (here / existing).chmod(0o644)
    assert main(["init", "--defaults", "--force"]) == 0
    assert (here / existing).read_text() != "# mine\n"
    assert stat.S_IMODE((here / ".env").stat().st_mode) == 0o600


def test_init_force_keeps_a_copy_of_the_env_it_replaces(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init", "--defaults", "--region", "fra"]) == 0
    env, toml = here / ".env", here / "vultrscale.toml"
    _fill(env)
    env.chmod(0o644)  # the copy is 0600 all the same
    filled, edited = env.read_bytes(), toml.read_bytes()
    (here / ".env.bak").write_text("an older copy\n")  # replaced, as docs/real-fleet.md says
    (here / ".env.bak").chmod(0o644)
    capsys.readouterr()

    assert main(["init", "--defaults", "--force"]) == 0
    out = capsys.readouterr().out
    assert (here / ".env.bak").read_bytes() == filled
    assert stat.S_IMODE((here / ".env.bak").stat().st_mode) == 0o600
    assert (here / "vultrscale.toml.bak").read_bytes() == edited
    assert "Kept the previous vultrscale.toml as vultrscale.toml.bak." in out
    assert "Kept the previous .env as .env.bak (mode 0600" in out
    assert not any(value in out for value in FILLED.values())  # named, never shown
    assert config.load(toml, env={}).fleet.region == "ewr"  # the files are init's again
    assert "FILLEDKEY" not in env.read_text()

    # Again: the files hold what it writes, so nothing is kept and the copies stay as they are.
    assert main(["init", "--defaults", "--force"]) == 0
    assert "Kept" not in capsys.readouterr().out
    assert (here / ".env.bak").read_bytes() == filled
    assert (here / "vultrscale.toml.bak").read_bytes() == edited


class FailOnce:
    """os.open and os.replace as they are, except that the ``nth`` call on a path under
    ``under`` fails with EIO."""

    def __init__(self, under: Path, nth: int) -> None:
        self.under, self.nth, self.calls, self.failed = str(under), nth, 0, False

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.under in os.fspath(args[0]):
                self.calls += 1
                if self.calls == self.nth:
                    self.failed = True
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real(*args, **kwargs)

        return call


def test_a_failure_at_any_step_of_init_force_loses_no_file(
    here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file system call init makes in its directory fails in turn (then none does): every
    file it replaces is still at its path or in its .bak, never neither, the .env's copy is
    0600, no temporary is left, no secret is printed, and the error says what was replaced."""
    real_open, real_replace = os.open, os.replace
    for nth in itertools.count(1):
        where = here / f"run{nth}"
        assert main(["--config", str(where / "vultrscale.toml"), "init", "--defaults"]) == 0
        _fill(where / ".env")
        (where / "vultrscale.toml").write_text("# mine\n")
        before = {p.name: p.read_bytes() for p in where.iterdir()}
        fail = FailOnce(where, nth)
        monkeypatch.setattr(os, "open", fail.wrap(real_open))
        monkeypatch.setattr(os, "replace", fail.wrap(real_replace))
        code = main(["--config", str(where / "vultrscale.toml"), "init", "--defaults", "--force"])
        monkeypatch.setattr(os, "open", real_open)
        monkeypatch.setattr(os, "replace", real_replace)
        said = capsys.readouterr()
        for name, content in before.items():
            copy = where / f"{name}.bak"
            kept = [(where / name).read_bytes(), copy.read_bytes() if copy.exists() else None]
            assert content in kept, f"{name} lost when call {nth} failed: {said.err}"
        if (where / ".env.bak").exists():
            assert stat.S_IMODE((where / ".env.bak").stat().st_mode) == 0o600
        assert not list(where.glob("*.tmp")) and not list(where.glob(".*.tmp"))
        assert not any(value in said.out + said.err for value in FILLED.values())
        if not fail.failed:
            assert code == 0, said.err
            break
        # A failed directory sync is no failure (not every file system syncs a directory).
        assert code in (0, 1) and "unexpected" not in said.err, said.err
        replaced = [n for n, content in before.items() if (where / n).read_bytes() != content]
        if code == 1:  # says what it did: nothing, or which file it replaced and where the copy is
            assert all(f"{where / n} was replaced" in said.err for n in replaced), said.err
            assert ("nothing written" in said.err) == (not replaced), said.err
    assert nth > 8  # four files written (two of them copies), four renames, then no failure
    assert (where / ".env.bak").read_bytes() == before[".env"]


def test_init_force_replaces_nothing_it_cannot_read_to_keep_a_copy_of(
    here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root every file reads, so the refusal a user meets (a .env only root may read) is
    played by the open that init reads the file with."""
    (here / ".env").write_text(f"VULTR_API_KEY={FILLED['VULTR_API_KEY']}\n")

    def refused(path: Path, *args: Any, **kwargs: Any) -> Any:
        if Path(path).name != ".env":
            return open(path, *args, **kwargs)
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(scaffold, "open", refused, raising=False)
    assert main(["init", "--defaults", "--force"]) == 2
    err = capsys.readouterr().err
    assert "cannot read .env: Permission denied; nothing written." in err, err
    assert [p.name for p in here.iterdir()] == [".env"]
    assert (here / ".env").read_text() == f"VULTR_API_KEY={FILLED['VULTR_API_KEY']}\n"


@pytest.mark.parametrize("existing", ["vultrscale.toml", ".env"])
def test_with_force_a_directory_or_a_link_where_its_copy_goes_writes_nothing(
    here: Path, existing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (here / existing).write_text("# mine\n")
    copy = here / f"{existing}.bak"
    copy.mkdir()
    assert main(["init", "--defaults", "--force"]) == 2
    assert f"{existing}.bak is not a file; nothing written" in capsys.readouterr().err
    assert sorted(p.name for p in here.iterdir()) == sorted([existing, copy.name])
    copy.rmdir()
    copy.symlink_to(here / "elsewhere")
    assert main(["init", "--defaults", "--force"]) == 2
    assert f"{existing}.bak is a link; nothing written" in capsys.readouterr().err
    assert (here / existing).read_text() == "# mine\n"


def test_git_ignores_the_env_and_the_copy_init_force_keeps_of_it() -> None:
    ignored = (ROOT / ".gitignore").read_text().split()
    assert {".env", ".env.bak", "vultrscale.toml", "vultrscale.toml.bak"} <= set(ignored)


@pytest.mark.parametrize("existing", ["vultrscale.toml", ".env"])
def test_a_directory_or_a_link_in_the_way_writes_nothing_even_with_force(
    here: Path, existing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (here / existing).mkdir()
    assert main(["init", "--defaults", "--force"]) == 2
    assert "is not a file; nothing written" in capsys.readouterr().err
    assert sorted(p.name for p in here.iterdir()) == [existing]
    (here / existing).rmdir()
    (here / existing).symlink_to(here / "elsewhere")  # dangling: a write would create it
    assert main(["init", "--defaults", "--force"]) == 2
    assert "is a link; nothing written" in capsys.readouterr().err
    assert sorted(p.name for p in here.iterdir()) == [existing]


def test_the_template_has_the_docs_reference_keys(here: Path) -> None:
    """The configuration shown in docs/real-fleet.md and the written file name the same keys."""
    block = REAL_FLEET.read_text().split("## Configuration", 1)[1].split("```toml\n", 1)[1]
    reference = tomllib.loads(block.split("```", 1)[0])
    written = tomllib.loads(scaffold.config_text(scaffold.Answers()))
    reference["policy"].pop("floor")  # the template leaves the example floor commented out
    assert {s: sorted(v) for s, v in written.items()} == {
        s: sorted(v) for s, v in reference.items()
    }


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (["--region", "\U0001f600"], ["fleet.region"]),
        (["--region", "New York", "--plan", ""], ["fleet.region", "fleet.plan"]),
        (["--plan", "bad plan"], ["fleet.plan"]),
        (["--snapshot", "../../x"], ["fleet.snapshot_id"]),
        (["--snapshot", f"{UUID}\n"], ["fleet.snapshot_id"]),
    ],
)
def test_an_answer_config_check_would_refuse_is_exit_2_and_writes_nothing(
    here: Path, args: list[str], refused: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init", "--defaults", *args]) == 2
    err = capsys.readouterr().err
    assert all(key in err for key in refused), err
    assert "Nothing was written" in err and "unexpected" not in err
    assert list(here.iterdir()) == []


def test_any_text_is_written_as_toml_it_reads_back() -> None:
    """A character above U+FFFF (json.dumps escapes it as a surrogate pair, invalid TOML),
    quotes, backslashes and control characters: the value loads back as given. (No answer
    config check takes holds such text today; the writer stays safe for one that will.)"""
    odd = 'snap-\U0001f600-"q"-\\-\t-\x7f-\x01'
    assert tomllib.loads(f"v = {scaffold._toml(odd)}")["v"] == odd


def test_a_config_path_under_a_file_is_exit_2_and_writes_nothing(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (here / "prod").write_text("a file\n")
    assert main(["--config", "prod/eu/fleet.toml", "init", "--defaults"]) == 2
    err = capsys.readouterr().err
    assert "prod is not a directory" in err and "unexpected" not in err
    assert [p.name for p in here.iterdir()] == ["prod"]


def test_a_failure_writing_the_env_leaves_neither_file(
    here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up at the second file: the first is not left behind either, so a rerun
    needs no --force."""
    real_open = os.open

    def full_disk(path: str | os.PathLike[str], *args: object, **kwargs: object) -> int:
        if ".env" in os.fspath(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", full_disk)
    assert main(["--config", "new/fleet.toml", "init", "--defaults"]) == 1
    err = capsys.readouterr().err
    assert "cannot write new/.env: No space left on device" in err and "unexpected" not in err
    assert list(here.iterdir()) == []  # not the config, not a temporary, not the directory
    monkeypatch.setattr(os, "open", real_open)
    assert main(["--config", "new/fleet.toml", "init", "--defaults"]) == 0


class Script:
    """The user at the keyboard: answers in order; records the questions and what was said."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, str]] = []
        self.said: list[str] = []

    def prompt(self, question: str, default: str) -> str:
        self.asked.append((question, default))
        answer = self.answers.pop(0)
        return default if answer == "<enter>" else answer


def _catalog(key: str = KEY) -> tuple[Simulator, VultrClient]:
    sim = Simulator(KEY, clock=FakeClock(), seed=3, timings=Timings(snapshot_complete=0))
    client = VultrClient(key, "http://sim.invalid", transport=SimTransport(sim), max_attempts=1)
    return sim, client


def test_questions_list_regions_plans_of_the_region_and_snapshots_from_the_api() -> None:
    sim, client = _catalog()
    inst = client.create_instance(
        region="fra", plan="vc2-1c-2gb", os_id=2284, label="bake-1", tags=["bake"]
    )
    baked = client.create_snapshot(inst.id, "my image")
    sim.tick()
    regions = sorted(r.id for r in client.list_regions())
    fra_plans = client.region_availability("fra")
    user = Script(str(regions.index("fra") + 1), "nope", "vc2-2c-4gb", "1")

    got = scaffold.ask(
        user.prompt, user.said.append, scaffold.ApiCatalog(client), scaffold.Answers()
    )

    assert got == scaffold.Answers(region="fra", plan="vc2-2c-4gb", snapshot_id=baked.id)
    listed = [line.split()[1] for line in user.said if re.match(r"\s+\d+\. ", line)]
    assert listed[: len(regions)] == regions
    plans = listed[len(regions) : -1]
    assert set(plans) == fra_plans and "vc2-2c-4gb" in plans
    assert listed[-1] == baked.id
    assert "'nope' is not in the list: give its number or its id." in user.said
    assert [q for q, _ in user.asked][:2] == ["Region", "Plan"]
    assert user.asked[0][1] == "ewr"  # the default offered


def test_when_the_api_fails_it_says_so_once_and_takes_typed_values() -> None:
    _, client = _catalog(key="WRONG-KEY-0123456789ABCDEFGHIJKLMNOPQR")
    user = Script("sjc", "vc2-4c-8gb", "<enter>")
    got = scaffold.ask(
        user.prompt, user.said.append, scaffold.ApiCatalog(client), scaffold.Answers()
    )
    assert got == scaffold.Answers(region="sjc", plan="vc2-4c-8gb", snapshot_id="")
    failures = [s for s in user.said if s.startswith("Could not list the choices")]
    assert len(failures) == 1, user.said
    assert "WRONG-KEY" not in "\n".join(user.said)


def test_without_a_catalog_a_required_answer_is_asked_again() -> None:
    user = Script("", "ams", "<enter>", "")
    got = scaffold.ask(user.prompt, user.said.append, None, scaffold.Answers())
    assert got == scaffold.Answers(region="ams", plan="vc2-1c-2gb", snapshot_id="")
    assert "Region is required." in user.said


def test_interactive_answers_end_up_in_a_file_that_loads(here: Path) -> None:
    user = Script("lax", "vhf-1c-1gb", "9a7b1e02-5c3d-4f6e-8a9b-0c1d2e3f4a5b")
    answers = scaffold.ask(user.prompt, user.said.append, None, scaffold.Answers())
    written = scaffold.write(here / "vultrscale.toml", answers, force=False)
    _fill(written[1])
    cfg = config.load(written[0], env={})
    assert (cfg.fleet.region, cfg.fleet.plan, cfg.fleet.snapshot_id) == (
        "lax",
        "vhf-1c-1gb",
        "9a7b1e02-5c3d-4f6e-8a9b-0c1d2e3f4a5b",
    )
