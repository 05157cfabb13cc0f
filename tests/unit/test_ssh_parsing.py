"""The drain transport's pure parts: command building, service-name checks, is-active mapping."""

from __future__ import annotations

import pytest

from vultrscale.core.model import ServiceState
from vultrscale.errors import UsageError
from vultrscale.ssh import is_active_command, parse_is_active, stop_command, validate_service


@pytest.mark.parametrize(
    ("stdout", "code", "expected"),
    [
        ("active\n", 0, ServiceState.ACTIVE),
        ("reloading\n", 0, ServiceState.ACTIVE),
        ("inactive\n", 3, ServiceState.INACTIVE),
        ("failed\n", 3, ServiceState.FAILED),
        ("activating\n", 3, ServiceState.ACTIVATING),
        ("deactivating\n", 3, ServiceState.DEACTIVATING),
        ("inactive\n", 0, ServiceState.UNKNOWN),  # exit code and word disagree
        ("active\n", 3, ServiceState.UNKNOWN),
        ("", 1, ServiceState.UNKNOWN),  # e.g. systemd not running
        ("inactive\n", 4, ServiceState.UNKNOWN),
        ("weird\n", 3, ServiceState.UNKNOWN),
        ("", 0, ServiceState.UNKNOWN),
    ],
    ids=lambda v: repr(v),
)
def test_is_active_output_and_exit_code_map_to_a_state(
    stdout: str, code: int, expected: ServiceState
) -> None:
    assert parse_is_active(stdout, code) is expected


def test_only_inactive_and_failed_count_as_stopped() -> None:
    stopped = {s for s in ServiceState if s.stopped}
    assert stopped == {ServiceState.INACTIVE, ServiceState.FAILED}


def test_the_commands_are_exactly_these() -> None:
    assert stop_command("worker") == "sudo -n systemctl stop --no-block worker"
    assert is_active_command("jobs@1.service") == "systemctl is-active jobs@1.service"


@pytest.mark.parametrize(
    "name",
    ["worker; reboot", "w`id`", "w$(id)", "w|x", "w&", "w>f", "w x", "w\tx", "'w'", '"w"',
     "w\n", "-w", "", "../w", "w/x", "w" * 65, "wörker"],
)  # fmt: skip
def test_names_that_could_change_the_command_are_refused(name: str) -> None:
    with pytest.raises(UsageError, match="refusing service name") as info:
        stop_command(name)
    assert info.value.exit_code == 2


@pytest.mark.parametrize("name", ["worker", "jobs@1", "my_worker.service", "w-2", "W" * 64])
def test_plain_unit_names_pass(name: str) -> None:
    assert validate_service(name) == name
