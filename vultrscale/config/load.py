"""``load(path, env, flags)``: the settings resolved from the command line's flags, the
environment (``VULTRSCALE_<SECTION>_<KEY>``, the ``.env`` merged in under it), the config file
and the defaults, in that order, each value read by its setting's type (``schema``); then every
check (``checks.validate``). One ConfigError lists every problem, each naming its key."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vultrscale.config.checks import validate
from vultrscale.config.files import exists, is_file, parse_toml, read_dotenv, resolve_config_path
from vultrscale.config.kinds import Table, Tables, spec_of
from vultrscale.config.model import Config
from vultrscale.config.schema import SECTIONS, all_settings, default_of, env_name
from vultrscale.config.secrets import (
    DEFAULT_API_URL,
    NOT_SETTINGS,
    SECRET_NAMES,
    Secrets,
    api_url_problem,
)
from vultrscale.core.values import shown
from vultrscale.errors import ConfigError
from vultrscale.redaction import is_text

# The variables read besides VULTRSCALE_*: the secrets and the API's address.
_READ_AS_TEXT = frozenset({*SECRET_NAMES, "VULTR_API_URL"})


def load(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    *,
    require_file: bool | None = None,
) -> Config:
    """Load and validate the configuration. Raises ConfigError listing every problem.

    ``path`` None means: ``$VULTRSCALE_CONFIG``, else ``./vultrscale.toml`` if present.
    ``flags`` maps dotted keys (``"policy.max_instances"``) to values given on the command line.
    """
    env = dict(os.environ if env is None else env)
    if path is None:
        cfg_path, must_exist = resolve_config_path(None, env)
    else:
        cfg_path, must_exist = Path(path).expanduser(), True
    if require_file is not None:
        must_exist = require_file

    data: dict[str, Any] = {}
    source = "defaults"
    if is_file(cfg_path, "config file"):
        try:
            text = cfg_path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                [f"{cfg_path} is not UTF-8 text (byte {exc.start} cannot be read)"],
                hint="Save the config file as UTF-8.",
            ) from None
        except OSError as exc:
            raise ConfigError(
                [f"cannot read {cfg_path}: {exc.strerror}"],
                hint="Make the file readable by this user, or pass another with --config.",
            ) from None
        data = parse_toml(text, str(cfg_path), "is")
        source = str(cfg_path)
    elif must_exist:
        if exists(cfg_path):
            raise ConfigError(
                [f"config file {cfg_path} is not a file (a directory?)"],
                hint="Pass the path of a TOML file with --config.",
            )
        raise ConfigError(
            [f"config file {cfg_path} does not exist"],
            hint="Pass an existing file with --config, or unset VULTRSCALE_CONFIG to use defaults.",
        )

    # .env next to the config file (or in the working directory): weaker than the real env.
    dotenv = read_dotenv(cfg_path.parent / ".env" if source != "defaults" else Path(".env"))
    hidden = frozenset(
        n for n in SECRET_NAMES if n in env and not env[n].strip() and dotenv.get(n, "").strip()
    )
    return _resolve(data, {**dotenv, **env}, flags or {}, source, hidden)


def check_text(text: str, where: str) -> None:
    """ConfigError listing every problem ``config check`` would find in ``text`` as the config
    file ``where``, read on its own (no environment, no .env, no secrets); None if it loads."""
    _resolve(parse_toml(text, where, "would be"), {}, {}, where)


def _resolve(
    data: dict[str, Any],
    merged_env: Mapping[str, str],
    flags: Mapping[str, Any],
    source: str,
    hidden: frozenset[str] = frozenset(),
) -> Config:
    """The config from a file's ``data``, the environment (.env merged in) and the flags;
    ConfigError listing every problem."""
    problems: list[str] = []
    # Every problem at once: a key whose value cannot be read (or that a misspelling left unset)
    # takes its default for the checks below, and their findings about that key are left out:
    # they would be about the default ("min_instances (10) is above max_instances (5)" when the
    # cap set is 20 under a misspelled name).
    failed: set[str] = set()
    # Bytes that are not UTF-8 reach os.environ as lone surrogates: no library takes them (libpq
    # and httpx raise UnicodeEncodeError). Said here by name, never by value (it may be a secret).
    undecodable = sorted(
        n
        for n, v in merged_env.items()
        if (n in _READ_AS_TEXT or n.startswith("VULTRSCALE_")) and not is_text(v)
    )
    problems.extend(f"{n} is not UTF-8 text (in the environment or .env)" for n in undecodable)
    failed.update(k for n in undecodable if (k := _setting_key(n)))
    merged_env = {n: v for n, v in merged_env.items() if n not in undecodable}
    if "secrets" in data or any(k in data for k in ("api_key", "database_url")):
        problems.append(
            "secrets are not read from the config file: set VULTR_API_KEY and DATABASE_URL "
            "in the environment or .env instead"
        )
        data = {k: v for k, v in data.items() if k not in ("secrets", "api_key", "database_url")}

    for key in data:
        if key not in SECTIONS:
            problems.append(f"unknown section [{key}] (known: {', '.join(SECTIONS)})")

    # Environment overrides: VULTRSCALE_<SECTION>_<KEY>.
    layered: dict[str, dict[str, Any]] = {
        s: dict(data.get(s, {})) if isinstance(data.get(s), dict) else {} for s in SECTIONS
    }
    # The settings a misspelled variable or a section that is not a table was meant to set.
    meant_keys: set[str] = set()
    for s in SECTIONS:
        if s in data and not isinstance(data[s], dict):
            problems.append(f"[{s}] must be a table")
            meant_keys.update(f"{s}.{f.name}" for f in dataclasses.fields(SECTIONS[s]))
    for name, value in merged_env.items():
        if not name.startswith("VULTRSCALE_") or name in NOT_SETTINGS:
            continue
        rest = name[len("VULTRSCALE_") :].lower()
        section, _, key = rest.partition("_")
        if section in SECTIONS and key:
            layered[section][key] = _FromEnv(value)
        else:  # a misspelled section was ignored: VULTRSCALE_POLICIES_MAX_INSTANCES=1
            problem, meant = _unknown_variable(name)
            problems.append(problem)
            meant_keys.add(_setting_key(meant) or "")
    for dotted, value in flags.items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        layered.setdefault(section, {})[key] = value
    for dotted in meant_keys - {""}:
        section, _, key = dotted.partition(".")
        if key not in layered[section]:  # the key meant is at its default
            failed.add(dotted)

    built = {
        section: _build(section, cls, layered[section], problems, failed)
        for section, cls in SECTIONS.items()
    }
    api_url = merged_env.get("VULTR_API_URL", "") or DEFAULT_API_URL
    url_problem = api_url_problem(api_url)
    if url_problem:
        problems.append(url_problem)
    secrets = dataclasses.replace(Secrets.from_env(merged_env), hidden_by_env=hidden)
    problems.extend(secrets.problems())
    cfg = Config(**built, secrets=secrets, api_url=api_url.rstrip("/"), source=source)
    problems.extend(p for p in validate(cfg) if not _names_any(p, failed))
    if problems:
        raise ConfigError(problems)
    return cfg


def _names_any(problem: str, keys: set[str]) -> bool:
    """Whether ``problem`` names one of the dotted ``keys`` (``policy.floor`` also names
    ``policy.floor[0].cron``)."""
    return any(re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", problem) for k in keys)


def setting_key_problem(dotted: str) -> str | None:
    """None if ``dotted`` names a setting (``policy.max_instances``), else what is wrong, with
    the nearest setting."""
    import difflib

    keys = [s.dotted for s in all_settings()]
    if dotted in keys:
        return None
    close = difflib.get_close_matches(dotted, keys, n=1)
    guess = f"; did you mean {close[0]}?" if close else ""
    return f"{shown(dotted)} is not a setting (SECTION.KEY as in the config file){guess}"


def _variables() -> dict[str, str]:
    """Every setting's variable and the dotted key it sets; a section's table too
    (``VULTRSCALE_POLICY_FORECAST``: ``policy.forecast``)."""
    out = {s.env: s.dotted for s in all_settings()}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            out.setdefault(env_name(section, f.name), f"{section}.{f.name}")
    return out


def _setting_key(name: str) -> str | None:
    """The dotted key (``policy.max_instances``) the variable ``name`` sets, if it is a setting."""
    return None if name in NOT_SETTINGS else _variables().get(name)


def _unknown_variable(name: str) -> tuple[str, str]:
    """The problem with a VULTRSCALE_ variable that names no setting, and the nearest variable
    ("" if none is near)."""
    import difflib

    close = difflib.get_close_matches(name, [*_variables(), *NOT_SETTINGS], n=1)
    guess = f"; did you mean {close[0]}?" if close else ""
    sections = ", ".join(s.upper() for s in SECTIONS)
    problem = (
        f"{shown(name)[1:-1]} (in the environment or .env) is not a setting: settings are "
        f"VULTRSCALE_<SECTION>_<KEY> with a SECTION of {sections}{guess}"
    )
    return problem, close[0] if close else ""


class _FromEnv(str):
    """A setting as the environment gives it: text, read as a TOML value only for a setting that
    is not text (``VULTRSCALE_WORKER_QUEUE=2024`` is the queue "2024", not a number)."""


def _from_env(value: str) -> Any:
    """Environment values are strings; let TOML read numbers and booleans."""
    import tomllib

    try:
        return tomllib.loads(f"v = {value}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # not a value: said as the text it is
        return value


def _build(
    section: str, cls: type, raw: dict[str, Any], problems: list[str], failed: set[str]
) -> Any:
    """The section's (or table's) value from ``raw``, each value read by its setting's type; a
    key that cannot be read is a problem, named in ``failed``, and takes its default."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    raw = _tables_joined(raw, fields)
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{section}.{key}"
        f = fields.get(key)
        if f is None:
            problems.append(_unknown_key(section, key, value, list(fields), raw, failed))
            continue
        spec = spec_of(f)
        if isinstance(value, _FromEnv) and spec.kind.env_toml:
            value = _from_env(value)
        try:
            if isinstance(spec.kind, Table):
                if not isinstance(value, dict):
                    raise ValueError(f"{where}: expected a [{where}] table, got {shown(value)}")
                kwargs[key] = _build(where, spec.kind.item, value, problems, failed)
            elif isinstance(spec.kind, Tables):
                given = " and ".join(f"{section}.{k}" for k in spec.replaces if k in raw)
                if given:
                    problems.append(
                        f"{where}: given together with {given}: keep [[{where}]] and delete "
                        f"{given} (the first of [[{where}]] is the preferred one), or delete "
                        f"[[{where}]] to keep {' and '.join(spec.replaces)} alone"
                    )
                kwargs[key] = _build_tables(where, spec.kind, value, problems)
            else:
                kwargs[key] = spec.kind.read(value, where)
        except ValueError as exc:
            problems.append(str(exc))
            failed.add(where)
    return cls(**kwargs)


