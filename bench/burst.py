"""``python -m bench.burst``: a burst the fleet cannot serve in time (issue 31, second target).

    python -m bench.burst [--requests 400] [--engines 2] [--service 1.0] [--client-timeout 5]
        [--queue-timeout 30s] [--queue-max N] [--wave 50] [--no-write]

``--engines`` simulated llama.cpp engines of one slot each (processes; each request a
streamed chat of ``--service`` seconds: 50 ms per token), behind a fresh standalone proxy
(``--queue-timeout``, ``--queue-max`` when given, else the proxy's default), cold: no
request has gone through it before the burst. ``--requests`` clients (one identity) send at
once, in waves of ``--wave`` 10 ms apart (a connect storm of 400 at once would measure the
listen backlog's SYN retries, not the queue); each gives up when it has no answer (status
line) after ``--client-timeout`` seconds. Reported: every request's final status (200,
refused with its status and reason, or given up unanswered), the refusals within 1 s of the
burst with a valid ``Retry-After`` (an integer of seconds from 1 to 3600, or an HTTP date),
when each refusal came, and of the clients that gave up, those whose refusal was
foreseeable: behind more requests kept by the proxy than the engines could start within
``--queue-timeout`` at the rate they started them. Targets: at least 200 refused within
1 s with a valid ``Retry-After``, every request a final status, none given up while a
refusal was foreseeable. ``bench/out/burst.json`` and (unless ``--no-write``) a dated
section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import email.utils
import io
import json
import os
import sys
import time
import urllib.request
from typing import Any

import attrs
from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool, readBody
from twisted.web.http_headers import Headers

from bench import procs
from bench.routing.report import writeSection
from bench.routing.routers import MODEL, EngineSettings, startEngines

HEADING = "## Burst (issue 31)"
DECODE_MS = 50.0
BUCKETS = (0.25, 0.5, 1.0, 1.5, 2.0, 5.0, 30.0)


@attrs.define
class Outcome:
    """One request of the burst, its times from the burst's start."""

    index: int
    sent: float = 0.0
    status: int = 0
    at: float | None = None  # the status line came (for a 200: the request started)
    retryAfter: str | None = None
    reason: str = ""
    gaveUp: bool = False
    error: str = ""


def validRetryAfter(value: str | None) -> bool:
    """Whether ``value`` is a usable ``Retry-After``: 1 to 3600 seconds, or an HTTP date."""
    if value is None:
        return False
    if value.strip().isdigit():
        return 1 <= int(value) <= 3600
    return email.utils.parsedate_to_datetime(value) is not None if "," in value else False


def foreseeable(outcomes: list[Outcome], rate: float, timeout: float) -> list[int]:
    """The clients that gave up unanswered although, as the proxy could see it, they could
    not start before their queue time ran out: behind at least ``rate × timeout`` requests
    it kept (sent before theirs and not refused; whether those clients would give up, the
    proxy cannot know), at the rate the engines started requests."""
    kept = sorted((o for o in outcomes if o.gaveUp or o.status == 200), key=lambda o: o.sent)
    return [o.index for k, o in enumerate(kept) if o.gaveUp and k >= rate * timeout]


def timeline(times: list[float]) -> dict[str, int]:
    """How many of ``times`` fall in each bucket (``≤ 0.25 s``, ..., ``> 30 s``)."""
    out: dict[str, int] = {}
    low = 0.0
    for high in BUCKETS:
        out[f"{low:g}–{high:g} s"] = sum(1 for t in times if low < t <= high or t == low == 0)
        low = high
    out[f"> {low:g} s"] = sum(1 for t in times if t > low)
    return out


async def _one(
    agent: Agent,
    clock: IReactorTime,
    url: str,
    body: bytes,
    o: Outcome,
    start: float,
    patience: float,
) -> None:
    headers = Headers({b"content-type": [b"application/json"]})
    o.sent = clock.seconds() - start
    d = agent.request(b"POST", url.encode(), headers, FileBodyProducer(io.BytesIO(body)))

    def giveUp() -> None:
        o.gaveUp = True
        d.cancel()

    patient = IReactorTime(clock).callLater(patience, giveUp)
    try:
        response = await d
    except Exception as e:
        o.error = "" if o.gaveUp else type(e).__name__
        return
    finally:
        if patient.active():
            patient.cancel()
    o.at, o.status = clock.seconds() - start, response.code
    retry = response.headers.getRawHeaders(b"retry-after")
    o.retryAfter = retry[0].decode("latin-1") if retry else None
    try:
        reading = readBody(response)
        reading.addTimeout(60, clock)
        content = await reading
    except Exception as e:
        o.error = type(e).__name__
        return
    if o.status != 200:
        try:
            o.reason = str(json.loads(content)["error"]["code"])
        except (ValueError, KeyError, TypeError):
            o.reason = ""


