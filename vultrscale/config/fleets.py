"""A directory of fleets: ``load_fleets(path, env, flags)``.

``VULTRSCALE_CONFIG`` (or ``--config``) may name a directory: every ``*.toml`` in it is one
fleet, written exactly as a single config file (files whose name starts with a dot, an
editor's, are left out). A single file is a directory of one fleet, loaded as ``load`` always
loaded it. Each file is loaded on its own (the ``.env`` of the directory under the
environment), so one that cannot be read is that fleet's problem (``Fleets.bad``) and the
others still run; two files that name the same fleet or the same tag (Vultr lists by exact
tag, so each fleet would adopt the other's instances) are both refused, each naming the
other. The ``[account]`` keys are the account's, one value for every fleet: the files that set
one must agree, or the whole directory is refused.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vultrscale.config.files import exists, resolve_config_path
from vultrscale.config.model import Config
from vultrscale.config.schema import AccountConfig
from vultrscale.errors import ConfigError, UsageError

_FIX_CLASH = "Give each fleet file its own [fleet] name and tag (one file per fleet)."


@dataclass(frozen=True)
class BadFile:
    """A fleet file that cannot run: why (every problem), how to fix it, and the fleet name it
    gives when the name can be read (None: not even that)."""

    path: Path
    problems: tuple[str, ...]
    hint: str = ""
    name: str | None = None

    def error(self) -> ConfigError:
        return ConfigError(
            [f"{self.path.name}: {p}" for p in self.problems], hint=self.hint or None
        )


@dataclass(frozen=True)
class Fleets:
    """The fleets of one config path: those that load (by name), and the files that do not."""

    source: Path
    directory: bool  # a directory of fleet files, not a single file
    configs: tuple[Config, ...]
    bad: tuple[BadFile, ...] = ()
    # Every fleet a file of the path names, those of files that cannot run too, whichever
    # ``select`` kept: a fleet in the database not among them is one no file describes.
    described: tuple[str, ...] = ()

    @property
    def names(self) -> list[str]:
        return [c.fleet.name for c in self.configs]

    @property
    def account(self) -> AccountConfig:
        """The account's settings, the same in every fleet's config."""
        return self.configs[0].account if self.configs else AccountConfig()

    def select(self, name: str | None) -> Fleets:
        """Only the fleet ``name`` (None: all of them). A name no file gives is a usage error
        naming the fleets there are; a name only a bad file gives is that file's error."""
        if name is None:
            return self
        for cfg in self.configs:
            if cfg.fleet.name == name:
                return dataclasses.replace(self, configs=(cfg,), bad=())
        for bad in self.bad:
            if bad.name == name:
                raise bad.error()
        known = ", ".join(self.names) or "none that load"
        raise UsageError(
            f"--fleet {name}: no fleet of that name in {self.source} (fleets: {known})",
            hint="Name a fleet by its [fleet] name (`vultrscale config check` lists them).",
        )

    def one(self) -> Config:
        """The fleet of a command that acts on one: the single file's, or the directory's only
        file's; a directory of several asks for ``--fleet``."""
        if len(self.configs) == 1 and not self.bad:
            return self.configs[0]
        if len(self.bad) == 1 and not self.configs:
            raise self.bad[0].error()
        names = ", ".join([*self.names, *(b.path.name for b in self.bad)])
        raise UsageError(
            f"{self.source} holds {len(self.configs) + len(self.bad)} fleets ({names}): this "
            "command acts on one",
            hint="Name it with --fleet NAME (before or after the command).",
        )

    def bad_error(self) -> ConfigError | None:
        """Every bad file's problems as one error (exit 2), None when every file loads."""
        if not self.bad:
            return None
        problems = [f"{b.path.name}: {p}" for b in self.bad for p in b.problems]
        hints = list(dict.fromkeys(b.hint for b in self.bad if b.hint))
        return ConfigError(problems, hint=" ".join(hints) or None)


def load_fleets(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    *,
    require_file: bool | None = None,
) -> Fleets:
    """The fleets of ``path`` (None: ``$VULTRSCALE_CONFIG``, else ``./vultrscale.toml``): a
    directory's every ``*.toml``, or the one file (``load``, its ConfigError raised as ever).
    Raises ConfigError for a directory with no fleet file or whose files disagree on the
    account; a file that cannot run is in ``Fleets.bad``."""
    import os

    from vultrscale import config  # its ``load``, looked up now (a test may stand in for it)

    load = config.load
    env = dict(os.environ if env is None else env)
    if path is None:
        where, _ = resolve_config_path(None, env)
    else:
        where = Path(path).expanduser()
    if not _is_dir(where):
        cfg = load(path, env, flags, require_file=require_file)
        return Fleets(where, False, (cfg,), (), (cfg.fleet.name,))
    files = sorted(p for p in where.glob("*.toml") if not p.name.startswith(".") and p.is_file())
    if not files:
        raise ConfigError(
            [f"{where} is a directory with no *.toml fleet file in it"],
            hint=f"Write one with `vultrscale --config {where} init`, or move a vultrscale.toml "
            "into it (every *.toml there is one fleet).",
        )
    loaded: dict[Path, Config] = {}
    bad: dict[Path, BadFile] = {}
    for file in files:
        try:
            loaded[file] = load(file, env, flags, require_file=True)
        except ConfigError as exc:
            bad[file] = BadFile(file, tuple(exc.problems), exc.hint or "", _raw_name(file))
    _clashes(loaded, bad)
    account = _account(files, loaded, env)
    configs = sorted(
        (dataclasses.replace(c, account=account) for c in loaded.values()),
        key=lambda c: c.fleet.name,
    )
    named = [c.fleet.name for c in configs] + [b.name for b in bad.values() if b.name]
    return Fleets(
        where,
        True,
        tuple(configs),
        tuple(bad[f] for f in files if f in bad),
        tuple(sorted(set(named))),
    )


