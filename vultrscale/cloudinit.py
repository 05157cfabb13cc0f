"""Render the cloud-init user-data a new worker instance boots with (templates in cloud-init/).

Every value is put into the template as a JSON string, which is also a valid YAML double-quoted
scalar, so no configuration value can change the shape of the document. The rendered text is
parsed back and checked before it is returned; a template that renders invalid is a UsageError.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

from vultrscale.config import SERVICE_NAME, Config
from vultrscale.errors import UsageError
from vultrscale.redaction import is_text, mask_url, redact
from vultrscale.workerunit import start_limit_interval_seconds, timeout_stop_seconds

USER_DATA_TEMPLATE = "user-data.yaml.tmpl"
SUDOERS_TEMPLATE = "sudoers-worker.tmpl"
WORKER_ENV_PATH = "/etc/vultrscale/worker.env"
SYSTEMCTL = "/usr/bin/systemctl"
MASKED = "*** (masked; --show-secrets prints it)"

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PUBLIC_KEY = re.compile(r"^(ssh-ed25519|ecdsa-sha2-nistp\d+|ssh-rsa) [A-Za-z0-9+/=]+$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def template_dir() -> Path:
    """Where the templates live: ``vultrscale/templates`` (a link to cloud-init/ in the repo)."""
    return Path(__file__).resolve().parent / "templates"


def read_template(name: str) -> str:
    """The text of one template; UsageError when it is missing."""
    path = template_dir() / name
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"cloud-init template {name} cannot be read ({exc.strerror})",
            hint="Reinstall vultrscale; the templates ship inside the package.",
        ) from None


def _substitute(name: str, template: str, values: dict[str, str]) -> str:
    try:
        return string.Template(template).substitute(values)
    except (KeyError, ValueError) as exc:
        raise UsageError(
            f"cloud-init template {name} uses an unknown or malformed placeholder: {exc}",
            hint=f"Placeholders are ${{name}}; known names: {', '.join(sorted(values))}.",
        ) from None


def env_quote(value: str) -> str:
    """A value for a systemd EnvironmentFile line: double-quoted, with \\ " $ ` escaped."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise UsageError(
            "a worker environment value contains a line break",
            hint="Remove line breaks from DATABASE_URL and the [worker] settings.",
        )
    escaped = re.sub(r'([\\"$`])', r"\\\1", value)
    return f'"{escaped}"'


