"""Plot a run's same-round ratios (nvpair/direct, nvpair/nginx, nginx/direct) as a PNG.

Runs under ``bench/.venv`` (matplotlib): ``python -m bench.plot summary.json ratios.png``.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    """Read the summary written by ``bench.report`` and draw grouped bars on a log scale."""
    source, target = sys.argv[1], sys.argv[2]
    with open(source) as f:
        summary = json.load(f)
    table = summary["table"]
    labels = [
        f"{e['label']}\n({'higher' if e['higher_is_better'] else 'lower'} is better)" for e in table
    ]
    series = [
        ("nvpair/direct", "#d62728"),
        ("nvpair/nginx", "#1f77b4"),
        ("nginx/direct", "#7f7f7f"),
    ]
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(table) + 2))
    height = 0.26
    for i, (key, color) in enumerate(series):
        values = [e[key] if e[key] == e[key] else 0 for e in table]
        ys = [j + (i - 1) * height for j in range(len(table))]
        bars = ax.barh(ys, values, height=height, color=color, label=key)
        for bar, value in zip(bars, values, strict=True):
            if value > 0:
                ax.text(
                    value * 1.03, bar.get_y() + height / 2, f"{value:.2f}", va="center", fontsize=7
                )
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(table)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio (same-round, median over rounds; log scale)")
    ax.set_title(f"nvpair-proxy vs direct vs nginx — {summary['date']}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(target, dpi=110)


if __name__ == "__main__":
    main()
