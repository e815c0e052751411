"""The demo's summary: a rich table, ``summary.json`` and a PNG chart of accuracy and rollouts.

``summary`` is the dict :func:`sara_demo.demo.run_demo` returns (see its docstring); these
functions only read it. matplotlib (the trainer extra) is imported only to draw the chart.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}" if not value.is_integer() else f"{int(value):,}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _acc(arm: dict[str, Any], n: int) -> str:
    from .compare import standard_error

    value = arm["accuracy_after"]
    return f"{100 * value:.1f}% ± {100 * standard_error(value, n):.1f}"


def _reach(cmp: dict[str, Any], key: str) -> tuple[str, str]:
    """(SARA, DS) cells for the rollouts or tokens spent to reach a target."""
    got = cmp[key]
    sara = "not reached" if got["sara"] is None else f"{got['sara']:,.0f}"
    if got["ratio"] is not None:
        sara += f" ({got['ratio']:.2f}x DS)"
    return sara, "not reached" if got["ds"] is None else f"{got['ds']:,.0f}"


def comparison_rows(summary: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, SARA, Dynamic Sampling) rows of the side-by-side table: all measured here."""
    sara, ds = summary["arms"]["sara"], summary["arms"]["dynamic_sampling"]
    cmp, acc = summary["comparison"], summary["accuracy"]
    n = acc["n"]
    before = f"{100 * acc['before_rl']:.1f}% ± {100 * acc['standard_error_before']:.1f}"

    def both(key: str) -> tuple[str, str]:
        return _num(sara[key]), _num(ds[key])

    return [
        ("held-out greedy accuracy, warm start", before, before),
        ("held-out greedy accuracy after RL (± 1 s.e.)", _acc(sara, n), _acc(ds, n)),
        ("change", f"{100 * (sara['accuracy_after'] - acc['before_rl']):+.1f} points",
         f"{100 * (ds['accuracy_after'] - acc['before_rl']):+.1f} points"),
        ("rollouts spent", *both("rollouts_spent")),
        ("tokens spent", *both("tokens_spent")),
        ("RL steps (batches of mixed groups)", *both("steps")),
        ("rollouts per mixed group", *both("rollouts_per_mixed_group")),
        (f"rollouts to reach DS's final {100 * cmp['targets']['ds_final']:.1f}%",
         *_reach(cmp, "rollouts_to_ds_final")),
        ("tokens to reach it", *_reach(cmp, "tokens_to_ds_final")),
        (f"rollouts to reach {100 * cmp['targets']['halfway']:.1f}% (halfway)",
         *_reach(cmp, "rollouts_to_halfway")),
        ("groups committed / abandoned",
         f"{sara['groups_committed']:,} / {sara['groups_abandoned']:,}",
         f"{ds['groups_delivered']:,} kept of {ds['groups_opened']:,}"),
        ("DS rollouts per mixed group: SARA's live ESTIMATE | measured",
         _ds_estimate(summary.get("estimate") or {}), _num(ds["rollouts_per_mixed_group"])),
        ("false abandons measured on audited groups (95% CI)",
         _false_abandons(summary.get("estimate") or {}), "-"),
        ("wall time of the arm", f"{sara['seconds']:.0f}s", f"{ds['seconds']:.0f}s"),
    ]


def _ds_estimate(est: dict[str, Any]) -> str:
    """The scheduler's DS figure with its 95% interval, or why there is none."""
    low, high = est.get("low"), est.get("high")
    if low is None:
        return "-"
    point = est.get("ds_rollouts_per_mixed_group")
    head = "no audit finished yet" if point is None else f"{point:.1f}"
    return f"{head} (95% CI {low:.1f}-{'inf' if high is None else f'{high:.1f}'})"