def _unknown_key(
    section: str, key: str, value: Any, known: list[str], raw: dict[str, Any], failed: set[str]
) -> str:
    import difflib

    close = difflib.get_close_matches(key, known, n=1)
    if close and close[0] not in raw:  # the key meant is at its default
        failed.add(f"{section}.{close[0]}")
    guess = f"did you mean {close[0]}? " if close else ""
    named = f"{shown(f'{section}.{key}')[1:-1]}:"
    if isinstance(value, _FromEnv):  # named as set: the file does not have it
        variable = shown(env_name(section, key))[1:-1]
        named = f"{variable} (in the environment or .env): {named[:-1]} is an"
        guess = f"did you mean {env_name(section, close[0])}? " if close else ""
    return f"{named} unknown key ({guess}known in [{section}]: {', '.join(known)})"


def _tables_joined(
    raw: dict[str, Any], fields: Mapping[str, dataclasses.Field[Any]]
) -> dict[str, Any]:
    """A table's keys set one at a time (``VULTRSCALE_POLICY_FORECAST_MODE``, a sweep's
    ``policy.forecast.mode``) joined to the table the file may give."""
    out = raw
    for name, f in fields.items():
        if not isinstance(spec_of(f).kind, Table):
            continue
        pieces = [k for k in out if k.startswith((f"{name}_", f"{name}."))]
        if not pieces:
            continue
        out = dict(out)
        table = out.get(name)
        joined = dict(table) if isinstance(table, dict) else {}
        for k in pieces:
            joined[k[len(name) + 1 :]] = out.pop(k)
        out[name] = joined
    return out