def _status(ops: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ops}/status", timeout=10) as r:
        return dict(json.loads(r.read()))


async def burst(reactor: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The whole scenario: engines, a cold proxy, the burst, the outcomes."""
    clock = IReactorTime(reactor)
    tokens = max(1, round(args.service * 1000 / DECODE_MS))
    engines = startEngines(args.engines, EngineSettings(1, 65536, 16, 0.0, DECODE_MS))
    options = ["--queue-timeout", args.queue_timeout, "--affinity", "off", "--log-level", "warn"]
    if args.queue_max is not None:
        options += ["--queue-max", str(args.queue_max)]
    ops = procs.freePort()
    urls = [f"http://127.0.0.1:{e.port}" for e in engines]
    proxy = None
    try:
        proxy = procs.spawnStandalone(urls, *options, opsPort=ops)
        _ready(proxy, ops, args.engines)
        url = f"http://127.0.0.1:{proxy.port}/v1/chat/completions"
        doc = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        body = json.dumps({**doc, "max_tokens": tokens}).encode()
        agent = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))
        outcomes = [Outcome(i) for i in range(args.requests)]
        start = clock.seconds()
        pending = []
        for first in range(0, args.requests, args.wave):
            for o in outcomes[first : first + args.wave]:
                run = _one(agent, clock, url, body, o, start, args.client_timeout)
                pending.append(defer.Deferred.fromCoroutine(run))
            await task.deferLater(clock, 0.01, lambda: None)
        await defer.gatherResults(pending)
        # Those that gave up may still be waiting in the proxy for a moment: let it settle.
        await task.deferLater(clock, 1.0, lambda: None)
        status = _status(ops).get("queueing") or {}
    finally:
        if proxy is not None:
            proxy.close()
        for e in engines:
            e.close()
    return _figures(args, outcomes, status, tokens)


def _ready(proxy: procs.Server, ops: int, n: int) -> None:
    """Until the proxy's ``/status`` shows every engine with its models and slots (its
    first probes; no request has gone through it)."""
    procs.waitForFleet(proxy, ops, n)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = _status(ops).get("engineStates") or {}
        if len(states) == n and all(s.get("slotsTotal") for s in states.values()):
            return
        time.sleep(0.1)
    raise RuntimeError("the proxy never read every engine's slots")


def _figures(
    args: argparse.Namespace, outcomes: list[Outcome], status: dict[str, Any], tokens: int
) -> dict[str, Any]:
    refused = [o for o in outcomes if o.at is not None and o.status not in (0, 200)]
    started = sorted(o.at for o in outcomes if o.status == 200 and o.at is not None)
    span = started[-1] - started[0] if len(started) > 1 else 0.0
    rate = (len(started) - 1) / span if span > 0 else float(args.engines) / args.service
    timeout = float(args.queue_timeout.rstrip("s"))
    finals: dict[str, int] = {}
    for o in outcomes:
        key = (
            "gave up unanswered"
            if o.gaveUp
            else f"{o.status} {o.reason}".strip()
            if o.status
            else f"no status ({o.error})"
        )
        finals[key] = finals.get(key, 0) + 1
    fromSend = sum(1 for o in refused if o.at is not None and o.at - o.sent <= 1.0)
    within = [
        o for o in refused if o.at is not None and o.at <= 1.0 and validRetryAfter(o.retryAfter)
    ]
    gaveUp = [o for o in outcomes if o.gaveUp]
    late = foreseeable(outcomes, rate, timeout)
    return {
        "requests": len(outcomes),
        "tokensPerRequest": tokens,
        "finalStatuses": finals,
        "refused": len(refused),
        "refusedWithin1sValidRetryAfter": len(within),
        "refusedInvalidRetryAfter": sum(1 for o in refused if not validRetryAfter(o.retryAfter)),
        "retryAfterValues": sorted({o.retryAfter or "none" for o in refused}),
        "refusalTimeline": timeline([o.at for o in refused if o.at is not None]),
        "refusalTimes": sorted(round(o.at, 3) for o in refused if o.at is not None),
        "refusedWithin1sOfSending": fromSend,
        "served": len(started),
        "firstStarts": [round(t, 3) for t in started[: args.engines * 2]],
        "startRate": round(rate, 2),
        "gaveUpUnanswered": len(gaveUp),
        "gaveUpForeseeable": len(late),
        "noFinalStatus": sum(1 for o in outcomes if not o.gaveUp and o.status == 0),
        "sendSpread": round(max(o.sent for o in outcomes) - min(o.sent for o in outcomes), 3),
        "proxyRefused": status.get("refused"),
    }


def _s(value: float) -> str:
    return f"{value:g}"


def markdown(results: dict[str, Any]) -> str:
    """The dated section."""
    r, a = results["burst"], results["settings"]
    finals = ", ".join(f"{k}: {v}" for k, v in sorted(r["finalStatuses"].items()))
    times = ", ".join(f"{k}: {v}" for k, v in r["refusalTimeline"].items() if v)
    ok = (
        r["refusedWithin1sValidRetryAfter"] >= 200
        and r["noFinalStatus"] == 0
        and r["gaveUpForeseeable"] == 0
    )
    lines = [
        f"{HEADING}, run of {results['date']}",
        "",
        f"`{results['command']}` ({results['machine']}). {a['engines']} simulated llama.cpp "
        f"engines of one slot, each request a streamed chat of {r['tokensPerRequest']} tokens "
        f"({_s(a['service'])} s), behind a fresh, cold standalone proxy (`--queue-timeout "
        f"{a['queue_timeout']}`, `--queue-max` "
        f"{'default' if a['queue_max'] is None else a['queue_max']}). {r['requests']} "
        f"clients (one identity) sent within {r['sendSpread']:.2f} s (waves of {a['wave']}, "
        f"10 ms apart); each gave up without a status line after {_s(a['client_timeout'])} s. "
        "Times from the burst's start. A refusal's `Retry-After` is valid when it is 1 to 3600 "
        "seconds or an HTTP date. A client that gave up had a foreseeable refusal when it was "
        "behind more requests kept by the proxy (sent before it, not refused) than the engines "
        "could start within `--queue-timeout`, at the rate they started them "
        f"({r['startRate']} per second).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| refused within 1 s with a valid `Retry-After` (target ≥ 200) "
        f"| **{r['refusedWithin1sValidRetryAfter']}** |",
        f"| refused within 1 s of their own sending | {r['refusedWithin1sOfSending']} |",
        f"| the first requests started at | {', '.join(f'{t:.2f} s' for t in r['firstStarts'])} |",
        f"| refused in all / with an invalid `Retry-After` | {r['refused']} / "
        f"{r['refusedInvalidRetryAfter']} |",
        f"| `Retry-After` values | {', '.join(r['retryAfterValues'])} |",
        f"| when the refusals came | {times or '–'} |",
        f"| final statuses | {finals} |",
        f"| requests with no final status (target 0) | **{r['noFinalStatus']}** |",
        f"| clients that gave up unanswered | {r['gaveUpUnanswered']} |",
        f"| of them with a foreseeable refusal (target 0) | **{r['gaveUpForeseeable']}** |",
        f"| the proxy's `/status` refusals | {json.dumps(r['proxyRefused'])} |",
        f"| targets | **{'PASS' if ok else 'FAIL'}** |",
    ]
    return "\n".join(lines) + "\n"


async def main(reactor: Any, argv: list[str]) -> None:
    """Run the burst, print and keep the figures."""
    p = argparse.ArgumentParser(prog="python -m bench.burst")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--service", type=float, default=1.0, help="seconds per request")
    p.add_argument("--client-timeout", type=float, default=5.0)
    p.add_argument("--queue-timeout", default="30s")
    p.add_argument("--queue-max", type=int, default=None, help="default: the proxy's")
    p.add_argument("--wave", type=int, default=50)
    p.add_argument("--no-write", action="store_true", help="leave bench/RESULTS.md alone")
    args = p.parse_args(argv)
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python -m bench.burst", *argv]),
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.0f} at start",
        "settings": vars(args),
        "burst": await burst(reactor, args),
    }
    os.makedirs(os.path.join(procs.ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(procs.ROOT, "bench", "out", "burst.json"), "w") as f:
        json.dump(results, f, indent=1)
    section = markdown(results)
    sys.stdout.write(section)
    if not args.no_write:
        writeSection(os.path.join(procs.ROOT, "bench", "RESULTS.md"), section, HEADING)


if __name__ == "__main__":
    task.react(lambda reactor: defer.Deferred.fromCoroutine(main(reactor, sys.argv[1:])))
