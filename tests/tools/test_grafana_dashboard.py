"""compose/grafana: the Orbit dashboard and its provisioning next to Prometheus.

Every query of the dashboard names only metrics the exporter serves: the families of
orbit_tasks/metrics/families.py (read from the databases and the broker) and of
orbit_tasks/counters.py (the workers' counters and histograms), expanded to the sample names a
scrape carries (``_total``, ``_bucket``/``_sum``/``_count``). A real scrape is compared too, in
tests/integration/test_metrics_counters.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from orbit_tasks import counters
from orbit_tasks.metrics.families import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "compose" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "orbit.json"
COMPOSE = ROOT / "compose" / "docker-compose.yml"
HISTOGRAMS = {"orbit_sender_http_seconds", "orbit_sender_accept_lag_seconds"}


def served_samples() -> set[str]:
    """Every sample name a scrape of `orbit metrics serve` can carry from orbit's families."""
    names = set(METRIC_NAMES)
    for family in counters.FAMILIES:
        if family in HISTOGRAMS:
            names |= {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
        else:
            names.add(family)
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions (followed by
    ``(``), label names (in ``{...}``, ``by (...)``, ``without (...)``), keywords or numbers."""
    text = re.sub(r'"[^"]*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    found = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word = match.group(0)
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or word in {"and", "or", "unless", "bool", "offset"}:
            continue
        found.add(word)
    return found


def queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    out = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def test_extraction_sees_through_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(orbit_sender_http_seconds_bucket{a="b"}[5m])))'
        " / on (x) orbit_up > 0"
    )
    assert metric_names(expr) == {"orbit_sender_http_seconds_bucket", "orbit_up"}
    assert metric_names("sum by (storage) (delta(orbit_archive_claims[1h]))") == {
        "orbit_archive_claims"
    }


def test_every_dashboard_query_names_a_served_metric() -> None:
    found = queries()
    assert len(found) >= 15
    served = served_samples()
    used: set[str] = set()
    for title, expr in found:
        names = metric_names(expr)
        assert names, (title, expr)
        assert names <= served, (title, names - served)
        used |= names
    # the dashboard shows what issue 17 asks for
    for wanted in ("orbit_sender_sends_total", "orbit_sender_http_seconds_bucket",
                   "orbit_sender_accept_lag_seconds_bucket", "orbit_archive_confirmed_roots",
                   "orbit_archive_confirmed_bytes", "orbit_archive_confirmed_files",
                   "orbit_archive_claims", "orbit_archive_takeovers_total",
                   "orbit_archive_stalls_total"):  # fmt: skip
        assert wanted in used, wanted


def test_every_panel_uses_the_provisioned_datasource() -> None:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    (source,) = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text(encoding="utf-8")
    )["datasources"]
    assert source["url"] == "http://prometheus:9090"
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == source["uid"], panel["title"]
    (provider,) = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "orbit.yml").read_text(encoding="utf-8")
    )["providers"]
    grafana = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["grafana"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in grafana["volumes"]}
    assert mounts[provider["options"]["path"]] == "./grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
