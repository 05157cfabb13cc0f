#!/usr/bin/env python3
"""Benchmark: drain 20 instances in one pass against draining one, over real sshd.

Starts N OpenSSH servers on 127.0.0.<first...> (each with its own pinned ed25519 host key, the
project's sudoers rule via real sudo, and a systemctl stand-in with systemd's stop semantics;
see tests/e2e/sshd_hosts.py). Each host runs a stand-in service that exits ``--drain-delay``
seconds after SIGTERM. A drain is what reconcile does over its passes, done back to back here:
``stop_many`` then ``is_active_many`` every ``--poll`` seconds until every host is stopped,
with a fresh SSHDrain (fresh connections) per drain. In the same run, alternating the order
each repetition, it drains one host and all N hosts, and prints the median wall times and the
ratio all/one (target: within 1.5x, i.e. parallel, not serial). ``--serial`` adds the
baseline of a one-at-a-time loop: each host drained completely (stop, then poll until its
service has stopped) before the next is touched, so the services stop one after another too.

The fixed waits, in every drain: the stand-in service exits ``--drain-delay`` (0.5) s after
SIGTERM and the scaler polls every ``--poll`` (0.2) s, so no drain can end before the first
poll after the delay (0.6 s with the defaults); a serial loop pays that once per host.
--json ends the output with the figures as one JSON object (for scripts/bench).

Needs root, /usr/sbin/sshd and sudo. Example: python scripts/bench_drain.py --hosts 20 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e import sshd_hosts  # noqa: E402
from vultrscale.model import HostTarget  # noqa: E402
from vultrscale.ssh import SSHDrain  # noqa: E402

SERVICE = """
import signal, sys, time
def stop(*_):
    time.sleep({delay})
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(3600)
"""


def drain(
    key: Path, targets: list[HostTarget], poll: float, timeout: float
) -> tuple[float, float, float]:
    """Wall seconds from the stop request until every target reports stopped, the CPU seconds
    this (the scaler's) process spent on it, and the wall seconds until every stop was sent
    (connections included)."""
    with SSHDrain(str(key), connect_timeout=10, command_timeout=20) as ssh:
        cpu = time.process_time()
        started = time.monotonic()
        sent = ssh.stop_many(targets)
        sent_after = time.monotonic() - started
        failed = {label: err for label, err in sent.items() if err is not None}
        if failed:
            raise SystemExit(f"stop failed: {failed}")
        pending = list(targets)
        while pending:
            if time.monotonic() - started > timeout:
                raise SystemExit(f"not stopped after {timeout}s: {[t.label for t in pending]}")
            time.sleep(poll)
            states = ssh.is_active_many(pending)
            for label, state in states.items():
                if isinstance(state, Exception):
                    raise SystemExit(f"{label}: {state}")
            pending = [t for t in pending if not states[t.label].stopped]  # type: ignore[union-attr]
        return time.monotonic() - started, time.process_time() - cpu, sent_after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=20, help="sshd endpoints (default 20)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument(
        "--drain-delay", type=float, default=0.5, help="service exit delay after SIGTERM (s)"
    )
    parser.add_argument("--poll", type=float, default=0.2, help="is-active poll interval (s)")
    parser.add_argument("--first", type=int, default=101, help="first address 127.0.0.<first>")
    parser.add_argument(
        "--serial",
        action="store_true",
        help="also drain all hosts one at a time, each to the end (the serial baseline)",
    )
    parser.add_argument("--json", action="store_true", help="end with the figures as JSON")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="vultrscale-bench-key-"))
    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    argv = [python, "-c", SERVICE.format(delay=args.drain_delay)]

    print(f"starting {args.hosts} sshd hosts on 127.0.0.{args.first}..", flush=True)
    hosts = sshd_hosts.start_hosts(args.hosts, key, first_address=args.first)
    one: list[float] = []
    many: list[float] = []
    serial: list[float] = []
    cpu: dict[str, list[float]] = {"one": [], "all": [], "serial": []}
    try:
        targets = [h.target() for h in hosts.hosts]
        for rep in range(args.repeat):
            order = ["one", "all"] if rep % 2 == 0 else ["all", "one"]
            if args.serial:
                order.append("serial")
            for which in order:
                chosen = hosts.hosts[:1] if which == "one" else hosts.hosts
                for h in chosen:
                    hosts.start_service(h, argv, timeout_stop_sec=30)
                picked = targets[:1] if which == "one" else targets
                if which == "serial":  # host after host, each drained to the end
                    seconds = used = sent = 0.0
                    for target in picked:
                        s1, u1, t1 = drain(key, [target], args.poll, timeout=120)
                        seconds, used, sent = seconds + s1, used + u1, sent + t1
                else:
                    seconds, used, sent = drain(key, picked, args.poll, timeout=120)
                {"one": one, "all": many, "serial": serial}[which].append(seconds)
                cpu[which].append(used)
                print(
                    f"  rep {rep + 1}: drain of {len(picked):>2} {which:>6}"
                    f": {seconds * 1000:7.0f} ms "
                    f"(stops sent after {sent * 1000:.0f} ms; scaler CPU {used * 1000:.0f} ms)"
                )
    finally:
        hosts.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    m_one, m_many = statistics.median(one), statistics.median(many)
    print()
    print(
        f"compares: draining {args.hosts} hosts in one pass against draining 1 host, "
        f"{args.repeat} alternated repetitions"
        + (f"; and {args.hosts} hosts drained one after another (--serial)" if serial else "")
    )
    floor = (int(args.drain_delay / args.poll) + 1) * args.poll
    print(
        f"fixed waits: the service exits {args.drain_delay:g}s after SIGTERM; polled every "
        f"{args.poll:g}s: no drain ends before {floor:g}s"
    )
    print(f"median drain of 1 host:   {m_one * 1000:7.0f} ms  (n={len(one)})")
    print(f"median drain of {args.hosts} hosts: {m_many * 1000:7.0f} ms  (n={len(many)})")
    print(
        f"median scaler CPU: {statistics.median(cpu['one']) * 1000:.0f} ms for 1, "
        f"{statistics.median(cpu['all']) * 1000:.0f} ms for {args.hosts} (the rest of the wall "
        "time is sshd, sudo and the services, which share this machine's cores)"
    )
    if serial:
        m_serial = statistics.median(serial)
        print(
            f"median drain of {args.hosts} hosts one after another (serial baseline): "
            f"{m_serial * 1000:.0f} ms ({m_serial / m_one:.2f}x one host)"
        )
    ratio = m_many / m_one
    verdict = "within" if ratio <= 1.5 else "NOT within"
    print(f"ratio {args.hosts}/1: {ratio:.2f}x ({verdict} the 1.5x target)")
    if args.json:
        figures = {"one_ms": m_one * 1000, "all_ms": m_many * 1000, "hosts": args.hosts}
        if serial:
            figures["serial_ms"] = statistics.median(serial) * 1000
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
