"""The files written from the code: init's commented vultrscale.toml names every setting and
loads back as the defaults, and .env.example, docs/reference/settings.md (from the config's
schema) and docs/reference/cli.md (from the command tree) are what scripts/gen_reference.py
writes now (a stale one fails here: run the script)."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from vultrscale import config, scaffold
from vultrscale.cli import reference as cli_reference
from vultrscale.config import reference
from vultrscale.config.kinds import Tables, spec_of, value_problems
from vultrscale.config.schema import SECTIONS, all_settings
from vultrscale.config.secrets import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
_HEADER = re.compile(r"^(?:# )?\[(\[?)([\w.]+)\]?\]")
_KEY = re.compile(r"^(?:# )?(\w+) = ")


@pytest.mark.parametrize(
    ("path", "generate"),
    [
        (".env.example", reference.env_example),
        ("docs/reference/settings.md", reference.settings_page),
        ("docs/reference/cli.md", cli_reference.cli_page),
    ],
    ids=["env-example", "settings-reference", "cli-reference"],
)
def test_the_generated_files_are_up_to_date(path: str, generate: object) -> None:
    assert callable(generate)
    assert (ROOT / path).read_text(encoding="utf-8") == generate(), (
        f"{path} is stale: run scripts/gen_reference.py"
    )


def _template_keys(text: str) -> set[str]:
    """The dotted keys the template names, set or commented out (an array of tables counts as
    its key, ``policy.floor``)."""
    keys: set[str] = set()
    section, in_array = "", False
    for line in text.splitlines():
        if m := _HEADER.match(line):
            section, in_array = m[2], bool(m[1])
            if in_array:
                keys.add(section)
        elif (m := _KEY.match(line)) and not in_array:
            keys.add(f"{section}.{m[1]}")
    return keys


def test_the_template_names_every_setting() -> None:
    text = scaffold.config_text(scaffold.Answers())
    assert _template_keys(text) == set(config.setting_keys())


def test_the_template_loads_back_as_the_defaults_and_the_answers(tmp_path: Path) -> None:
    answers = scaffold.Answers(
        region="fra", plan="vc2-2c-4gb", snapshot_id="cb676a46-66fd-4dfb-b839-443f2e6c0b60"
    )
    path = tmp_path / "vultrscale.toml"
    path.write_text(scaffold.config_text(answers))
    cfg = config.load(path, {})
    assert (cfg.fleet.region, cfg.fleet.plan, cfg.fleet.snapshot_id) == (
        "fra",
        "vc2-2c-4gb",
        "cb676a46-66fd-4dfb-b839-443f2e6c0b60",
    )
    # Every other setting at its default, but those whose template value is an example.
    examples = {"queue.queue": "default"}
    for s in all_settings():
        if s.dotted in examples or s.dotted.startswith("fleet.") and s.key in (
            "region",
            "plan",
            "snapshot_id",
        ):
            continue
        section = cfg
        for part in s.section.split("."):
            section = getattr(section, part)
        assert getattr(section, s.key) == s.default, s.dotted
    assert cfg.queue.queue == examples["queue.queue"]


def test_every_example_the_template_comments_out_is_a_valid_value() -> None:
    """Uncommented, a commented-out key is taken (each of an offering's and a floor's too)."""

    def check(where: str, cls: type) -> None:
        for f in dataclasses.fields(cls):
            spec = spec_of(f)
            if isinstance(spec.kind, Tables):
                check(f"{where}.{f.name}[0]", spec.kind.item)
            elif spec.example:
                value = spec.kind.read(tomllib.loads(f"v = {spec.example}")["v"], where)
                assert value_problems(spec, f"{where}.{f.name}", value) == [], f.name

    for section, cls in SECTIONS.items():
        check(section, cls)


def test_the_template_and_the_init_env_are_toml_and_dotenv_a_loader_reads(
    tmp_path: Path,
) -> None:
    (tmp_path / "vultrscale.toml").write_text(scaffold.config_text(scaffold.Answers()))
    (tmp_path / ".env").write_text(scaffold.env_text())
    assert config.read_dotenv(tmp_path / ".env") == {
        "VULTR_API_KEY": "",
        "DATABASE_URL": "",
        "WORKER_DATABASE_URL": "",
    }
    assert config.load(tmp_path / "vultrscale.toml", {}).source.endswith("vultrscale.toml")


def test_env_example_and_the_reference_name_every_variable() -> None:
    example = (ROOT / ".env.example").read_text()
    page = (ROOT / "docs" / "reference" / "settings.md").read_text()
    for s in all_settings():
        assert f"# {s.env}=" in example, s.env
        assert f"`{s.env}`" in page or s.section.count(".") or isinstance(s.spec.kind, Tables)
        assert f"`{s.dotted}`" in page, s.dotted
    for v in VARIABLES:
        assert f"`{v.name}`" in page
        assert (f"{v.name}=" in example) == bool(v.group), v.name


def test_every_default_written_as_the_template_writes_it_reads_back_the_same() -> None:
    for s in all_settings():
        if not isinstance(s.spec.kind, Tables):
            written = tomllib.loads(f"v = {reference.toml_text(s.spec, s.default)}")["v"]
            assert s.spec.kind.read(written, s.dotted) == s.default, s.dotted
