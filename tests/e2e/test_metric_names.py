"""The alert rules and the dashboard name only metrics the scaler exports: every metric in
their queries is in a real scrape of `vultrscale reconcile --loop --metrics-port` (a real
process, the simulator over HTTP, real Postgres)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.cli_world import scaler_key, simulator_with_snapshot
from vultrscale.db import queue

pytestmark = pytest.mark.e2e

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
API_KEY = "VKEY-scrape-test-0123456789abcdefghijk"

# PromQL's own words (functions, aggregations, keywords) and Grafana's variables: what is left
# of a query without them, its strings, label matchers and ranges, are metric names.
PROMQL_WORDS = frozenset(
    [
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "rate",
        "increase",
        "irate",
        "delta",
        "time",
        "absent",
        "absent_over_time",
        "clamp_min",
        "clamp_max",
        "label_values",
        "topk",
        "bottomk",
        "histogram_quantile",
        "humanizeDuration",
    ]
)


def _served_url(log: Path) -> str | None:
    """The /metrics URL the loop logged once it bound its port (``--metrics-port 0``)."""
    m = re.search(r"serves metrics at (http://\S+/metrics)", log.read_text())
    return m[1] if m else None


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL query (or a Grafana query with $variables) reads."""
    bare = re.sub(r"label_values\(([^,)]*),[^)]*\)", r"\1", expr)  # Grafana's: (metric, label)
    bare = re.sub(r'"[^"]*"', "", bare)  # strings: label values
    bare = re.sub(r"\{[^}]*\}", "", bare)  # label matchers
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # ranges
    bare = re.sub(r"\$\{?\w+\}?", "", bare)  # Grafana's variables
    bare = re.sub(r"\((?:by|without|on|ignoring)\b[^)]*\)", "", bare)  # grouping labels
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    return {w for w in words if w not in PROMQL_WORDS}


def _rule_queries() -> list[str]:
    doc = yaml.safe_load((DEPLOY / "vultrscale-rules.yml").read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def _dashboard_queries() -> list[str]:
    doc = json.loads((DEPLOY / "vultrscale-dashboard.json").read_text())
    queries = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    queries += [v["definition"] for v in doc["templating"]["list"] if v.get("type") == "query"]
    return queries


@pytest.fixture
def scrape(db_url: str, tmp_path: Path) -> Iterator[set[str]]:
    """The sample names of /metrics, once the loop has run a pass that created instances."""
    sim, server, snapshot_id = simulator_with_snapshot(API_KEY, seed=11)
    key = scaler_key(tmp_path)
    config = tmp_path / "vultrscale.toml"
    config.write_text(f'[fleet]\nsnapshot_id = "{snapshot_id}"\nssh_key = "{key}"\n')
    with psycopg.connect(db_url, autocommit=True) as conn:
        queue.enqueue(conn, [{}] * 6)
    env = {
        **os.environ,
        "VULTRSCALE_CONFIG": str(config),
        "VULTR_API_KEY": API_KEY,
        "VULTR_API_URL": server.url,
        "DATABASE_URL": db_url,
        "WORKER_DATABASE_URL": db_url,
        "PYTHONFAULTHANDLER": "1",  # a stop that hangs shows where (SIGABRT below)
    }
    exe = shutil.which("vultrscale")
    assert exe, "vultrscale is not on PATH (run with the project's .venv/bin on PATH)"
    # Port 0: the loop binds a free port itself and logs it (a port found free here and let
    # go could be taken by another process before the loop bound it).
    err_log = tmp_path / "loop.err"
    with err_log.open("w") as err_file:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [exe, "reconcile", "--loop", "--interval", "5s", "--metrics-port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
            cwd=tmp_path,
        )
    try:
        names: set[str] = set()
        deadline = time.monotonic() + 60
        while "vultrscale_last_pass_timestamp_seconds" not in names:
            assert proc.poll() is None, (proc.communicate(), err_log.read_text())
            assert time.monotonic() < deadline, "no pass in the metrics within 60 s"
            url = _served_url(err_log)
            try:
                text = httpx.get(url, timeout=5).text if url else ""
            except httpx.TransportError:
                text = ""  # not answering yet
            families = text_string_to_metric_families(text)
            names = {s.name for family in families for s in family.samples}
            time.sleep(0.2)  # a condition polled under a deadline
        assert sim.count("POST", "/v2/instances", 202) >= 2  # a pass that acted
        yield names
        # As systemd stops it (KillSignal=SIGINT): exit 130, which the units take for success,
        # within the unit's TimeoutStopSec (60 s: a pass may be under way when the signal comes).
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            proc.communicate(timeout=10)
            err = err_log.read_text()
            pytest.fail(f"the loop did not stop within 60 s of SIGINT; its threads:\n{err[-6000:]}")
        assert proc.returncode == 130
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        finally:
            proc.kill()
            server.stop()


def test_the_rules_and_the_dashboard_name_only_metrics_a_real_scrape_shows(
    scrape: set[str],
) -> None:
    for source, queries in (("rules", _rule_queries()), ("dashboard", _dashboard_queries())):
        for query in queries:
            unknown = metric_names(query) - scrape
            assert not unknown, f"{source}: {query!r} names {unknown}, not in the scrape"


def test_the_dashboard_shows_what_an_operator_watches() -> None:
    named = set().union(*(metric_names(q) for q in _dashboard_queries()))
    assert {
        "vultrscale_instances",  # instances by state
        "vultrscale_queue_ready",  # queue depth
        "vultrscale_queue_oldest_ready_seconds",  # oldest job age
        "vultrscale_actions_total",  # creates, drains, replacements
        "vultrscale_budget_month_to_date_usd",  # spend ...
        "vultrscale_budget_ceiling_usd",  # ... against the ceiling
        "vultrscale_pass_duration_seconds",  # pass duration
        "vultrscale_passes_total",  # errors
    } <= named


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ('sum by (state) (vultrscale_instances{fleet="$fleet"})', {"vultrscale_instances"}),
        (
            'sum by (fleet) (increase(vultrscale_passes_total{exit_code="1"}[10m]))',
            {"vultrscale_passes_total"},
        ),
        ("time() - max by (fleet) (up_typo)", {"up_typo"}),
        ("absent(vultrscale_last_pass)", {"vultrscale_last_pass"}),
        ("label_values(vultrscale_instances, fleet)", {"vultrscale_instances"}),
    ],
    ids=["grouped", "counter", "typo", "absent", "grafana-variable"],
)
def test_metric_names_reads_what_a_query_names(query: str, names: set[str]) -> None:
    # Guards the scrape test: a misspelt metric is found, PromQL's words are not.
    assert metric_names(query) == names
