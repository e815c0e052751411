"""The `monitoring` compose profile: Prometheus and Grafana, provisioned from docker/monitoring/.

Checked with the real compose binary (as test_compose.py), `promtool check config` where promtool
is installed (Debian's `prometheus` package), and the provisioning files against each other. That
every PromQL expression names a metric the service exports is checked against a live scheduler in
tests/dashboard/test_grafana_metrics.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .test_compose import (  # noqa: F401  (fixtures)
    ENV_EXAMPLE, ROOT, compose, filled_env, project_dir, resolved, run_compose, tokens,
)

MONITORING = ROOT / "docker" / "monitoring"
PROMETHEUS_YML = MONITORING / "prometheus.yml"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "sara.json"
DATASOURCES = MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = MONITORING / "grafana" / "provisioning" / "dashboards" / "sara.yml"


def dashboard_expressions(dashboard: dict) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and template-variable queries."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


@pytest.fixture(scope="module")
def monitoring(compose, tokens, tmp_path_factory) -> dict:  # noqa: F811
    project = project_dir(tmp_path_factory.mktemp("monitoring"),
                          filled_env(ENV_EXAMPLE.read_text(), tokens))
    return resolved(compose, project, "cpu", "monitoring")


@pytest.mark.parametrize("profiles", [("monitoring",), ("cpu", "monitoring")])
def test_config_with_the_monitoring_profile_is_valid(compose, tokens, tmp_path,  # noqa: F811
                                                      profiles):
    project = project_dir(tmp_path, filled_env(ENV_EXAMPLE.read_text(), tokens))
    args = [a for p in profiles for a in ("--profile", p)]
    out = run_compose(compose, project, *args, "config", "-q")
    assert out.returncode == 0, out.stderr


def test_monitoring_adds_prometheus_and_grafana_on_loopback(monitoring, tokens):  # noqa: F811
    services = monitoring["services"]
    assert {"prometheus", "grafana"} <= set(services)
    for name, port in (("prometheus", 9090), ("grafana", 3000)):
        service = services[name]
        assert service["profiles"] == ["monitoring"]
        (published,) = service["ports"]
        assert (published["host_ip"], published["target"]) == ("127.0.0.1", port)
        assert service["healthcheck"]["test"][0] == "CMD"
    # Prometheus gets the operator token (to read /metrics) and nothing else
    env = services["prometheus"]["environment"]
    assert env == {"SARA_OPERATOR_TOKEN": tokens["SARA_OPERATOR_TOKEN"]}
    assert "SARA_ADMIN_TOKEN" not in json.dumps(services["grafana"])


def test_bind_mounts_name_files_in_the_repository(monitoring):
    for name in ("prometheus", "grafana"):
        for volume in monitoring["services"][name]["volumes"]:
            if volume["type"] != "bind":
                continue
            # resolved against the temporary project dir: map back onto the repository
            relative = volume["source"].split("/docker/monitoring/", 1)[1]
            assert (MONITORING / relative).exists(), volume["source"]
            assert volume.get("read_only"), volume["target"]


def test_prometheus_scrapes_the_scheduler_with_the_token_file_compose_writes():
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["scheduler:8000"]
    token_file = job["authorization"]["credentials_file"]
    compose_text = (ROOT / "docker-compose.yml").read_text()
    assert f"> {token_file}" in compose_text, "compose must write the file prometheus.yml reads"


def test_promtool_check_config(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    # the token file exists only inside the container: point a copy at a local stand-in
    token = tmp_path / "token"
    token.write_text("t0k")
    text = PROMETHEUS_YML.read_text()
    original = re.search(r"credentials_file: (\S+)", text).group(1)
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace(original, str(token)))
    out = subprocess.run([promtool, "check", "config", str(config)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_grafana_provisioning_fits_together():
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    (provider,) = yaml.safe_load(PROVIDERS.read_text())["providers"]
    assert provider["options"]["path"] == "/etc/grafana/dashboards"
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"])
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    # what /dashboard shows: the DS comparison as an estimate, decisions, queues, workers
    for words in ("Net saving vs Dynamic Sampling (ESTIMATE", "DS estimate", "Decisions",
                  "Queues", "Workers"):
        assert words in titles, words


def test_every_expression_names_a_sara_or_process_metric():
    """Each expression names at least one metric the live test can check (none escapes it)."""
    for expr in dashboard_expressions(json.loads(DASHBOARD.read_text())):
        assert re.search(r"\b(sara|process)_[a-z0-9_]+", expr), expr


def test_mounted_paths_match_the_provisioning(monitoring):
    targets = {v["target"] for v in monitoring["services"]["grafana"]["volumes"]}
    assert {"/etc/grafana/provisioning", "/etc/grafana/dashboards"} <= targets
    assert Path(DASHBOARD).name in (ROOT / "docker-compose.yml").read_text()
