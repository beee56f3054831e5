"""compose/prometheus: the alert rules and the scrape config.

Always: the YAML parses, the alert names are the ones SPEC §12 / issue 9 asks for, each has a
``for:``, a severity and annotations naming its runbook section, and every metric an expression
uses is one the exporter serves. With promtool (Debian ``prometheus``, installed on the dev and
CI machines): ``promtool check rules``, ``promtool check config`` and the rule unit tests in
tests/prometheus/alerts_test.yml.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from orbit_tasks.metrics.families import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "compose" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
CONFIG = PROMETHEUS / "prometheus.yml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "alerts_test.yml"
REQUIRED = {
    "OrbitStorageUnserved",
    "OrbitArchiveLeasesExpired",
    "OrbitArchiveJobsFailed",
    "OrbitArchivePlansOverdue",
    "OrbitArchiveBacklogNotShrinking",
    "OrbitArchiveReplicaDiverged",
    "OrbitOutboxReviewRows",
    "OrbitOutboxRowsNearDeadline",
    "OrbitSourceDown",
    "OrbitBeatTicksStopped",
}
# PromQL words that look like names but are functions, keywords or label names.
PROMQL_WORDS = {"or", "and", "unless", "by", "without", "on", "ignoring", "delta", "label_replace"}
PROMTOOL = shutil.which("promtool")


def _rules() -> list[dict]:  # type: ignore[type-arg]
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _metric_names(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_labels = re.sub(r"\{[^}]*\}", "", without_strings)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    words = set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", without_ranges))
    return words - PROMQL_WORDS


def test_alert_names_annotations_and_metrics() -> None:
    rules = _rules()
    assert {r["alert"] for r in rules} == REQUIRED
    assert len(rules) == len(REQUIRED)
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", str(rule["for"])), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        anchor = f"docs/operations.md#{name.lower()}"
        notes = rule["annotations"]
        assert notes["summary"] and anchor in notes["description"], name
        assert notes["runbook_url"] == anchor
        used = _metric_names(rule["expr"])
        assert used, name
        unknown = used - set(METRIC_NAMES) - {"up"}
        assert not unknown, (name, unknown)


def test_metric_name_extraction_sees_through_promql() -> None:
    expr = 'orbit_up == 0 or label_replace(up{job="orbit"} == 0, "source", "x", "", "")'
    assert _metric_names(expr) == {"orbit_up", "up"}
    assert _metric_names("delta(orbit_outbox_review_rows[15m]) > 0") == {"orbit_outbox_review_rows"}


def test_scrape_config_targets_the_exporter_and_loads_the_rules() -> None:
    doc = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert doc["rule_files"] == ["alerts.yml"]
    (job,) = doc["scrape_configs"]
    assert job["job_name"] == "orbit"  # the job OrbitSourceDown watches with `up`
    assert job["static_configs"] == [{"targets": ["metrics:10108"]}]  # the default port
    assert 'up{job="orbit"}' in ALERTS.read_text(encoding="utf-8")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None, "promtool missing: `make install` installs Debian's prometheus"
    return subprocess.run(
        [PROMTOOL, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_checks_rules_and_config() -> None:
    rules = _promtool("check", "rules", str(ALERTS))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"SUCCESS: {len(REQUIRED)} rules found" in rules.stdout
    config = _promtool("check", "config", str(CONFIG))
    assert config.returncode == 0, config.stdout + config.stderr


def test_promtool_rule_unit_tests() -> None:
    """Unserved, source down (a source, then the exporter itself), unresolved REVIEW rows, rows near
    the deadline, failed jobs, overdue plans, expired leases and a diverged replica, at exact
    evaluation times."""
    result = _promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text(encoding="utf-8")))
    assert tested == REQUIRED
