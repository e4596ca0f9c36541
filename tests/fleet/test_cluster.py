"""End to end: the cluster personality between real proxy processes on loopback (issue 5).

Each node is a real ``twistd nvpair-proxy`` with its own ``--cluster-dir`` (certificates
minted by ``testing.certs``) and its own fake engine as its local backend.  Node A's discovery
lists node B as a peer at ``127.0.0.1:<B's facade port>``; A reaches B over pinned mutual TLS
on the same port B serves loopback plaintext on.
"""

from __future__ import annotations

import os
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.certs import writeMember, writeNodeTLS
from tests.support.clusterfixture import ENGINE, ClusterNode, chat, newIdentity, pinnedClient
from tests.support.harness import directNode, startEngine


def _d(coro: Any) -> defer.Deferred[Any]:
    return defer.Deferred.fromCoroutine(coro)


class ClusterTestCase(TestCase):
    """Shared helpers: post to a node's facade in plaintext and read the answer."""

    timeout = 120

    async def post(self, node: ClusterNode, body: dict[str, Any]) -> tuple[int, Any, bytes]:
        """POST a chat completion to ``node``'s facade over loopback plaintext."""
        response = await treq.post(
            f"http://127.0.0.1:{node.port}/v1/chat/completions", json=body, persistent=False
        )
        content = await response.content()
        return response.code, response.headers, content