def worker_env(
    cfg: Config, label: str, *, show_secrets: bool, concurrency: int | None = None
) -> str:
    """The worker's environment file (``/etc/vultrscale/worker.env``, mode 0600).
    ``concurrency``: the jobs an instance of its offering runs (its ``jobs_per_instance``),
    else ``worker.concurrency``."""
    # Refuses (UsageError) rather than fall back to the scaler's own credentials unasked.
    url = cfg.worker_database_url().reveal()
    w = cfg.worker
    values = {
        # mask_url cannot parse every URL (an unescaped '#'): redact what it may have missed.
        "DATABASE_URL": url if show_secrets else redact(mask_url(url), [*cfg.secrets.values()]),
        "VULTRSCALE_WORKER_ID": label,
        "VULTRSCALE_INSTANCE_LABEL": label,
        "VULTRSCALE_WORKER_APP": w.app,
        "VULTRSCALE_WORKER_CONCURRENCY": str(concurrency or w.concurrency),
        "VULTRSCALE_WORKER_DRAIN_SECONDS": f"{w.drain_seconds:g}",
        "VULTRSCALE_WORKER_LEASE_SECONDS": f"{w.lease_seconds:g}",
        "VULTRSCALE_WORKER_QUEUE": w.queue,
        "VULTRSCALE_WORKER_OUTAGE_SECONDS": f"{w.outage_seconds:g}",
    }
    lines = [f"# vultrscale worker {label}: read by the {cfg.fleet.service} unit."]
    lines += [f"{key}={env_quote(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def unit_dropin(cfg: Config) -> str:
    """A systemd drop-in for the unit: TimeoutStopSec from the configured drain time, the
    start-limit interval from the outage budget."""
    return (
        "# vultrscale: restarts that each waited out the outage budget never hit the start limit.\n"
        f"[Unit]\nStartLimitIntervalSec={start_limit_interval_seconds(cfg.worker)}\n"
        "# vultrscale: systemd waits this long for the drain before SIGKILL.\n"
        f"[Service]\nTimeoutStopSec={timeout_stop_seconds(cfg.worker)}\n"
    )


def render_sudoers(user: str, service: str, *, systemctl: str = SYSTEMCTL) -> str:
    """The sudoers drop-in: ``user`` may run only stop --no-block, is-active and start
    --no-block (a revive) of ``service``."""
    if not _USER.fullmatch(user):
        raise UsageError(f"fleet.ssh_user {user!r} is not a valid user name")
    if not SERVICE_NAME.fullmatch(service):
        raise UsageError(f"fleet.service {service!r} is not a valid systemd unit name")
    if not re.fullmatch(r"/[A-Za-z0-9_./-]+", systemctl):
        raise UsageError(f"systemctl path {systemctl!r} must be an absolute plain path")
    text = read_template(SUDOERS_TEMPLATE)
    return _substitute(
        SUDOERS_TEMPLATE, text, {"user": user, "service": service, "systemctl": systemctl}
    )


def render_user_data(
    cfg: Config,
    label: str,
    host_key_private: str,
    host_key_public: str,
    scaler_public_key: str,
    *,
    show_secrets: bool,
    concurrency: int | None = None,
) -> str:
    """The #cloud-config document for instance ``label``; ``concurrency``: its offering's
    ``jobs_per_instance`` (None: ``worker.concurrency``).

    With ``show_secrets`` False the database password and the private host key are masked
    (for display); the create call renders with ``show_secrets=True``.
    """
    if not _LABEL.fullmatch(label):
        raise UsageError(
            f"instance label {label!r} must be letters, digits, '_', '.' or '-' (max 64)",
        )
    for what, key in (("host key", host_key_public), ("scaler public key", scaler_public_key)):
        if not _PUBLIC_KEY.fullmatch(key.strip()):
            raise UsageError(
                f"the {what} is not an OpenSSH public key line (`ssh-ed25519 AAAA...`)",
                hint="Use the .pub file that ssh-keygen wrote next to fleet.ssh_key.",
            )
    if "PRIVATE KEY" not in host_key_private:
        raise UsageError("the instance host key is not an OpenSSH private key")
    values = {
        "label": label,
        "host_key_private": host_key_private if show_secrets else MASKED,
        "host_key_public": host_key_public.strip(),
        "ssh_user": cfg.fleet.ssh_user,
        "scaler_public_key": scaler_public_key.strip(),
        "worker_env": worker_env(cfg, label, show_secrets=show_secrets, concurrency=concurrency),
        "sudoers": render_sudoers(cfg.fleet.ssh_user, cfg.fleet.service),
        "unit_dropin_path": f"/etc/systemd/system/{cfg.fleet.service}.service.d/vultrscale.conf",
        "unit_dropin": unit_dropin(cfg),
        "service_unit": f"{cfg.fleet.service}.service",
    }
    # The label also appears in a comment line; it is checked above to be one plain word.
    quoted = {k: (v if k == "label" else yaml_quoted(k, v)) for k, v in values.items()}
    text = _substitute(USER_DATA_TEMPLATE, read_template(USER_DATA_TEMPLATE), quoted)
    check_user_data(text, values)
    return text


# Escaped beyond printable ASCII: raw, YAML refuses DEL and reads NEL, LS and PS as line breaks.
_NOT_ASCII = re.compile(r"[^\x20-\x7e]")


def yaml_quoted(key: str, value: str) -> str:
    """``value`` as a YAML double-quoted scalar that reads back exactly: JSON's escapes (YAML's
    double-quoted style takes them), every character outside ASCII escaped, and those beyond
    U+FFFF as one ``\\UXXXXXXXX`` (JSON's surrogate pair reads back as two lone surrogates).
    A lone surrogate (bytes that were not UTF-8) has no form that reads back: UsageError."""
    if not is_text(value):
        raise UsageError(
            f"the user-data's {key} holds bytes that are not UTF-8 text",
            hint="Check the settings and secrets it is made of (the .env file, the environment).",
        )

    def escape(m: re.Match[str]) -> str:
        code = ord(m.group())
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"

    return _NOT_ASCII.sub(escape, json.dumps(value, ensure_ascii=False))


def check_user_data(text: str, expected: dict[str, str] | None = None) -> dict[str, Any]:
    """Parse rendered user-data; UsageError unless it is a #cloud-config mapping as rendered."""
    import yaml

    if not text.startswith("#cloud-config\n"):
        raise UsageError(
            "the rendered user-data does not start with #cloud-config",
            hint=f"Keep `#cloud-config` as the first line of {USER_DATA_TEMPLATE}.",
        )
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(
            f"the rendered user-data is not valid YAML: {_yaml_position(exc)}",
            hint=f"Fix {USER_DATA_TEMPLATE}; values are inserted as quoted strings.",
        ) from None
    if not isinstance(doc, dict):
        raise UsageError(
            "the rendered user-data is not a YAML mapping",
            hint=f"Fix {USER_DATA_TEMPLATE}.",
        )
    if expected is not None:
        files = {f.get("path"): f for f in doc.get("write_files") or [] if isinstance(f, dict)}
        env = files.get(WORKER_ENV_PATH, {})
        if env.get("content") != expected["worker_env"] or str(env.get("permissions")) != "0600":
            raise UsageError(
                f"the rendered user-data does not write {WORKER_ENV_PATH} with mode 0600",
                hint=f"Fix the write_files entry in {USER_DATA_TEMPLATE}.",
            )
        keys = doc.get("ssh_keys") or {}
        if keys.get("ed25519_public") != expected["host_key_public"]:
            raise UsageError(
                "the rendered user-data does not install the pinned host key",
                hint=f"Fix the ssh_keys entry in {USER_DATA_TEMPLATE}.",
            )
    return doc


def _yaml_position(exc: Exception) -> str:
    # YAML errors quote the offending text, which may hold a secret: keep only the position.
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or "syntax error"
    if mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(problem)
