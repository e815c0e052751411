// SARA dashboard: polls /stats about once a second and draws it. No dependencies.
//
// Auth: a token given as ?token=... is kept in sessionStorage (this tab only) and sent as
// "Authorization: Bearer <token>" on every poll; without one in the URL the stored one is used.
//
// For tests and scrapers, every chart <canvas> gets data-points (points or bars drawn) after
// each render, every numeric tile data-value (the raw number from /stats, "" when null), and the
// status element data-state (connecting | ok | error), data-polls and data-now (the `now` of the
// last /stats rendered).
(function () {
  "use strict";

  const POLL_MS = 1000;
  const ERROR_POLL_MS = 2000;
  const HISTORY = 300; // samples kept for the time charts (5 minutes at one per second)
  const TOKEN_KEY = "sara.dashboard.token";
  const CONFIG_FIRST = ["policy", "selection", "prior", "commit", "group_size", "tau_low",
    "tau_skip", "batch_size", "prefetch_batches", "max_staleness", "max_rollouts_per_batch",
    "posterior_decay", "posterior_half_life", "lease_ttl_s", "batch_ack_timeout_s", "worker_stale_s", "auth_enabled",
    "redis"];

  const css = getComputedStyle(document.documentElement);
  const color = (name) => css.getPropertyValue("--" + name).trim() || "#888";

  const $ = (sel, root) => (root || document).querySelector(sel);
  const byTestId = (id) => $('[data-testid="' + id + '"]');

  // --- token -------------------------------------------------------------------------------------

  function readToken() {
    const fromUrl = new URLSearchParams(window.location.search).get("token");
    try {
      if (fromUrl) {
        sessionStorage.setItem(TOKEN_KEY, fromUrl);
        return fromUrl;
      }
      return sessionStorage.getItem(TOKEN_KEY);
    } catch (e) { // storage disabled: the URL's token still works for this page
      return fromUrl;
    }
  }
  const token = readToken();

  // --- formatting --------------------------------------------------------------------------------

  const isNum = (v) => typeof v === "number" && isFinite(v);

  function fmt(v, digits) {
    if (!isNum(v)) return "–";
    if (Number.isInteger(v) && digits === undefined) return v.toLocaleString("en-US");
    const d = digits === undefined ? 2 : digits;
    if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en-US");
    return v.toFixed(d);
  }
  const pct = (v, digits) => (isNum(v) ? (v * 100).toFixed(digits === undefined ? 1 : digits) + "%" : "–");

  function compact(v) {
    if (!isNum(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
    if (Number.isInteger(v)) return String(v);
    if (a >= 100) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    return v.toFixed(2).replace(/\.?0+$/, "") || "0";
  }

  function ago(seconds) {
    if (!isNum(seconds)) return "–";
    const s = Math.max(0, seconds);
    if (s < 10) return s.toFixed(1) + " s";
    if (s < 120) return Math.round(s) + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  function setTile(testid, value, text, state) {
    const el = byTestId(testid);
    if (!el) return;
    el.dataset.value = isNum(value) ? String(value) : "";
    if (state !== undefined) el.dataset.state = state;
    const target = $(".tile-value", el) || $("b", el) || el;
    target.textContent = text;
  }

  function setText(sel, text) {
    const el = $(sel);
    if (el) el.textContent = text;
  }

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else node.setAttribute(k, v);
    }
    for (const child of children || []) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // --- canvas charts -----------------------------------------------------------------------------

  const renderers = new Map(); // canvas -> last draw closure, redrawn on resize

  function surface(canvas) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(50, canvas.clientWidth);
    const h = Math.max(50, canvas.clientHeight);
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    return { ctx, w, h };
  }

  const TICKS = 4;

  // The top of a y axis at or above v whose TICKS steps are round numbers.
  function niceMax(v) {
    if (!(v > 0)) return TICKS;
    const raw = v / TICKS;
    const exp = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) {
      if (m * exp >= raw - 1e-12) return m * exp * TICKS;
    }
    return 10 * exp * TICKS;
  }

  function emptyState(ctx, w, h, text) {
    ctx.fillStyle = color("muted");
    ctx.textAlign = "center";
    ctx.fillText(text, w / 2, h / 2);
  }

  function yAxis(ctx, pad, w, h, yMax, format) {
    const ticks = TICKS;
    ctx.textAlign = "right";
    for (let i = 0; i <= ticks; i++) {
      const v = (yMax * i) / ticks;
      const y = pad.t + (h - pad.t - pad.b) * (1 - i / ticks);
      ctx.strokeStyle = i === 0 ? color("line") : color("grid");
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(pad.l, Math.round(y) + 0.5);
      ctx.lineTo(w - pad.r, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.fillStyle = color("muted");
      ctx.fillText(format(v), pad.l - 6, y);
    }
  }

  // series: [{values: [number|null], color, dash, width, fill}] over shared times `ts` (seconds).
  function lineChart(canvas, ts, series, opts) {
    const draw = () => {
      const { ctx, w, h } = surface(canvas);
      const pad = { l: 46, r: 12, t: 8, b: 22 };
      let points = 0;
      let vmax = 0;
      for (const s of series) {
        for (const v of s.values) if (isNum(v)) vmax = Math.max(vmax, v);
      }
      const drawable = series.some((s) => s.values.some(isNum));
      if (!drawable || ts.length === 0) {
        canvas.dataset.points = "0";
        emptyState(ctx, w, h, opts.empty || "waiting for data…");
        return;
      }
      const yMax = opts.yMax !== undefined ? opts.yMax : niceMax(vmax * 1.08);
      yAxis(ctx, pad, w, h, yMax, opts.format || compact);
      const t1 = ts[ts.length - 1];
      const t0 = Math.min(ts[0], t1 - 10); // at least a 10 s window, so one point sits at the right
      const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (w - pad.l - pad.r);
      const y = (v) => pad.t + (1 - Math.min(v, yMax) / yMax) * (h - pad.t - pad.b);
      // x axis: seconds before now
      ctx.fillStyle = color("muted");
      ctx.textAlign = "center";
      const span = t1 - t0;
      const step = [5, 10, 15, 30, 60, 120, 300].find((s) => span / s <= 6) || 600;
      for (let back = 0; back <= span; back += step) {
        const xx = x(t1 - back);
        if (xx < pad.l + 12 && back !== 0) continue;
        ctx.fillText(back === 0 ? "now" : "-" + (back >= 120 ? back / 60 + "m" : back + "s"), xx, h - 9);
      }
      for (const s of series) {
        ctx.strokeStyle = s.color;
        ctx.lineWidth = s.width || 2;
        ctx.setLineDash(s.dash ? [6, 4] : []);
        ctx.lineJoin = "round";
        ctx.beginPath();
        let pen = false;
        let drawn = 0;
        let last = null;
        for (let i = 0; i < ts.length; i++) {
          const v = s.values[i];
          if (!isNum(v)) { pen = false; continue; }
          const px = x(ts[i]);
          const py = y(v);
          if (pen) ctx.lineTo(px, py); else ctx.moveTo(px, py);
          pen = true;
          drawn += 1;
          last = [px, py];
        }
        ctx.stroke();
        ctx.setLineDash([]);
        if (last) { // a dot on the newest point (also makes a lone point visible)
          ctx.fillStyle = s.color;
          ctx.beginPath();
          ctx.arc(last[0], last[1], 3, 0, 2 * Math.PI);
          ctx.fill();
        }
        points += drawn;
      }
      canvas.dataset.points = String(points);
    };
    renderers.set(canvas, draw);
    draw();
  }

  // bars: [{label, parts: [{value, color}]}]: stacked bars, left to right.
  function barChart(canvas, bars, opts) {
    const draw = () => {
      const { ctx, w, h } = surface(canvas);
      const pad = { l: 46, r: 12, t: 14, b: 22 };
      if (bars.length === 0) {
        canvas.dataset.points = "0";
        emptyState(ctx, w, h, opts.empty || "nothing yet");
        return;
      }
      const totals = bars.map((b) => b.parts.reduce((a, p) => a + (isNum(p.value) ? p.value : 0), 0));
      const yMax = niceMax(Math.max(...totals) * 1.12);
      yAxis(ctx, pad, w, h, yMax, compact);
      const slot = (w - pad.l - pad.r) / bars.length;
      const bw = Math.max(2, Math.min(48, slot * 0.72));
      const labelEvery = Math.max(1, Math.ceil(22 / slot));
      bars.forEach((b, i) => {
        const cx = pad.l + slot * (i + 0.5);
        let base = h - pad.b;
        for (const p of b.parts) {
          if (!isNum(p.value) || p.value <= 0) continue;
          const bh = (p.value / yMax) * (h - pad.t - pad.b);
          ctx.fillStyle = p.color;
          ctx.fillRect(cx - bw / 2, base - bh, bw, bh);
          base -= bh;
        }
        ctx.fillStyle = color("muted");
        ctx.textAlign = "center";
        if (i % labelEvery === 0) ctx.fillText(b.label, cx, h - 9);
        if (opts.valueLabels && slot >= 22 && totals[i] > 0) {
          ctx.fillStyle = color("ink");
          ctx.fillText(compact(totals[i]), cx, Math.max(pad.t - 6, base - 8));
        }
      });
      canvas.dataset.points = String(totals.filter((t) => t > 0).length); // bars drawn
    };
    renderers.set(canvas, draw);
    draw();
  }

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => renderers.forEach((draw) => draw()), 100);
  });

  // --- state -------------------------------------------------------------------------------------

  const history = []; // one sample per poll
  let previous = null;
  let polls = 0;

  function sample(stats, prev) {
    const c = stats.counters || {};
    const d = stats.derived || {};
    const q = stats.queues || {};
    const k = (stats.config || {}).group_size;
    let rates = { commit: null, abandon: null, cont: null };
    if (prev && prev.counters) {
      const dt = stats.now - prev.now;
      const delta = (f) => (c[f] || 0) - (prev.counters[f] || 0);
      const ds = [delta("decisions_commit"), delta("decisions_abandon"), delta("decisions_continue")];
      if (dt > 0 && ds.every((v) => v >= 0)) { // a reset (flushed namespace) gives no rate
        rates = { commit: ds[0] / dt, abandon: ds[1] / dt, cont: ds[2] / dt };
      }
    }
    const ds = d.ds_rollouts_per_effective_group;
    return {
      t: stats.now,
      rpeg: d.rollouts_per_effective_group,
      ds: ds,
      useful: d.useful_fraction,
      dsUseful: isNum(ds) && ds > 0 && isNum(k) ? Math.min(1, k / ds) : null,
      commit: rates.commit, abandon: rates.abandon, cont: rates.cont,
      pending: q.pending, leased: q.leased, open: q.open_groups, ready: q.ready_groups,
      unacked: q.unacked_batches,
    };
  }

  const col = (key) => history.map((s) => s[key]);

  // --- render ------------------------------------------------------------------------------------

  // tau_low=auto: show the price in force and a fresh prompt's thresholds (failures/successes)
  function tauText(tau, auto) {
    if (isNum(tau)) return String(tau);
    if (tau !== "auto") return "–";
    if (!auto || !isNum(auto.rho)) return "auto";
    return "auto (ρ " + auto.rho.toFixed(1) + ", " + auto.abandon_after_failures + "/" +
      auto.abandon_after_successes + ")";
  }

  function renderHeader(stats) {
    const cfg = stats.config || {};
    setText("#meta-namespace", stats.namespace || "–");
    setText("#meta-run-state", stats.run_state || "running");
    setText("#meta-policy", cfg.policy || "–");
    const prior = cfg.prior && cfg.prior !== "uniform" ? "prior " + cfg.prior : null;
    setText("#meta-selection", [cfg.selection, prior].filter(Boolean).join(" · ") || "–");
    // outcome: successes and failures mix; reward: the rewards are not all equal
    setText("#meta-effective", cfg.effective || "outcome");
    setText("#meta-k", isNum(cfg.group_size) ? String(cfg.group_size) : "–");
    setText("#meta-tau", tauText(cfg.tau_low, stats.auto_thresholds));
    setText("#meta-version", "v" + ((stats.policy || {}).version ?? "–"));
    setText("#meta-auth", cfg.auth_enabled ? "tokens" : "OPEN");
    $("#meta-auth").dataset.state = cfg.auth_enabled ? "on" : "open";
  }

  // What the run should know about its configuration (rewards not 0/1 under the outcome view)
  function renderWarnings(stats) {
    const box = $('[data-testid="warnings"]');
    const warnings = stats.warnings || [];
    box.textContent = warnings.join("\n");
    box.hidden = warnings.length === 0;
  }

  // Every DS figure is an estimate from audit sampling: shown with its 95% interval.
  function interval(lo, hi, f) {
    return isNum(lo) ? "95% CI " + f(lo) + "–" + (isNum(hi) ? f(hi) : "∞") : "no interval yet";
  }

  // "saving" only when the whole interval is above zero; "not-saving" when it is below.
  function savingState(d) {
    if (!isNum(d.net_saving_vs_ds)) return "waiting";
    if (isNum(d.net_saving_vs_ds_low) && d.net_saving_vs_ds_low > 0) return "saving";
    if (isNum(d.net_saving_vs_ds_high) && d.net_saving_vs_ds_high < 0) return "not-saving";
    return "noise";
  }

  function renderEfficiency(stats) {
    const d = stats.derived || {};
    const c = stats.counters || {};
    const cfg = stats.config || {};
    const rpeg = d.rollouts_per_effective_group;
    const ds = d.ds_rollouts_per_effective_group;
    const saving = d.net_saving_vs_ds;
    const state = savingState(d);
    const audited = (c.audits_mixed || 0) + (c.audits_pure || 0);
    const savingCi = interval(d.net_saving_vs_ds_low, d.net_saving_vs_ds_high, pct);
    setTile("tile-saving", saving, pct(saving), state);
    setText('[data-testid="note-saving-interval"]', savingCi);
    setTile("tile-rollouts-per-effective-group", rpeg, fmt(rpeg));
    setTile("tile-ds-rollouts-per-effective-group", ds, fmt(ds));
    setText('[data-testid="note-ds-interval"]', interval(d.ds_rollouts_per_effective_group_low,
      d.ds_rollouts_per_effective_group_high, fmt) + " · " + fmt(audited) + " audited groups");
    setTile("tile-useful-fraction", d.useful_fraction, pct(d.useful_fraction));
    setTile("tile-net-rollouts-saved-vs-ds", d.net_rollouts_saved_vs_ds, fmt(d.net_rollouts_saved_vs_ds, 0));
    setText('[data-testid="note-net-saved-interval"]',
      interval(d.net_rollouts_saved_vs_ds_low, d.net_rollouts_saved_vs_ds_high, (v) => fmt(v, 0)));
    setTile("tile-groups-delivered", c.groups_delivered, fmt(c.groups_delivered));
    setText('[data-testid="note-batches"]', fmt(c.batches_formed) + " batches · " + fmt(c.batches_acked) + " acked");
    setTile("tile-abandon-rate", d.abandon_rate, pct(d.abandon_rate));
    setTile("tile-expected-false-abandon-rate", d.expected_false_abandon_rate, pct(d.expected_false_abandon_rate, 2));
    setTile("tile-false-abandon-rate", d.false_abandon_rate, pct(d.false_abandon_rate, 1));
    setText('[data-testid="note-false-abandon-interval"]', fmt(audited) + " audited · " +
      interval(d.false_abandon_rate_low, d.false_abandon_rate_high, pct));
    setTile("tile-audit-cost", d.audit_cost_fraction, pct(d.audit_cost_fraction, 1));
    renderVerdict(stats, state, savingCi);
  }

  function renderVerdict(stats, state, savingCi) {
    const d = stats.derived || {};
    const c = stats.counters || {};
    const verdict = byTestId("verdict");
    verdict.dataset.state = state;
    const main = $(".verdict-main", verdict);
    const sub = $(".verdict-sub", verdict);
    const saving = d.net_saving_vs_ds;
    // groups of another size than k (Pilot-Commit's, var_k's): their cost in groups of k beside
    const perK = d.rollouts_per_group_of_k;
    const ofK = isNum(perK) && isNum(d.rollouts_per_effective_group) &&
      Math.abs(perK - d.rollouts_per_effective_group) > 1e-9 ? " (" + fmt(perK) + " per group of k)" : "";
    const detail = fmt(d.rollouts_per_effective_group) + " rollouts per effective group here" + ofK + "; DS " +
      "would spend " + fmt(d.ds_rollouts_per_effective_group) + " (estimate, " +
      interval(d.ds_rollouts_per_effective_group_low, d.ds_rollouts_per_effective_group_high, fmt) +
      ") · measured false abandons " + pct(d.false_abandon_rate) + " · audit cost " +
      pct(d.audit_cost_fraction);
    if (state === "waiting") {
      main.textContent = "No estimate yet: waiting for delivered groups and the first finished audit…";
      sub.textContent = fmt(c.rollouts_completed) + " rollouts completed so far under " +
        ((stats.config || {}).policy || "?") + ".";
    } else if (state === "saving") {
      main.textContent = "Saving " + pct(saving) + " of rollouts against Dynamic Sampling (" + savingCi + ")";
      sub.textContent = detail;
    } else if (state === "not-saving") {
      main.textContent = "Spending " + pct(-saving) + " more rollouts than Dynamic Sampling (" + savingCi + ")";
      sub.textContent = detail;
    } else {
      main.textContent = pct(saving) + " against Dynamic Sampling: within noise (" + savingCi + ")";
      sub.textContent = detail;
    }
  }

  function renderCharts(stats) {
    const ts = col("t");
    const last = history[history.length - 1];
    setText('[data-legend="rpeg"]', fmt(last.rpeg));
    setText('[data-legend="ds"]', fmt(last.ds));
    setText('[data-legend="useful"]', pct(last.useful));
    setText('[data-legend="ds-useful"]', pct(last.dsUseful));
    lineChart(byTestId("chart-efficiency"), ts, [
      { values: col("ds"), color: color("ds"), dash: true },
      { values: col("rpeg"), color: color("sara"), width: 2.5 },
    ], { empty: "no effective group delivered yet", format: compact });
    lineChart(byTestId("chart-useful-fraction"), ts, [
      { values: col("dsUseful"), color: color("ds"), dash: true },
      { values: col("useful"), color: color("sara"), width: 2.5 },
    ], { yMax: 1, format: (v) => Math.round(v * 100) + "%", empty: "no rollout completed yet" });

    setTile("tile-commit-per-s", last.commit, fmt(last.commit, 1));
    setTile("tile-abandon-per-s", last.abandon, fmt(last.abandon, 1));
    setTile("tile-continue-per-s", last.cont, fmt(last.cont, 1));
    lineChart(byTestId("chart-decisions"), ts, [
      { values: col("cont"), color: color("continue") },
      { values: col("abandon"), color: color("abandon") },
      { values: col("commit"), color: color("commit"), width: 2.5 },
    ], { empty: "rates need two polls…" });

    const q = stats.queues || {};
    const d = stats.derived || {};
    setTile("queue-pending", q.pending, fmt(q.pending));
    setTile("queue-leased", q.leased, fmt(q.leased));
    setTile("queue-in-flight", d.rollouts_in_flight, fmt(d.rollouts_in_flight));
    setTile("queue-open-groups", q.open_groups, fmt(q.open_groups));
    setTile("queue-ready-groups", q.ready_groups, fmt(q.ready_groups));
    setTile("queue-unacked-batches", q.unacked_batches, fmt(q.unacked_batches));
    setTile("queue-expected-yield", q.expected_yield_open, fmt(q.expected_yield_open, 1));
    setTile("queue-flow-target", q.flow_target, fmt(q.flow_target));
    setTile("queue-engine-occupancy", q.engine_occupancy, pct(q.engine_occupancy, 0));
    setTile("queue-engine-slots", q.engine_slots, fmt(q.engine_slots));
    setTile("derived-delivered-age", d.delivered_age_versions, fmt(d.delivered_age_versions, 2));
    lineChart(byTestId("chart-queues"), ts, [
      { values: col("pending"), color: color("pending") },
      { values: col("leased"), color: color("leased") },
      { values: col("open"), color: color("open") },
      { values: col("ready"), color: color("ready"), width: 2.5 },
      { values: col("unacked"), color: color("unacked") },
    ], {});

    const hist = stats.abandon_histogram || {};
    const keys = Object.keys(hist).sort((a, b) => Number(a) - Number(b));
    const hcanvas = byTestId("chart-abandon-histogram");
    hcanvas.dataset.values = JSON.stringify(hist);
    const abandoned = keys.reduce((a, key) => a + hist[key], 0);
    setText('[data-legend="abandoned"]', fmt(abandoned));
    setText('[data-legend="saved"]', fmt((stats.counters || {}).rollouts_not_spent_on_abandoned_groups));
    // every n from the smallest seen (1, or 0 for skipped prompts) to k - 1, empty ones too
    const k = (stats.config || {}).group_size;
    const ns = keys.map(Number);
    const lo = Math.min(1, ...ns);
    const hi = Math.max(isNum(k) ? k - 1 : 0, ...ns);
    const slots = [];
    if (keys.length) for (let n = lo; n <= hi && slots.length < 256; n++) slots.push(n);
    barChart(hcanvas, slots.map((n) => ({
      label: String(n), parts: [{ value: hist[String(n)] || 0, color: color("abandon") }],
    })), { valueLabels: true, empty: "no group abandoned yet" });

    const batches = (stats.recent_batches || []).slice().reverse(); // oldest first
    setText('[data-legend="batches"]', fmt((stats.counters || {}).batches_formed));
    setTile("tile-policy-version", (stats.policy || {}).version, "v" + ((stats.policy || {}).version ?? "–"));
    barChart(byTestId("chart-batches"), batches.map((b) => {
      const st = b.stats || {};
      return {
        label: "v" + b.policy_version,
        parts: [{ value: isNum(st.rollouts_spent) ? st.rollouts_spent : b.rollouts, color: color("sara") },
                { value: st.rollouts_not_spent_on_abandoned_groups, color: color("saved") }],
      };
    }), { empty: "no batch formed yet" });
  }

  function renderWorkers(stats) {
    const table = byTestId("workers-table");
    const body = $("tbody", table);
    const version = (stats.policy || {}).version;
    const gone = (w) => Boolean(w.stale || w.stopped);
    const workers = (stats.workers || []).slice().sort((a, b) =>
      (gone(a) - gone(b)) || String(a.worker_id).localeCompare(String(b.worker_id)));
    const rows = workers.map((w) => {
      const behind = isNum(w.policy_version) && isNum(version) && w.policy_version < version;
      return el("tr", { class: w.stale ? "stale" : "", "data-testid": "worker-row",
                        "data-worker-id": w.worker_id, "data-stale": String(!!w.stale),
                        "data-rollouts-completed": String(w.rollouts_completed) }, [
        el("td", { class: "mono", text: w.worker_id }),
        el("td", { text: w.backend || "–" }),
        el("td", { class: "num" }, [isNum(w.policy_version) ? "v" + w.policy_version : "–",
          ...(behind ? [el("span", { class: "badge badge-behind", text: "behind" })] : [])]),
        el("td", { class: "num", text: fmt(w.rollouts_per_s, 1) }),
        el("td", { class: "num", text: fmt(w.tokens_per_s, 0) }),
        el("td", { class: "num", text: fmt(w.rollouts_completed) }),
        el("td", { class: "num", text: fmt(w.tokens_generated) }),
        el("td", { class: "num", text: fmt(w.leases) }),
        el("td", { class: "num", text: ago(stats.now - w.last_seen) + " ago" }),
        el("td", {}, [el("span", { class: "badge " + (gone(w) ? "badge-stale" : "badge-ok"),
                                    text: w.stopped ? "stopped" : w.stale ? "STALE" : "live" })]),
      ]);
    });
    if (rows.length === 0) {
      rows.push(el("tr", { class: "empty" }, [el("td", { colspan: "10", text: "no worker has leased yet" })]));
    }
    body.replaceChildren(...rows);
    table.dataset.rows = String(workers.length);
    const stale = workers.filter((w) => w.stale).length;
    const stopped = workers.filter((w) => w.stopped).length;
    setText('[data-testid="workers-summary"]',
      (workers.length - stale - stopped) + " live" + (stale ? " · " + stale + " stale" : "") +
      (stopped ? " · " + stopped + " stopped" : ""));
  }

  function renderBatches(stats) {
    const table = byTestId("batches-table");
    const batches = stats.recent_batches || [];
    const rows = batches.map((b) => {
      const st = b.stats || {};
      return el("tr", { "data-testid": "batch-row", "data-batch-id": b.batch_id }, [
        el("td", { class: "mono", text: String(b.batch_id).slice(0, 18), title: b.batch_id }),
        el("td", { class: "num", text: ago(stats.now - b.created_at) }),
        el("td", { class: "num", text: "v" + b.policy_version }),
        el("td", { class: "num", text: fmt(b.groups) }),
        el("td", { class: "num", text: fmt(b.rollouts) }),
        el("td", { class: "num", text: fmt(st.rollouts_spent) }),
        el("td", { class: "num", text: fmt(st.groups_committed) }),
        el("td", { class: "num", text: fmt(st.groups_abandoned) }),
        el("td", { class: "num", text: fmt(st.groups_dropped) }),
        el("td", { class: "num", text: fmt(st.rollouts_not_spent_on_abandoned_groups) }),
        el("td", {}, st.ended_early ? [el("span", { class: "badge badge-early", text: "early" })] : ["–"]),
      ]);
    });
    if (rows.length === 0) {
      rows.push(el("tr", { class: "empty" }, [el("td", { colspan: "11", text: "no batch formed yet" })]));
    }
    $("tbody", table).replaceChildren(...rows);
    table.dataset.rows = String(batches.length);
  }

  function renderConfig(stats) {
    const cfg = stats.config || {};
    const keys = Object.keys(cfg).sort((a, b) => {
      const ia = CONFIG_FIRST.indexOf(a);
      const ib = CONFIG_FIRST.indexOf(b);
      return (ia < 0 ? 999 : ia) - (ib < 0 ? 999 : ib) || a.localeCompare(b);
    });
    const list = byTestId("config-table");
    list.replaceChildren(...keys.map((key) => {
      const v = cfg[key];
      const text = v === null || v === undefined ? "–" : typeof v === "object" ? JSON.stringify(v) : String(v);
      return el("div", { "data-key": key, "data-value": text,
                         class: CONFIG_FIRST.includes(key) ? "key-setting" : "" }, [
        el("dt", { text: key }), el("dd", { text: text }),
      ]);
    }));
    list.dataset.rows = String(keys.length);
  }

  function render(stats) {
    history.push(sample(stats, previous));
    if (history.length > HISTORY) history.splice(0, history.length - HISTORY);
    previous = stats;
    renderHeader(stats);
    renderWarnings(stats);
    renderEfficiency(stats);
    renderCharts(stats);
    renderWorkers(stats);
    renderBatches(stats);
    renderConfig(stats);
  }

  // --- polling -----------------------------------------------------------------------------------

  class HttpError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function fetchStats() {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    const r = await fetch("stats", { headers: headers, cache: "no-store", credentials: "omit" });
    if (!r.ok) {
      let message = r.statusText || "error";
      try { message = (await r.json()).error.message || message; } catch (e) { /* not JSON */ }
      throw new HttpError(r.status, message);
    }
    return r.json();
  }

  function setStatus(state, text, stats) {
    const status = byTestId("status");
    status.dataset.state = state;
    status.dataset.polls = String(polls);
    if (stats) status.dataset.now = String(stats.now);
    $(".status-text", status).textContent = text;
  }

  async function poll() {
    let delay = POLL_MS;
    const started = performance.now();
    try {
      const stats = await fetchStats();
      polls += 1;
      render(stats);
      const time = new Date(stats.now * 1000).toLocaleTimeString();
      setStatus("ok", "live · " + time, stats);
    } catch (e) {
      delay = ERROR_POLL_MS;
      let text = "error: " + (e && e.message ? e.message : String(e));
      if (e instanceof HttpError && (e.status === 401 || e.status === 403)) {
        text = "HTTP " + e.status + ": " + e.message + " (open /dashboard?token=<operator token>)";
      } else if (e instanceof HttpError) {
        text = "HTTP " + e.status + ": " + e.message;
      } else if (e instanceof TypeError) {
        text = "scheduler unreachable, retrying";
      }
      setStatus("error", text);
    }
    setTimeout(poll, Math.max(100, delay - (performance.now() - started)));
  }

  poll();
})();
