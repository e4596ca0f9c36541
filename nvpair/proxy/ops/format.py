"""Human units, error reasons in words, and the inline SVG sparklines and bars of the ops page.

Everything returned is HTML-safe: numbers are formatted here and every string that came from
an engine or a client (model names, node ids, error texts) goes through :func:`esc`.
``static/ops.js`` draws the same shapes in the browser from the same JSON.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Decimal
from html import escape

SPARK_WIDTH = 120
SPARK_HEIGHT = 28
_PAD = 2
BAR_WIDTH = 60
BAR_HEIGHT = 8

REASONS = {
    "no_owner": "no node serves this model",
    "upstream_unreachable": "engine unreachable",
    "no_content": "no first token in time",
    "deadline_exceeded": "deadline passed while retrying",
    "owner_unavailable": "no owner became available",
    "attempts_exhausted": "every attempt failed",
    "internal": "internal proxy error",
    "cancelled": "cancelled",
    "client disconnected": "client disconnected",
    "attempt transport": "attempt could not reach the engine",
    "attempt status": "attempt answered a retryable status",
    "attempt header_timeout": "attempt got no headers in time",
    "attempt no_content": "attempt got no first token in time",
    "attempt moved": "attempt moved off a busy engine's queue",
    "other": "other reasons",
    "unknown": "unknown reason",
}


def esc(text: object) -> str:
    """``text`` as HTML text or attribute value (quotes escaped too)."""
    return escape(str(text), quote=True)


def fixed(value: float, digits: int) -> str:
    """``value`` with ``digits`` decimals as JavaScript's ``toFixed`` writes it (an exact half
    rounds up), so the page reads the same whether the server or the script drew it."""
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def _r1(value: float) -> float:
    """One decimal, as ``Math.round(value * 10) / 10`` in the script."""
    return math.floor(value * 10 + 0.5) / 10


def reasonText(code: str | None) -> str:
    """An error reason code in words (codes we do not know are shown as they are)."""
    if code is None:
        return ""
    if code.startswith("upstream status "):
        return f"engine answered {code[16:]}"
    return REASONS.get(code, code)


def millis(ms: float | None) -> str:
    """A duration in milliseconds: ``412 ms``, ``1.24 s``, ``2 min 5 s``."""
    if ms is None:
        return "–"
    if ms < 1000:
        return f"{fixed(ms, 0)} ms"
    return seconds(ms / 1000)


def seconds(s: float) -> str:
    """A duration in seconds, in the largest sensible unit."""
    if s < 1:
        return f"{fixed(s * 1000, 0)} ms"
    if s < 10:
        return f"{fixed(s, 2)} s"
    if s < 60:
        return f"{fixed(s, 1)} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


def ago(s: float) -> str:
    """How long ago, coarsely: ``just now``, ``4 s ago``, ``3 min ago``, ``2 h ago``."""
    if s < 1:
        return "just now"
    if s < 60:
        return f"{fixed(s, 0)} s ago"
    if s < 3600:
        return f"{int(s // 60)} min ago"
    return f"{int(s // 3600)} h ago"


def number(value: float | None) -> str:
    """A count or rate, compact: ``7``, ``3.4``, ``812``, ``12.5k``, ``3.1M``."""
    if value is None:
        return "–"
    if value >= 1e6:
        return f"{fixed(value / 1e6, 1)}M"
    if value >= 1e4:
        return f"{fixed(value / 1e3, 1)}k"
    if value == int(value):
        return f"{int(value)}"
    if value >= 100:
        return fixed(value, 0)
    return fixed(value, 1) if value >= 10 else fixed(value, 2).rstrip("0").rstrip(".")


def _compress(segment: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Drop the inner points of flat runs (the line looks the same, the SVG is smaller)."""
    last = len(segment) - 1
    return [
        p
        for i, p in enumerate(segment)
        if i in (0, last) or p[1] != segment[i - 1][1] or p[1] != segment[i + 1][1]
    ]


def points(values: Sequence[float | None], top: float) -> list[list[tuple[float, float]]]:
    """The polyline segments of ``values`` scaled to ``top`` (a None breaks the line)."""
    n = len(values)
    step = (SPARK_WIDTH - 2 * _PAD) / max(n - 1, 1)
    span = SPARK_HEIGHT - 2 * _PAD
    segments: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    for i, v in enumerate(values):
        if v is None:
            if current:
                segments.append(_compress(current))
            current = []
            continue
        y = SPARK_HEIGHT - _PAD - (v / top * span if top > 0 else 0)
        current.append((_r1(_PAD + i * step), _r1(y)))
    if current:
        segments.append(_compress(current))
    return segments


def _n(value: float) -> str:
    """A coordinate as SVG text, as JavaScript's ``String`` writes it (``26``, ``2.5``)."""
    return f"{value:g}"


def sparkline(metric: str, values: Sequence[float | None], label: str, bars: bool = False) -> str:
    """An inline SVG chart of ``values`` (oldest first): a line, or bars for error counts."""
    present = [v for v in values if v is not None]
    top = max(present, default=0.0)
    body = [
        f"<title>{esc(label)}</title>",
        f'<line class="base" x1="{_PAD}" y1="{SPARK_HEIGHT - _PAD}" '
        f'x2="{SPARK_WIDTH - _PAD}" y2="{SPARK_HEIGHT - _PAD}"/>',
    ]
    if bars:
        n = len(values)
        width = (SPARK_WIDTH - 2 * _PAD) / max(n, 1)
        for i, v in enumerate(values):
            if v:
                h = _r1(v / top * (SPARK_HEIGHT - 2 * _PAD))
                body.append(
                    f'<rect x="{_n(_r1(_PAD + i * width))}" '
                    f'y="{_n(_r1(SPARK_HEIGHT - _PAD - h))}" '
                    f'width="{_n(_r1(max(width, 2.0)))}" height="{_n(h)}"/>'
                )
    else:
        for segment in points(values, top):
            if len(segment) == 1:  # a value between gaps: a short dash (a point would not show)
                x, y = segment[0]
                segment = [(_r1(max(x - 1.5, _PAD)), y), (_r1(min(x + 1.5, SPARK_WIDTH - _PAD)), y)]
            text = " ".join(f"{_n(x)},{_n(y)}" for x, y in segment)
            body.append(f'<polyline points="{text}"/>')
    return (
        f'<svg class="spark {esc(metric)}" data-metric="{esc(metric)}" '
        f'data-max="{number(top)}" width="{SPARK_WIDTH}" height="{SPARK_HEIGHT}" '
        f'viewBox="0 0 {SPARK_WIDTH} {SPARK_HEIGHT}" preserveAspectRatio="none" role="img" '
        f'aria-label="{esc(label)}">{"".join(body)}</svg>'
    )


def bar(metric: str, value: float, scale: float, label: str) -> str:
    """A small horizontal bar for ``value`` out of ``scale``, then the value and ``label``."""
    fill = _r1(BAR_WIDTH * min(value / scale, 1.0)) if scale > 0 else 0.0
    return (
        f'<span class="meter"><svg class="bar {esc(metric)}" width="{BAR_WIDTH}" '
        f'height="{BAR_HEIGHT}" viewBox="0 0 {BAR_WIDTH} {BAR_HEIGHT}" aria-hidden="true">'
        f'<rect class="track" width="{BAR_WIDTH}" height="{BAR_HEIGHT}" rx="2"/>'
        f'<rect class="fill" width="{_n(fill)}" height="{BAR_HEIGHT}" rx="2"/></svg>'
        f'<span class="val">{number(value)}</span><span class="lbl">{esc(label)}</span>'
        "</span>"
    )
