"""Load spreading, workload events and backpressure end to end (spec §5.5, §6; protocol §4-§5).

The real process under a scripted broker, fake engines on 127.0.0.1, treq or raw TCP clients.
"""

from __future__ import annotations

import json
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IAddress, IConsumer, IPushProducer
from twisted.internet.protocol import ClientFactory, Protocol, ServerFactory
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair.proxy.testing.fakeengine import Answer, HangAfterHeaders, Status
from tests.support.cases.requestcase import FAST, RequestCase, asyncTest

STREAM = {"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def priority(generation: int, order: list[str]) -> dict[str, Any]:
    """A scheduler snapshot with equal (zero) load on every listed node."""
    return {
        "generation": generation,
        "order": order,
        "load": {n: {"pending": 0, "gpuPressure": 0} for n in order},
    }


class WorkloadCase(RequestCase):
    """Helpers over the recorded notifications."""

    def shape(self, workloadId: str) -> list[tuple[str, str, str | None]]:
        return [
            (m, i["state"], i.get("scheduledOn")) for m, i in self.proxy.workloadEvents(workloadId)
        ]

    def workloadIds(self) -> list[str]:
        ids: list[str] = []
        for _, info in self.proxy.workloadEvents():
            if info["id"] not in ids:
                ids.append(info["id"])
        return ids

    def lastActivity(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for method, params in self.proxy.notifications:
            if method == "discovery:node-activity":
                last[params["nodeId"]] = params["inFlight"]
        return last

    async def streams(self, count: int) -> list[bytes]:
        """``count`` concurrent streaming chat requests; their bodies."""

        async def one() -> bytes:
            response = await treq.post(
                self.url("/v1/chat/completions"), json=STREAM, persistent=False
            )
            self.assertEqual(response.code, 200)
            return bytes(await treq.content(response))

        results = await defer.gatherResults(
            [defer.Deferred.fromCoroutine(one()) for _ in range(count)]
        )
        return list(results)

    async def allEnded(self, count: int) -> None:
        """Wait until ``count`` terminal workload events arrived, then a round trip."""

        def ended() -> int:
            return sum(
                1
                for m, _ in self.proxy.workloadEvents()
                if m in ("workload:completed", "workload:errored")
            )

        while ended() < count:
            await defer.race(
                [
                    self.proxy.nextNotification("workload:completed"),
                    self.proxy.nextNotification("workload:errored"),
                ]
            )
        await self.proxy.sync()


class SpreadTests(WorkloadCase):
    """Reservations spread concurrent work; nothing leaks (§6)."""

    @asyncTest
    async def test_concurrentStreamsSpreadThenBackToA(self) -> None:
        """Scheduler order [A, B], equal load: 4 slow streams split 2/2; then one goes to A."""
        proxy, port, (a, b) = await self.setUpProxy()
        for engine in (a, b):
            engine.default = Answer(chunks=3, chunkDelay=0.5)
        proxy.notify("node/set-priority", priority(1, ["A", "B"]))
        await proxy.sync()
        bodies = await self.streams(4)
        self.assertTrue(all(b"tok2" in body for body in bodies))
        self.assertEqual((a.requestCount, b.requestCount), (2, 2))
        await self.allEnded(4)
        self.assertEqual(self.lastActivity(), {"A": 0, "B": 0})
        a.default = b.default = Answer()
        await self.streams(1)
        self.assertEqual((a.requestCount, b.requestCount), (3, 2), "nothing leaked")

    @asyncTest
    async def test_redeliveredSnapshotKeepsReservations(self) -> None:
        """A redelivered generation keeps A's live reservation; a newer one supersedes it."""
        proxy, port, (a, b) = await self.setUpProxy(
            argv=[*FAST, "--response-header-timeout", "30s", "--job-deadline", "60s"]
        )
        proxy.notify("node/set-priority", priority(5, ["A", "B"]))
        await proxy.sync()
        a.script(HangAfterHeaders())
        hanging = treq.post(self.url("/v1/chat/completions"), json=STREAM, persistent=False)

        def dropHanging() -> None:
            hanging.cancel()
            hanging.addErrback(lambda _: None)

        self.addCleanup(dropHanging)
        await a.waitForRequest(1)
        proxy.notify("node/set-priority", priority(5, ["A", "B"]))
        await proxy.sync()
        await self.streams(1)
        self.assertEqual((a.requestCount, b.requestCount), (1, 1), "A still reserved: to B")
        proxy.notify("node/set-priority", priority(6, ["A", "B"]))
        await proxy.sync()
        await self.streams(1)
        self.assertEqual((a.requestCount, b.requestCount), (2, 1), "superseded: back to A")

    @asyncTest
    async def test_burstOfFifty(self) -> None:
        """50 concurrent streams over 3 equally loaded owners: none gets more than 20."""
        proxy, port, engines = await self.setUpProxy(names=("A", "B", "C"))
        for engine in engines:
            engine.default = Answer(chunks=3, chunkDelay=1.0)
        proxy.notify("node/set-priority", priority(1, ["A", "B", "C"]))
        await proxy.sync()
        await self.streams(50)
        counts = [e.requestCount for e in engines]
        self.assertEqual(sum(counts), 50)
        self.assertLessEqual(max(counts), 20, counts)
        await self.allEnded(50)
        self.assertEqual(self.lastActivity(), {"A": 0, "B": 0, "C": 0})
        ends = [i["state"] for m, i in proxy.workloadEvents() if m == "workload:completed"]
        self.assertEqual(len(ends), 50)
        for engine in engines:
            engine.default = Answer()
        await self.streams(1)
        self.assertEqual(engines[0].requestCount, counts[0] + 1, "the map is empty again")


class EventSequenceTests(WorkloadCase):
    """The exact §5.5 event sequence, as the broker receives it."""

    def assertSequence(self, expected: list[tuple[str, str, str | None]]) -> dict[str, Any]:
        (workloadId,) = self.workloadIds()
        self.assertEqual(self.shape(workloadId), expected)
        infos = [i for _, i in self.proxy.workloadEvents(workloadId)]
        seqs = [i["seq"] for i in infos]
        self.assertEqual(seqs, list(range(seqs[0], seqs[0] + len(seqs))))
        self.assertEqual(len({i["runId"] for i in infos}), 1)
        self.assertEqual(len(infos[0]["runId"]), 16)
        self.assertEqual({i["model"] for i in infos}, {"m1"})
        self.assertNotIn("startedAt", infos[0])
        return infos[-1]

    @asyncTest
    async def test_failoverOnceThenComplete(self) -> None:
        """A 503, B completes: queued, on A, cleared, on B, running on B, completed on B."""
        proxy, port, (a, b) = await self.setUpProxy()
        a.script(Status(503))
        await self.streams(1)
        await self.allEnded(1)
        last = self.assertSequence(
            [
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "B"),
                ("workload:started", "running", "B"),
                ("workload:completed", "completed", "B"),
            ]
        )
        self.assertIsNone(last["error"])
        self.assertEqual(last["stats"]["completionTokens"], 3)
        self.assertLessEqual(last["createdAt"], last["startedAt"])
        self.assertLessEqual(last["startedAt"], last["completedAt"])

    @asyncTest
    async def test_clientAbandons(self) -> None:
        """The client leaves while A withholds content: cancelled, at once."""
        proxy, port, (a, b) = await self.setUpProxy(
            argv=[*FAST, "--response-header-timeout", "30s"]
        )
        a.script(HangAfterHeaders())
        d = treq.post(self.url("/v1/chat/completions"), json=STREAM, persistent=False)
        await a.waitForRequest(1)
        d.cancel()
        d.addErrback(lambda _: None)
        await self.allEnded(1)
        last = self.assertSequence(
            [
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:errored", "cancelled", "A"),
            ]
        )
        self.assertNotIn("stats", last)
        self.assertEqual(b.requestCount, 0, "no retry for a requester that left")

    @asyncTest
    async def test_budgetExhausted(self) -> None:
        """Two permitted attempts, both 503: the last one's answer commits; failed on B."""
        proxy, port, (a, b) = await self.setUpProxy(argv=[*FAST, "--max-dispatch-attempts", "2"])
        a.script(Status(503))
        b.script(Status(503))
        response = await treq.post(self.url("/v1/chat/completions"), json=STREAM, persistent=False)
        self.assertEqual(response.code, 503)
        await treq.content(response)
        await self.allEnded(1)
        last = self.assertSequence(
            [
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "B"),
                ("workload:started", "running", "B"),  # the final answer committed (§5.5)
                ("workload:errored", "failed", "B"),
            ]
        )
        self.assertNotIn("stats", last)


