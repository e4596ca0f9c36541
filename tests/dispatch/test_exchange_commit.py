"""An exchange's commit (spec §5.1-§5.4): the first body byte commits, headers alone do not;
the status table decides what fails over before commit; no owner answers at once."""

from __future__ import annotations

from twisted.internet.interfaces import IProtocol

from nvpair.proxy.testing.fakecontext import RUN_ID, FakeContext
from nvpair.proxy.testing.upstreamspy import FakeResponse, UpstreamCall
from tests.support.exchangecase import SSE, USAGE, LoopCase
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import makeFacade, node, setNodes


class HappyPathTests(LoopCase):
    """A first attempt that commits and streams to the end."""

    def test_streamsExactBytesAndReports(self) -> None:
        """The client gets the upstream status, headers and bytes; events follow §5.5."""
        ex, request = self.start()
        call = self.upstream.last()
        self.assertEqual(call.nodeId, "A")
        response = call.respond(
            200,
            {
                b"content-type": [b"text/event-stream"],
                b"x-engine": [b"yes"],
                b"connection": [b"close"],
            },
        )
        self.assertIsNone(request.code, "headers alone commit nothing")
        response.send(SSE[:3], SSE[3:], USAGE)
        self.assertEqual(request.code, 200)
        self.assertEqual(request.header(b"x-engine"), [b"yes"])
        self.assertIsNone(request.header(b"connection"))
        self.assertEqual(request.header(b"x-nvpair-node"), [b"A"])
        response.end()
        self.assertEqual(request.body, SSE + USAGE)
        self.assertTrue(request.finished)
        self.assertEqual(
            self.shape(),
            [
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:started", "running", "A"),
                ("workload:completed", "completed", "A"),
            ],
        )
        infos = [i for _, i in self.events()]
        self.assertEqual([i["seq"] for i in infos], [1, 2, 3, 4])
        self.assertEqual({i["runId"] for i in infos}, {RUN_ID})
        self.assertEqual({i["id"] for i in infos}, {"1"})
        self.assertNotIn("startedAt", infos[1])
        self.assertIn("startedAt", infos[2])
        self.assertEqual(infos[3]["stats"]["promptTokens"], 3)
        self.assertEqual(infos[3]["stats"]["completionTokens"], 2)
        self.assertEqual(self.context.sink.activity(), [("A", 1), ("A", 0)])
        self.assertReleased()

    def test_answeredBeforeTheLoopWaits(self) -> None:
        """An upstream whose whole answer arrives while the attempt starts (before the loop
        awaits it) is served and reported exactly once."""
        clock = self.clock

        class Immediate(FakeResponse):
            def deliverBody(self, protocol: IProtocol) -> None:
                super().deliverBody(protocol)
                self.send(SSE, USAGE)
                self.end()

        def auto(call: UpstreamCall) -> None:
            call.connect()
            call.deferred.callback(Immediate(clock, 200))

        self.upstream.auto = auto
        ex, request = self.start()
        self.assertEqual(request.code, 200)
        self.assertEqual(request.body, SSE + USAGE)
        self.assertTrue(request.finished)
        self.assertEqual(
            [m for m, _, _ in self.shape()][-2:], ["workload:started", "workload:completed"]
        )
        self.assertEqual(self.terminal()["state"], "completed")
        self.assertIsNone(ex.serving)
        self.assertReleased()

    def test_eofWithoutBodyCommits(self) -> None:
        """An upstream that answers 200 and ends with no body commits (§5.2)."""
        ex, request = self.start()
        response = self.upstream.last().respond(200, length=0)
        response.end()
        self.assertEqual(request.code, 200)
        self.assertTrue(request.finished)
        self.assertEqual(request.body, b"")
        self.assertEqual(self.terminal()["state"], "completed")
        self.assertEqual(len(self.upstream.calls), 1)

    def test_forwardsRequest(self) -> None:
        """Method, path with query, body and end-to-end headers are forwarded; hop-by-hop not."""
        request = FakeRequest(
            path=b"/v1/chat/completions?x=1",
            headers={
                b"content-type": [b"application/json"],
                b"authorization": [b"Bearer k"],
                b"connection": [b"keep-alive, x-hop"],
                b"x-hop": [b"1"],
                b"host": [b"proxy"],
                b"keep-alive": [b"5"],
                b"te": [b"trailers"],
                b"expect": [b"100-continue"],
            },
        )
        self.start(request=request, body=b'{"model":"m1"}')
        call = self.upstream.last()
        self.assertEqual(
            (call.method, call.path, call.body),
            (b"POST", b"/v1/chat/completions?x=1", b'{"model":"m1"}'),
        )
        names = {n.lower() for n, _ in call.headers.getAllRawHeaders()}
        self.assertEqual(names, {b"content-type", b"authorization"})
        self.assertEqual(call.address, "http://A")


