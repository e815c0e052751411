"""The demo's summary: a rich table, ``summary.json`` and a PNG chart of accuracy and rollouts.

``summary`` is the dict :func:`sara_trainer.demo.run_demo` returns (see its docstring); these
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


def _saved(sched: dict[str, Any]) -> str:
    """Saved rollouts, and their share of what DS would have paid for the same groups (every
    opened group run to k: SARA's spend plus k - n for each abandoned group)."""
    saved, spent = sched["rollouts_saved_vs_ds"], sched["rollouts_spent"]
    if not saved or spent + saved <= 0:
        return _num(saved)
    return f"{saved:,} ({100 * saved / (spent + saved):.0f}% of DS's {spent + saved:,})"


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs of the summary table, in order."""
    acc, sched = summary["accuracy"], summary["scheduler"]
    delta = acc["after_rl"] - acc["before_rl"]
    rows = [
        ("held-out accuracy after SFT (before RL)", _pct(acc["before_rl"])),
        ("held-out accuracy after RL", _pct(acc["after_rl"])),
        ("change", f"{100 * delta:+.1f} points"),
        ("held-out problems (greedy)", _num(acc["n"])),
        ("RL steps (policy version)",
         f"{summary['rl']['steps']} (v{summary['rl']['policy_version']})"),
        ("rollouts spent", _num(sched["rollouts_spent"])),
        ("tokens spent", _num(sched["tokens_spent"])),
        ("groups committed", _num(sched["groups_committed"])),
        ("groups abandoned", _num(sched["groups_abandoned"])),
        ("groups delivered (effective)", _num(sched["groups_delivered"])),
        ("rollouts saved vs Dynamic Sampling", _saved(sched)),
        ("rollouts per effective group", _num(sched["rollouts_per_effective_group"])),
        ("useful fraction", _pct(sched["useful_fraction"])),
        ("SFT warm start", f"{summary['sft']['steps']} steps, {summary['sft']['seconds']:.0f}s"),
        ("wall time", f"{summary['wall_seconds']:.0f}s"),
    ]
    return rows


def render_table(summary: dict[str, Any]):
    """A ``rich.table.Table`` of the summary."""
    from rich.table import Table

    table = Table(title=f"SARA demo (seed {summary['seed']}, backend {summary['backend']})")
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


def plot_chart(summary: dict[str, Any], path: str | Path) -> Path:
    """Two panels over RL steps: held-out greedy accuracy and batch mean reward; cumulative
    rollouts spent and rollouts saved against Dynamic Sampling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = summary["history"]
    evals = summary["evals"]
    steps = [h["step"] for h in history]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    acc_line = top.plot([e["step"] for e in evals], [100 * e["accuracy"] for e in evals], "o-",
                        color="tab:blue", label="held-out greedy accuracy (left)")
    top.set_ylabel("held-out accuracy, %")
    top.set_title("SARA demo: accuracy and rollouts over RL steps")
    top.grid(alpha=0.3)
    right = top.twinx()  # sampled reward on effective groups lives on another scale
    reward_line = right.plot(steps, [100 * h["mean_reward"] for h in history], "-",
                             color="tab:orange", alpha=0.6,
                             label="batch mean reward, sampled (right)")
    right.set_ylabel("batch mean reward, %")
    lines = acc_line + reward_line
    top.legend(lines, [line.get_label() for line in lines], loc="upper left", fontsize="small")
    bottom.plot(steps, [h["rollouts_cum"] for h in history], "-", color="tab:green",
                label="rollouts spent (cumulative)")
    bottom.plot(steps, [h["saved_vs_ds_cum"] for h in history], "--", color="tab:red",
                label="rollouts saved vs DS (cumulative)")
    bottom.set_xlabel("RL step")
    bottom.set_ylabel("rollouts")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="upper left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