# -- backpressure --------------------------------------------------------------------------


@implementer(IPushProducer)
class _EndlessStream(Protocol):
    """An engine that answers every request with an endless SSE stream, honouring pauses."""

    CHUNK = b"data: " + b"x" * 65000 + b"\n\n"

    def __init__(self, owner: EndlessEngine) -> None:
        self.owner = owner
        self.paused = False
        self.streaming = False
        self._buffer = b""

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        if not self.streaming and b"\r\n\r\n" in self._buffer:
            self.streaming = True
            transport = self.transport
            assert transport is not None
            IConsumer(transport).registerProducer(self, True)
            transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            self.owner.started.callback(None)
            self._pump()

    def _pump(self) -> None:
        if self.paused or not self.streaming:
            return
        frame = b"%x\r\n%s\r\n" % (len(self.CHUNK), self.CHUNK)
        assert self.transport is not None
        self.transport.write(frame)
        self.owner.sent += len(frame)
        reactor.callLater(0, self._pump)

    def pauseProducing(self) -> None:
        self.paused = True
        self.owner.pauses += 1

    def resumeProducing(self) -> None:
        self.paused = False
        self._pump()

    def stopProducing(self) -> None:
        self.streaming = False

    def connectionLost(self, reason: Failure = Failure(Exception())) -> None:  # noqa: B008
        self.streaming = False
        if not self.owner.lost.called:
            self.owner.lost.callback(self.owner.sent)


