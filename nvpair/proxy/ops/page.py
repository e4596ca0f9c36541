"""The operations page rendered on the server from ``/status`` and ``/status/history``.

The page is complete without JavaScript (a ``<noscript>`` refresh reloads it every 10 s);
with JavaScript, ``/ops.js`` redraws the same elements from the JSON every 2 s.  Both draw
the same structure, so the browser test can read either.  Every engine- or client-provided
string is escaped (:func:`nvpair.proxy.ops.format.esc`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

from nvpair.proxy.ops.documents import (
    HistoryDocument,
    NodeStatus,
    Series,
    StatusDocument,
    WorkloadEntry,
)
from nvpair.proxy.ops.format import ago, bar, esc, fixed, millis, number, reasonText, sparkline
from nvpair.proxy.ops.queueview import breakerNote, queueTile
from nvpair.proxy.ops.residencyview import residencyNote

MAX_MODELS_SHOWN = 6
_MINUTE_BUCKETS = 6

_NODE_HEADINGS = (
    "state",
    "node",
    "models",
    "work",
    "est. load",
    "requests/s",
    "TTFT p50",
    "tokens/s",
    "errors",
)
_WORKLOAD_HEADINGS = (
    "#",
    "ended",
    "state",
    "model",
    "node",
    "attempts",
    "TTFT",
    "tokens in / out",
    "tokens/s",
    "duration",
    "error",
)


def _number(value: object) -> float | None:
    """A statistic as a number, or None (drawn as a dash) when absent or not a number."""
    return value if isinstance(value, int | float) else None


def lastMinute(values: Sequence[float], bucketSeconds: int) -> float:
    """The mean per second of a per-bucket count over the last minute's buckets."""
    return sum(values[-_MINUTE_BUCKETS:]) / (_MINUTE_BUCKETS * bucketSeconds)


def _errorReasons(series: Series) -> str:
    totals = series["totals"]["errorsByReason"]
    return ", ".join(f"{reasonText(code)} ×{count}" for code, count in totals.items())


def charts(series: Series, bucketSeconds: int) -> list[tuple[str, str, str, str, str]]:
    """(metric, title, headline value, SVG, 15-minute summary) of one series' four charts."""
    totals = series["totals"]
    rps = lastMinute(series["requests"], bucketSeconds)
    tps = lastMinute(series["tokens"], bucketSeconds)
    reasons = _errorReasons(series)
    return [
        (
            "rps",
            "requests/s",
            f"{number(rps)}/s",
            sparkline(
                "rps",
                series["requestsPerSecond"],
                f"requests per second, 15 min ({totals['requests']} requests)",
            ),
            f"{totals['requests']} in 15 min",
        ),
        (
            "ttft",
            "TTFT p50",
            millis(totals["ttftP50Ms"]),
            sparkline("ttft", series["ttftP50Ms"], "time to first token, median per 10 s"),
            "median over 15 min",
        ),
        (
            "tps",
            "tokens/s",
            f"{number(tps)}/s",
            sparkline(
                "tps",
                series["tokensPerSecond"],
                f"tokens per second, 15 min ({totals['tokens']} tokens)",
            ),
            f"{number(totals['tokens'])} tokens in 15 min",
        ),
        (
            "errors",
            "errors",
            number(totals["errors"]),
            sparkline(
                "errors",
                series["errors"],
                f"errors in 15 min: {reasons}" if reasons else "no errors in 15 min",
                bars=True,
            ),
            reasons or "none in 15 min",
        ),
    ]


def _tiles(
    series: Series, bucketSeconds: int, affinity: Mapping[str, object] | None, queue: str = ""
) -> str:
    tiles = [
        f'<div class="tile {metric}"><div class="tlabel">{title}</div>'
        f'<div class="tval">{esc(value)}</div>{svg}<div class="tsub">{esc(sub)}</div></div>'
        for metric, title, value, svg, sub in charts(series, bucketSeconds)
    ]
    if affinity is not None:
        tiles.append(_affinityTile(affinity))
    tiles.append(queue)
    return f'<div class="tiles">{"".join(tiles)}</div>'


def affinityCounts(status: StatusDocument, engineId: str) -> Mapping[str, object] | None:
    """A facade's conversation-affinity counters, or None where affinity does not apply.

    Either the facade's own ``affinity`` object, or the process-wide ``affinity`` object's
    ``counts`` for this engine when it is ``active`` (empty until the first placement).
    """
    own = status["facades"][engineId].get("affinity")
    if isinstance(own, dict) and own:
        return own
    shared = status.get("affinity")
    if not isinstance(shared, dict) or not shared.get("active"):
        return None
    counts = shared.get("counts")
    found = counts.get(engineId) if isinstance(counts, dict) else None
    return found if isinstance(found, dict) else {}