def _false_abandons(est: dict[str, Any]) -> str:
    if est.get("false_abandon_rate") is None:
        return "-"
    return (f"{_pct(est['false_abandon_rate'])} ({_pct(est['false_abandon_low'])}-"
            f"{_pct(est['false_abandon_high'])}) of {est['audited_groups']:,} audited; audit "
            f"cost {_pct(est.get('audit_cost_fraction') or 0)} of rollouts")


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs of the single-arm table (``--no-compare``), in order."""
    acc, sched = summary["accuracy"], summary["scheduler"]
    delta = acc["after_rl"] - acc["before_rl"]
    est = summary.get("estimate") or {}
    return [
        ("held-out greedy accuracy, warm start", _pct(acc["before_rl"])),
        ("held-out greedy accuracy after RL",
         f"{_pct(acc['after_rl'])} ± {100 * acc['standard_error_after']:.1f}"),
        ("change", f"{100 * delta:+.1f} points"),
        ("held-out problems (greedy)", _num(acc["n"])),
        ("RL steps (policy version)",
         f"{summary['rl']['steps']} (v{summary['rl']['policy_version']})"),
        ("rollouts spent", _num(sched["rollouts_spent"])),
        ("tokens spent", _num(sched["tokens_spent"])),
        ("groups committed / abandoned",
         f"{sched['groups_committed']:,} / {sched['groups_abandoned']:,}"),
        ("rollouts per mixed group", _num(sched["rollouts_per_effective_group"])),
        ("DS rollouts per mixed group (ESTIMATE, 95% CI)", _ds_estimate(est)),
        ("false abandons measured on audited groups (95% CI)", _false_abandons(est)),
        ("wall time", f"{summary['wall_seconds']:.0f}s"),
    ]


def render_table(summary: dict[str, Any]):
    """A ``rich.table.Table`` of the summary: side by side when the DS arm ran."""
    from rich.table import Table

    title = f"SARA demo (seed {summary['seed']}, backend {summary['backend']})"
    if summary.get("comparison"):
        table = Table(title=title, caption="every figure measured in this run (but the one marked "
                      "ESTIMATE, SARA's live figure for DS beside DS's measured one), same warm "
                      "start, seed, prompts and rollout budget; ± is one binomial standard error")
        table.add_column("metric")
        table.add_column("SARA", justify="right")
        table.add_column("Dynamic Sampling", justify="right")
        for row in comparison_rows(summary):
            table.add_row(*row)
        return table
    table = Table(title=title, caption="--no-compare: no DS arm ran; the DS figure is the "
                  "scheduler's estimate, not a measurement")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for label, value in summary_rows(summary):
        table.add_row(label, value)
    return table


def print_summary(summary: dict[str, Any], console=None) -> None:
    from rich.console import Console

    (console or Console()).print(render_table(summary))


def write_json(summary: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(summary, indent=1, default=_jsonable) + "\n")
    tmp.replace(path)
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


ARM_STYLE = {"sara": ("SARA", "tab:blue"), "dynamic_sampling": ("Dynamic Sampling", "tab:red")}


def plot_chart(summary: dict[str, Any], path: str | Path) -> Path:
    """Held-out greedy accuracy of each arm against rollouts spent (left) and tokens spent
    (right), with DS's final accuracy and where each arm first reached it (dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    cmp = summary.get("comparison")
    for panel, key, unit in ((panels[0], "rollouts_cum", "rollouts"),
                             (panels[1], "tokens_cum", "tokens")):
        for name, arm in summary["arms"].items():
            label, color = ARM_STYLE.get(name, (name, "tab:gray"))
            evals = arm["evals"]
            panel.plot([e[key] for e in evals], [100 * e["accuracy"] for e in evals], "o-",
                       color=color, label=label, markersize=4)
        if cmp:
            panel.axhline(100 * cmp["ds_final_accuracy"], color="tab:gray", ls=":", lw=1,
                          label="DS's final accuracy")
            reached = cmp[f"{unit}_to_ds_final"]
            for arm, color in (("sara", "tab:blue"), ("ds", "tab:red")):
                if reached[arm] is not None:
                    panel.axvline(reached[arm], color=color, ls=":", lw=1)
        panel.set_xlabel(f"{unit} spent")
        panel.grid(alpha=0.3)
        panel.legend(loc="lower right", fontsize="small")
    panels[0].set_ylabel("held-out greedy accuracy, %")
    n = summary["accuracy"]["n"]
    fig.suptitle(f"sara demo, seed {summary['seed']}: held-out accuracy ({n:,} problems) "
                 "against what each method spent")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