class HeaderIsNotCommitTests(LoopCase):
    """Headers alone commit nothing; the first-content cap fails over (§5.2)."""

    settings = {"responseHeaderTimeout": 2.0}

    def test_headersThenSilenceFailsOver(self) -> None:
        """A: headers and silence past the cap → B serves; A's body is stopped."""
        ex, request = self.start()
        first = self.upstream.last().respond(200)
        self.clock.advance(1.9)
        self.assertEqual(len(self.upstream.calls), 1)
        self.clock.advance(0.1)
        self.assertTrue(first.transport.stopped)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
        self.upstream.last().answer(200, SSE)
        self.assertEqual(request.body, SSE)
        self.assertEqual(request.header(b"x-nvpair-node"), [b"B"])
        self.assertEqual(
            self.shape(),
            [
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "B"),
                ("workload:started", "running", "B"),
                ("workload:completed", "completed", "B"),
            ],
        )

    def test_zeroDisablesCaps(self) -> None:
        """--response-header-timeout 0 disables both caps."""
        self.context = FakeContext(responseHeaderTimeout=0.0)
        self.clock = self.context.clock
        self.upstream = self.context.upstream
        self.facade = makeFacade(self.clock, [node("A"), node("B")])
        ex, request = self.start()
        call = self.upstream.last().connect()
        self.clock.advance(100000)
        self.assertFalse(call.cancelled)
        response = call.respond(200)
        self.clock.advance(100000)
        response.send(b"x")
        self.assertEqual(request.code, 200)

    def test_slowFirstByteWithinCapCommits(self) -> None:
        """A first byte just inside the cap commits on that node."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        self.clock.advance(1.99)
        response.send(b"x")
        response.end()
        self.assertEqual(self.upstream.nodesCalled(), ["A"])
        self.assertEqual(request.body, b"x")


class NoOwnerTests(LoopCase):
    """No owner at admission answers 502 at once (§5.1, §5.4)."""

    def test_noOwnerAtAdmission(self) -> None:
        """An unadvertised model contacts no engine; submitted then errored(no_owner)."""
        ex, request = self.start(model="unknown", body=b'{"model":"unknown"}')
        self.assertEqual(self.upstream.calls, [])
        self.assertEqual(request.code, 502)
        self.assertEqual(self.errorReason(request), "no_owner")
        self.assertEqual(
            self.shape(),
            [("workload:submitted", "queued", None), ("workload:errored", "failed", None)],
        )
        self.assertEqual(self.terminal()["error"], "no_owner")
        self.assertReleased()

    def test_selfWithoutLocalBackendIsNoOwner(self) -> None:
        """A self node is a candidate only once a local backend is known."""
        setNodes(self.facade, [node("S", isSelf=True)])
        ex, request = self.start()
        self.assertEqual(request.code, 502)
        self.assertEqual(self.upstream.calls, [])

    def test_selfUsesLocalBackend(self) -> None:
        """A self node is reached through the local backend, before other owners."""
        setNodes(self.facade, [node("B"), node("S", isSelf=True)])
        self.facade.setLocalBackend("http://127.0.0.1:9")
        self.start()
        self.assertEqual(self.upstream.last().address, "http://127.0.0.1:9")
        self.assertEqual(self.upstream.last().nodeId, "S")


class StatusTableTests(LoopCase):
    """The §5.4 status table, pre-commit with budget remaining."""

    def failover(self, status: int) -> tuple[FakeRequest, FakeResponse]:
        ex, request = self.start()
        first = self.upstream.last().respond(status, {b"content-type": [b"application/json"]})
        return request, first

    def test_retriedStatuses(self) -> None:
        """404 (inference), 408, 429 and every 5xx fail over to the next owner."""
        for status in (404, 408, 429, 500, 502, 503, 504, 599):
            self.setUp()
            request, first = self.failover(status)
            self.assertIsNone(request.code, status)
            self.assertEqual(self.upstream.nodesCalled(), ["A", "B"], status)
            self.upstream.last().answer(200, SSE)
            self.assertEqual(request.code, 200, status)
            self.assertEqual(request.body, SSE)
            self.assertEqual(self.terminal()["state"], "completed")
            self.assertEqual(self.terminal()["scheduledOn"], "B")
            self.assertReleased()

    def test_answerStatuses(self) -> None:
        """3xx and 4xx other than 404/408/429 are the answer at once, whatever budget is left."""
        for status in (301, 302, 400, 401, 403, 405, 409, 413, 422):
            self.setUp()
            request, first = self.failover(status)
            first.send(b'{"error":"x"}')
            first.end()
            self.assertEqual(self.upstream.nodesCalled(), ["A"], status)
            self.assertEqual(request.code, status)
            self.assertEqual(request.body, b'{"error":"x"}')
            info = self.terminal()
            self.assertEqual(info["state"], "failed", status)
            if status >= 400:
                self.assertNotIn("stats", info, "error bodies are never measured")
            self.assertReleased()

    def test_committedSuccessCompleted(self) -> None:
        """Every 2xx commits and completes."""
        for status in (200, 201, 204):
            self.setUp()
            ex, request = self.start()
            self.upstream.last().answer(status, b"x")
            self.assertEqual(self.terminal()["state"], "completed")
            self.assertEqual(request.code, status)

    def test_transportErrorFailsOverAndForgetsAddress(self) -> None:
        """A refused dial fails over, and the node's confirmed address is forgotten."""
        self.facade.confirmed["A"] = "http://A"
        ex, request = self.start()
        self.upstream.last().refuse()
        self.assertNotIn("A", self.facade.confirmed)
        self.upstream.last().answer(200, SSE)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
        self.assertEqual(self.facade.confirmed.get("B"), "http://B")
        self.assertEqual(request.code, 200)

    def test_dropBeforeHeadersFailsOver(self) -> None:
        """A connection lost before headers is a transport error: fail over."""
        ex, request = self.start()
        self.upstream.last().drop()
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])

    def test_dropAfterHeadersFailsOver(self) -> None:
        """Headers then a dead connection before any byte: not committed, fail over."""
        ex, request = self.start()
        self.upstream.last().respond(200).fail()
        self.assertIsNone(request.code)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])

    def test_404VerbatimIsAnswer(self) -> None:
        """On a non-inference route a 404 is the answer, not retried."""
        ex, request = self.start(
            inference=False, model=None, request=FakeRequest(b"GET", b"/props"), body=b""
        )
        self.upstream.last().answer(404, b"nf")
        self.assertEqual(self.upstream.nodesCalled(), ["A"])
        self.assertEqual(request.code, 404)