def _build_tables(where: str, kind: Tables, value: Any, problems: list[str]) -> tuple[Any, ...]:
    """An array of tables (``[[fleet.offerings]]``), each table read with the fields of
    ``kind.item``; one that cannot be read is a problem and left out."""
    fields = dataclasses.fields(kind.item)
    names = [f.name for f in fields]
    if not isinstance(value, list) or (kind.nonempty and not value):
        required = " and ".join(f.name for f in fields if default_of(f) is dataclasses.MISSING)
        raise ValueError(f"{where}: expected [[{where}]] tables, each with {required}")
    out = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{at}: expected a table with {', '.join(names)}")
            continue
        for key in sorted(set(entry) - set(names)):
            problems.append(f"{at}.{key}: unknown key (known: {', '.join(names)})")
        kwargs, bad = {}, False
        for f in fields:
            spec = spec_of(f)
            if f.name not in entry:
                if default_of(f) is dataclasses.MISSING:
                    problems.append(f"{at}.{f.name}: required, {spec.allowed_text()}")
                    bad = True
                continue
            try:
                kwargs[f.name] = spec.kind.read(entry[f.name], f"{at}.{f.name}")
            except ValueError as exc:
                problems.append(str(exc))
                bad = True
        if not bad:
            out.append(kind.item(**kwargs))
    return tuple(out)
