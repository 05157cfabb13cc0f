"""Where the settings are read from: the config file (TOML) and the ``.env`` next to it, each
a ConfigError with a fix when it cannot be read."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vultrscale.errors import ConfigError

DEFAULT_CONFIG_NAME = "vultrscale.toml"
_BOM = "\ufeff"
_NESTED_HINT = "Flatten the value: TOML arrays and tables inside each other, thousands deep."


def resolve_config_path(explicit: str | None, env: Mapping[str, str]) -> tuple[Path, bool]:
    """The config file to read and whether it must exist (named explicitly)."""
    if explicit:
        return Path(explicit).expanduser(), True
    if env.get("VULTRSCALE_CONFIG"):
        return Path(env["VULTRSCALE_CONFIG"]).expanduser(), True
    return Path(DEFAULT_CONFIG_NAME), False


def read_dotenv(path: Path, *, strict: bool = True) -> dict[str, str]:
    """KEY=VALUE lines of a .env file (``export`` and quotes allowed); absent file: empty.
    ``strict``: a line python-dotenv cannot read is a ConfigError (else it is left out: for
    redacting what the readable lines hold, on an error path)."""
    if not is_file(path, ".env file"):
        return {}
    import io

    from dotenv import dotenv_values
    from dotenv.parser import parse_stream

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError([f"cannot read {path}: {exc.strerror}"]) from None
    # Bytes that are not UTF-8 kept as the environment keeps them (lone surrogates): `load`
    # names the variable instead of failing on the whole file.
    text = raw.decode("utf-8", errors="surrogateescape")
    # A line python-dotenv cannot read was dropped with a log line: a DATABASE_URL with its
    # closing quote missing became "DATABASE_URL is not set". Named by its number, never shown.
    bad = [b.original.line for b in parse_stream(io.StringIO(text)) if b.error]
    if bad and strict:
        lines = ", ".join(str(n) for n in bad)
        raise ConfigError(
            [f"{path}: line(s) {lines} are not KEY=VALUE lines python-dotenv can read"],
            hint="Look for a quote left open or a line without '='; quote values with spaces.",
        )
    return {k: v for k, v in dotenv_values(stream=io.StringIO(text)).items() if v is not None}




def parse_toml(text: str, where: str, verb: str) -> dict[str, Any]:
    """The TOML document ``text`` of the config file ``where``; ConfigError with a fix if it
    cannot be read."""
    import tomllib  # here: a command whose config is missing fails without it

    if text.startswith(_BOM):  # tomllib's words were "Invalid statement (at line 1, column 1)"
        raise ConfigError(
            [f"{where} starts with a UTF-8 byte-order mark (BOM), which TOML does not allow"],
            hint="Save the file as UTF-8 without a BOM (an editor's 'UTF-8', not 'UTF-8 with "
            "BOM'), or remove it: sed -i '1s/^\\xEF\\xBB\\xBF//' FILE",
        )
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            [f"{where} {verb} not valid TOML: {exc}"],
            hint="Fix the TOML syntax (strings in quotes, one key per line).",
        ) from None
    except RecursionError:
        raise ConfigError(
            [f"{where} {verb} nested too deeply to read (arrays or tables inside each other)"],
            hint=_NESTED_HINT,
        ) from None


def is_file(path: Path, what: str) -> bool:
    """``path.is_file()``, a directory on the way that this user cannot search (which
    ``is_file`` raises for) a ConfigError saying so."""
    try:
        return path.is_file()
    except OSError as exc:
        raise _unreachable(path, what, exc) from None


def exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError as exc:
        raise _unreachable(path, "config file", exc) from None


def _unreachable(path: Path, what: str, exc: OSError) -> ConfigError:
    return ConfigError(
        [
            f"cannot look up the {what} {path}: {exc.strerror or exc} (a directory on its path "
            "cannot be searched by this user?)"
        ],
        hint="Give this user search (x) permission on every directory of the path, or move "
        "the file where it can read it.",
    )
