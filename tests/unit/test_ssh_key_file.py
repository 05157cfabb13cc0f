"""The scaler's key file: stat checks on every pass, parsed only by a pass that uses it, once
per process while the file is unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from vultrscale import config as config_mod
from vultrscale import ssh
from vultrscale.core.model import Action, ActionKind, Plan
from vultrscale.errors import UsageError
from vultrscale.wiring import build_parts


def _write_ed25519(path: Path) -> str:
    private, public = ssh.generate_host_key()
    path.write_text(private)
    path.chmod(0o600)
    return public


def _write_rsa(path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _line(key: object) -> str:
    return f"{key.get_name()} {key.get_base64()}"  # type: ignore[attr-defined]


def test_an_unchanged_key_is_parsed_once_per_process(tmp_path: Path) -> None:
    key = tmp_path / "id"
    public = _write_ed25519(key)
    first = ssh.load_private_key(key)
    assert _line(first) == public
    assert ssh.load_private_key(str(key)) is first


def test_a_key_replaced_by_another_file_is_read_again(tmp_path: Path) -> None:
    key = tmp_path / "id"
    _write_ed25519(key)
    old = ssh.load_private_key(key)
    fresh = tmp_path / "id.new"
    public = _write_ed25519(fresh)
    os.replace(fresh, key)  # as `ssh-keygen` then `mv`: another inode
    assert _line(ssh.load_private_key(key)) == public != _line(old)


def test_a_key_rewritten_in_place_is_read_again(tmp_path: Path) -> None:
    key = tmp_path / "id"
    _write_ed25519(key)
    before = key.stat()
    old = ssh.load_private_key(key)
    other = tmp_path / "other"
    public = _write_ed25519(other)
    key.write_text(other.read_text())  # same inode, same size (both ed25519)
    # A later modification time, as the next write would give (a write within the same clock
    # tick as the first may keep its time on some filesystems).
    os.utime(key, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    assert key.stat().st_ino == before.st_ino and key.stat().st_size == before.st_size
    assert _line(ssh.load_private_key(key)) == public != _line(old)


def test_a_parsed_key_whose_mode_or_presence_changed_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "id"
    _write_rsa(key)
    ssh.load_private_key(key)
    key.chmod(0o644)
    with pytest.raises(UsageError, match="accessible by group or others") as loose:
        ssh.load_private_key(key)
    assert loose.value.exit_code == 2
    key.unlink()
    with pytest.raises(UsageError, match="does not exist"):
        ssh.load_private_key(key)


def test_a_key_owned_by_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "id"
    _write_ed25519(key)
    if os.geteuid() == 0:
        os.chown(key, 54321, -1)
    else:  # the file is ours: be someone else
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    with pytest.raises(UsageError, match="belongs to uid") as info:
        ssh.check_key_file(key)
    assert "chown" in info.value.hint and info.value.exit_code == 2


# --- the real parts: what a pass checks, and when it parses -------------------------------


@pytest.fixture
def key_and_cfg(tmp_path: Path) -> tuple[Path, config_mod.Config]:
    key = tmp_path / "scaler_key"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n")
    key.chmod(0o600)
    (tmp_path / "vultrscale.toml").write_text(f'[fleet]\nssh_key = "{key}"\n')
    env = {"VULTR_API_KEY": "k" * 32, "DATABASE_URL": "postgresql://u@127.0.0.1:9/db"}
    return key, config_mod.load(tmp_path / "vultrscale.toml", env=env)


def _plan(*actions: Action) -> Plan:
    return Plan(desired=0, target=0, capacity=0, floor=0, cap=5, actions=actions)


def test_a_pass_checks_only_what_stat_tells_before_it_acts(
    key_and_cfg: tuple[Path, config_mod.Config],
) -> None:
    key, cfg = key_and_cfg
    parts = build_parts(cfg)
    try:
        for check in parts.preflight:
            check()  # an unreadable key body: not read by a pass that uses no key
        parts.before_changes(_plan())  # a steady pass: nothing to create or drain
        key.chmod(0o640)
        with pytest.raises(UsageError, match="accessible by group or others"):
            for check in parts.preflight:
                check()
    finally:
        parts.close()


@pytest.mark.parametrize(
    "action",
    [
        Action(ActionKind.CREATE, reason="demand"),
        Action(ActionKind.DRAIN, label="worker-1", reason="idle"),
    ],
    ids=["create", "drain"],
)
def test_a_pass_that_creates_or_drains_loads_the_key_before_it_acts(
    key_and_cfg: tuple[Path, config_mod.Config], action: Action
) -> None:
    _key, cfg = key_and_cfg
    parts = build_parts(cfg)
    try:
        with pytest.raises(UsageError, match="could not be read") as info:
            parts.before_changes(_plan(action))
        assert info.value.exit_code == 2
    finally:
        parts.close()
