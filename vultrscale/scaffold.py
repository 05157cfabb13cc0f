"""``vultrscale init``: a commented ``vultrscale.toml`` and a ``.env`` template for a real fleet.

The answers (region, plan, snapshot) come from the user, from the Vultr API's lists, or from
the defaults; secrets never come from here: the ``.env`` gets placeholders only and the user
fills them in. Nothing is written when either file exists, unless ``force``: then each file
replaced is kept first as ``NAME.bak`` (the filled-in ``.env`` holds the user's secrets).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from vultrscale.config import SECRET_NAMES, FleetConfig, check_text
from vultrscale.errors import ConfigError, RuntimeFailure, UsageError, VultrscaleError
from vultrscale.redaction import is_text

if TYPE_CHECKING:
    from vultrscale.vultr.client import VultrClient

# The variables the user fills in .env; init never writes a value for them.
SECRETS = SECRET_NAMES


@dataclass(frozen=True)
class Answers:
    region: str = FleetConfig.region
    plan: str = FleetConfig.plan
    snapshot_id: str = FleetConfig.snapshot_id  # empty: the one `vultrscale snapshot` records
    # A new fleet of a directory of fleets (`init --fleet NAME`): its own name, tag and labels.
    name: str = FleetConfig.name
    tag: str = FleetConfig.tag
    label_prefix: str = FleetConfig.label_prefix
    queue: str | None = None  # worker.queue and queue.queue; None: as the template has them

    def named(self, name: str) -> Answers:
        """These answers for a fleet of its own in a directory: ``name``, the tag
        ``vultrscale-<name>``, labels ``<name>-...`` (when the name makes a label) and its own
        queue, ``name`` (a fleet name is a queue name)."""
        import re

        prefix = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:31] or self.label_prefix
        return replace(
            self, name=name, tag=f"vultrscale-{name}", label_prefix=prefix, queue=name
        )


@dataclass(frozen=True)
class Choice:
    """One entry of a list the user picks from: the id to write, and what it is."""

    id: str
    about: str


class Catalog(Protocol):
    """Where the lists come from (the Vultr API); any method may raise VultrscaleError."""

    def regions(self) -> list[Choice]: ...

    def plans(self, region: str) -> list[Choice]: ...

    def snapshots(self) -> list[Choice]: ...


class ApiCatalog:
    """The lists from the Vultr API: regions, the plans deployable in a region now (cheapest
    first), the account's complete snapshots."""

    def __init__(self, client: VultrClient) -> None:
        self.client = client

    def regions(self) -> list[Choice]:
        found = sorted(self.client.list_regions(), key=lambda r: r.id)
        return [Choice(r.id, f"{r.city}, {r.country}") for r in found]

    def plans(self, region: str) -> list[Choice]:
        available = self.client.region_availability(region)
        found = [p for p in self.client.list_plans() if p.id in available]
        found.sort(key=lambda p: (p.monthly_cost, p.id))
        return [
            Choice(p.id, f"{p.vcpu_count} vCPU, {p.ram / 1024:g} GB RAM, ${p.monthly_cost:g}/month")
            for p in found
        ]

    def snapshots(self) -> list[Choice]:
        found = [s for s in self.client.list_snapshots() if s.status == "complete"]
        return [Choice(s.id, s.description or "(no description)") for s in found]


Prompt = Callable[[str, str], str]  # (question, default) -> the answer typed
Say = Callable[[str], None]


def ask(prompt: Prompt, say: Say, catalog: Catalog | None, start: Answers) -> Answers:
    """Region, plan and snapshot, each picked from the catalog's list (by number or id) or,
    with no catalog or once it has failed, typed in."""
    failed = catalog is None

    def listing(get: Callable[[Catalog], list[Choice]]) -> list[Choice] | None:
        nonlocal failed
        if failed or catalog is None:
            return None
        try:
            return get(catalog)
        except VultrscaleError as exc:
            failed = True
            say(f"Could not list the choices from the Vultr API ({exc.message}); type the values.")
            return None

    region = _pick(prompt, say, "Region", start.region, listing(lambda c: c.regions()))
    plan = _pick(prompt, say, "Plan", start.plan, listing(lambda c: c.plans(region)))
    snapshots = listing(lambda c: c.snapshots())
    if snapshots == []:
        say(
            "No complete snapshot in the account yet: leave it empty and bake one"
            " (docs/real-fleet.md, 'Bake your image')."
        )
    snapshot = _pick(
        prompt,
        say,
        "Snapshot (empty: the one `vultrscale snapshot` records)",
        start.snapshot_id,
        snapshots,
        optional=True,
    )
    return Answers(region=region, plan=plan, snapshot_id=snapshot)