class PeerForwardingTests(ClusterTestCase):
    """Two members A and B, each pinning the other."""

    async def twoNodes(self, argvA: tuple[str, ...] = ()) -> tuple[ClusterNode, ClusterNode]:
        a = ClusterNode(self, reactor, "node-a", ["m-a"], argv=argvA)
        b = ClusterNode(self, reactor, "node-b", ["m-b"])
        await defer.gatherResults([_d(a.start(pins=[b])), _d(b.start(pins=[a]))])
        return a, b

    @defer.inlineCallbacks
    def test_servedByPeerEngine(self):  # type: ignore[no-untyped-def]
        """A request to A for a model only B advertises is served by B's engine through mTLS."""
        a, b = yield _d(self.twoNodes())
        yield a.proxy.nodes(ENGINE, [a.selfNode(), b.peerNode()])
        code, headers, body = yield _d(self.post(a, chat("m-b")))
        self.assertEqual(code, 200, body)
        self.assertEqual(headers.getRawHeaders("x-nvpair-node"), ["node-b"])
        self.assertEqual(headers.getRawHeaders("x-fake-engine"), ["engine-node-b"])
        self.assertEqual(len(b.engine.requests), 1)
        self.assertEqual(b.engine.requests[0].json()["model"], "m-b")
        self.assertEqual(a.engine.requestCount, 0)
        done = yield _d(a.proxy.waitFor("workload:completed"))
        self.assertEqual(done["workloadInfo"]["scheduledOn"], "node-b")
        yield b.proxy.sync()
        self.assertEqual(b.proxy.workloadEvents(), [], "a peer request is no workload on B")

    @defer.inlineCallbacks
    def test_unpinnedClientRefused(self):  # type: ignore[no-untyped-def]
        """B refuses a client certificate it has not pinned; A's pinned certificate is served."""
        a, b = yield _d(self.twoNodes())
        url = f"https://127.0.0.1:{b.port}/v1/models"
        outsider = newIdentity("node-x")
        stranger = pinnedClient(self, reactor, "node-x", outsider[0], outsider[1], b.name, b.fp)
        try:
            yield stranger.get(url)
        except Exception:
            pass
        else:
            self.fail("B answered a client whose certificate it has not pinned")
        member = pinnedClient(self, reactor, a.name, a.cert, a.key, b.name, b.fp)
        response = yield member.get(url)
        listing = yield response.json()
        self.assertEqual(response.code, 200)
        self.assertEqual([m["id"] for m in listing["data"]], ["m-b"])
        self.assertEqual(b.engine.requestCount, 1)

    @defer.inlineCallbacks
    def test_pinRemovedFailsOver(self):  # type: ignore[no-untyped-def]
        """Removing A's pin from B makes A's next attempt fail at the transport and fail over."""
        a, b = yield _d(self.twoNodes())
        direct = startEngine(self, reactor, "openai", ["m-b"], name="direct")
        yield a.proxy.nodes(ENGINE, [b.peerNode(), directNode("direct", direct)])
        a.proxy.notify(f"{ENGINE}:node/select", {"nodeId": "node-b"})
        code, headers, body = yield _d(self.post(a, chat("m-b")))
        self.assertEqual((code, headers.getRawHeaders("x-nvpair-node")), (200, ["node-b"]), body)
        changed = b.proxy.clusterChange()
        b.pin()  # B no longer pins anyone
        record = yield changed
        self.assertEqual(record["pins"], 0)
        for _ in range(2):  # the kept-alive connection, then a fresh handshake
            code, headers, body = yield _d(self.post(a, chat("m-b")))
            self.assertEqual(code, 200, body)
            self.assertEqual(headers.getRawHeaders("x-nvpair-node"), ["direct"])
            self.assertEqual(headers.getRawHeaders("x-nvpair-attempts"), ["2"])
        self.assertEqual(len(b.engine.requests), 1)
        self.assertEqual(len(direct.requests), 2)

    @defer.inlineCallbacks
    def test_peerRequestNeverRoutedOnward(self):  # type: ignore[no-untyped-def]
        """B answers a peer request from its local backend only: 502 without one, never C."""
        a = ClusterNode(self, reactor, "node-a", ["m-a"])
        b = ClusterNode(self, reactor, "node-b", ["m-b"], engine=False)
        yield defer.gatherResults([_d(a.start(pins=[b])), _d(b.start(pins=[a]))])
        other = startEngine(self, reactor, "openai", ["m-b"], name="other")
        yield b.proxy.nodes(ENGINE, [directNode("node-c", other)])
        client = pinnedClient(self, reactor, a.name, a.cert, a.key, b.name, b.fp)
        url = f"https://127.0.0.1:{b.port}/v1/chat/completions"
        response = yield client.post(url, json=chat("m-b"))
        body = yield response.json()
        self.assertEqual(response.code, 502)
        self.assertEqual(body["error"]["code"], "upstream_unreachable")
        self.assertEqual(other.requestCount, 0)
        local = startEngine(self, reactor, "openai", ["m-z"], name="b-local")
        b.proxy.notify(f"{ENGINE}:node/set-local-backend", {"url": local.url})
        yield b.proxy.sync()
        response = yield client.post(url, json=chat("m-b"))
        yield response.content()
        self.assertEqual(response.code, 200)
        self.assertEqual(len(local.requests), 1, "forwarded to the local engine as is")
        self.assertEqual(other.requestCount, 0)
        self.assertEqual(b.proxy.workloadEvents(), [])

    @defer.inlineCallbacks
    def test_tlsAndPlaintextInterleaved(self):  # type: ignore[no-untyped-def]
        """One port serves loopback plaintext and pinned TLS requests, interleaved."""
        a, b = yield _d(self.twoNodes())
        yield b.proxy.nodes(ENGINE, [b.selfNode()])
        client = pinnedClient(self, reactor, a.name, a.cert, a.key, b.name, b.fp)
        tlsURL = f"https://127.0.0.1:{b.port}/v1/chat/completions"
        plainURL = f"http://127.0.0.1:{b.port}/v1/chat/completions"
        calls = []
        for i in range(6):
            if i % 2:
                calls.append(client.post(tlsURL, json=chat("m-b")))
            else:
                calls.append(treq.post(plainURL, json=chat("m-b"), persistent=False))
        responses = yield defer.gatherResults(calls)
        bodies = yield defer.gatherResults([r.json() for r in responses])
        self.assertEqual([r.code for r in responses], [200] * 6)
        for body in bodies:
            self.assertEqual(body["choices"][0]["message"]["content"], "tok0tok1tok2")
        nodes = [r.headers.getRawHeaders("x-nvpair-node") for r in responses]
        self.assertEqual(nodes, [["node-b"], None] * 3, "only plaintext is routed by B")
        self.assertEqual(len(b.engine.requests), 6)
        yield b.proxy.sync()
        completed = [m for m, _ in b.proxy.workloadEvents() if m == "workload:completed"]
        self.assertEqual(len(completed), 3)


