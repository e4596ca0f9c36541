"""Placement by cached prefix and live slot state, end to end: the real standalone process
over simulated engines (``nvpair.proxy.testing.simengine``) on loopback."""

from __future__ import annotations

import time
from typing import Any

import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.simengine import SimConfig, SimEngine
from tests.support.harness import reservedPort
from tests.support.standaloneharness import StandaloneProxy, backendUp

CHAT = "/v1/chat/completions"
DEADLINE = 30.0


def words(n: int, tag: str) -> str:
    """``n`` distinct words (a long system prompt when ``n`` is large)."""
    return " ".join(f"{tag}{i}" for i in range(n))


def pause(seconds: float) -> Deferred[None]:
    d: Deferred[None] = Deferred()
    reactor.callLater(seconds, d.callback, None)
    return d


class PlacementTests(TestCase):
    """Tenants group on one engine; a node whose slots a direct client took is avoided."""

    timeout = 120

    async def start(self, engines: int = 2, slots: int = 2, prefillMs: float = 0.05) -> None:
        self.engines: list[SimEngine] = []
        self.urls: list[str] = []
        for i in range(engines):
            engine = SimEngine(
                reactor,
                SimConfig(
                    models=("m1",), name=f"E{i}", slots=slots, prefillMs=prefillMs, decodeMs=1
                ),
            )
            port = engine.listen()
            self.addCleanup(engine.close)
            self.engines.append(engine)
            self.urls.append(f"http://127.0.0.1:{port}")
        self.opsPort = reservedPort(self)
        self.proxy = StandaloneProxy(
            self,
            reactor,
            ["llamacpp"],
            [("llamacpp", url) for url in self.urls],
            ["--ops-port", str(self.opsPort)],
        )
        await self.proxy.start()
        for url in self.urls:
            await self.proxy.waitForLog(backendUp(url))

    async def chat(self, system: str, user: str) -> tuple[str, dict[str, Any]]:
        """One request through the proxy: the serving node and the usage reported (with
        the engine's FIFO wait, ``X-Sim-Queue-Ms``, as ``queueMs``)."""
        response = await treq.post(
            self.proxy.url("llamacpp") + CHAT,
            json={
                "model": "m1",
                "max_tokens": 2,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": user},
                ],
            },
            persistent=False,
        )
        body = await response.json()
        self.assertEqual(response.code, 200, body)
        [nodeId] = response.headers.getRawHeaders("x-nvpair-node")
        [queued] = response.headers.getRawHeaders("x-sim-queue-ms")
        return nodeId, {**body["usage"], "queueMs": float(queued)}

    async def ops(self, path: str) -> bytes:
        response = await treq.get(f"http://127.0.0.1:{self.opsPort}{path}", persistent=False)
        self.assertEqual(response.code, 200)
        return bytes(await response.content())

    async def status(self) -> dict[str, Any]:
        response = await treq.get(f"http://127.0.0.1:{self.opsPort}/status", persistent=False)
        document: dict[str, Any] = await response.json()
        return document

    async def waitForState(
        self, url: str, busy: int, available: int | None = None
    ) -> dict[str, Any]:
        """Poll /status (bounded) until the engine at ``url`` is read fresh with ``busy``
        slots busy (and the ledger's ``available`` free, when given)."""
        deadline = reactor.seconds() + DEADLINE
        while True:
            entry = (await self.status()).get("engineStates", {}).get(url, {})
            if (
                entry.get("state") == "fresh"
                and entry.get("slotsBusy") == busy
                and (available is None or entry.get("slotsAvailable") == available)
            ):
                return dict(entry)
            if reactor.seconds() > deadline:
                self.fail(f"engine state of {url} never showed {busy} busy: {entry}")
            await pause(0.1)

    async def test_tenantGroupsAndStateShown(self) -> None:
        """Users of one tenant (a long shared system prompt, worth grouping at 1 ms a
        token) land on one engine, which reports their shared prefix cached; /status and
        /metrics show slots and hit ratio."""
        await self.start(prefillMs=1.0)
        system = words(400, "acme")
        homes = set()
        cached = []
        for user in ("alice asks about invoices", "bob wants a refund", "carol resets"):
            node, usage = await self.chat(system, user)
            homes.add(node)
            cached.append(usage["prompt_tokens_details"]["cached_tokens"])
        self.assertEqual(len(homes), 1, homes)
        self.assertEqual(cached[0], 0)
        self.assertGreater(min(cached[1:]), 300)
        (home,) = homes
        await self.waitForState(home, 0)
        status = await self.status()
        entry = status["engineStates"][home]
        self.assertEqual(entry["slotsTotal"], 2)
        self.assertGreater(entry["cacheHitRatio"], 0.5)
        nodes = {n["id"]: n for n in status["facades"]["llamacpp"]["nodes"]}
        self.assertEqual(nodes[home]["engine"]["slotsTotal"], 2)
        self.assertGreater(status["affinity"]["prefixIndex"]["blocks"], 0)
        metrics = (await self.ops("/metrics")).decode()
        self.assertIn(f'nvpair_proxy_engine_slots_total{{node="{home}"}} 2.0', metrics)
        self.assertIn(f'nvpair_proxy_engine_state_fresh{{node="{home}"}} 1.0', metrics)
        self.assertIn(f'nvpair_proxy_engine_cache_hit_ratio{{node="{home}"}}', metrics)

    async def test_slotsTakenDirectlyAreAvoided(self) -> None:
        """Every slot of one engine taken by a client the proxy does not see (only the
        engine's /slots shows it): new conversations all go to the other engine."""
        await self.start()
        full, free = self.urls
        response = await treq.post(full + "/sim/hold", json={"slots": 2}, persistent=False)
        self.assertEqual(response.code, 200, await response.text())
        await self.waitForState(full, 2)
        served = [(await self.chat(f"short system {i}", "hi"))[0] for i in range(8)]
        self.assertEqual(served, [free] * 8)

    async def hold(self, url: str, slots: int) -> None:
        """Take ``slots`` of the engine at ``url`` as a direct client would."""
        response = await treq.post(url + "/sim/hold", json={"slots": slots}, persistent=False)
        self.assertEqual(response.code, 200, await response.text())
        await self.waitForState(url, slots)

    async def test_heldInTheProxyForItsPrefix(self) -> None:
        """The tenant's engine full (direct clients), the other free: a second user's
        request (a long shared prefix, slow to recompute) waits in the proxy, not in that
        engine's queue, and goes there, cached, once a slot is free."""
        await self.start(prefillMs=5.0)
        system = words(400, "acme")
        home, _ = await self.chat(system, "alice asks about invoices")
        await self.hold(home, 2)
        asked = Deferred.fromCoroutine(self.chat(system, "bob wants a refund"))
        deadline = reactor.seconds() + DEADLINE
        while (await self.status())["queueing"]["held"]["now"] != 1:
            self.assertLess(reactor.seconds(), deadline, "the request was never held")
            await pause(0.05)
        response = await treq.post(home + "/sim/hold", json={"slots": 0}, persistent=False)
        self.assertEqual(response.code, 200)
        node, usage = await asked
        self.assertEqual(node, home)
        self.assertGreater(usage["prompt_tokens_details"]["cached_tokens"], 300)
        self.assertEqual(usage["queueMs"], 0.0)  # it never waited inside the engine
        held = (await self.status())["queueing"]["held"]
        self.assertEqual(held, {"now": 0, "endedWithRoom": 1, "endedWithBudget": 0})
        metrics = (await self.ops("/metrics")).decode()
        self.assertIn('nvpair_proxy_holds_total{result="room"} 1.0', metrics)

    async def test_heldNoLongerThanRecomputing(self) -> None:
        """The tenant's engine stays full: the held request goes to the free engine once it
        has waited what recomputing the prompt there takes (at 2 ms a token, longer than
        ``RECOMPUTE_SECONDS``: worth a hold), and never waits in a queue."""
        await self.start(prefillMs=2.0)
        system = words(400, "acme")
        home, _ = await self.chat(system, "alice asks about invoices")
        free = next(url for url in self.urls if url != home)
        await self.hold(home, 2)
        node, usage = await self.chat(system, "bob wants a refund")
        self.assertEqual(node, free)
        self.assertEqual(usage["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertEqual(usage["queueMs"], 0.0)
        held = (await self.status())["queueing"]["held"]
        self.assertEqual(held, {"now": 0, "endedWithRoom": 0, "endedWithBudget": 1})

    async def streamed(self, user: str) -> tuple[str, float, float]:
        """One streamed request through the proxy, read to its end: the serving node, the
        seconds until its answer ended, and its engine's FIFO wait (ms)."""
        began = time.monotonic()
        response = await treq.post(
            self.proxy.url("llamacpp") + CHAT,
            json={
                "model": "m1",
                "stream": True,
                "max_tokens": 2,
                "messages": [{"role": "user", "content": user}],
            },
            persistent=False,
        )
        body = await response.content()
        self.assertEqual(response.code, 200, body)
        self.assertIn(b"data: [DONE]", body)
        [nodeId] = response.headers.getRawHeaders("x-nvpair-node")
        [queued] = response.headers.getRawHeaders("x-sim-queue-ms")
        return nodeId, time.monotonic() - began, float(queued)

    async def test_movedOffAQueueItsReportDidNotShow(self) -> None:
        """One-slot engines; a direct client took one engine's slot after its last report
        (its /slots still shows it idle). Of two streamed requests sent together, the
        proxy places one there, where it waits in the engine's queue: past its first-token
        budget, with the other engine free again, it is moved there and served, within a
        second. /metrics counts the move."""
        await self.start(slots=1)
        for hidden in self.urls:
            await self.hideHold(hidden)
            free = next(url for url in self.urls if url != hidden)
            results = await gatherResults(
                [Deferred.fromCoroutine(self.streamed(f"question {i}")) for i in range(2)]
            )
            self.assertEqual([node for node, _, _ in results], [free, free])
            self.assertLess(max(seconds for _, seconds, _ in results), 1.0)
            await self.release(hidden)
        metrics = (await self.ops("/metrics")).decode()
        self.assertIn(
            'nvpair_proxy_dispatch_attempts_total{engine="llamacpp",reason="moved"} 2.0', metrics
        )

    async def hideHold(self, url: str) -> None:
        """A direct client takes the slot of the engine at ``url``, unreported; the proxy
        has read every engine fresh, idle and free since."""
        response = await treq.post(
            url + "/sim/hold", json={"slots": 1, "reported": False}, persistent=False
        )
        self.assertEqual(response.code, 200, await response.text())
        for each in self.urls:
            await self.waitForState(each, 0, available=1)

    async def release(self, url: str) -> None:
        response = await treq.post(url + "/sim/hold", json={"slots": 0}, persistent=False)
        self.assertEqual(response.code, 200, await response.text())