def _pick(
    prompt: Prompt,
    say: Say,
    what: str,
    default: str,
    choices: list[Choice] | None,
    *,
    optional: bool = False,
) -> str:
    """One answer: a number or an id from ``choices`` when there are any, else any text
    (empty only when ``optional``)."""
    from vultrscale.status import one_line

    for n, c in enumerate(choices or [], 1):
        say(f"  {n:3d}. {one_line(c.id):<24} {one_line(c.about)}")  # text from the API
    ids = [c.id for c in choices or []]
    while True:
        answer = prompt(what, default).strip()
        if choices and answer.isdigit() and 1 <= int(answer) <= len(choices):
            return choices[int(answer) - 1].id
        if not answer and not optional:
            say(f"{what} is required.")
        elif choices and answer and answer not in ids:
            say(f"{answer!r} is not in the list: give its number or its id.")
        else:
            return answer


def config_text(a: Answers) -> str:
    """The commented vultrscale.toml: every setting with its help, from the config's schema
    (``config.reference.template``), the answers in their keys."""
    from vultrscale.config import reference

    answers = {
        key: _toml(getattr(a, attr)) for attr, key, _ in _KEYS if getattr(a, attr) is not None
    }
    return reference.template(answers)


def env_text() -> str:
    """The .env init writes next to the config: placeholders for the secrets."""
    from vultrscale.config import reference

    return reference.init_env()


# TOML basic strings: these characters escaped, control characters as \uXXXX, every other
# character as itself (json.dumps is not TOML: it writes a character above U+FFFF as a pair of
# \uD8xx\uDCxx escapes, which TOML refuses).
_TOML_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _toml(value: str) -> str:
    """``value`` as a TOML basic string."""
    out = []
    for ch in value:
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif ch < " " or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# Which config key each answer becomes, and the flag that gives it.
_KEYS = (
    ("name", "fleet.name", "--fleet"),
    ("region", "fleet.region", "--region"),
    ("plan", "fleet.plan", "--plan"),
    ("snapshot_id", "fleet.snapshot_id", "--snapshot"),
    ("tag", "fleet.tag", "--fleet"),
    ("label_prefix", "fleet.label_prefix", "--fleet"),
    ("queue", "worker.queue", "--fleet"),
    ("queue", "queue.queue", "--fleet"),
)
_BAD_ANSWER_HINT = (
    "Nothing was written. Give a valid --region, --plan or --snapshot (or answer again): "
    "the values named above."
)


def checked_text(a: Answers, config_path: Path) -> str:
    """The config text for ``a``, loaded by the config module as ``config check`` would load
    the file; ConfigError (exit 2) naming each answer it refuses."""
    unreadable = []
    for attr, key, flag in _KEYS:
        value = getattr(a, attr)
        # bytes that were not UTF-8 on the command line
        if value is not None and not is_text(value):
            unreadable.append(f"{key} ({flag}): {value!r} is not UTF-8 text")
    if unreadable:
        raise ConfigError(unreadable, hint=_BAD_ANSWER_HINT)
    text = config_text(a)
    try:
        check_text(text, str(config_path))
    except ConfigError as exc:
        raise ConfigError(exc.problems, hint=_BAD_ANSWER_HINT) from None
    return text


def backup_path(path: Path) -> Path:
    """Where ``init --force`` keeps a copy of the file at ``path`` before replacing it."""
    return path.with_name(f"{path.name}.bak")


def refuse_existing(config_path: Path, *, force: bool, env: bool = True) -> None:
    """UsageError naming the first of the two files that exists (``--force`` overwrites files)
    or that can never be written (a directory, a link: even with ``force``; with ``force``,
    also where the copy of an existing file would go), or the first existing directory above
    them that is not a directory. ``env``: the .env is written too (else only the config)."""
    for path in (config_path, config_path.parent / ".env") if env else (config_path,):
        in_the_way = [path, backup_path(path)] if force and path.exists() else [path]
        for p in in_the_way:
            if p.is_symlink() or (p.exists() and not p.is_file()):
                raise UsageError(
                    f"{p} is {'a link' if p.is_symlink() else 'not a file'}; nothing written.",
                    hint="Move it away, or write elsewhere with --config PATH.",
                )
        if path.exists() and not force:
            raise UsageError(
                f"{path} exists; nothing written.",
                hint=f"Move it away, or pass --force to replace it (kept as {path.name}.bak).",
            )
    above = next((p for p in _ancestors(config_path.parent) if p.exists()), None)
    if above is not None and not above.is_dir():
        raise UsageError(
            f"{above} is not a directory, so {config_path} cannot be written; nothing written.",
            hint="Write elsewhere with --config PATH.",
        )