class EndlessEngine(ServerFactory):
    """Counts what its endless streams managed to send before the proxy cut them."""

    def __init__(self) -> None:
        self.sent = 0
        self.pauses = 0
        self.started: defer.Deferred[None] = defer.Deferred()
        self.lost: defer.Deferred[int] = defer.Deferred()

    def buildProtocol(self, addr: IAddress | None) -> Protocol:
        return _EndlessStream(self)


class _StalledClient(Protocol):
    """Sends one request and never reads the answer."""

    def __init__(self, request: bytes, lost: defer.Deferred[None]) -> None:
        self.request = request
        self.lost = lost

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.request)
        IPushProducer(self.transport).pauseProducing()

    def connectionLost(self, reason: Failure = Failure(Exception())) -> None:  # noqa: B008
        self.lost.callback(None)


class _StalledClients(ClientFactory):
    """Connects one ``_StalledClient`` and keeps it."""

    def __init__(self, request: bytes, lost: defer.Deferred[None]) -> None:
        self.request = request
        self.lost = lost
        self.client: _StalledClient | None = None

    def buildProtocol(self, addr: IAddress | None) -> _StalledClient:
        self.client = _StalledClient(self.request, self.lost)
        return self.client


class BackpressureTests(WorkloadCase):
    """A client that stops reading pauses the engine; the write deadline then cuts it."""

    @asyncTest
    async def test_stalledClientBoundedAndCut(self) -> None:
        """The engine is paused with a bounded amount sent; the client is cut: cancelled."""
        engine = EndlessEngine()
        listening = reactor.listenTCP(0, engine, interface="127.0.0.1")
        self.addCleanup(listening.stopListening)
        proxy, port, _ = await self.setUpProxy(names=())
        host = listening.getHost()
        assert isinstance(host, IPv4Address)
        url = f"http://127.0.0.1:{host.port}"
        await proxy.nodes(self.engineId, [{"id": "E", "addresses": [url], "models": ["m1"]}])
        body = json.dumps(STREAM).encode()
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        clientLost: defer.Deferred[None] = defer.Deferred()
        factory = _StalledClients(request, clientLost)
        connector = reactor.connectTCP("127.0.0.1", port, factory)
        self.addCleanup(connector.disconnect)
        await engine.started
        sent = await engine.lost  # the proxy closed the upstream after cutting the client
        await self.allEnded(1)
        assert factory.client is not None
        # Read again: the proxy has closed this connection.
        IPushProducer(factory.client.transport).resumeProducing()
        await clientLost
        self.assertGreater(engine.pauses, 0, "the proxy paused the engine's stream")
        self.assertLess(sent, 96 * 1024 * 1024, "bounded: socket buffers, not the stream")
        (workloadId,) = self.workloadIds()
        self.assertEqual(self.shape(workloadId)[-1], ("workload:errored", "cancelled", "E"))
        self.assertEqual(self.lastActivity(), {"E": 0})
