"""Rendered user-data against the real validators: cloud-init's schema, visudo, sh, bash -n.

(``systemd-analyze verify`` of worker.service lives with the worker runtime's tests.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from vultrscale import cloudinit
from vultrscale.config import Config, load
from vultrscale.core.clock import FakeClock
from vultrscale.errors import UsageError
from vultrscale.fake_vultr import SimTransport, Simulator
from vultrscale.ssh import generate_host_key
from vultrscale.vultr.client import VultrClient

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NASTY_PASSWORD = "p@ss w\"o'rd$HOME`id`\\#: - [x] {y}"
# libpq's key=value form keeps every awkward character (a URL would percent-encode them: libpq
# refuses a URL with a raw space and would quote the password back in its error)
NASTY_URL = "host=db.internal port=5432 user=app dbname=jobs password='{}'".format(
    NASTY_PASSWORD.replace("\\", "\\\\").replace("'", "\\'")
)

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {
        "env": {
            "DATABASE_URL": "postgresql://admin:adminpw99@10.0.0.5/jobs",
            "WORKER_DATABASE_URL": "postgresql://vultrscale_worker:s3cretpw@10.0.0.5/jobs",
        }
    },
    "scaler-url-opted-in": {
        "env": {
            "DATABASE_URL": "postgresql://app:s3cretpw@10.0.0.5/jobs",
            "VULTRSCALE_WORKER_USE_SCALER_DATABASE_URL": "true",
        }
    },
    "worker-url-and-settings": {
        "env": {
            "DATABASE_URL": "postgresql://admin:adminpw99@10.0.0.5/jobs",
            "WORKER_DATABASE_URL": "postgresql://worker:workerpw77@10.1.0.5/jobs?sslmode=require",
            "VULTRSCALE_WORKER_CONCURRENCY": "8",
            "VULTRSCALE_WORKER_DRAIN_SECONDS": "120",
            "VULTRSCALE_DRAIN_TIMEOUT": "10m",
            "VULTRSCALE_WORKER_QUEUE": "emails:high",
            "VULTRSCALE_WORKER_APP": "shop.tasks:handle",
        },
    },
    "other-user-and-unit": {
        "env": {
            "WORKER_DATABASE_URL": "postgresql://app:s3cretpw@10.0.0.5/jobs",
            "VULTRSCALE_FLEET_SSH_USER": "deploy",
            "VULTRSCALE_FLEET_SERVICE": "jobs@1",
        },
    },
    "nasty-password": {"env": {"WORKER_DATABASE_URL": NASTY_URL}},
    # beyond U+FFFF (JSON writes a surrogate pair, which YAML reads as two lone surrogates),
    # and characters YAML would take for line breaks if written raw
    "unicode-password": {
        "env": {"WORKER_DATABASE_URL": "postgresql://w:Pw\U0001f600\u2028\u0085\u00fc5@h/jobs"}
    },
}


def _config(variant: str) -> Config:
    return load(None, VARIANTS[variant]["env"], None, require_file=False)


def _render(cfg: Config, *, show_secrets: bool, label: str = "worker-7f3a") -> tuple[str, str]:
    private, public = generate_host_key()
    _, scaler = generate_host_key()
    text = cloudinit.render_user_data(
        cfg, label, private, public, scaler, show_secrets=show_secrets
    )
    return text, private


def _schema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["cloud-init", "schema", "--config-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


needs_cloud_init = pytest.mark.skipif(
    shutil.which("cloud-init") is None, reason="cloud-init missing (apt-get install cloud-init)"
)


@needs_cloud_init
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cloud_init_accepts_every_rendered_user_data(variant: str, tmp_path: Path) -> None:
    cfg = _config(variant)
    for show in (True, False):
        text, _ = _render(cfg, show_secrets=show)
        path = tmp_path / f"user-data-{show}.yaml"
        path.write_text(text)
        result = _schema(path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Valid cloud-config" in result.stdout


@needs_cloud_init
def test_the_schema_check_does_fail_on_a_broken_document(tmp_path: Path) -> None:
    # The validator above can say no: a key of the wrong type is refused.
    text, _ = _render(_config("defaults"), show_secrets=True)
    path = tmp_path / "broken.yaml"
    path.write_text(text.replace("ssh_deletekeys: true", "ssh_deletekeys: [1, 2]"))
    assert _schema(path).returncode != 0


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_document_holds_exactly_the_values_given(variant: str) -> None:
    cfg = _config(variant)
    private, public = generate_host_key()
    _, scaler = generate_host_key()
    doc = yaml.safe_load(
        cloudinit.render_user_data(cfg, "worker-7f3a", private, public, scaler, show_secrets=True)
    )
    assert doc["ssh_keys"] == {"ed25519_private": private, "ed25519_public": public}
    assert doc["ssh_deletekeys"] is True
    [user] = doc["users"]
    assert user["name"] == cfg.fleet.ssh_user and user["ssh_authorized_keys"] == [scaler]
    assert user["hashed_passwd"] == "*" and user["lock_passwd"] is False  # key login works
    files = {f["path"]: f for f in doc["write_files"]}
    env = files["/etc/vultrscale/worker.env"]
    assert env["permissions"] == "0600" and env["owner"] == "root:root"
    dropin = files[f"/etc/systemd/system/{cfg.fleet.service}.service.d/vultrscale.conf"]
    assert "TimeoutStopSec=" in dropin["content"]
    assert files["/etc/sudoers.d/vultrscale-worker"]["permissions"] == "0440"
    assert doc["runcmd"][-1] == ["systemctl", "enable", "--now", f"{cfg.fleet.service}.service"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_env_file_reads_back_exactly_in_a_real_shell(variant: str, tmp_path: Path) -> None:
    # systemd's EnvironmentFile and sh share these double-quote rules (\\ " $ ` escaped).
    cfg = _config(variant)
    text, _ = _render(cfg, show_secrets=True, label="worker-9")
    content = {f["path"]: f for f in yaml.safe_load(text)["write_files"]}[
        "/etc/vultrscale/worker.env"
    ]["content"]
    env_file = tmp_path / "worker.env"
    env_file.write_text(content, encoding="utf-8")
    out = subprocess.run(
        ["sh", "-c", f'set -a; . "{env_file}"; env'],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        encoding="utf-8",
        check=True,
    ).stdout
    # split on newlines only: str.splitlines() also breaks at U+2028 and U+0085
    seen = dict(line.split("=", 1) for line in out.split("\n") if "=" in line)
    w = cfg.worker
    assert seen["DATABASE_URL"] == cfg.worker_database_url().reveal()
    assert seen["VULTRSCALE_WORKER_ID"] == "worker-9"
    assert seen["VULTRSCALE_INSTANCE_LABEL"] == "worker-9"
    assert seen["VULTRSCALE_WORKER_APP"] == w.app
    assert seen["VULTRSCALE_WORKER_CONCURRENCY"] == str(w.concurrency)
    assert float(seen["VULTRSCALE_WORKER_DRAIN_SECONDS"]) == w.drain_seconds
    assert float(seen["VULTRSCALE_WORKER_LEASE_SECONDS"]) == w.lease_seconds
    assert seen["VULTRSCALE_WORKER_QUEUE"] == w.queue


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_secrets_are_masked_unless_asked_for(variant: str) -> None:
    cfg = _config(variant)
    masked, private = _render(cfg, show_secrets=False)
    shown, shown_private = _render(cfg, show_secrets=True)
    # Check the raw text and the decoded document (JSON escapes could hide a match).
    masked_doc = yaml.safe_load(masked)
    decoded = masked + "\n".join(f["content"] for f in masked_doc["write_files"])
    for secret in [*cfg.secrets.values(), private.splitlines()[1]]:
        assert secret not in decoded
        assert cloudinit.env_quote(secret) not in decoded
    assert masked_doc["ssh_keys"]["ed25519_private"] == cloudinit.MASKED
    assert "PRIVATE KEY" not in masked
    shown_doc = yaml.safe_load(shown)
    assert shown_doc["ssh_keys"]["ed25519_private"] == shown_private
    env = {f["path"]: f["content"] for f in shown_doc["write_files"]}["/etc/vultrscale/worker.env"]
    assert f"DATABASE_URL={cloudinit.env_quote(cfg.worker_database_url().reveal())}" in env


def test_values_that_would_break_the_document_are_refused_or_quoted() -> None:
    cfg = _config("defaults")
    private, public = generate_host_key()
    with pytest.raises(UsageError, match="label"):
        cloudinit.render_user_data(cfg, "x\nruncmd: [rm]", private, public, public,
                                   show_secrets=False)  # fmt: skip
    with pytest.raises(UsageError, match="public key"):
        cloudinit.render_user_data(cfg, "w1", private, public + "\nevil: 1", public,
                                   show_secrets=False)  # fmt: skip
    env = {"WORKER_DATABASE_URL": "postgresql://a:b@h/db\nX=1"}
    broken = load(None, env, None, require_file=False)
    # (config strips only the ends; a line break inside must not reach the env file)
    with pytest.raises(UsageError, match="line break"):
        cloudinit.render_user_data(broken, "w1", private, public, public, show_secrets=True)


def test_a_template_that_renders_invalid_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = cloudinit.template_dir()
    for name in ("sudoers-worker.tmpl",):
        shutil.copy(real / name, tmp_path / name)
    monkeypatch.setattr(cloudinit, "template_dir", lambda: tmp_path)
    private, public = generate_host_key()
    cfg = _config("defaults")

    (tmp_path / "user-data.yaml.tmpl").write_text("#cloud-config\nusers: [${ssh_user}\n")
    with pytest.raises(UsageError, match="not valid YAML") as info:
        cloudinit.render_user_data(cfg, "w1", private, public, public, show_secrets=True)
    assert info.value.exit_code == 2
    assert "s3cretpw" not in str(info.value)

    (tmp_path / "user-data.yaml.tmpl").write_text("#cloud-config\nx: ${nope}\n")
    with pytest.raises(UsageError, match="unknown or malformed placeholder"):
        cloudinit.render_user_data(cfg, "w1", private, public, public, show_secrets=True)

    (tmp_path / "user-data.yaml.tmpl").write_text("#cloud-config\nx: 1\n")
    with pytest.raises(UsageError, match="does not write /etc/vultrscale/worker.env"):
        cloudinit.render_user_data(cfg, "w1", private, public, public, show_secrets=True)


@pytest.mark.skipif(shutil.which("visudo") is None, reason="sudo missing (apt-get install sudo)")
@pytest.mark.parametrize(("user", "service"), [("worker", "worker"), ("deploy", "jobs@1.x_y-z")])
def test_visudo_accepts_the_sudoers_rule(tmp_path: Path, user: str, service: str) -> None:
    rule = cloudinit.render_sudoers(user, service)
    assert f"NOPASSWD: /usr/bin/systemctl stop --no-block {service}," in rule
    assert rule.rstrip().endswith(f", /usr/bin/systemctl start --no-block {service}")
    path = tmp_path / "rule"
    path.write_text(rule)
    result = subprocess.run(["visudo", "-cf", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    # And visudo does reject a broken rule, so the check above means something.
    path.write_text(rule.replace("NOPASSWD:", "NOPASSWD"))
    assert subprocess.run(["visudo", "-cf", str(path)], capture_output=True).returncode != 0


def test_bake_script_parses_and_is_strict() -> None:
    bake = REPO / "cloud-init" / "bake.sh"
    result = subprocess.run(["bash", "-n", str(bake)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "set -euo pipefail" in bake.read_text()
    assert os.access(bake, os.X_OK)


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        pytest.param({"WORKER_SERVICE": "worker.service"}, "without '.service'", id="suffix"),
        pytest.param({"APP_DIR": ".env"}, "holds .env", id="app-dir-with-env"),
        pytest.param({"APP_DIR": "vultrscale.toml"}, "holds vultrscale.toml", id="with-toml"),
        pytest.param({"VENV": "venv"}, "not an absolute path", id="relative-venv"),
        pytest.param({"VULTRSCALE_SPEC": ""}, "set VULTRSCALE_SPEC", id="no-spec"),
        pytest.param(
            {"VULTRSCALE_SPEC": "", "WORKER_UNIT": "/nonexistent.service"},
            "WORKER_UNIT '/nonexistent.service' is not a readable file",
            id="foreign-unit-missing",
        ),
        pytest.param(
            {"VULTRSCALE_SPEC": "", "WORKER_UNIT": "unit"},
            "is not a service unit",
            id="foreign-unit-not-a-service",
        ),
    ],
)
def test_bake_refuses_bad_settings_before_it_changes_anything(
    tmp_path: Path, settings: dict[str, str], said: str
) -> None:
    """An APP_DIR with the scaler's .env or vultrscale.toml put its secrets in every snapshot
    (and the worker read them); 'worker.service' made a unit cloud-init never enabled. Run
    with a PATH of only what the checks use, so that nothing past them could run here."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("dirname", "id"):
        found = shutil.which(name)
        assert found is not None
        (tools / name).symlink_to(found)
    env = {"PATH": str(tools), "VULTRSCALE_SPEC": "./vultrscale-0.1.0-py3-none-any.whl"}
    if settings.get("WORKER_UNIT") == "unit":  # a file, but no [Service] ExecStart=
        (tmp_path / "unit").write_text("[Unit]\nDescription=not a service\n")
        settings = {**settings, "WORKER_UNIT": str(tmp_path / "unit")}
    if "APP_DIR" in settings:
        app = tmp_path / "app"
        app.mkdir()
        (app / settings["APP_DIR"]).write_text("VULTR_API_KEY=secret\n")
        settings = {"APP_DIR": str(app)}
    result = subprocess.run(
        ["/bin/bash", str(REPO / "cloud-init" / "bake.sh")],
        env={**env, **settings},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1 and said in result.stderr, result.stderr
    assert "bake: packages" not in result.stdout  # refused before its first step


def test_templates_ship_inside_the_package() -> None:
    # vultrscale/templates links to cloud-init/, and setuptools copies it as package data.
    names = {p.name for p in cloudinit.template_dir().iterdir()}
    assert {"user-data.yaml.tmpl", "sudoers-worker.tmpl", "bake.sh"} <= names
    assert (REPO / "vultrscale" / "templates").resolve() == (REPO / "cloud-init").resolve()


def test_rendered_user_data_reaches_the_instance_unchanged_through_the_create_call() -> None:
    # The client base64-encodes user-data for POST /v2/instances; the simulator decodes it.
    text, _ = _render(_config("defaults"), show_secrets=True)
    sim = Simulator("sim-key-0123456789", clock=FakeClock(), rate_limit=None)
    with VultrClient("sim-key-0123456789", "http://vultr.sim", transport=SimTransport(sim)) as c:
        made = c.create_instance(
            region="ewr", plan="vc2-1c-2gb", label="worker-7f3a", tags=[], os_id=2136,
            user_data=text,
        )  # fmt: skip
    assert sim.user_data(made.id) == text


# --- the command ---------------------------------------------------------------------------


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("vultrscale")
    assert exe
    base = {"PATH": os.environ["PATH"], "HOME": str(cwd)}
    return subprocess.run(
        [exe, *args], env={**base, **env}, cwd=cwd, capture_output=True, text=True, timeout=60
    )


@needs_cloud_init
def test_render_command_masks_validates_and_fails_cleanly(tmp_path: Path) -> None:
    key = tmp_path / "scaler"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    env = {
        "DATABASE_URL": "postgresql://admin:adminpw99@10.0.0.5/jobs",
        "WORKER_DATABASE_URL": "postgresql://vultrscale_worker:s3cretpw@10.0.0.5/jobs",
        "VULTRSCALE_FLEET_SSH_KEY": str(key),
    }
    masked = _cli(["cloud-init", "render", "--label", "worker-ab12"], env, tmp_path)
    assert masked.returncode == 0, masked.stderr
    assert "s3cretpw" not in masked.stdout + masked.stderr
    assert "PRIVATE KEY" not in masked.stdout
    assert 'VULTRSCALE_WORKER_ID=\\"worker-ab12\\"' in masked.stdout
    assert Path(str(key) + ".pub").read_text().split()[1] in masked.stdout
    (tmp_path / "ud.yaml").write_text(masked.stdout)
    assert _schema(tmp_path / "ud.yaml").returncode == 0

    shown = _cli(["cloud-init", "render", "--show-secrets"], env, tmp_path)
    assert shown.returncode == 0
    assert "s3cretpw" in shown.stdout and "BEGIN OPENSSH PRIVATE KEY" in shown.stdout

    key.chmod(0o644)
    loose = _cli(["cloud-init", "render"], env, tmp_path)
    assert loose.returncode == 2
    assert f"chmod 600 {key}" in loose.stderr
    key.chmod(0o600)

    no_db = _cli(["cloud-init", "render"], {"VULTRSCALE_FLEET_SSH_KEY": str(key)}, tmp_path)
    assert no_db.returncode == 2 and "DATABASE_URL" in no_db.stderr

    missing = _cli(
        ["cloud-init", "render"], {**env, "VULTRSCALE_FLEET_SSH_KEY": str(tmp_path / "x")}, tmp_path
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_a_value_that_is_not_utf8_text_is_refused_without_echoing_it() -> None:
    # os.environ holds undecodable bytes as lone surrogates: no YAML text reads back as them
    # (the config refuses such a variable first; this is the renderer's own guard)
    with pytest.raises(UsageError) as refused:
        cloudinit.yaml_quoted("worker_env", "DATABASE_URL=postgresql://w:pw-sec\udcffret@h/j")
    assert "not UTF-8" in refused.value.message
    assert "pw-sec" not in f"{refused.value.message} {refused.value.hint}"
