"""Conversation affinity with real engines: time to first token of later turns, prefix vs off.

    python -m bench.affinity [--conversations 2] [--turns 6] [--rounds 2] [--threads 1]

Starts two llama-cpp-python servers (Gemma 3 270M, through ``bench/llamalaunch.py`` so that
llama.cpp keeps a full-size sliding-window cache: each engine then reuses the longest common
prefix of the prompt it evaluated last, as llama.cpp's own server does for a slot; with
``--ram-cache`` also llama-cpp-python's RAM prompt cache; ``--logits_all false``) and one
standalone proxy over both, then runs the same workload once per mode, alternating
``--affinity prefix`` and ``--affinity off`` for ``--rounds`` rounds, with fresh engines
(empty caches) and a fresh proxy for every run.  The workload: ``--conversations``
conversations at once, each a thread sending its turns one after the other with a pause of
up to ``--think`` seconds (seeded); every turn re-sends the whole history (a long system
prompt, every earlier question and answer) plus a new question, streamed, ``max_tokens``
small and temperature 0.  Reported per run: time to first token (request sent to the first
content event) of the first turns and of the later turns, how often a conversation changed
node, and the proxy's affinity counts.  The interpreter with ``llama_cpp`` and the model
package is ``NVPAIR_LLAMA_PYTHON`` (default: the main checkout's ``.venv-llama``).  Every
process is started here and ended by its pid.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import threading
import time
import urllib.request
from typing import Any

from bench.procs import ROOT, freePort, spawn, spawnStandalone, stop, waitForFleet
from tests.fleet.test_real_engine import CHECK, INSTALL_HINT, llamaPython

MODEL = "gemma3-270m"
WORDS = (
    "river stone lantern harbor meadow copper signal orchard winter candle mirror valley "
    "thunder garden silver compass anchor feather marble canyon harvest beacon glacier "
    "pepper violin saddle quarry ribbon tunnel walnut falcon prism ember cobalt lagoon "
    "parcel trellis summit velvet basalt cedar fjord gravel hollow juniper kettle lichen "
    "mosaic nectar oyster pebble quiver rafter sorrel timber umber vessel willow"
).split()


def modelPath(python: str) -> str:
    """The GGUF file the model package assembles, found with the engine's interpreter."""
    out = subprocess.run([python, "-c", CHECK], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"{python} cannot run llama-cpp-python with the model; {INSTALL_HINT}")
    return out.stdout.strip().splitlines()[-1]