def _affinityTile(affinity: Mapping[str, object]) -> str:
    """The hit rate (``hit`` or ``hits`` over every counted placement) and the counters."""
    numbers = {
        k: v for k, v in affinity.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    hits = numbers.get("hit", numbers.get("hits"))
    total = sum(numbers.values())
    value = f"{fixed(100 * hits / total, 0)}%" if hits is not None and total else "–"
    detail = " · ".join(f"{esc(k)} {number(v)}" for k, v in sorted(numbers.items()))
    return (
        f'<div class="tile affinity"><div class="tlabel">affinity hit rate</div>'
        f'<div class="tval">{value}</div>'
        f'<div class="tsub">{detail or "no placements yet"}</div></div>'
    )


def _models(names: list[str], count: int) -> str:
    shown = "".join(f'<span class="model">{esc(n)}</span>' for n in names[:MAX_MODELS_SHOWN])
    more = count - min(len(names), MAX_MODELS_SHOWN)
    if more > 0:
        hidden = esc(", ".join(names[MAX_MODELS_SHOWN:]))
        shown += f'<span class="more" title="{hidden}">+{more} more</span>'
    return shown or '<span class="none">none</span>'


def _addresses(node: NodeStatus) -> str:
    """The node's addresses under its id (the one last reached first), unless it is its id."""
    confirmed = node["confirmed"]
    addresses = [confirmed] if confirmed else []
    addresses += [a for a in node["addresses"] if a != confirmed]
    if not addresses or addresses == [node["id"]]:
        return ""
    return f'<div class="addr">{esc(" ".join(addresses))}</div>'


def engineLine(engine: Mapping[str, object]) -> str:
    """A node's engine state in words (standalone): slots, loaded models, cache hit ratio;
    as ops.js's ``engineLine``."""
    parts: list[str] = []
    busy, total = engine.get("slotsBusy"), engine.get("slotsTotal")
    if engine.get("state") != "fresh":
        parts.append("engine state unknown")
    elif isinstance(busy, int) and isinstance(total, int):
        parts.append(f"slots {busy}/{total} busy")
    elif isinstance(busy, int):
        parts.append(f"{busy} busy")
    loaded = engine.get("loaded")
    if isinstance(loaded, list):
        parts.append(f"{len(loaded)} loaded")
    ratio = engine.get("cacheHitRatio")
    if isinstance(ratio, int | float) and not isinstance(ratio, bool):
        parts.append(f"cache {math.floor(ratio * 100 + 0.5)}%")
    return " · ".join(parts)


def _nodeRow(
    node: NodeStatus,
    series: Series | None,
    empty: Series,
    bucketSeconds: int,
    scale: float,
    now: int,
    breaker: str = "",
) -> str:
    state = node["state"]
    why = node["stateReason"]
    if node["checkedAt"] is not None:
        why = f"{why} · {ago((now - node['checkedAt']) / 1000)}"
    selfMark = '<span class="self">self</span>' if node["self"] else ""
    if node["name"]:
        selfMark = f'<span class="nname">{esc(node["name"])}</span>{selfMark}'
    engine = node.get("engine")
    engineDiv = f'<div class="engine">{esc(engineLine(engine))}</div>' if engine else ""
    cells = [
        f'<td class="st"><span class="state {esc(state)}">{esc(state)}</span>'
        f'<div class="why">{esc(why)}</div>{engineDiv}{breaker}</td>',
        f'<td class="nid">{esc(node["id"])}{selfMark}{_addresses(node)}</td>',
        f'<td class="models">{_models(node["modelNames"], node["models"])}</td>',
        f'<td class="work">{bar("inflight", node["inFlight"], scale, "in flight")}'
        f"{bar('reserved', node['reserved'], scale, 'reserved')}</td>",
        f'<td class="num">{number(node["estimatedLoad"])}</td>',
    ]
    for _, _, value, svg, _ in charts(series or empty, bucketSeconds):
        cells.append(f'<td class="chart">{svg}<span class="sv">{esc(value)}</span></td>')
    return (
        f'<tr class="node" data-node="{esc(node["id"])}" data-state="{esc(state)}">'
        f"{''.join(cells)}</tr>"
    )


def _facade(
    engineId: str, status: StatusDocument, history: HistoryDocument, empty: Series, now: int
) -> str:
    facade = status["facades"][engineId]
    seconds = history["bucketSeconds"]
    hist = history["facades"].get(engineId, {"series": empty, "nodes": {}})
    ports = str(facade["port"]) + "".join(f" + {esc(a)}" for a in facade["aliases"])
    meta = (
        f"port {ports} · pin {esc(facade['pin'] or 'none')} · local backend "
        f"{esc(facade['localBackend'] or 'none')} · discovery updates "
        f"{facade['discoveryUpdates']}"
    )
    scale = float(
        max(
            [n["inFlight"] for n in facade["nodes"]]
            + [n["reserved"] for n in facade["nodes"]]
            + [1]
        )
    )
    rows = "".join(
        _nodeRow(
            n,
            hist["nodes"].get(n["id"]),
            empty,
            seconds,
            scale,
            now,
            breakerNote(status, n["id"]) + residencyNote(status, n["id"]),
        )  # fmt: skip
        for n in facade["nodes"]
    )
    if not rows:
        rows = f'<tr><td colspan="{len(_NODE_HEADINGS)}" class="none">no nodes</td></tr>'
    heads = "".join(f"<th>{h}</th>" for h in _NODE_HEADINGS)
    affinity = affinityCounts(status, engineId)
    tiles = _tiles(hist["series"], seconds, affinity, queueTile(status, engineId))
    return (
        f'<section class="card facade" data-facade="{esc(engineId)}">'
        f'<div class="fhead"><h2>{esc(engineId)}</h2><span class="meta">{meta}</span></div>'
        f"{tiles}"
        f'<table class="nodes"><thead><tr>{heads}</tr></thead><tbody>{rows}</tbody></table>'
        f"</section>"
    )


def _workloadRow(w: WorkloadEntry, now: int) -> str:
    stats = w["stats"] or {}
    tokens = "–"
    if "promptTokens" in stats or "completionTokens" in stats:
        out = number(_number(stats.get("completionTokens")))
        tokens = f"{number(_number(stats.get('promptTokens')))} / {out}"
        if stats.get("estimated"):
            tokens += " (est.)"
    tps = _number(stats.get("tokensPerSecond"))
    ended = ago((now - w["completedAt"]) / 1000) if w["completedAt"] is not None else "–"
    error = ""
    if w["error"]:
        error = f"{esc(w['errorText'])} <code>{esc(w['error'])}</code>"
    cells = [
        esc(w["id"]),
        ended,
        f'<span class="wstate">{esc(w["state"])}</span>',
        esc(w["model"]),
        esc(w["node"] or "–"),
        str(w["attempts"]),
        millis(_number(stats.get("ttftMs"))),
        tokens,
        "–" if tps is None else f"{number(tps)}/s",
        millis(w["durationMs"]),
        error,
    ]
    return (
        f'<tr class="wl {esc(w["state"])}" data-state="{esc(w["state"])}">'
        + "".join(f"<td>{c}</td>" for c in cells)
        + "</tr>"
    )


def summary(status: StatusDocument) -> str:
    """The chips under the title: mode, run, requests in progress, workload counts."""
    terminals = status["workloads"]["terminals"]
    chips = [
        "standalone" if status["standalone"] else "under a broker",
        *_fleetChips(status),
        f"run <code>{esc(status['runId'])}</code>",
        f"in progress <b>{status['requestsInProgress']}</b>",
        f"live workloads <b>{status['workloads']['live']}</b>",
    ] + [f"{esc(state)} <b>{count}</b>" for state, count in sorted(terminals.items())]
    return "".join(f'<span class="chip">{c}</span>' for c in chips)


def _fleetChips(status: StatusDocument) -> list[str]:
    """The fleet file's chips: generation, when loaded, the last refusal (its one line)."""
    fleet = status["fleet"]
    if fleet is None:
        return []
    chips = [f"fleet generation <b>{fleet['generation']}</b>"]
    if fleet["loadedAt"] is not None:
        chips.append(f"fleet loaded <b>{ago((status['now'] - fleet['loadedAt']) / 1000)}</b>")
    if fleet["error"] is not None:
        chips.append(f"fleet file refused <code>{esc(fleet['error']['message'])}</code>")
    return chips


def renderPage(status: StatusDocument, history: HistoryDocument, empty: Series) -> str:
    """The whole page; ``empty`` is the document of a series with no data."""
    now = status["now"]
    facades = "".join(_facade(e, status, history, empty, now) for e in status["facades"])
    if not facades:
        facades = '<section class="card"><p class="none">no facade is enabled yet</p></section>'
    rows = "".join(_workloadRow(w, now) for w in status["workloads"]["recent"])
    if not rows:
        rows = (
            f'<tr><td colspan="{len(_WORKLOAD_HEADINGS)}" class="none">'
            "no workload has ended yet</td></tr>"
        )
    heads = "".join(f"<th>{h}</th>" for h in _WORKLOAD_HEADINGS)
    stamp = time.strftime("%H:%M:%S", time.gmtime(now / 1000))
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>nvpair-proxy · operations</title>"
        '<link rel="stylesheet" href="/ops.css"><script src="/ops.js" defer></script>'
        '<noscript><meta http-equiv="refresh" content="10"></noscript></head><body>'
        '<header class="top"><h1>nvpair-proxy</h1>'
        f'<div id="summary" class="chips">{summary(status)}</div>'
        f'<span id="live" class="live" data-source="server">as of {stamp} UTC</span></header>'
        f'<main><div id="facades">{facades}</div>'
        '<section class="card"><h2>Recent workloads <span class="meta">newest first</span></h2>'
        f'<table class="workloads"><thead><tr>{heads}</tr></thead>'
        f'<tbody id="workloads">{rows}</tbody></table></section></main>'
        '<footer><a href="/status">/status</a> · <a href="/status/history">/status/history</a>'
        ' · <a href="/metrics">/metrics</a> · charts: last 15 min in 10 s buckets</footer>'
        "</body></html>"
    )
