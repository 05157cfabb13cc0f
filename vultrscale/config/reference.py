"""What is written from the schema rather than by hand: the commented ``vultrscale.toml`` that
``vultrscale init`` writes, ``.env.example`` and ``docs/reference/settings.md``
(``scripts/gen_reference.py`` writes the two files, ``--check`` says when they are stale)."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from vultrscale.config.kinds import (
    SECONDS,
    TEXT,
    Spec,
    Table,
    Tables,
    WaitTarget,
    spec_of,
)
from vultrscale.config.schema import (
    SECTION_HELP,
    SECTIONS,
    Setting,
    default_of,
    env_name,
    settings_of,
)
from vultrscale.config.secrets import VARIABLES
from vultrscale.core.values import format_duration, toml_value

# Sections the template shows commented out, as examples.
_COMMENTED_SECTIONS = frozenset({"simulate", "account"})
_WIDTH = 100
_COMMENT_AT = 30  # the column the template's comments start at

TEMPLATE_HEAD = """\
# vultrscale.toml, written by `vultrscale init`. Check it with `vultrscale config check`.
# Secrets never go here: VULTR_API_KEY, DATABASE_URL and WORKER_DATABASE_URL come from the
# environment or the .env next to this file. Any key can also be set as
# VULTRSCALE_<SECTION>_<KEY> (VULTRSCALE_POLICY_MAX_INSTANCES=3). Durations: "90s", "5m", "1h".
"""
_GENERATED = "Generated from the schema (vultrscale/config/schema.py) by scripts/gen_reference.py."


def _about(section: str) -> str:
    """What a section is for; a table inside one (``policy.forecast``): its field's help."""
    if section in SECTION_HELP:
        return SECTION_HELP[section]
    parent, _, key = section.rpartition(".")
    fields = {f.name: f for f in dataclasses.fields(SECTIONS[parent])}
    return spec_of(fields[key]).help


# --- values as each file writes them -------------------------------------------------------


def _duration(td: timedelta) -> str:
    days = td / timedelta(days=1)
    return f"{days:g}d" if days >= 1 and days.is_integer() else format_duration(td)


def toml_text(spec: Spec, value: Any) -> str:
    """``value`` of a setting as the config file writes it."""
    if isinstance(value, timedelta):
        return f'"{_duration(value)}"'
    if isinstance(value, WaitTarget):
        return f'"{value}"'
    if spec.kind is SECONDS:
        return f"{value:g}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return toml_value({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    return toml_value(value)


def _example(spec: Spec, value: Any) -> str:
    """The TOML text the template writes: the declared example, else the default."""
    return spec.example or toml_text(spec, value)


def env_text(spec: Spec, value: Any) -> str:
    """``value`` as the environment gives it: text as it is, anything else as TOML writes it."""
    if spec.kind is TEXT or isinstance(value, timedelta | WaitTarget):
        return str(_duration(value) if isinstance(value, timedelta) else value)
    if spec.kind is SECONDS:
        return f"{value:g}"
    return toml_text(spec, value)


def _item_example(cls: type) -> dict[str, Any]:
    """One table of an array of tables, from its fields' examples and defaults."""
    import tomllib

    out = {}
    for f in dataclasses.fields(cls):
        spec = spec_of(f)
        text = spec.example or (toml_text(spec, default_of(f)) if _has_default(f) else "")
        if text:
            out[f.name] = tomllib.loads(f"v = {text}")["v"]
    return out


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return default_of(f) is not dataclasses.MISSING


# --- init's template --------------------------------------------------------------------------


def _commented_line(code: str, help: str, *, hash_code: bool = False) -> list[str]:
    """``code`` with ``help`` as a comment from column _COMMENT_AT on, wrapped under itself."""
    code = f"# {code}" if hash_code else code
    if not help:
        return [code]
    if len(code) > _COMMENT_AT + 10:  # too long for the comment beside it: above it
        return [*_comment(help), code]
    at = max(_COMMENT_AT, len(code) + 1)
    lines = textwrap.wrap(help, width=_WIDTH - at - 2, break_on_hyphens=False)
    out = [f"{code.ljust(at)}# {lines[0]}"]
    out += [f"{'#' if hash_code else ''}".ljust(at) + f"# {line}" for line in lines[1:]]
    return out


