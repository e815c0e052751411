"""GET /dashboard in a real headless Chromium against a real scheduler with a moving workload.

The page is opened with ?token=<operator token> (auth on), watched while the workload runs (the
numbers must move), then the workload is stopped; once the page has polled the quiescent state
twice, every chart must have drawn points and every number on it must equal /stats fetched right
after. A full-page screenshot is saved under the test's tmp_path (its path is printed; set
SARA_DASHBOARD_SCREENSHOT_DIR to also copy it there).

Skipped, with the reason, only when no Chromium (or no `websockets`) is found and CI is unset;
in CI it must run.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

import pytest

from sara_client import SaraClient
from sara_service.settings import Settings

from ._cdp import Browser, find_chromium, wait_until
from ._live import LiveServer, Workload

TOKENS = {"worker": "tok-worker-1f3a", "trainer": "tok-trainer-9b2c",
          "operator": "tok-operator-77d1", "admin": "tok-admin-c0de"}
CHARTS = ("chart-efficiency", "chart-useful-fraction", "chart-decisions",
          "chart-abandon-histogram", "chart-queues", "chart-batches")


def _require_browser() -> str:
    exe = find_chromium()
    missing = []
    if exe is None:
        missing.append("chromium (apt-get install -y chromium, or set SARA_CHROMIUM)")
    if importlib.util.find_spec("websockets") is None:
        missing.append("the websockets package (pip install websockets)")
    if missing:
        reason = "dashboard browser test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI is set: this test must run)")
        pytest.skip(reason)
    return exe


SNAPSHOT_JS = r"""
(() => {
  const all = (s) => Array.from(document.querySelectorAll(s));
  const one = (s) => document.querySelector(s);
  const tiles = {}, text = {}, charts = {}, config = {};
  all("[data-testid][data-value]").forEach((e) => {
    tiles[e.dataset.testid] = e.dataset.value;
    const shown = e.querySelector(".tile-value") || e.querySelector("b") || e;
    text[e.dataset.testid] = shown.textContent.trim();
  });
  all("canvas[data-testid]").forEach((c) => {
    charts[c.dataset.testid] = {points: Number(c.dataset.points), width: c.width,
                                height: c.height};
  });
  all('[data-testid="config-table"] [data-key]').forEach((r) => { config[r.dataset.key] = r.dataset.value; });
  const status = one('[data-testid="status"]');
  return {
    tiles, text, charts, config,
    histogram: JSON.parse(one('[data-testid="chart-abandon-histogram"]').dataset.values || "{}"),
    workers: all('[data-testid="worker-row"]').map((r) => ({
      id: r.dataset.workerId, stale: r.dataset.stale === "true",
      completed: Number(r.dataset.rolloutsCompleted)})),
    batches: all('[data-testid="batch-row"]').map((r) => r.dataset.batchId),
    status: {state: status.dataset.state, polls: Number(status.dataset.polls),
             now: Number(status.dataset.now || 0), text: status.textContent.trim()},
    verdict: {state: one('[data-testid="verdict"]').dataset.state,
              text: one('[data-testid="verdict"]').textContent.trim()},
    policy: one('[data-testid="meta-policy-version"]').textContent.trim(),
    effective: one('[data-testid="meta-effective"]').textContent.trim(),
    warnings: {hidden: one('[data-testid="warnings"]').hidden,
               text: one('[data-testid="warnings"]').textContent.trim()},
    tokenStored: sessionStorage.getItem("sara.dashboard.token") !== null,
  };
})()
"""


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def num(value: str) -> float | None:
    return None if value == "" else float(value)


def _lease_one_rollout(worker: SaraClient) -> str:
    """Lease one rollout as one of the workload's workers, while the workload still runs.

    Once the workload stops, its trainer no longer acks batches, so flow control may admit no
    new group and the queue can be empty: the lease must be taken before the stop."""
    lease = wait_until(lambda: (got := worker.lease("sim-a", 1, wait_s=1)).rollouts and got,
                       30, "a rollout to lease while the workload runs")
    return lease.rollouts[0].rollout_id


@pytest.mark.e2e
@pytest.mark.timeout(90)
def test_dashboard_live_in_chromium(redis_url, tmp_path):
    exe = _require_browser()
    settings = Settings(redis_url=redis_url, policy="sara", group_size=8, tau_low=0.5,
                        audit_fraction=0.5,  # enough finished audits for every DS figure
                        batch_size=8, prefetch_batches=2, worker_stale_s=2.0,
                        **{f"{role}_token": tok for role, tok in TOKENS.items()})
    server = LiveServer(settings)
    access = _Capture()
    logging.getLogger("uvicorn.access").addHandler(access)
    server.start()
    workload = None
    try:
        workload = Workload(server.url, admin=TOKENS["admin"], worker=TOKENS["worker"],
                            trainer=TOKENS["trainer"]).start()
        with Browser.launch(tmp_path, exe) as browser, \
                SaraClient(server.url, token=TOKENS["operator"]) as operator, \
                SaraClient(server.url, token=TOKENS["worker"]) as worker:
            page = browser.page()
            page.navigate(f"{server.url}/dashboard?token={TOKENS['operator']}")

            def snap() -> dict:
                return page.evaluate(SNAPSHOT_JS)

            # live: the page polls, decisions per second and delivered groups move
            moving = wait_until(
                lambda: (s := snap())["status"]["polls"] >= 8
                and num(s["tiles"]["tile-commit-per-s"] or "0") > 0
                and num(s["tiles"]["tile-groups-delivered"] or "0") > 0
                and len(s["batches"]) >= 2 and s,
                30, "the dashboard to show a moving workload")
            assert moving["status"]["state"] == "ok", moving["status"]
            # two live workers report engines of 16 slots, each 50-100% full
            assert num(moving["tiles"]["queue-engine-slots"]) == 32
            assert 50 <= float(moving["text"]["queue-engine-occupancy"].rstrip("%")) <= 100
            assert moving["tokenStored"]

            assert moving["warnings"]["hidden"] and moving["effective"] == "outcome"
            shaped = _lease_one_rollout(worker)
            workload.stop()
            # one reward of 0.1 (neither 0 nor 1): the outcome view's warning must show
            worker.report("sim-a", [{"rollout_id": shaped, "reward": 0.1}])
            quiet_now = operator.stats().now
            after = wait_until(lambda: (s := snap())["status"]["now"] > quiet_now and s, 10,
                               "a poll after the workload stopped")
            # quiet once every worker has gone stale (2 s unseen): /stats, read after the page,
            # then counts the same engines (none) as the page's last poll did
            shown = wait_until(lambda: (s := snap())["status"]["polls"]
                               >= after["status"]["polls"] + 1
                               and all(w["stale"] for w in s["workers"]) and s, 10,
                               "a quiet poll with every worker stale")
            stats = operator.stats().model_dump(mode="json")
            shot = page.screenshot(tmp_path / "dashboard.png")
            print(f"\ndashboard screenshot: {shot}")
            keep = os.environ.get("SARA_DASHBOARD_SCREENSHOT_DIR")  # e.g. a CI artifact folder
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                print(f"dashboard screenshot copied to {shutil.copy(shot, keep)}")
            errors = page.errors()
    finally:
        if workload is not None and not workload.stop_event.is_set():
            workload.stop()
        server.stop()
        logging.getLogger("uvicorn.access").removeHandler(access)

    assert errors == [], errors
    assert shown["status"]["state"] == "ok", shown["status"]

    # every chart drew data
    for chart in CHARTS:
        assert shown["charts"][chart]["points"] > 0, (chart, shown["charts"])
        assert shown["charts"][chart]["width"] > 100, (chart, shown["charts"])

    # the numbers equal /stats in the quiescent state
    c, d, q = stats["counters"], stats["derived"], stats["queues"]
    expected = {
        "tile-saving": d["net_saving_vs_ds"],
        "tile-rollouts-per-effective-group": d["rollouts_per_effective_group"],
        "tile-ds-rollouts-per-effective-group": d["ds_rollouts_per_effective_group"],
        "tile-useful-fraction": d["useful_fraction"],
        "tile-net-rollouts-saved-vs-ds": d["net_rollouts_saved_vs_ds"],
        "tile-false-abandon-rate": d["false_abandon_rate"],
        "tile-audit-cost": d["audit_cost_fraction"],
        "tile-groups-delivered": c["groups_delivered"],
        "tile-abandon-rate": d["abandon_rate"],
        "tile-expected-false-abandon-rate": d["expected_false_abandon_rate"],
        "tile-policy-version": stats["policy"]["version"],
        "tile-commit-per-s": 0, "tile-abandon-per-s": 0, "tile-continue-per-s": 0,
        "queue-pending": q["pending"], "queue-leased": q["leased"],
        "queue-in-flight": d["rollouts_in_flight"], "queue-open-groups": q["open_groups"],
        "queue-ready-groups": q["ready_groups"], "queue-unacked-batches": q["unacked_batches"],
        "queue-expected-yield": q["expected_yield_open"], "queue-flow-target": q["flow_target"],
        "queue-engine-slots": q["engine_slots"],
        "derived-delivered-age": d["delivered_age_versions"],
    }
    for testid, value in expected.items():
        assert value is not None, testid
        assert num(shown["tiles"][testid]) == pytest.approx(value, rel=1e-9, abs=1e-12), testid
    assert shown["text"]["tile-groups-delivered"] == f"{c['groups_delivered']:,}"
    occupancy_shown = shown["text"]["queue-engine-occupancy"]
    assert occupancy_shown == "–" and q["engine_occupancy"] is None  # no live engine now
    useful_shown = shown["text"]["tile-useful-fraction"]
    assert useful_shown.endswith("%")
    assert float(useful_shown[:-1]) == pytest.approx(100 * d["useful_fraction"], abs=0.051)
    assert shown["policy"] == f"v{stats['policy']['version']}"
    (warning,) = stats["warnings"]
    assert not shown["warnings"]["hidden"] and shown["warnings"]["text"] == warning
    assert stats["policy"]["version"] >= 1  # the trainer published while the page watched
    assert shown["histogram"] == stats["abandon_histogram"] and stats["abandon_histogram"]
    assert shown["charts"]["chart-abandon-histogram"]["points"] == len(stats["abandon_histogram"])
    assert shown["batches"] == [b["batch_id"] for b in stats["recent_batches"]]
    assert shown["charts"]["chart-batches"]["points"] == len(stats["recent_batches"])
    assert {w["id"]: w["completed"] for w in shown["workers"]} == \
        {w["worker_id"]: w["rollouts_completed"] for w in stats["workers"]}
    assert {w["id"] for w in shown["workers"]} == {"sim-a", "sim-b", "sim-idle"}
    assert [w["stale"] for w in shown["workers"] if w["id"] == "sim-idle"] == [True]
    assert shown["config"]["policy"] == "sara" and shown["config"]["group_size"] == "8"
    # the headline is called a saving only when its whole interval is above zero
    low, high = d["net_saving_vs_ds_low"], d["net_saving_vs_ds_high"]
    state = "saving" if low > 0 else "not-saving" if high < 0 else "noise"
    assert shown["verdict"]["state"] == state
    assert "95% CI" in shown["verdict"]["text"] and "estimate" in shown["verdict"]["text"]
    assert "per group of k" not in shown["verdict"]["text"]   # every group has k: no aside

    # the token went out in the URL once and never into a log line
    assert any("/dashboard?token=***" in line for line in access.lines), access.lines[:5]
    assert not any(tok in line for line in access.lines for tok in TOKENS.values())
    assert not any("?token=" in line for line in access.lines if "/stats" in line)
