"""Sample the proxy with py-spy under load and summarize where its CPU goes.

``record`` runs ``py-spy record`` against a pid for a fixed duration while a load runs,
writing the collapsed stacks (``raw``) and, when asked, a flame graph SVG.  ``summarize``
turns collapsed stacks into the top functions by self time and by inclusive time.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.procs import ROOT

PYSPY = os.path.join(ROOT, "bench", ".venv", "bin", "py-spy")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::(?P<line>\d+))?\)$")


def available() -> bool:
    """Whether py-spy is installed in the bench venv."""
    return os.access(PYSPY, os.X_OK)


def record(pid: int, seconds: float, out: str, fmt: str, load: Callable[[], Any]) -> Any:
    """Sample ``pid`` for ``seconds`` (format ``raw`` or ``flamegraph``) while ``load()`` runs."""
    argv = [
        PYSPY,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(int(seconds)),
        "--rate",
        "200",
        "--format",
        fmt,
        "--output",
        out,
        "--nonblocking",
    ]
    with open(out + ".log", "w") as log:
        sampler = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            result = load()
        finally:
            try:
                sampler.wait(seconds + 60)
            except subprocess.TimeoutExpired:
                sampler.kill()
                sampler.wait(5)
    return result


def _short(frame: str) -> str:
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match.group("file")
    for marker in ("/site-packages/", "/work/main/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{match.group('func')} ({path})"


def summarize(rawFile: str, top: int = 25) -> dict[str, Any]:
    """Top functions from a py-spy ``raw`` file.

    ``self``: the leaf frame with its caller (a syscall shows as the Python function making
    it, e.g. ``untilConcludes ← Connection.writeSomeData`` is the socket ``send``);
    ``inclusive``: every frame on the stack, leaving out the event-loop scaffolding present
    in more than 80% of the samples; ``project``: each sample charged to the deepest
    ``nvpair/`` frame on its stack (``(outside nvpair)`` when none); ``self_by_file``.
    """
    selfCounts: Counter[str] = Counter()
    totalCounts: Counter[str] = Counter()
    project: Counter[str] = Counter()
    files: Counter[str] = Counter()
    samples = 0
    with open(rawFile) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [
                _short(fr)
                for fr in stack.split(";")
                if fr and not fr.startswith(("process ", "thread "))
            ]
            if not frames:
                continue
            samples += n
            leaf = frames[-1]
            caller = frames[-2].split(" (", 1)[0] if len(frames) > 1 else ""
            selfCounts[f"{leaf} ← {caller}" if caller else leaf] += n
            for fr in set(frames):
                totalCounts[fr] += n
            owner = next((fr for fr in reversed(frames) if "(nvpair/" in fr), "(outside nvpair)")
            project[owner] += n
            files[leaf.rsplit("(", 1)[-1].rstrip(")")] += n

    def pct(counter: Counter[str], skipAbove: float = 101.0) -> list[tuple[str, float]]:
        if not samples:
            return []
        shares = [(k, 100.0 * v / samples) for k, v in counter.most_common()]
        return [(k, v) for k, v in shares if v <= skipAbove][:top]

    return {
        "samples": samples,
        "self": pct(selfCounts),
        "inclusive": pct(totalCounts, 80.0),
        "project": pct(project),
        "self_by_file": pct(files),
    }


def formatSummary(summary: dict[str, Any], top: int = 15) -> str:
    """Markdown tables of a ``summarize`` result."""
    lines = [f"{summary['samples']} samples (py-spy, 200 Hz, idle excluded).", ""]
    for key, title in (
        ("self", "self time (leaf ← caller)"),
        ("inclusive", "inclusive time (frames in > 80% of samples left out)"),
        ("project", "samples charged to the deepest nvpair frame"),
        ("self_by_file", "self time by file"),
    ):
        lines += [f"| {title} | % |", "|---|---:|"]
        lines += [f"| `{name}` | {share:.1f} |" for name, share in summary[key][:top]]
        lines.append("")
    return "\n".join(lines)