def _ancestors(directory: Path) -> list[Path]:
    """``directory`` and the directories above it, innermost first."""
    return [directory, *directory.parents]


class Written(NamedTuple):
    """What :func:`write` wrote, and the copies it kept of the files it replaced."""

    config: Path
    env: Path
    kept: tuple[Path, ...] = ()


def write(config_path: Path, answers: Answers, *, force: bool, env: bool = True) -> Written:
    """Write the config and the .env next to it (where the config loader reads it); nothing
    when either exists, unless ``force``, and nothing when an answer is not valid config. Both
    are written to temporary files next to them first and renamed into place only once both
    are whole, so a failure (a full disk) leaves neither, nor a directory it made. The .env is
    mode 0600 from its first byte. With ``force``, an existing file whose content differs is
    first kept as ``NAME.bak`` (see :func:`_write_together`)."""
    text = checked_text(answers, config_path)
    refuse_existing(config_path, force=force, env=env)
    env_path = config_path.parent / ".env"
    made: list[Path] = []
    try:
        for directory in reversed([p for p in _ancestors(config_path.parent) if not p.exists()]):
            try:
                directory.mkdir()
            except OSError as exc:
                raise _WriteFailed(directory, exc) from None
            made.append(directory)
        files = [(config_path, text, 0o666)]
        if env:
            files.append((env_path, env_text(), 0o600))
        kept = _write_together(files)
    except _WriteFailed as failed:
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise cannot_write(failed.path, failed.error, failed.verb, failed.replaced) from None
    return Written(config_path, env_path, kept)


class _WriteFailed(Exception):
    def __init__(
        self, path: Path, error: OSError, verb: str = "write", replaced: tuple[Path, ...] = ()
    ) -> None:
        self.path, self.error, self.verb, self.replaced = path, error, verb, replaced


def _copies(files: list[tuple[Path, str, int]]) -> list[tuple[Path, bytes, int]]:
    """(NAME.bak, the old bytes, mode) for each file that exists with other content than
    what is to be written there. The copy's mode is no more open than the file's own nor than
    the mode the file is written with (the .env's: 0600), and always lets the owner read it."""
    out = []
    for path, text, mode in files:
        try:
            with open(path, "rb") as f:
                old = f.read()
                held = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise _WriteFailed(path, exc, "read") from None
        if old != text.encode("utf-8"):
            out.append((backup_path(path), old, mode & (held | 0o600)))
    return out


