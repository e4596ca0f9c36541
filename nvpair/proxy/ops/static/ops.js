// nvpair-proxy operations page: redraws the server-rendered page from /status and
// /status/history every 2 s (same structure as nvpair/proxy/opspage.py draws). Text is only
// ever set with textContent, never parsed as HTML.
"use strict";
(function () {
  var SVG = "http://www.w3.org/2000/svg";
  var W = 120, H = 28, PAD = 2, BW = 60, BH = 8, MINUTE = 6, MAX_MODELS = 6;
  var NODE_HEADS = ["state", "node", "models", "work", "est. load",
    "requests/s", "TTFT p50", "tokens/s", "errors"];
  var reasons = {};
  var busy = false;
  var refreshes = 0;

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    return e;
  }
  function add(parent, children) {
    children.forEach(function (c) { if (c) parent.appendChild(c); });
    return parent;
  }
  function r1(v) { return Math.round(v * 10) / 10; }

  function number(v) {
    if (v === null || v === undefined) return "\u2013";
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e4) return (v / 1e3).toFixed(1) + "k";
    if (v === Math.trunc(v)) return String(v);
    if (v >= 100) return v.toFixed(0);
    if (v >= 10) return v.toFixed(1);
    return v.toFixed(2).replace(/0+$/, "").replace(/\.$/, "");
  }
  function seconds(s) {
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 10) return s.toFixed(2) + " s";
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.floor(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor(s % 3600 / 60) + " min";
  }
  function millis(ms) {
    if (ms === null || ms === undefined) return "\u2013";
    return ms < 1000 ? ms.toFixed(0) + " ms" : seconds(ms / 1000);
  }
  function ago(s) {
    if (s < 1) return "just now";
    if (s < 60) return s.toFixed(0) + " s ago";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    return Math.floor(s / 3600) + " h ago";
  }
  function reasonText(code) {
    if (code.indexOf("upstream status ") === 0) return "engine answered " + code.slice(16);
    return reasons[code] || code;
  }

  function sparkline(metric, values, label, bars) {
    var present = values.filter(function (v) { return v !== null; });
    var top = present.length ? Math.max.apply(null, present) : 0;
    var s = svg("svg", {"class": "spark " + metric, "data-metric": metric,
      "data-max": number(top), width: W, height: H, viewBox: "0 0 " + W + " " + H,
      preserveAspectRatio: "none", role: "img", "aria-label": label});
    var title = svg("title", {});
    title.textContent = label;
    add(s, [title, svg("line", {"class": "base", x1: PAD, y1: H - PAD, x2: W - PAD,
      y2: H - PAD})]);
    var n = values.length;
    if (bars) {
      var width = (W - 2 * PAD) / Math.max(n, 1);
      values.forEach(function (v, i) {
        if (!v) return;
        var h = r1(v / top * (H - 2 * PAD));
        s.appendChild(svg("rect", {x: r1(PAD + i * width), y: r1(H - PAD - h),
          width: r1(Math.max(width, 2)), height: h}));
      });
      return s;
    }
    var step = (W - 2 * PAD) / Math.max(n - 1, 1), seg = [];
    function flush() {  // inner points of flat runs dropped, as the server does
      var last = seg.length - 1, kept = seg.filter(function (p, i) {
        return i === 0 || i === last || p[1] !== seg[i - 1][1] || p[1] !== seg[i + 1][1];
      });
      if (seg.length === 1) {  // a value between gaps: a short dash (a point would not show)
        var x = seg[0][0], y = seg[0][1];
        kept = [[r1(Math.max(x - 1.5, PAD)), y], [r1(Math.min(x + 1.5, W - PAD)), y]];
      }
      if (seg.length) {
        s.appendChild(svg("polyline", {points: kept.map(function (p) {
          return p[0] + "," + p[1];
        }).join(" ")}));
      }
      seg = [];
    }
    values.forEach(function (v, i) {
      if (v === null) { flush(); return; }
      seg.push([r1(PAD + i * step), r1(H - PAD - (top > 0 ? v / top * (H - 2 * PAD) : 0))]);
    });
    flush();
    return s;
  }
  function bar(metric, value, scale, label) {
    var fill = scale > 0 ? r1(BW * Math.min(value / scale, 1)) : 0;
    var s = svg("svg", {"class": "bar " + metric, width: BW, height: BH,
      viewBox: "0 0 " + BW + " " + BH, "aria-hidden": "true"});
    add(s, [svg("rect", {"class": "track", width: BW, height: BH, rx: 2}),
      svg("rect", {"class": "fill", width: fill, height: BH, rx: 2})]);
    return add(el("span", "meter"), [s, el("span", "val", number(value)),
      el("span", "lbl", label)]);
  }

  function lastMinute(values, bucketSeconds) {
    return values.slice(-MINUTE).reduce(function (a, b) { return a + b; }, 0) /
      (MINUTE * bucketSeconds);
  }
  function errorReasons(series) {
    var by = series.totals.errorsByReason;
    return Object.keys(by).map(function (c) { return reasonText(c) + " \u00d7" + by[c]; })
      .join(", ");
  }
  function charts(series, bucketSeconds) {
    var t = series.totals, reasons = errorReasons(series);
    return [
      ["rps", "requests/s", number(lastMinute(series.requests, bucketSeconds)) + "/s",
        sparkline("rps", series.requestsPerSecond,
          "requests per second, 15 min (" + t.requests + " requests)"),
        t.requests + " in 15 min"],
      ["ttft", "TTFT p50", millis(t.ttftP50Ms),
        sparkline("ttft", series.ttftP50Ms, "time to first token, median per 10 s"),
        "median over 15 min"],
      ["tps", "tokens/s", number(lastMinute(series.tokens, bucketSeconds)) + "/s",
        sparkline("tps", series.tokensPerSecond,
          "tokens per second, 15 min (" + t.tokens + " tokens)"),
        number(t.tokens) + " tokens in 15 min"],
      ["errors", "errors", number(t.errors),
        sparkline("errors", series.errors,
          reasons ? "errors in 15 min: " + reasons : "no errors in 15 min", true),
        reasons || "none in 15 min"]
    ];
  }
  function emptySeries(n) {
    var zeros = [], nulls = [];
    for (var i = 0; i < n; i++) { zeros.push(0); nulls.push(null); }
    return {requests: zeros, requestsPerSecond: zeros, ttftP50Ms: nulls, tokens: zeros,
      tokensPerSecond: zeros, errors: zeros, errorsByReason: {},
      totals: {requests: 0, tokens: 0, ttftP50Ms: null, errors: 0, errorsByReason: {}}};
  }

  function affinityCounts(s, id) {  // as opspage.affinityCounts
    var own = s.facades[id].affinity, shared = s.affinity;
    if (own && typeof own === "object" && Object.keys(own).length) return own;
    if (!shared || typeof shared !== "object" || !shared.active) return null;
    var found = shared.counts && shared.counts[id];
    return found && typeof found === "object" ? found : {};
  }
  function affinityTile(a) {
    var keys = Object.keys(a).filter(function (k) { return typeof a[k] === "number"; }).sort();
    var total = keys.reduce(function (sum, k) { return sum + a[k]; }, 0);
    var hits = "hit" in a ? a.hit : a.hits, value = "\u2013";
    if (typeof hits === "number" && total) value = (100 * hits / total).toFixed(0) + "%";
    var detail = keys.map(function (k) { return k + " " + number(a[k]); }).join(" \u00b7 ");
    return add(el("div", "tile affinity"), [el("div", "tlabel", "affinity hit rate"),
      el("div", "tval", value), el("div", "tsub", detail || "no placements yet")]);
  }
  function queueTile(s, id) {  // as queueview.queueTile
    var q = s.queueing;
    if (!q || typeof q !== "object") return null;
    var queues = (q.queues && q.queues[id]) || {}, total = 0;
    var parts = Object.keys(queues).sort().map(function (m) {
      total += queues[m].depth;
      return m + " " + number(queues[m].depth) + " waiting, last wait " +
        seconds(queues[m].lastWaitSeconds);
    });
    var held = q.held;
    if (held && typeof held === "object" &&
        (held.now || held.endedWithRoom || held.endedWithBudget)) {
      parts.push("held for a prefix " + number(held.now) + " now, " +
        number(held.endedWithRoom) + " got its slot, " + number(held.endedWithBudget) +
        " recomputed");
    }
    var clients = q.clients && q.clients[id];
    if (q.declaredClients && q.declaredClients.length && clients && typeof clients === "object") {
      Object.keys(clients).sort().forEach(function (label) {
        var c = clients[label], refused = 0;
        Object.keys(c.refused || {}).forEach(function (r) { refused += c.refused[r]; });
        parts.push(label + " " + number(c.waiting) + " waiting, " + number(c.dispatched) +
          " served" + (refused ? ", " + number(refused) + " refused" : ""));
      });
    }
    return add(el("div", "tile queue"), [el("div", "tlabel", "queue"),
      el("div", "tval", number(total)), el("div", "tsub", parts.join(" \u00b7 ") || "nobody waits")]);
  }
  function breakerNote(s, id) {  // as queueview.breakerNote
    var q = s.queueing, b = q && typeof q === "object" && q.breakers ? q.breakers[id] : null;
    if (!b || typeof b !== "object") return null;
    return el("div", "breaker " + b.state,
      "breaker " + b.state + " \u00b7 opened " + number(b.opens) + "\u00d7");
  }
  function residencyNote(s, id) {  // as residencyview.residencyNote
    var r = s.residency, e = r && typeof r === "object" && r.nodes ? r.nodes[id] : null;
    if (!e || typeof e !== "object" || !e.models) return null;
    var names = e.models.slice(0, 4).map(function (m) {
      return m.state === "loaded" ? m.model : m.model + " (" + m.state + ")";
    });
    if (e.models.length > 4) names.push("+" + (e.models.length - 4));
    var parts = [];
    if (names.length) parts.push("holds " + names.join(", "));
    else if (e.fresh) parts.push("holds no model");
    var plural = function (n, w) { return number(n) + " " + w + (n === 1 ? "" : "s"); };
    if (e.loads || e.evictions) parts.push(plural(e.loads, "load"), plural(e.evictions, "eviction"));
    return parts.length ? el("div", "resident", parts.join(" \u00b7 ")) : null;
  }
  function tiles(series, bucketSeconds, affinity, queue) {
    var box = el("div", "tiles");
    charts(series, bucketSeconds).forEach(function (c) {
      add(box, [add(el("div", "tile " + c[0]), [el("div", "tlabel", c[1]),
        el("div", "tval", c[2]), c[3], el("div", "tsub", c[4])])]);
    });
    if (affinity !== null) box.appendChild(affinityTile(affinity));
    if (queue) box.appendChild(queue);
    return box;
  }
  function models(names, count) {
    var td = el("td", "models");
    names.slice(0, MAX_MODELS).forEach(function (n) { td.appendChild(el("span", "model", n)); });
    var more = count - Math.min(names.length, MAX_MODELS);
    if (more > 0) {
      var rest = el("span", "more", "+" + more + " more");
      rest.title = names.slice(MAX_MODELS).join(", ");
      td.appendChild(rest);
    }
    if (!td.childNodes.length) td.appendChild(el("span", "none", "none"));
    return td;
  }
  function engineLine(e) {  // as opspage.engineLine
    var parts = [];
    var busy = e.slotsBusy, total = e.slotsTotal;
    if (e.state !== "fresh") parts.push("engine state unknown");
    else if (typeof busy === "number" && typeof total === "number")
      parts.push("slots " + busy + "/" + total + " busy");
    else if (typeof busy === "number") parts.push(busy + " busy");
    if (Array.isArray(e.loaded)) parts.push(e.loaded.length + " loaded");
    if (typeof e.cacheHitRatio === "number")
      parts.push("cache " + Math.floor(e.cacheHitRatio * 100 + 0.5) + "%");
    return parts.join(" \u00b7 ");
  }
  function nodeRow(node, series, bucketSeconds, scale, now, breaker, resident) {
    var why = node.stateReason;
    if (node.checkedAt !== null) why += " \u00b7 " + ago((now - node.checkedAt) / 1000);
    var tr = el("tr", "node");
    tr.setAttribute("data-node", node.id);
    tr.setAttribute("data-state", node.state);
    var id = el("td", "nid", node.id);
    if (node.name) id.appendChild(el("span", "nname", node.name));
    if (node.self) id.appendChild(el("span", "self", "self"));
    var addresses = node.confirmed ? [node.confirmed] : [];
    node.addresses.forEach(function (a) { if (a !== node.confirmed) addresses.push(a); });
    if (addresses.length && !(addresses.length === 1 && addresses[0] === node.id))
      id.appendChild(el("div", "addr", addresses.join(" ")));
    add(tr, [add(el("td", "st"), [el("span", "state " + node.state, node.state),
      el("div", "why", why), node.engine ? el("div", "engine", engineLine(node.engine)) : null,
      breaker, resident]), id, models(node.modelNames, node.models),
      add(el("td", "work"), [bar("inflight", node.inFlight, scale, "in flight"),
        bar("reserved", node.reserved, scale, "reserved")]),
      el("td", "num", number(node.estimatedLoad))]);
    charts(series, bucketSeconds).forEach(function (c) {
      add(tr, [add(el("td", "chart"), [c[3], el("span", "sv", c[2])])]);
    });
    return tr;
  }
  function facadeCard(id, s, history, now) {
    var f = s.facades[id];
    var bs = history.bucketSeconds, empty = emptySeries(history.buckets);
    var hist = history.facades[id] || {series: empty, nodes: {}};
    var ports = String(f.port) + f.aliases.map(function (a) { return " + " + a; }).join("");
    var meta = "port " + ports + " \u00b7 pin " + (f.pin || "none") + " \u00b7 local backend " +
      (f.localBackend || "none") + " \u00b7 discovery updates " + f.discoveryUpdates;
    var scale = Math.max.apply(null, f.nodes.map(function (n) {
      return Math.max(n.inFlight, n.reserved);
    }).concat([1]));
    var card = el("section", "card facade");
    card.setAttribute("data-facade", id);
    var head = add(el("tr"), NODE_HEADS.map(function (h) { return el("th", null, h); }));
    var body = el("tbody");
    f.nodes.forEach(function (n) {
      body.appendChild(nodeRow(n, hist.nodes[n.id] || empty, bs, scale, now, breakerNote(s, n.id),
        residencyNote(s, n.id)));
    });
    if (!f.nodes.length) {
      var none = el("td", "none", "no nodes");
      none.colSpan = NODE_HEADS.length;
      body.appendChild(add(el("tr"), [none]));
    }
    return add(card, [add(el("div", "fhead"), [el("h2", null, id), el("span", "meta", meta)]),
      tiles(hist.series, bs, affinityCounts(s, id), queueTile(s, id)),
      add(el("table", "nodes"), [add(el("thead"), [head]), body])]);
  }

  function workloadRow(w, now) {
    var st = w.stats || {}, tokens = "\u2013";
    if ("promptTokens" in st || "completionTokens" in st) {
      tokens = number(st.promptTokens) + " / " + number(st.completionTokens);
      if (st.estimated) tokens += " (est.)";
    }
    var tr = el("tr", "wl " + w.state);
    tr.setAttribute("data-state", w.state);
    var err = el("td");
    if (w.error) add(err, [document.createTextNode(w.errorText + " "), el("code", null, w.error)]);
    var state = add(el("td"), [el("span", "wstate", w.state)]);
    var cells = [w.id, w.completedAt === null ? "\u2013" : ago((now - w.completedAt) / 1000),
      null, w.model, w.node || "\u2013", w.attempts, millis(st.ttftMs), tokens,
      st.tokensPerSecond === undefined ? "\u2013" : number(st.tokensPerSecond) + "/s",
      millis(w.durationMs)];
    cells.forEach(function (c, i) { tr.appendChild(i === 2 ? state : el("td", null, c)); });
    tr.appendChild(err);
    return tr;
  }
  function chips(s) {
    var box = el("div", "chips"), t = s.workloads.terminals;
    function chip(label, value, code) {
      var c = el("span", "chip", label);
      if (value !== undefined) {
        c.appendChild(document.createTextNode(" "));
        c.appendChild(el(code ? "code" : "b", null, value));
      }
      box.appendChild(c);
    }
    chip(s.standalone ? "standalone" : "under a broker");
    if (s.fleet) {
      chip("fleet generation", s.fleet.generation);
      if (s.fleet.loadedAt !== null) chip("fleet loaded", ago((s.now - s.fleet.loadedAt) / 1000));
      if (s.fleet.error) chip("fleet file refused", s.fleet.error.message, true);
    }
    chip("run", s.runId, true);
    chip("in progress", s.requestsInProgress);
    chip("live workloads", s.workloads.live);
    Object.keys(t).sort().forEach(function (k) { chip(k, t[k]); });
    return box;
  }

  function render(s, history) {
    reasons = history.reasons || {};
    var now = s.now;
    document.getElementById("summary").replaceChildren.apply(
      document.getElementById("summary"), Array.from(chips(s).childNodes));
    var facades = document.getElementById("facades"), ids = Object.keys(s.facades);
    facades.replaceChildren.apply(facades, ids.map(function (id) {
      return facadeCard(id, s, history, now);
    }));
    if (!ids.length) {
      facades.appendChild(add(el("section", "card"),
        [el("p", "none", "no facade is enabled yet")]));
    }
    var rows = s.workloads.recent.map(function (w) { return workloadRow(w, now); });
    if (!rows.length) {
      var none = el("td", "none", "no workload has ended yet");
      none.colSpan = 11;
      rows = [add(el("tr"), [none])];
    }
    var body = document.getElementById("workloads");
    body.replaceChildren.apply(body, rows);
    var live = document.getElementById("live");
    live.className = "live on";
    live.setAttribute("data-source", "js");
    live.setAttribute("data-refreshes", String(++refreshes));
    live.textContent = "live \u00b7 updated " + new Date(now).toISOString().slice(11, 19) + " UTC";
  }
  function json(path) {
    var options = {cache: "no-store"};
    if (window.AbortSignal && AbortSignal.timeout) options.signal = AbortSignal.timeout(8000);
    return fetch(path, options).then(function (r) {
      if (!r.ok) throw new Error(path + " answered " + r.status);
      return r.json();
    });
  }
  function refresh() {
    if (busy) return;
    busy = true;
    Promise.all([json("/status"), json("/status/history")]).then(function (docs) {
      render(docs[0], docs[1]);
    }).catch(function (e) {
      var live = document.getElementById("live");
      live.className = "live stale";
      live.textContent = "cannot reach the proxy: " + e.message;
    }).finally(function () { busy = false; });
  }
  refresh();
  setInterval(refresh, 2000);
})();
