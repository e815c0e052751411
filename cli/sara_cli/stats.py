"""`sara stats`: GET /stats as a table, as JSON, or live (--watch)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from . import common
from .common import DEFAULT_URL, TokenOpt, UrlOpt, fail

COUNTERS = ("rollouts_issued", "rollouts_completed", "rollouts_cancelled", "groups_opened",
            "groups_committed", "groups_abandoned", "groups_delivered", "groups_audited",
            "audits_mixed", "audits_pure", "audit_rollouts",
            "rollouts_not_spent_on_abandoned_groups", "expected_false_abandons",
            "batches_formed", "batches_acked")


def stats(
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    watch_: Annotated[bool, typer.Option("--watch", "-w", help="Live view, refreshed every "
                                         "--interval seconds; Ctrl-C to quit.")] = False,
    interval: Annotated[float, typer.Option("--interval", "-n", min=0.1,
                                            help="Seconds between refreshes of --watch.")] = 1.0,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Show GET /stats as a compact table, or live with --watch (the /dashboard figures)."""
    if watch_:
        if as_json:
            raise fail("--json and --watch do not go together", 2)
        _watch(url, token, interval)
        return
    try:
        client = common.client(url, token)
        try:
            raw = client.stats()
        finally:
            common.close(client)
    except Exception as e:
        raise fail(f"stats failed: {e}", 1) from None
    data = raw.model_dump(mode="json") if hasattr(raw, "model_dump") else dict(raw)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    _print_table(data, url)


def _watch(url: str, token: str | None, interval: float) -> None:
    """`sara stats --watch`: the live view of sara_cli.watch until Ctrl-C."""
    from . import watch

    client = common.client(url, token)
    try:
        watch.watch(client.stats, interval)
    finally:
        common.close(client)


def _print_table(data: dict[str, Any], url: str) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = data.get("config") or {}
    console = Console()
    console.print(f"[bold]{url}[/]  ns={data.get('namespace')}  {cfg.get('policy', '?')} "
                  f"k={cfg.get('group_size', '?')}  policy "
                  f"v{(data.get('policy') or {}).get('version')}", highlight=False)
    console.print(estimate_line(data.get("derived") or {}), highlight=False)
    for warning in data.get("warnings") or []:
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False, markup=True)
    table = Table()
    for column, justify in (("section", "left"), ("metric", "left"), ("value", "right")):
        table.add_column(column, justify=justify)
    counters = data.get("counters") or {}
    for name in COUNTERS:
        if name in counters:
            table.add_row("counters", name, fmt(counters[name]))
    for section in ("derived", "queues"):
        for name, value in (data.get(section) or {}).items():
            table.add_row(section, name, fmt(value))
    workers = data.get("workers") or []
    stale = sum(1 for w in workers if w.get("stale"))
    stopped = sum(1 for w in workers if w.get("stopped"))
    table.add_row("workers", "live / stale / stopped",
                  f"{len(workers) - stale - stopped} / {stale} / {stopped}")
    console.print(table)


def estimate_line(derived: dict) -> str:
    """The DS comparison in one line, each estimate with its 95% interval."""
    def ci(name: str, pct: bool = False) -> str:
        point, low, high = (derived.get(name + suffix) for suffix in ("", "_low", "_high"))
        show = (lambda v: "-" if v is None else f"{100 * v:+.1f}%") if pct else fmt
        return f"{show(point)} (95% CI {show(low)} to {show(high) if high is not None else 'inf'})"

    return (f"ESTIMATE vs Dynamic Sampling: net saving {ci('net_saving_vs_ds', True)}; DS would "
            f"spend {ci('ds_rollouts_per_effective_group')} rollouts per effective group; "
            f"measured false-abandon rate {ci('false_abandon_rate')}")


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)