def _help(spec: Spec) -> str:
    """A setting's help in the template, with its choices when the help does not name them."""
    if spec.choices and not any(c in spec.help for c in spec.choices):
        return f"{spec.help}: {' | '.join(spec.choices)}"
    return spec.help


def template(values: Mapping[str, str] = {}) -> str:
    """The commented vultrscale.toml: every setting, with its default (or example) and help.
    ``values``: TOML text for some dotted keys (the answers init asked for)."""
    out = [TEMPLATE_HEAD.rstrip("\n")]
    for section, cls in SECTIONS.items():
        out.append("")
        out += _template_section(section, cls, values, section in _COMMENTED_SECTIONS)
    return "\n".join(out) + "\n"


def _template_section(
    section: str, cls: type, values: Mapping[str, str], commented: bool
) -> list[str]:
    out = _commented_line(f"[{section}]", _about(section), hash_code=commented)
    arrays: list[tuple[str, Spec, type]] = []
    tables: list[tuple[str, type]] = []
    for f in dataclasses.fields(cls):
        spec, dotted = spec_of(f), f"{section}.{f.name}"
        if isinstance(spec.kind, Tables):
            arrays.append((dotted, spec, spec.kind.item))
        elif isinstance(spec.kind, Table):
            tables.append((dotted, spec.kind.item))
        else:
            text = values.get(dotted) or _example(spec, default_of(f))
            hashed = commented or spec.commented
            out += _commented_line(f"{f.name} = {text}", _help(spec), hash_code=hashed)
    for dotted, spec, item in arrays:
        out.append("")
        out += _commented_line(f"[[{dotted}]]", spec.help, hash_code=True)
        for f in dataclasses.fields(item):
            g = spec_of(f)
            text = g.example or (toml_text(g, default_of(f)) if _has_default(f) else '""')
            out += _commented_line(f"{f.name} = {text}", g.help, hash_code=True)
    for dotted, item in tables:
        out.append("")
        out += _template_section(dotted, item, values, commented)
    return out


# --- .env.example ------------------------------------------------------------------------------


def _comment(text: str) -> list[str]:
    return [f"# {line}" for line in textwrap.wrap(text, width=_WIDTH - 2, break_on_hyphens=False)]


def _heading(title: str) -> str:
    return f"# --- {title} ".ljust(_WIDTH, "-")


def _env_value(text: str) -> str:
    """A value as a .env line holds it: quoted when it has spaces, quotes or a '#'."""
    return f"'{text}'" if any(c in text for c in " \"'#") else text


def env_example() -> str:
    """``.env.example``: every variable vultrscale reads, the settings commented out."""
    out = [
        "# Every environment variable vultrscale reads. Copy to .env next to your vultrscale.toml",
        "# (or export them); the real environment wins over .env. No real secrets here.",
        f"# {_GENERATED}",
    ]
    groups = {
        "secrets": "secrets (only ever from the environment or .env, never from the TOML file)",
        "where": "where things are",
    }
    for group, title in groups.items():
        out += ["", _heading(title)]
        out += _variables(group)
    out += ["", _heading("every setting, as VULTRSCALE_<SECTION>_<KEY>: stronger than the file")]
    out += _comment(
        "Commented out: a line set here is stronger than vultrscale.toml and weaker than a flag "
        "(an empty VULTRSCALE_WORKER_APP= is an invalid app). Uncomment only what you mean to "
        "override; each shows its default. The key's reference: docs/reference/settings.md."
    )
    for section, cls in SECTIONS.items():
        out += ["", f"# [{section}] {_about(section)}"]
        for s in settings_of(section, cls):  # a table's keys one by one
            out += _comment(s.spec.help)
            out.append(f"# {s.env}={_env_value(_env_default(s))}")
    out += ["", _heading("the worker (`vultrscale worker`, on each instance from cloud-init)")]
    out += _variables("worker")
    out += ["", _heading("tests")]
    out += _variables("tests")
    return "\n".join(out) + "\n"


def _variables(group: str) -> list[str]:
    out = []
    for v in VARIABLES:
        if v.group == group:
            out += _comment(v.help)
            out.append(f"{'# ' if v.commented else ''}{v.name}={v.example}")
    return out