def getJSON(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def waitUntil(check: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready within {timeout:.0f}s")


def startEngine(python: str, model: str, args: argparse.Namespace) -> tuple[Any, str]:
    """One llama-cpp-python server (full-size SWA cache); (process, URL)."""
    port = freePort()
    launcher = os.path.join(ROOT, "bench", "llamalaunch.py")
    proc = spawn(
        [
            python,
            launcher,
            "--model",
            model,
            "--chat_format",
            "gemma",
            "--model_alias",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            str(args.ctx),
            "--n_threads",
            str(args.threads),
            "--n_threads_batch",
            str(args.threads),
            "--cache",
            "true" if args.ram_cache else "false",
            "--cache_type",
            "ram",
            "--logits_all",
            "false",
            "--verbose",
            "false",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    waitUntil(lambda: getJSON(url + "/v1/models")["data"], "llama.cpp server", 120)
    return proc, url


def startProxy(urls: list[str], mode: str) -> tuple[Any, int, int]:
    """The standalone proxy over ``urls``; (process, facade port, ops port)."""
    opsPort = freePort()
    server = spawnStandalone(urls, "--affinity", mode, opsPort=opsPort)
    waitForFleet(server, opsPort, len(urls))
    return server.procs[0], server.port, opsPort


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def turnTTFT(port: int, messages: list[dict[str, str]], maxTokens: int) -> tuple[float, str, str]:
    """One streamed turn: (seconds to the first content event, answer text, serving node)."""
    body = json.dumps(
        {
            "model": MODEL,
            "messages": messages,
            "stream": True,
            "max_tokens": maxTokens,
            "temperature": 0,
        }
    ).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        began = time.monotonic()
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"status {response.status}: {response.read()[:200]!r}")
        node = response.getheader("x-nvpair-node") or "?"
        first: float | None = None
        parts: list[str] = []
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices", ()):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if first is None:
                        first = time.monotonic() - began
                    parts.append(piece)
        return (first if first is not None else time.monotonic() - began), "".join(parts), node
    finally:
        conn.close()


def conversation(
    port: int, index: int, args: argparse.Namespace, out: list[tuple[int, float, str]]
) -> None:
    """One conversation's turns, in order; appends (turn, ttft, node) to ``out``."""
    try:
        _conversation(port, index, args, out)
    except Exception as e:  # reported by the run: every turn must complete
        print(f"conversation {index} failed: {e!r}", flush=True)


def _conversation(
    port: int, index: int, args: argparse.Namespace, out: list[tuple[int, float, str]]
) -> None:
    rng = random.Random(1000 + index)
    messages = [
        {"role": "system", "content": f"Conversation {index}. " + text(rng, args.system_words)}
    ]
    for turn in range(args.turns):
        if turn:
            time.sleep(rng.uniform(0, args.think))  # the user reads, then types
        messages.append({"role": "user", "content": text(rng, args.user_words) + "?"})
        ttft, answer, node = turnTTFT(port, messages, args.max_tokens)
        out.append((turn, ttft, node))
        messages.append({"role": "assistant", "content": answer})


def affinityCounts(opsPort: int) -> dict[str, int]:
    status = getJSON(f"http://127.0.0.1:{opsPort}/status")["affinity"]
    return dict(status.get("counts", {}).get("llamacpp", {}))


def runOnce(mode: str, python: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Fresh engines and proxy, the whole workload in ``mode``; the figures of the run."""
    engines = [startEngine(python, model, args) for _ in range(2)]
    proxy, port, opsPort = startProxy([url for _, url in engines], mode)
    try:
        results: list[list[tuple[int, float, str]]] = [[] for _ in range(args.conversations)]
        threads = [
            threading.Thread(target=conversation, args=(port, i, args, results[i]))
            for i in range(args.conversations)
        ]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
        counts = affinityCounts(opsPort)
    finally:
        stop(proxy)
        for proc, _ in engines:
            stop(proc)
    firsts = [t for conv in results for turn, t, _ in conv if turn == 0]
    laters = [t for conv in results for turn, t, _ in conv if turn > 0]
    moves = sum(1 for conv in results for a, b in zip(conv, conv[1:], strict=False) if a[2] != b[2])
    if len(laters) != args.conversations * (args.turns - 1):
        raise RuntimeError("a conversation did not finish")
    return {
        "mode": mode,
        "elapsed": elapsed,
        "first": firsts,
        "later": laters,
        "moves": moves,
        "counts": counts,
    }


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]


def describe(run: dict[str, Any], args: argparse.Namespace) -> str:
    later = run["later"]
    return (
        f"| {run['mode']} | {statistics.median(run['first']):.2f} | "
        f"{statistics.median(later):.2f} | {statistics.mean(later):.2f} | "
        f"{percentile(later, 0.9):.2f} | {run['moves']}/"
        f"{args.conversations * (args.turns - 1)} | "
        f"{run['counts'] or '-'} | {run['elapsed']:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="threads per engine")
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--system-words", type=int, default=1500)
    parser.add_argument("--user-words", type=int, default=150)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument(
        "--ram-cache", action="store_true", help="also turn on llama-cpp-python's RAM prompt cache"
    )
    parser.add_argument(
        "--think",
        type=float,
        default=3.0,
        help="longest pause between a conversation's turns, seconds",
    )
    args = parser.parse_args()
    python = llamaPython()
    model = modelPath(python)
    print(
        f"{args.conversations} conversations at once x {args.turns} turns, 2 engines "
        f"({args.threads} thread each), system {args.system_words} words, "
        f"+{args.user_words} words a turn, max_tokens {args.max_tokens}, "
        f"0-{args.think:g} s between turns, RAM cache {'on' if args.ram_cache else 'off'}",
        flush=True,
    )
    print(
        "| affinity | TTFT turn 1 median (s) | later turns median (s) | later mean (s) | "
        "later p90 (s) | node changes | proxy counts | run (s) |"
    )
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for _ in range(args.rounds):
        for mode in ("prefix", "off"):
            print(describe(runOnce(mode, python, model, args), args), flush=True)


if __name__ == "__main__":
    main()