def _sync_directory(directory: Path) -> None:
    """Make the renames done in ``directory`` durable, where the filesystem allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_together(files: list[tuple[Path, str, int]]) -> tuple[Path, ...]:
    """Each (path, text, mode) written whole to a temporary file in its directory, then all
    renamed over their paths; returns the copies it kept. An existing file with other content
    is kept first as NAME.bak (replacing an older NAME.bak), written the same way, and every
    copy is whole, in place and synced before the first file is replaced: whatever fails, and
    when, each file that was there is still at its path or in its NAME.bak, never neither.
    _WriteFailed naming the path and the files already replaced by then on any error, the
    temporaries removed, and a file this call had just put where none was removed again (never
    a copy: its original may be gone)."""
    copies = _copies(files)
    staged = [*copies, *((path, text.encode("utf-8"), mode) for path, text, mode in files)]
    kept = tuple(copy for copy, _, _ in copies)
    temps: list[Path] = []
    placed: list[Path] = []
    replaced: list[Path] = []  # files whose previous content is now only in their copy
    path = staged[0][0]
    try:
        for path, data, mode in staged:
            temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            temps.append(temp)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        for n, ((path, _, _), temp) in enumerate(zip(staged, temps, strict=True)):
            if n == len(copies):  # the copies on disk before any original is replaced
                for directory in {copy.parent for copy in kept}:
                    _sync_directory(directory)
            existed = path.exists()
            os.replace(temp, path)
            if n < len(copies):
                continue
            if not existed:
                placed.append(path)
            elif backup_path(path) in kept:
                replaced.append(path)
    except OSError as exc:
        for p in (*temps, *placed):
            with contextlib.suppress(OSError):
                p.unlink(missing_ok=True)
        raise _WriteFailed(path, exc, replaced=tuple(replaced)) from None
    return kept


# A path that cannot be written because of where it is (read-only, not a directory): the
# --config path is wrong, exit 2, as a --metrics-file whose directory is not writable. Anything
# else (a full disk, an I/O error) is a runtime failure, exit 1, as a failed metrics write.
_WRONG_PLACE = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EEXIST,
        errno.ENAMETOOLONG,
        errno.ELOOP,
    }
)


def cannot_write(
    path: Path, exc: OSError, verb: str = "write", replaced: tuple[Path, ...] = ()
) -> VultrscaleError:
    """The error for a file init could not write (or, ``verb`` "read", read to keep a copy of
    it before replacing it): nothing was left behind, or the files ``replaced`` already were,
    their previous content in their NAME.bak."""
    done = "; ".join(
        f"{p} was replaced, its previous content is in {backup_path(p)}" for p in replaced
    )
    message = f"cannot {verb} {path}: {exc.strerror or exc}; {done or 'nothing written'}."
    if exc.errno in _WRONG_PLACE:
        able = "readable" if verb == "read" else "writable"
        return UsageError(message, hint=f"Write elsewhere with --config PATH, or make it {able}.")
    return RuntimeFailure(message, hint="Free space on that disk (or fix it), then run init again.")


def next_steps(written: Written, *, env_written: bool = True) -> list[str]:
    """What ``init`` says after writing: the files, the copies it kept (never their content:
    the old .env holds secrets), and what to do next. ``env_written`` False: a new fleet in a
    directory whose .env (the account's secrets) was there already."""
    config_path, env_path, kept = written
    if not env_written:
        return [
            f"Wrote {config_path}: fleet file {config_path.name} of {config_path.parent} (its "
            f"secrets are the directory's, in {env_path}).",
            f"Then: vultrscale --config {config_path.parent} config check",
            f"      vultrscale --config {config_path.parent} --fleet {config_path.stem} "
            "reconcile --dry-run",
        ]
    said = [
        f"Kept the previous {config_path.name} as {copy}."
        if copy == backup_path(config_path)
        else f"Kept the previous {env_path.name} as {copy} (mode 0600; like the .env, keep it "
        "out of version control)."
        for copy in kept
    ]
    return [
        f"Wrote {config_path} and {env_path} (mode 0600).",
        *said,
        f"Fill in {env_path}: {', '.join(SECRETS)} (init writes no secret).",
        "Then: ssh-keygen -t ed25519 -f ~/.ssh/vultrscale_ed25519 -N ''",
        "      vultrscale config check",
    ]


# --- init --systemd: the scaler's own units ---------------------------------------------------

# The units, as deploy/ holds them (shipped in the package as vultrscale/deploy).
SYSTEMD_UNITS = ("vultrscale.service", "vultrscale-pass.service", "vultrscale-pass.timer")
# What the files say, and what init --systemd puts in their place.
_UNIT_EXEC = "/usr/local/bin/vultrscale"
_UNIT_DIR = "/etc/vultrscale"
_UNIT_CONFIG = "vultrscale.toml"
# Where the services cannot see a program or a file: ProtectHome= hides the homes,
# PrivateTmp= gives them a /tmp of their own.
_HIDDEN = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")
# A path systemd takes as it is written: no space, quote, specifier (%), variable ($), escape.
_UNIT_UNSAFE = frozenset(" \t\"'%$\\;")


def deploy_dir() -> Path:
    """The systemd units, alert rules and dashboard: ``vultrscale/deploy`` (a link to deploy/
    in the repository), shipped in the package like the cloud-init templates."""
    return Path(__file__).resolve().parent / "deploy"


_UNIT_PATH_HINT = (
    "Install vultrscale outside the home directories, e.g. "
    "`PIPX_HOME=/opt/pipx PIPX_BIN_DIR=/usr/local/bin pipx install vultrscale` or "
    "`UV_TOOL_DIR=/opt/uv-tools UV_TOOL_BIN_DIR=/usr/local/bin "
    "UV_PYTHON_INSTALL_DIR=/opt/uv-python uv tool install vultrscale`, "
    "and keep the config under /etc; nothing written."
)


def _hidden(value: str) -> bool:
    return any(value == h or value.startswith(h + "/") for h in _HIDDEN)


def _visible(what: str, value: str) -> str:
    """``value`` unless it lies where the services' sandbox hides it (UsageError)."""
    if _hidden(value):
        raise UsageError(
            f"{what} {value} is where the service's sandbox cannot see it "
            "(ProtectHome=, PrivateTmp=).",
            hint=_UNIT_PATH_HINT,
        )
    return value


def hidden_runtime(runtime: Sequence[str]) -> str | None:
    """A warning when a path the program the units name needs to start (its Python, that
    Python's prefix) lies where the sandbox hides it: every start of the service would fail
    (203/EXEC). A warning, not a refusal: the program's own path is checked, and units written
    on a build or test host whose Python lives under /root are for the host they go to."""
    hidden = [path for path in dict.fromkeys(runtime) if _hidden(path)]
    if not hidden:
        return None
    return (
        f"the Python that runs vultrscale needs {', '.join(hidden)}, where the services' "
        "sandbox cannot see it (ProtectHome=, PrivateTmp=): on this host they would fail at "
        "every start (203/EXEC)."
    )


UNIT_RUNTIME_FIX = _UNIT_PATH_HINT.removesuffix("; nothing written.") + "."


def _unit_path(what: str, value: str) -> str:
    """``value`` as a path a unit may name: absolute, outside what the sandbox hides, and
    nothing systemd would read as a specifier, a variable or a separator."""
    bad = sorted(c for c in set(value) if c in _UNIT_UNSAFE or not c.isprintable())
    if not value.startswith("/") or bad:
        why = "is not an absolute path" if bad == [] else f"holds {''.join(bad)!r}"
        raise UsageError(
            f"{what} {value!r} {why}: a systemd unit cannot name it.", hint=_UNIT_PATH_HINT
        )
    return _visible(what, value)


class UnitFiles(NamedTuple):
    """The root-only files the scaler's units read: its directory, the config's name in it."""

    directory: str = _UNIT_DIR
    config_name: str = _UNIT_CONFIG

    @property
    def config(self) -> str:
        return f"{self.directory}/{self.config_name}"

    @property
    def env(self) -> str:  # the .env `init` writes next to the config
        return f"{self.directory}/.env"

    @property
    def ssh_key(self) -> str:
        return f"{self.directory}/ssh_key"


def unit_files(config_path: Path | None) -> UnitFiles:
    """Where the units read their files: /etc/vultrscale, or ``config_path``'s directory and
    name. UsageError for one the service could not use."""
    if config_path is None:
        return UnitFiles()
    absolute = Path(os.path.abspath(config_path))
    name = absolute.name
    if ":" in name or not name or set(name) & _UNIT_UNSAFE:
        raise UsageError(
            f"The config's name {name!r} cannot be named in a unit.",
            hint="Name the config vultrscale.toml; nothing written.",
        )
    return UnitFiles(_unit_path("The config's directory", str(absolute.parent)), name)


def is_fleets_dir(config_path: Path | None) -> bool:
    """``config_path`` names a directory of fleet files: one that is, or a path without a
    suffix that is not there yet (the units are often written before the config)."""
    if config_path is None:
        return False
    return config_path.is_dir() or (not config_path.exists() and not config_path.suffix)


# The unit's lines that name the one config file, and what a directory of fleets puts there:
# every file of the directory a credential (fleets_NAME.toml), the directory of credentials
# the config (docs/fleets.md), its .env the secrets.
_CONFIG_CREDENTIAL = f"LoadCredential={_UNIT_CONFIG}:{_UNIT_DIR}/{_UNIT_CONFIG}"
_CONFIG_VARIABLE = f"VULTRSCALE_CONFIG=%d/{_UNIT_CONFIG}"
_CONFIG_COMMENT = f"#   {_UNIT_DIR}/{_UNIT_CONFIG}  the fleet's config (no secret in it)"


def systemd_units(command: Sequence[str], config_path: Path | None = None) -> dict[str, str]:
    """The units' text with ``command`` (the program, and ``-m vultrscale`` after a Python) in
    ExecStart and the files of :func:`unit_files` for /etc/vultrscale's; for a directory of
    fleets (:func:`is_fleets_dir`), every file of it loaded as the config and its .env the
    secrets, the SSH key beside it. UsageError for a path the service could not use."""
    program, *args = command
    exe = " ".join([_unit_path("The vultrscale program", program), *args])
    files = unit_files(config_path)
    fleets = is_fleets_dir(config_path)
    out = {}
    for unit in SYSTEMD_UNITS:
        text = (deploy_dir() / unit).read_text(encoding="utf-8")
        text = text.replace(f"ExecStart={_UNIT_EXEC} ", f"ExecStart={exe} ")
        if fleets:
            folder = files.config
            text = text.replace(_CONFIG_CREDENTIAL, f"LoadCredential=fleets:{folder}")
            text = text.replace(_CONFIG_VARIABLE, "VULTRSCALE_CONFIG=%d")
            text = text.replace(f"{_UNIT_DIR}/.env", f"{folder}/.env")
            text = text.replace(
                _CONFIG_COMMENT,
                f"#   {folder}/*.toml  the fleets' configs, one file each (no secret in them)",
            )
        text = text.replace(UnitFiles().config, files.config)
        text = text.replace(f"{_UNIT_DIR}/", f"{files.directory}/")
        out[unit] = text
    return out


def write_units(directory: Path, units: dict[str, str], *, force: bool) -> Written:
    """Write ``units`` into ``directory`` (mode 0644) as :func:`write` writes the config: all
    or none, an existing file refused unless ``force``, then kept as NAME.bak when it differs.
    ``Written.config`` is the directory, ``Written.env`` the first unit."""
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory} is not a directory; nothing written.", hint=_SYSTEMD_HINT)
    if not directory.is_dir():
        raise UsageError(f"{directory} does not exist; nothing written.", hint=_SYSTEMD_HINT)
    paths = [directory / name for name in units]
    for path in paths:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise UsageError(f"{path} is not a file; nothing written.", hint=_SYSTEMD_HINT)
        if path.exists() and not force:
            raise UsageError(
                f"{path} exists; nothing written.",
                hint=f"Move it away, or pass --force to replace it (kept as {path.name}.bak).",
            )
    try:
        kept = _write_together([(directory / name, text, 0o644) for name, text in units.items()])
    except _WriteFailed as failed:
        raise cannot_write(failed.path, failed.error, failed.verb, failed.replaced) from None
    return Written(directory, paths[0], kept)