def _env_default(s: Setting) -> str:
    if isinstance(s.spec.kind, Tables):
        return toml_value([_item_example(s.spec.kind.item)])
    return env_text(s.spec, s.default)


def init_env() -> str:
    """The ``.env`` that ``vultrscale init`` writes next to the config: the secrets, empty for
    the user to fill in (each with an example), and the API's address commented out."""
    out = _comment(
        "This .env, written by `vultrscale init`: the secrets vultrscale reads, next to "
        "vultrscale.toml. Fill in the three values below; the real environment wins over this "
        "file. Keep it mode 0600 and out of version control."
    )
    for v in VARIABLES:
        if v.group == "secrets":
            out += ["", *_comment(v.help)]
            out += [f"# Example: {v.example}"] * bool(v.example)
            out.append(f"{v.name}=")
        elif v.name == "VULTR_API_URL":
            out += ["", *_comment(v.help), f"# {v.name}={v.example}"]
    return "\n".join(out) + "\n"


# --- docs/reference/settings.md ---------------------------------------------------------------


def _type_name(spec: Spec) -> str:
    if isinstance(spec.kind, Tables):
        return f"array of [[tables]]{' (at least one)' if spec.kind.nonempty else ''}"
    return spec.kind.name


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def _row(key: str, spec: Spec, default: str, variable: str) -> str:
    allowed = spec.allowed_text()
    if spec.empty:
        allowed = f"{allowed}; empty: {spec.empty}" if allowed else f"empty: {spec.empty}"
    cells = [f"`{key}`", _type_name(spec), default, allowed or "", variable, spec.help]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _default_cell(f: dataclasses.Field[Any], spec: Spec) -> str:
    if not _has_default(f):
        return "required"
    value = default_of(f)
    if isinstance(spec.kind, Tables) and not value:
        return "none"
    return f"`{toml_text(spec, value)}`"


_HEADER = "| key | type | default | allowed | variable | help |\n|---|---|---|---|---|---|"


def settings_page() -> str:
    """docs/reference/settings.md: a table per section."""
    out = [
        "# Settings reference",
        "",
        f"<!-- {_GENERATED} Edit the schema, then run it. -->",
        "",
        "Every setting of `vultrscale.toml`, by section. Precedence: command-line flag > "
        "environment > config file > default; each setting can be given in the environment as "
        "the variable named here. Durations are written `250ms`, `90s`, `5m`, `1.5h`, `2d` or "
        "as a bare number of seconds, at most 366 days. `vultrscale config check` reports "
        "every problem at once, each naming its key; the rules that relate several settings "
        "(`policy.min_instances` at most `policy.max_instances`, `drain.timeout` at least the "
        "unit's TimeoutStopSec, ...) are checked there too.",
    ]
    for section, cls in SECTIONS.items():
        out += _page_section(section, cls)
    out += [
        "",
        "## Variables that are not settings",
        "",
        "Secrets come only from the environment or the `.env` next to the config file, never "
        "from the TOML file.",
        "",
        "| variable | what it is |",
        "|---|---|",
    ]
    out += [f"| `{v.name}` | {_cell(v.help)} |" for v in VARIABLES]
    return "\n".join(out) + "\n"


def _page_section(section: str, cls: type) -> list[str]:
    about = _about(section)
    out = ["", f"## [{section}]", "", f"{about[:1].upper()}{about[1:]}.", "", _HEADER]
    arrays, tables = [], []
    for f in dataclasses.fields(cls):
        spec, key = spec_of(f), f"{section}.{f.name}"
        if isinstance(spec.kind, Table):
            tables.append((key, spec.kind.item))
            continue
        out.append(_row(key, spec, _default_cell(f, spec), f"`{env_name(section, f.name)}`"))
        if isinstance(spec.kind, Tables):
            arrays.append((key, spec.kind.item))
    for key, item in arrays:
        out += ["", f"### [[{key}]]", "", "Each table of the array:", "", _HEADER]
        for f in dataclasses.fields(item):
            g = spec_of(f)
            out.append(_row(f"{key}[].{f.name}", g, _default_cell(f, g), ""))
    for key, item in tables:
        out += _page_section(key, item)
    return out
