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
The same drain without the poll's steps is printed too: every stop out plus the delay, what a
scaler polling at no cost would see (the stops going out is what is left to compare).
Each drain is broken down: when every stop was sent, the is-active rounds (how many, how long),
the scaler's CPU and the hosts' CPU (their sshd with the sessions, sudo and stand-in it ran),
which here shares this machine's cores with the scaler and on a real fleet does not.
--json ends the output with the figures as one JSON object (for scripts/bench).

Needs root, /usr/sbin/sshd and sudo. Example: python scripts/bench_drain.py --hosts 20 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e import sshd_hosts  # noqa: E402
from vultrscale.core.model import HostTarget  # noqa: E402
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


@dataclass
class Drained:
    """One drain: wall seconds from the stop request until every target reports stopped, the
    CPU seconds this (the scaler's) process spent on it, the wall seconds until every stop was
    sent (connections included), and the wall seconds of each is-active round."""

    seconds: float
    cpu: float
    sent: float
    polls: list[float]

    def __add__(self, other: Drained) -> Drained:
        return Drained(
            self.seconds + other.seconds,
            self.cpu + other.cpu,
            self.sent + other.sent,
            self.polls + other.polls,
        )


def drain(key: Path, targets: list[HostTarget], poll: float, timeout: float) -> Drained:
    """Drain ``targets`` as reconcile does over its passes (see the module docstring)."""
    with SSHDrain(str(key), connect_timeout=10, command_timeout=20) as ssh:
        cpu = time.process_time()
        started = time.monotonic()
        sent = ssh.stop_many(targets)
        sent_after = time.monotonic() - started
        failed = {label: err for label, err in sent.items() if err is not None}
        if failed:
            raise SystemExit(f"stop failed: {failed}")
        pending = list(targets)
        polls: list[float] = []
        while pending:
            if time.monotonic() - started > timeout:
                raise SystemExit(f"not stopped after {timeout}s: {[t.label for t in pending]}")
            time.sleep(poll)
            round_started = time.monotonic()
            states = ssh.is_active_many(pending)
            polls.append(time.monotonic() - round_started)
            for label, state in states.items():
                if isinstance(state, Exception):
                    raise SystemExit(f"{label}: {state}")
            pending = [t for t in pending if not states[t.label].stopped]  # type: ignore[union-attr]
        return Drained(time.monotonic() - started, time.process_time() - cpu, sent_after, polls)


def hosts_cpu(hosts: sshd_hosts.Hosts) -> float:
    """CPU seconds the hosts' sshd have used so far, with every session they have reaped (the
    logins, sudo and the systemctl stand-in): the hosts' side of a drain, which on a real fleet
    runs on 20 machines and here shares this one's cores with the scaler."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for host in hosts.hosts:
        assert host.sshd is not None
        fields = Path(f"/proc/{host.sshd.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / tick


def _sessions_ended(hosts: sshd_hosts.Hosts) -> bool:
    for host in hosts.hosts:
        assert host.sshd is not None
        pid = host.sshd.pid
        if Path(f"/proc/{pid}/task/{pid}/children").read_text().strip():
            return False
    return True


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
    runs: dict[str, list[Drained]] = {"one": [], "all": [], "serial": []}
    host_cpu: dict[str, list[float]] = {"one": [], "all": [], "serial": []}
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
                before = hosts_cpu(hosts)
                if which == "serial":  # host after host, each drained to the end
                    run = Drained(0.0, 0.0, 0.0, [])
                    for target in picked:
                        run += drain(key, [target], args.poll, timeout=120)
                else:
                    run = drain(key, picked, args.poll, timeout=120)
                sshd_hosts.wait_for(lambda: _sessions_ended(hosts), 10, "the sessions to end")
                runs[which].append(run)
                host_cpu[which].append(hosts_cpu(hosts) - before)
                print(
                    f"  rep {rep + 1}: drain of {len(picked):>2} {which:>6}"
                    f": {run.seconds * 1000:7.0f} ms "
                    f"(stops sent after {run.sent * 1000:.0f} ms; {len(run.polls)} polls of "
                    f"{statistics.median(run.polls) * 1000:.0f} ms median; "
                    f"scaler CPU {run.cpu * 1000:.0f} ms; "
                    f"hosts' CPU {host_cpu[which][-1] * 1000:.0f} ms)"
                )
    finally:
        hosts.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def median_ms(which: str, figure: Callable[[Drained], float]) -> float:
        return statistics.median(figure(run) for run in runs[which]) * 1000

    one, many, serial = ([run.seconds for run in runs[which]] for which in ("one", "all", "serial"))
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
    for which, label in (("one", "1 host:  "), ("all", f"{args.hosts} hosts:")):
        print(
            f"  {label} stops sent after {median_ms(which, lambda r: r.sent):4.0f} ms, "
            f"is-active rounds of {median_ms(which, lambda r: statistics.median(r.polls)):3.0f} ms"
            f" ({statistics.median(len(r.polls) for r in runs[which]):g} rounds), "
            f"scaler CPU {median_ms(which, lambda r: r.cpu):4.0f} ms, hosts' CPU "
            f"{statistics.median(host_cpu[which]) * 1000:4.0f} ms (sshd, sudo, stand-in)"
        )
    print(
        "  (the hosts' CPU runs on this machine's cores next to the scaler's; on a real fleet "
        "each host spends its share on its own)"
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
    # Without the poll's steps: every service has stopped by the time its stop was answered
    # plus the delay, and the last ones not much before; what a scaler polling at no cost, the
    # instant each service stopped, would see. What is left is getting the stops out.
    sent_one, sent_all = (median_ms(which, lambda r: r.sent) for which in ("one", "all"))
    delay_ms = args.drain_delay * 1000
    print(
        f"without the poll's steps (every stop out + the service's {args.drain_delay:g}s): "
        f"1 host {sent_one + delay_ms:.0f} ms, {args.hosts} hosts {sent_all + delay_ms:.0f} ms, "
        f"{(sent_all + delay_ms) / (sent_one + delay_ms):.2f}x"
    )
    if args.json:
        figures = {
            "one_ms": m_one * 1000,
            "all_ms": m_many * 1000,
            "hosts": args.hosts,
            "one_sent_ms": sent_one,
            "all_sent_ms": sent_all,
            "delay_ms": delay_ms,
        }
        if serial:
            figures["serial_ms"] = statistics.median(serial) * 1000
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
