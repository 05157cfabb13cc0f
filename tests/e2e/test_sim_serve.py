"""`vultrscale sim serve` as a real process: prints where it listens and which key to use,
answers the client, never prints a key taken from the environment, stops on SIGINT/SIGTERM."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from vultrscale.vultr.client import VultrClient
from vultrscale.vultr.errors import BadRequest
from vultrscale.vultr.refusals import Refusal, refusal

pytestmark = pytest.mark.e2e


def _read_until(lines: queue.Queue[str], pattern: str, deadline: float) -> list[str]:
    """Lines of output up to the first one matching ``pattern`` (fails at the deadline)."""
    seen: list[str] = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        seen.append(line.rstrip("\n"))
        if re.search(pattern, line):
            return seen
    pytest.fail(f"no line matching {pattern!r} in time; got {seen!r}")


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)


@pytest.fixture
def start() -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def run(
        env_key: str | None, *extra: str
    ) -> tuple[subprocess.Popen[str], list[str], queue.Queue[str]]:
        env = {k: v for k, v in os.environ.items() if k != "VULTR_API_KEY"}
        if env_key:
            env["VULTR_API_KEY"] = env_key
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "vultrscale.cli", "sim", "serve"),
                *("--port", "0", "--seed", "5", *extra),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        procs.append(proc)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_pump, args=(proc, lines), daemon=True).start()
        return proc, _read_until(lines, "VULTR_API_KEY", time.monotonic() + 30), lines

    yield run
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _url(lines: list[str]) -> str:
    match = re.search(r"export VULTR_API_URL=(http://127\.0\.0\.1:\d+)", "\n".join(lines))
    assert match, lines
    return match.group(1)


def test_serve_prints_a_generated_key_and_stops_on_sigint(start: object) -> None:
    proc, lines, rest = start(None)  # type: ignore[operator]
    url = _url(lines)
    key_match = re.search(r"export VULTR_API_KEY=(sim-[0-9a-f]{32})", "\n".join(lines))
    assert key_match, lines
    with VultrClient(key_match.group(1), url) as client:
        made = client.create_instance(
            region="ewr", plan="vc2-1c-1gb", label="cli-1", tags=["t"], os_id=2284
        )
        assert [i.id for i in client.list_instances(tag="t")] == [made.id]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 0
    assert _read_until(rest, "Stopping the simulator", time.monotonic() + 5)


def test_serve_never_prints_a_key_from_the_environment(start: object) -> None:
    secret = "ENVKEY-do-not-print-0123456789"
    proc, lines, rest = start(secret)  # type: ignore[operator]
    assert "# using VULTR_API_KEY from the environment" in lines
    with VultrClient(secret, _url(lines)) as client:
        assert client.account().name == "Simulated Account"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    tail = _read_until(rest, "Stopping the simulator", time.monotonic() + 5)
    assert secret not in "\n".join(lines + tail)


def test_serve_can_sell_out_an_offering_and_cap_the_account(start: object) -> None:
    key = "ENVKEY-capacity-0123456789"
    proc, lines, _ = start(  # type: ignore[operator]
        key, "--sold-out", "ewr/vc2-1c-1gb:unlisted", "--max-instances", "1"
    )
    with VultrClient(key, _url(lines)) as client:
        assert "vc2-1c-1gb" not in client.region_availability("ewr")
        with pytest.raises(BadRequest) as sold_out:
            client.create_instance(
                region="ewr", plan="vc2-1c-1gb", label="c-1", tags=["t"], os_id=2284
            )
        assert refusal(sold_out.value.api_message) is Refusal.UNAVAILABLE
        client.create_instance(region="ord", plan="vc2-1c-1gb", label="c-2", tags=["t"], os_id=2284)
        with pytest.raises(BadRequest) as limit:
            client.create_instance(
                region="ord", plan="vc2-1c-1gb", label="c-3", tags=["t"], os_id=2284
            )
        assert refusal(limit.value.api_message) is Refusal.INSTANCE_LIMIT
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0


def test_serve_refuses_an_offering_it_cannot_sell_out() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vultrscale.cli", "sim", "serve", "--sold-out", "ewr"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "REGION/PLAN" in done.stderr
