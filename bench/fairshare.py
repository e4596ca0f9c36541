"""Shares that cannot be minted and a queue bound one app cannot take (issue 32 items 2 and
3), measured with ``bench.fairness``'s proxy and simulated engines: an honest app (one
request at a time, one key) against a greedy one on a one-slot engine.

* ``minted``: the greedy app keeps 8 requests in flight with one key, then with a new
  ``Authorization`` value for every request, then the same with the honest app declared in
  the fleet file (``[[client]]``).  What the honest app got, and its answers against minted
  keys as a share of its answers against one key (the issue's target: at least 40 %).
* ``bound``: ``--queue-max 4`` and the greedy app keeps 12 in flight (more than the queue
  holds), with one key and with minted keys: the honest app's answers and ``queue_full``
  refusals (the target: none), and the greedy app's.

A refused app waits 20 ms before it sends again.  Every run is bounded in time.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import treq
from twisted.internet import defer, task
from twisted.web.http_headers import Headers

from bench.fairness import DECODE_MS, Proxy, body, sims

HONEST = "Bearer sk-bench-honest"
GREEDY = "Bearer sk-bench-greedy"


async def ask(url: str, key: str) -> tuple[int, str | None]:
    """One request: its status and, when refused, the reason (``error.code``)."""
    headers = Headers({b"content-type": [b"application/json"], b"authorization": [key.encode()]})
    try:
        response = await treq.post(url, body(), headers=headers, persistent=False)
        content = await response.content()
    except Exception:
        return 0, "transport"
    if response.code == 200:
        return 200, None
    try:
        return response.code, str(json.loads(content)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return response.code, None


async def contest(
    reactor: Any,
    seconds: float,
    greedyKey: Callable[[], str],
    inFlight: int,
    extra: list[str],
    fleet: str | None = None,
) -> dict[str, Any]:
    """The honest app and ``inFlight`` greedy loops for ``seconds`` on one one-slot engine."""
    (engine,) = sims(reactor, 1, slots=1, queueMax=0, decodeMs=DECODE_MS, prefillMs=0.0)
    proxy = Proxy([engine.url], ["--queue-timeout", "60s", *extra], fleet or "")
    try:
        await proxy.ready(reactor, 1)
        stopAt = time.monotonic() + seconds
        tallies: dict[str, dict[str, int]] = {"honest": {}, "greedy": {}}

        async def app(name: str, key: Callable[[], str]) -> None:
            tally = tallies[name]
            while time.monotonic() < stopAt:
                code, reason = await ask(proxy.url, key())
                outcome = "served" if code == 200 else reason or str(code)
                tally[outcome] = tally.get(outcome, 0) + 1
                if code != 200:
                    await task.deferLater(reactor, 0.02, lambda: None)

        loops = [app("honest", lambda: HONEST)] + [
            app("greedy", greedyKey) for _ in range(inFlight)
        ]
        await defer.gatherResults([defer.Deferred.fromCoroutine(loop) for loop in loops])
        honest, greedy = tallies["honest"], tallies["greedy"]
        served = honest.get("served", 0) + greedy.get("served", 0)
        return {
            "honest": honest,
            "greedy": greedy,
            "honestShare": round(honest.get("served", 0) / served, 3) if served else None,
        }
    finally:
        proxy.close()
        await engine.close()


def minted() -> Callable[[], str]:
    """A greedy app's keys: a new one for every request."""
    counter = itertools.count()
    return lambda: f"Bearer sk-bench-minted-{next(counter)}"


async def mintedRuns(reactor: Any, seconds: float) -> dict[str, Any]:
    """Item 2: one key, minted keys, minted keys against a declared honest app."""
    digest = hashlib.sha256(HONEST.encode()).hexdigest()
    declared = f'[[client]]\nname = "honest"\nkey_sha256 = "{digest}"\n'
    oneKey = await contest(reactor, seconds, lambda: GREEDY, 8, [])
    mintedKeys = await contest(reactor, seconds, minted(), 8, [])
    mintedDeclared = await contest(reactor, seconds, minted(), 8, [], declared)
    alone = oneKey["honest"].get("served", 0)
    against = mintedKeys["honest"].get("served", 0)
    return {
        "oneKey": oneKey,
        "mintedKeys": mintedKeys,
        "mintedKeysHonestDeclared": mintedDeclared,
        "honestMintedOverOneKey": round(against / alone, 3) if alone else None,
    }


async def boundRuns(reactor: Any, seconds: float) -> dict[str, Any]:
    """Item 3: ``--queue-max 4``, the greedy app keeping 12 in flight."""
    extra = ["--queue-max", "4"]
    return {
        "oneKey": await contest(reactor, seconds, lambda: GREEDY, 12, extra),
        "mintedKeys": await contest(reactor, seconds, minted(), 12, extra),
    }