def _is_dir(path: Path) -> bool:
    return exists(path) and path.is_dir()


def _raw_name(file: Path) -> str | None:
    """The ``[fleet] name`` a file gives, read as plain TOML (None: it cannot be read)."""
    return _raw(file, "name")


def _raw(file: Path, key: str) -> str | None:
    """``[fleet] key`` as a file gives it, read as plain TOML, its default when the file does
    not set it (None: the file or the value cannot be read)."""
    from vultrscale.config.schema import FleetConfig

    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return None
    fleet = data.get("fleet")
    default = getattr(FleetConfig, key)
    value = fleet.get(key, default) if isinstance(fleet, dict) else default
    return value if isinstance(value, str) else None


def clash(directory: Path, name: str, tag: str) -> str | None:
    """What a new fleet ``name`` with ``tag`` would clash with in ``directory`` (the file that
    gives the same name, or the same tag in any case); None: nothing. `init --fleet` asks."""
    for file in sorted(directory.glob("*.toml")):
        if file.name.startswith("."):
            continue
        if _raw(file, "name") == name:
            return f"{file} is fleet {name!r} already"
        other = _raw(file, "tag")
        if other is not None and other.casefold() == tag.casefold():
            return f"{file} has the tag {other!r} already (each fleet would adopt the other's)"
    return None


def _clashes(loaded: dict[Path, Config], bad: dict[Path, BadFile]) -> None:
    """Move to ``bad`` every pair of files that give the same fleet name, or the same tag (in
    any case: a tag is the fleet's claim on its instances), each naming the other."""
    problems: dict[Path, list[str]] = {}
    files = list(loaded)
    for i, a in enumerate(files):
        for b in files[i + 1 :]:
            fa, fb = loaded[a].fleet, loaded[b].fleet
            if fa.name == fb.name:
                for x, y in ((a, b), (b, a)):
                    problems.setdefault(x, []).append(
                        f"fleet.name {fa.name!r} is also the name in {y}: one fleet per name"
                    )
            if fa.tag.casefold() == fb.tag.casefold():
                for x, y in ((a, b), (b, a)):
                    tag, other = loaded[x].fleet.tag, loaded[y].fleet.tag
                    problems.setdefault(x, []).append(
                        f"fleet.tag {tag!r} is also the tag in {y} ({other!r}): each fleet "
                        "would adopt the other's instances"
                    )
    for file, said in problems.items():
        bad[file] = BadFile(file, tuple(said), _FIX_CLASH, loaded.pop(file).fleet.name)


def _account(files: list[Path], loaded: Mapping[Path, Config], env: Mapping[str, str]) -> Any:
    """The one ``[account]`` of the directory: each key as the files that set it agree (the
    environment's over them all), else its default. ConfigError naming two files that
    disagree."""
    values: dict[str, Any] = {}
    said_by: dict[str, Path] = {}
    problems: list[str] = []
    for file in files:
        cfg = loaded.get(file)
        if cfg is None:
            continue
        for key in _account_keys(file):
            value = getattr(cfg.account, key)
            if key in values and values[key] != value:
                problems.append(
                    f"account.{key} is {values[key]!r} in {said_by[key]} but {value!r} in "
                    f"{file}: it is the account's, one value for every fleet"
                )
            values.setdefault(key, value)
            said_by.setdefault(key, file)
    if problems:
        raise ConfigError(
            problems,
            hint="Set it once: in the directory's .env as VULTRSCALE_ACCOUNT_<KEY>, or in one "
            "file's [account] (the others may leave it out).",
        )
    base = next(iter(loaded.values())).account if loaded else AccountConfig()
    return dataclasses.replace(base, **values)


def _account_keys(file: Path) -> list[str]:
    """The ``[account]`` keys ``file`` sets (it loaded, so it reads)."""
    data = tomllib.loads(file.read_text(encoding="utf-8"))
    table = data.get("account")
    return sorted(table) if isinstance(table, dict) else []
