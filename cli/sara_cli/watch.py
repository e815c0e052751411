"""`sara stats --watch`: the dashboard's figures as a live terminal view (rich).

:func:`render` is pure: ``render(stats, previous, dt)`` turns one /stats answer (a
``StatsResponse`` or its JSON dict), the previous one (or None) and the seconds between them into a
rich renderable; decisions per second come from the counter deltas. :func:`watch` polls a fetch
function every ``interval`` seconds under ``rich.live.Live`` until Ctrl-C.

Imports only rich (and the standard library), so the CLI can import it lazily.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from rich import box
from rich.columns import Columns
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

BAR_WIDTH = 32
MAX_BATCHES = 8
DECISIONS = (("commit", "decisions_commit", "green"),
             ("abandon", "decisions_abandon", "dark_orange"),
             ("continue", "decisions_continue", "blue"))


def _as_dict(stats: Any) -> dict[str, Any]:
    if stats is None:
        return {}
    if hasattr(stats, "model_dump"):
        return stats.model_dump(mode="json")
    return dict(stats)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _f(v: Any, digits: int = 2) -> str:
    if not _num(v):
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def _pct(v: Any, digits: int = 1) -> str:
    return f"{100 * v:.{digits}f}%" if _num(v) else "-"


def _ago(seconds: Any) -> str:
    if not _num(seconds):
        return "-"
    s = max(0.0, float(seconds))
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def saving_vs_ds(stats: Mapping[str, Any]) -> tuple[float | None, float | None, float | None]:
    """The estimated net saving against Dynamic Sampling and its 95% interval (None: unknown)."""
    d = stats.get("derived") or {}
    return (d.get("net_saving_vs_ds"), d.get("net_saving_vs_ds_low"),
            d.get("net_saving_vs_ds_high"))


def _interval(low: Any, high: Any, fmt: Callable[[Any], str]) -> str:
    return f"95% CI {fmt(low)}–{fmt(high) if high is not None else '∞'}"


def decision_rates(stats: Mapping[str, Any], previous: Mapping[str, Any] | None,
                   dt: float | None) -> dict[str, float | None]:
    """Commit / abandon / continue per second between two /stats answers.

    ``dt`` defaults to the difference of the answers' ``now``; a counter that went down (the
    namespace was flushed) or a non-positive dt gives no rate (None)."""
    out: dict[str, float | None] = {name: None for name, _, _ in DECISIONS}
    if not previous:
        return out
    if dt is None and _num(stats.get("now")) and _num(previous.get("now")):
        dt = stats["now"] - previous["now"]
    if not dt or dt <= 0:
        return out
    c, p = stats.get("counters") or {}, previous.get("counters") or {}
    deltas = {name: (c.get(field) or 0) - (p.get(field) or 0) for name, field, _ in DECISIONS}
    if any(v < 0 for v in deltas.values()):
        return out
    return {name: v / dt for name, v in deltas.items()}


def _kv_table(title: str) -> Table:
    table = Table(title=title, title_style="bold", title_justify="left", box=box.SIMPLE_HEAD,
                  show_header=False, expand=False, pad_edge=False)
    table.add_column("metric", style="dim")
    table.add_column("value", justify="right")
    table.add_column("note", style="dim")
    return table


def _header(s: Mapping[str, Any]) -> RenderableType:
    cfg = s.get("config") or {}
    policy = s.get("policy") or {}
    saving = saving_vs_ds(s)
    head = Text.assemble(
        ("SARA ", "bold"), (f"ns={s.get('namespace', '?')}  ", ""),
        (f"{cfg.get('policy', '?')}", "bold"), (f"  selection={cfg.get('selection', '?')}", ""),
        (f"  k={cfg.get('group_size', '?')}  tau_low={cfg.get('tau_low', '?')}", ""),
        (f"  policy v{policy.get('version', '?')}", "bold"),
        ("  auth " + ("on" if cfg.get("auth_enabled") else "OPEN"), ""))
    warnings = [Text("warning: " + w, style="bold yellow") for w in s.get("warnings") or []]
    return Group(head, _verdict(saving, s.get("derived") or {}), *warnings)


def _verdict(saving: tuple, d: Mapping[str, Any]) -> Text:
    """The headline: an estimate with its interval, called a saving only when the interval is."""
    point, low, high = saving
    ci = f"  (ESTIMATE, {_interval(low, high, _pct)}; DS {_f(d.get('ds_rollouts_per_effective_group'))}" \
         f" vs {_f(d.get('rollouts_per_effective_group'))} rollouts per effective group here)"
    if point is None:
        return Text("no estimate yet: waiting for delivered groups and the first finished audit",
                    style="dim")
    if low is not None and low > 0:
        return Text.assemble((f"saving {_pct(point)} of rollouts vs Dynamic Sampling",
                              "bold green"), (ci, ""))
    if high is not None and high < 0:
        return Text.assemble((f"spending {_pct(-point)} more rollouts than Dynamic Sampling",
                              "bold yellow"), (ci, ""))
    return Text.assemble((f"{_pct(point)} vs Dynamic Sampling, within noise", "bold"), (ci, ""))


def _efficiency(s: Mapping[str, Any]) -> Table:
    d, c = s.get("derived") or {}, s.get("counters") or {}
    k = (s.get("config") or {}).get("group_size")
    ds = d.get("ds_rollouts_per_effective_group")
    ds_useful = min(1.0, k / ds) if _num(k) and _num(ds) and ds > 0 else None
    t = _kv_table("efficiency vs DS (DS figures are estimates from audited groups)")
    point, low, high = saving_vs_ds(s)
    t.add_row("net saving vs DS", Text(_pct(point), style="bold green" if (low or 0) > 0
                                       else "bold"), _interval(low, high, _pct))
    t.add_row("rollouts / effective group", _f(d.get("rollouts_per_effective_group")),
              f"DS {_f(ds)} ({_interval(d.get('ds_rollouts_per_effective_group_low'), d.get('ds_rollouts_per_effective_group_high'), _f)})")
    t.add_row("net rollouts saved vs DS", _f(d.get("net_rollouts_saved_vs_ds")),
              _interval(d.get("net_rollouts_saved_vs_ds_low"),
                        d.get("net_rollouts_saved_vs_ds_high"), _f))
    t.add_row("useful fraction", _pct(d.get("useful_fraction")), f"DS {_pct(ds_useful)}")
    t.add_row("groups delivered", _f(c.get("groups_delivered")),
              f"{_f(c.get('batches_formed'))} batches")
    t.add_row("abandon rate", _pct(d.get("abandon_rate")), "")
    t.add_row("false abandons (measured)", _pct(d.get("false_abandon_rate"), 1),
              f"{_f(c.get('audits_mixed', 0) + c.get('audits_pure', 0))} audited, "
              + _interval(d.get("false_abandon_rate_low"), d.get("false_abandon_rate_high"), _pct))
    t.add_row("audit cost", _pct(d.get("audit_cost_fraction"), 1), "of rollouts completed")
    t.add_row("not spent on abandoned groups", _f(c.get("rollouts_not_spent_on_abandoned_groups")),
              "not a saving: false abandons cost")
    return t


def _decisions(s: Mapping[str, Any], previous: Mapping[str, Any] | None,
               dt: float | None) -> Table:
    rates = decision_rates(s, previous, dt)
    c = s.get("counters") or {}
    t = Table(title="decisions / s", title_style="bold", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("decision")
    t.add_column("per s", justify="right")
    t.add_column("total", justify="right", style="dim")
    for name, field, style in DECISIONS:
        t.add_row(Text(name, style=style), _f(rates[name], 1), _f(c.get(field)))
    return t


def _queues(s: Mapping[str, Any]) -> Table:
    q, d = s.get("queues") or {}, s.get("derived") or {}
    t = _kv_table("queues")
    t.add_row("pending", _f(q.get("pending")), "issued, no worker yet")
    t.add_row("leased", _f(q.get("leased")), "with workers")
    t.add_row("in flight", _f(d.get("rollouts_in_flight")), "")
    t.add_row("open groups", _f(q.get("open_groups")),
              f"yield {_f(q.get('expected_yield_open'), 1)}")
    t.add_row("ready groups", _f(q.get("ready_groups")), f"target {_f(q.get('flow_target'))}")
    t.add_row("unacked batches", _f(q.get("unacked_batches")), "")
    return t


def _histogram(s: Mapping[str, Any]) -> Table:
    hist = s.get("abandon_histogram") or {}
    items = sorted(((int(n), int(v)) for n, v in hist.items()), key=lambda x: x[0])
    top = max((v for _, v in items), default=0)
    t = Table(title="abandoned after n rollouts", title_style="bold", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("n", justify="right")
    t.add_column("groups", min_width=BAR_WIDTH)
    t.add_column("", justify="right")
    if not items:
        t.add_row("-", Text("no group abandoned yet", style="dim"), "")
    for n, v in items:
        width = max(1, round(BAR_WIDTH * v / top)) if v > 0 else 0
        t.add_row(str(n), Text("█" * width, style="dark_orange"), str(v))
    return t


def _workers(s: Mapping[str, Any]) -> Table:
    workers = sorted(s.get("workers") or [],
                     key=lambda w: (bool(w.get("stale") or w.get("stopped")),
                                    str(w.get("worker_id"))))
    version = (s.get("policy") or {}).get("version")
    now = s.get("now")
    stale_n = sum(1 for w in workers if w.get("stale"))
    stopped_n = sum(1 for w in workers if w.get("stopped"))
    gone = f", {stopped_n} stopped" if stopped_n else ""
    t = Table(title=f"workers ({len(workers) - stale_n - stopped_n} live, {stale_n} stale{gone})",
              title_style="bold", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("worker", "left"), ("backend", "left"), ("policy v", "right"),
                          ("rollouts/s", "right"), ("tokens/s", "right"),
                          ("completed", "right"), ("last seen", "right"), ("state", "left")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    if not workers:
        t.add_row(Text("no worker has leased yet", style="dim"), *[""] * 7)
    for w in workers:
        pv = w.get("policy_version")
        behind = _num(pv) and _num(version) and pv < version
        seen = now - w["last_seen"] if _num(now) and _num(w.get("last_seen")) else None
        t.add_row(str(w.get("worker_id")), w.get("backend") or "-",
                  Text(f"v{pv}" if _num(pv) else "-", style="yellow" if behind else ""),
                  _f(w.get("rollouts_per_s"), 1), _f(w.get("tokens_per_s"), 0),
                  _f(w.get("rollouts_completed")), _ago(seen),
                  _state(w))
    return t


def _state(worker: Mapping[str, Any]) -> Text:
    if worker.get("stopped"):
        return Text("stopped", style="dim")
    return Text("STALE", style="bold red") if worker.get("stale") else Text("live", "green")


def _batches(s: Mapping[str, Any]) -> Table:
    batches = (s.get("recent_batches") or [])[:MAX_BATCHES]
    now = s.get("now")
    t = Table(title="recent batches", title_style="bold", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    ids = [str(b.get("batch_id", "?"))[:18] for b in batches]
    t.add_column("batch", no_wrap=True, min_width=max((len(i) for i in ids), default=5))
    for name in ("age", "policy v", "groups", "rollouts", "spent", "abandoned",
                 "unspent (abandoned)"):
        t.add_column(name, justify="right")
    t.add_column("early")
    if not batches:
        t.add_row(Text("no batch formed yet", style="dim"), *[""] * 8)
    for b in batches:
        st = b.get("stats") or {}
        age = now - b["created_at"] if _num(now) and _num(b.get("created_at")) else None
        t.add_row(str(b.get("batch_id", "?"))[:18], _ago(age), f"v{b.get('policy_version', '?')}",
                  _f(b.get("groups")), _f(b.get("rollouts")), _f(st.get("rollouts_spent")),
                  _f(st.get("groups_abandoned")), _f(st.get("rollouts_not_spent_on_abandoned_groups",
                                                           st.get("rollouts_saved_vs_ds"))),
                  Text("early", style="yellow") if st.get("ended_early") else "")
    return t


def render(stats: Any, previous: Any = None, dt: float | None = None) -> RenderableType:
    """One frame of the live view from a /stats answer (and the previous one, ``dt`` s earlier)."""
    s = _as_dict(stats)
    p = _as_dict(previous) if previous is not None else None
    # side by side where the terminal is wide enough, else one under the other
    top = Columns([_efficiency(s), _decisions(s, p, dt), _queues(s)], padding=(0, 4))
    return Group(_header(s), Text(""), top, _histogram(s), _workers(s), _batches(s))


def watch(fetch: Callable[[], Any], interval: float = 1.0, console: Console | None = None, *,
          max_frames: int | None = None, sleep: Callable[[float], Any] = time.sleep,
          clock: Callable[[], float] = time.monotonic) -> int:
    """Poll ``fetch`` every ``interval`` s and show :func:`render` live until Ctrl-C.

    A failing fetch shows its error above the last good frame and polling goes on. Returns the
    number of frames drawn (``max_frames`` bounds it, for tests)."""
    previous, previous_t, frames = None, None, 0
    last_good: RenderableType = Text("waiting for /stats…", style="dim")
    console = console or Console()
    # In a terminal a frame taller than the screen is cut with an ellipsis (a live region cannot
    # scroll); piped or captured, only the last frame is printed, whole.
    overflow = "ellipsis" if console.is_terminal else "visible"
    with Live(last_good, console=console, auto_refresh=False, transient=False,
              vertical_overflow=overflow) as live:
        try:
            while max_frames is None or frames < max_frames:
                started = clock()
                try:
                    stats = fetch()
                except Exception as e:  # connection refused, 401, 5xx: show it, keep polling
                    frame: RenderableType = Group(
                        Panel(Text(f"stats failed: {e}", style="bold red"), box=box.ROUNDED),
                        last_good)
                else:
                    dt = started - previous_t if previous_t is not None else None
                    last_good = frame = render(stats, previous, dt)
                    previous, previous_t = stats, started
                live.update(frame, refresh=True)
                frames += 1
                if max_frames is None or frames < max_frames:
                    sleep(max(0.0, interval - (clock() - started)))
        except KeyboardInterrupt:
            pass
    return frames
