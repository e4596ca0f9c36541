"""Load generators: wrk (non-streaming POSTs) and ``bench.streams`` (SSE), with CPU accounting.

Each run is bounded in time (the tool's own duration plus a hard subprocess timeout) and
returns a dict of measurements; the CPU time of the accounted processes is read from
``/proc/<pid>/stat`` just before and just after the load.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from typing import Any

from bench.procs import PYTHON, ROOT, cpuSeconds, rssKiB, spawn, stop

LUA = os.path.join(ROOT, "bench", "post.lua")
CHAT_BODY = '{"model":"bench","messages":[{"role":"user","content":"hi"}]}'


def _benchJSON(text: str, marker: str = "BENCHJSON ") -> dict[str, Any]:
    for line in text.splitlines():
        if line.startswith(marker):
            return dict(json.loads(line[len(marker) :]))
    raise RuntimeError(f"no {marker.strip()} line in output: {text[-400:]!r}")


def _machineTicks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    out: dict[str, float] = {}
    busy, total = _machineTicks()
    out["_machine_busy"], out["_machine_total"] = busy, total
    out["_wall"] = time.monotonic()
    for name, pid in pids.items():
        if name.startswith("_"):
            continue
        try:
            out[name] = cpuSeconds(pid)
        except OSError:
            out[name] = float("nan")
    return out


def _utilization(
    before: dict[str, float], after: dict[str, float], pids: dict[str, int]
) -> dict[str, float]:
    """Machine busy share (of all CPUs) and each process's share of one CPU, in %."""
    wall = after["_wall"] - before["_wall"]
    total = after["_machine_total"] - before["_machine_total"]
    out = {
        "machine_busy_pct": 100.0 * (after["_machine_busy"] - before["_machine_busy"]) / total
        if total
        else float("nan")
    }
    for name in pids:
        out[f"cpu_{name}_pct"] = 100.0 * (after[name] - before[name]) / wall if wall else 0.0
    return out


def wrk(
    port: int, conns: int, duration: float, bodyFile: str, cpuPids: dict[str, int]
) -> dict[str, Any]:
    """POST chat completions with wrk for ``duration`` seconds at ``conns`` connections."""
    threads = 1 if conns == 1 else 2
    argv = [
        "wrk",
        f"-t{threads}",
        f"-c{conns}",
        f"-d{duration:g}s",
        "--timeout",
        "5s",
        "-s",
        LUA,
        f"http://127.0.0.1:{port}/v1/chat/completions",
    ]
    env = dict(os.environ, BENCH_BODY=bodyFile)
    before = _cpu(cpuPids)
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=duration + 60
    )
    after = _cpu(cpuPids)
    result = _benchJSON(done.stdout)
    result.update(_utilization(before, after, cpuPids))
    seconds = result["duration_us"] / 1e6
    result["rps"] = result["requests"] / seconds if seconds > 0 else 0.0
    result["errors"] = sum(
        result[k]
        for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")
    )
    for name in cpuPids:
        spent = after[name] - before[name]
        result[f"cpu_{name}_us_per_req"] = (
            spent / result["requests"] * 1e6 if result["requests"] else float("nan")
        )
    return result


def sse(
    port: int, conns: int, duration: float, events: int, cpuPids: dict[str, int]
) -> dict[str, Any]:
    """Streamed chat completions with ``bench.streams load`` (its own process)."""
    argv = [
        PYTHON,
        "-m",
        "bench.streams",
        "load",
        "--port",
        str(port),
        "--conns",
        str(conns),
        "--duration",
        str(duration),
        "--expect-events",
        str(events),
    ]
    before = _cpu(cpuPids)
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=duration + 90)
    after = _cpu(cpuPids)
    result = _benchJSON(done.stdout)
    result.update(_utilization(before, after, cpuPids))
    for name in cpuPids:
        spent = after[name] - before[name]
        result[f"cpu_{name}_us_per_stream"] = (
            spent / result["streams"] * 1e6 if result["streams"] else float("nan")
        )
    return result


def hold(port: int, streams: int, events: int, pid: int, timeout: float) -> dict[str, Any]:
    """Hold ``streams`` concurrent streams, sampling the server's RSS every 100 ms."""
    baseline = rssKiB(pid)
    argv = [
        PYTHON,
        "-m",
        "bench.streams",
        "hold",
        "--port",
        str(port),
        "--streams",
        str(streams),
        "--expect-events",
        str(events),
        "--timeout",
        str(timeout),
    ]
    proc = spawn(argv, stdout=subprocess.PIPE)
    samples: list[int] = []
    atOpen: list[int] = []
    lines: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode()
            lines.append(line)
            if line.startswith("BENCHOPEN "):
                try:
                    atOpen.append(rssKiB(pid))
                except OSError:
                    pass

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            samples.append(rssKiB(pid))
        except OSError:
            break
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    thread.join(10)
    stop(proc)
    try:
        result = _benchJSON("".join(lines))
    except RuntimeError:
        result = {"all_complete": False, "error": "the hold client gave no result"}
    peak = max(samples) if samples else 0
    result.update(
        baseline_rss_kib=baseline,
        peak_rss_kib=peak,
        rss_at_all_open_kib=atOpen[0] if atOpen else None,
        rss_per_stream_kib=(peak - baseline) / streams if streams else 0.0,
    )
    return result