_SYSTEMD_HINT = "Give an existing directory: /etc/systemd/system (as root), or one to look in."


def systemd_next_steps(written: Written, executable: str, files: UnitFiles) -> list[str]:
    """What ``init --systemd`` says after writing: the files, the copies, and the setup the
    units expect (the paths they name)."""
    return [
        f"Wrote {', '.join(SYSTEMD_UNITS)} in {written.config} (ExecStart: {executable}).",
        *(f"Kept the previous {copy.name[: -len('.bak')]} as {copy}." for copy in written.kept),
        "The services read, as root, before they drop to a user of their own:",
        f"  {files.config} (the config), {files.env} (the secrets, mode 0600), "
        f"{files.ssh_key} (the SSH key).",
        "Then, as root:",
        f"  install -d -m 0700 {files.directory}",
        f"  vultrscale --config {files.config} init   # the config and its .env; fill in the .env",
        f"  ssh-keygen -t ed25519 -N '' -f {files.ssh_key}",
        f'  and in {files.config}, [fleet] ssh_key = "{files.ssh_key}" (the services read '
        "their copy of it; your own commands as root read this setting)",
        "  systemctl daemon-reload && systemctl enable --now vultrscale.service",
        "  (or one pass per timer tick instead: systemctl enable --now vultrscale-pass.timer)",
    ]