class LiveMembershipTests(ClusterTestCase):
    """Joining, leaving, pin changes and certificate rotation apply without a restart."""

    async def threeWay(self) -> tuple[ClusterNode, ClusterNode, Any]:
        a = ClusterNode(self, reactor, "node-a", ["m-a"])
        b = ClusterNode(self, reactor, "node-b", ["m-b"])
        await defer.gatherResults([_d(a.start(pins=[b])), _d(b.start(pins=[a], member=False))])
        direct = startEngine(self, reactor, "openai", ["m-b"], name="direct")
        await a.proxy.nodes(ENGINE, [b.peerNode(), directNode("direct", direct)])
        a.proxy.notify(f"{ENGINE}:node/select", {"nodeId": "node-b"})
        return a, b, direct

    async def servedBy(self, a: ClusterNode) -> str:
        code, headers, body = await self.post(a, chat("m-b"))
        self.assertEqual(code, 200, body)
        return str(headers.getRawHeaders("x-nvpair-node")[0])

    @defer.inlineCallbacks
    def test_joinLeaveAndRotate(self):  # type: ignore[no-untyped-def]
        """B joining, A leaving and rejoining, and B rotating its certificate take effect live."""
        a, b, direct = yield _d(self.threeWay())
        self.assertEqual((yield _d(self.servedBy(a))), "direct", "B is not a member yet")
        changed = b.proxy.clusterChange()
        writeMember(b.dir, b.name)
        yield changed
        self.assertEqual((yield _d(self.servedBy(a))), "node-b", "B joined")

        changed = a.proxy.clusterChange()
        os.unlink(os.path.join(a.dir, "member.json"))
        record = yield changed
        self.assertFalse(record["member"])
        self.assertEqual((yield _d(self.servedBy(a))), "direct", "A left: peers unreachable")
        changed = a.proxy.clusterChange()
        writeMember(a.dir, a.name)
        yield changed
        self.assertEqual((yield _d(self.servedBy(a))), "node-b", "A rejoined")

        cert, key, fp = newIdentity("node-b")
        changed = b.proxy.clusterChange()
        writeNodeTLS(b.dir, cert, key)
        yield changed
        self.assertEqual((yield _d(self.servedBy(a))), "direct", "A does not trust the new cert")
        changed = a.proxy.clusterChange()
        b.fp = fp
        a.pin(b)
        yield changed
        self.assertEqual((yield _d(self.servedBy(a))), "node-b", "A pinned the rotated cert")
        self.assertEqual(len(b.engine.requests), 3)

    @defer.inlineCallbacks
    def test_invalidFileReported(self):  # type: ignore[no-untyped-def]
        """A broken pins.json is reported as errors:report kind cluster; the last pins stay."""
        a, b, direct = yield _d(self.threeWay())
        changed = b.proxy.clusterChange()
        writeMember(b.dir, b.name)
        yield changed
        reported = a.proxy.nextNotification(
            "errors:report", lambda p: p.get("kind") == "cluster", timeout=20.0
        )
        with open(os.path.join(a.dir, "pins.json"), "w") as f:
            f.write('{"pins": {"node-b": ')
        report = yield reported
        self.assertIn("pins.json", report["message"])
        self.assertEqual((yield _d(self.servedBy(a))), "node-b", "the last good pins stay")


class ThreeNodeTests(ClusterTestCase):
    """Done when: three processes serve a streaming request over mTLS with failover."""

    @defer.inlineCallbacks
    def test_streamingWithFailover(self):  # type: ignore[no-untyped-def]
        """A streams from B over mTLS; with B stopped, the next stream fails over to C."""
        a = ClusterNode(self, reactor, "node-a", ["m-a"])
        b = ClusterNode(self, reactor, "node-b", ["m-s"])
        c = ClusterNode(self, reactor, "node-c", ["m-s"])
        assert a.engine is not None and b.engine is not None and c.engine is not None
        yield defer.gatherResults(
            [
                _d(a.start(pins=[b, c])),
                _d(b.start(pins=[a, c])),
                _d(c.start(pins=[a, b])),
            ]
        )
        yield a.proxy.nodes(ENGINE, [a.selfNode(), b.peerNode(), c.peerNode()])
        a.proxy.notify(f"{ENGINE}:node/select", {"nodeId": "node-b"})
        b.engine.default = c.engine.default = _answer(8)
        code, headers, body = yield _d(self.post(a, chat("m-s", stream=True)))
        self.assertEqual(code, 200, body)
        self.assertEqual(headers.getRawHeaders("x-nvpair-node"), ["node-b"])
        self.assertEqual(headers.getRawHeaders("content-type"), ["text/event-stream"])
        _assertStream(self, body, 8)
        yield b.proxy.stop()
        code, headers, body = yield _d(self.post(a, chat("m-s", stream=True)))
        self.assertEqual(code, 200, body)
        self.assertEqual(headers.getRawHeaders("x-nvpair-node"), ["node-c"])
        self.assertEqual(headers.getRawHeaders("x-nvpair-attempts"), ["2"])
        _assertStream(self, body, 8)
        self.assertEqual((len(b.engine.requests), len(c.engine.requests)), (1, 1))
        self.assertEqual(a.engine.requestCount, 0)
        done = yield _d(
            a.proxy.waitFor(
                "workload:completed", lambda p: p["workloadInfo"]["scheduledOn"] == "node-c"
            )
        )
        self.assertEqual(done["workloadInfo"]["stats"]["completionTokens"], 8)


def _answer(chunks: int) -> Any:
    from nvpair.proxy.testing.fakeengine import Answer

    return Answer(chunks=chunks)


def _assertStream(test: TestCase, body: bytes, chunks: int) -> None:
    events = [e for e in body.split(b"\n\n") if e]
    test.assertEqual(events[-1], b"data: [DONE]")
    for i in range(chunks):
        test.assertIn(b'"content":"tok%d"' % i, body)