def fleets_next_steps(written: Written, executable: str, files: UnitFiles) -> list[str]:
    """``init --systemd`` for a directory of fleets: the same units on each scaler host."""
    folder = files.config
    return [
        f"Wrote {', '.join(SYSTEMD_UNITS)} in {written.config} (ExecStart: {executable}), for "
        f"the directory of fleets {folder}.",
        *(f"Kept the previous {copy.name[: -len('.bak')]} as {copy}." for copy in written.kept),
        "The services read, as root, before they drop to a user of their own:",
        f"  {folder}/*.toml (a fleet each), {folder}/.env (the secrets, mode 0600), "
        f"{files.ssh_key} (the SSH key).",
        "Then, as root:",
        f"  install -d -m 0700 {files.directory} {folder}",
        f"  vultrscale --config {folder} init --fleet NAME   # once per fleet; fill in the .env",
        f"  ssh-keygen -t ed25519 -N '' -f {files.ssh_key}",
        f'  and in each fleet file, [fleet] ssh_key = "{files.ssh_key}"',
        "  systemctl daemon-reload && systemctl enable --now vultrscale.service",
        "Two scaler hosts: the same units and files on both, against the same database, and",
        f"  VULTRSCALE_ACCOUNT_SCALERS=2 in {folder}/.env (each keeps to half the API rate).",
    ]
