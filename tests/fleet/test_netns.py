"""The ingress gate for real (protocol §8): a non-loopback caller in a network namespace.

The test creates two network namespaces of its own joined by a veth pair (10.203.0.1/30 on
the server side, 10.203.0.2/30 on the client side; these addresses exist only inside the
namespaces), runs the real proxy and a fake engine inside the server namespace, and a
small stdlib client inside the client namespace.  A plaintext caller from 10.203.0.2 is
closed without an HTTP answer; a pinned TLS caller from the same address is served; an
unpinned TLS caller is refused.  The request names ``Host: peer``: a plaintext loopback
caller is refused for it (403, protocol §8), a pinned TLS peer is not.  The namespaces are
always deleted in cleanup.  Skipped where namespaces cannot be created (not root, no
``ip``, or ``ip netns add`` failing).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from types import SimpleNamespace
from typing import Any

from twisted.internet import defer, error, protocol, reactor, utils
from twisted.trial.unittest import SkipTest, TestCase

from nvpair.proxy.testing.certs import makeNodeCert
from tests.support.clusterfixture import ENGINE, ClusterNode, chat

SERVER_IP = "10.203.0.1"
CLIENT_IP = "10.203.0.2"

# Runs inside a namespace: one call per mode, result as one JSON line on stdout.
CLIENT = r"""
import hashlib, json, socket, ssl, sys
args = json.loads(sys.argv[1])
body = json.dumps(args["body"]).encode()
req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n"
       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
       % (args.get("hostHeader", "peer").encode(), len(body))) + body
out = {"received": 0, "head": "", "error": None, "pinOk": None}
try:
    sock = socket.create_connection((args["host"], args["port"]), timeout=20)
    if args["tls"]:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.load_cert_chain(args["cert"], args["key"])
        sock = ctx.wrap_socket(sock)
        der = sock.getpeercert(binary_form=True)
        out["pinOk"] = hashlib.sha256(der).hexdigest() == args["serverFP"]
    sock.sendall(req)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    out["received"] = len(data)
    out["head"] = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    out["body"] = data.split(b"\r\n\r\n", 1)[-1].decode("latin-1")
except Exception as e:
    out["error"] = type(e).__name__
print(json.dumps(out))
"""


class _FirstLine(protocol.ProcessProtocol):
    """Collects a child's first stdout line; records its end."""

    def __init__(self) -> None:
        self.buffer = b""
        self.line: defer.Deferred[bytes] = defer.Deferred()
        self.ended: defer.Deferred[None] = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        self.buffer += data
        if b"\n" in self.buffer and not self.line.called:
            self.line.callback(self.buffer.split(b"\n", 1)[0])

    def processEnded(self, reason: Any) -> None:
        if not self.line.called:
            self.line.errback(reason)
        self.ended.callback(None)


class IngressGateTests(TestCase):
    """A non-loopback plaintext caller is refused; a non-loopback pinned TLS caller is served."""

    timeout = 120

    async def ip(self, *args: str) -> None:
        """Run ``ip ARGS``; raise with its stderr on failure."""
        out, err, code = await utils.getProcessOutputAndValue(self.ipPath, args, env=os.environ)
        if code != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {err.decode(errors='replace').strip()}")

    async def makeNamespaces(self) -> None:
        """Create the namespace pair and the veth link between them (skip if impossible)."""
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            raise SkipTest("creating network namespaces needs root")
        ipPath = shutil.which("ip")
        if ipPath is None:
            raise SkipTest("the ip command (iproute2) is not installed")
        self.ipPath = ipPath
        tag = f"{os.getpid() % 100000}"
        self.server, self.client = f"nvps{tag}", f"nvpc{tag}"
        for ns in (self.server, self.client):
            try:
                await self.ip("netns", "add", ns)
            except RuntimeError as e:
                raise SkipTest(f"cannot create a network namespace: {e}") from None
            self.addCleanup(self._deleteNamespace, ns)
        s, c = self.server, self.client
        await self.ip(
            "-n",
            s,
            "link",
            "add",
            "vs" + tag,
            "type",
            "veth",
            "peer",
            "name",
            "vc" + tag,
            "netns",
            c,
        )
        await self.ip("-n", s, "addr", "add", f"{SERVER_IP}/30", "dev", "vs" + tag)
        await self.ip("-n", c, "addr", "add", f"{CLIENT_IP}/30", "dev", "vc" + tag)
        for ns, dev in ((s, "vs" + tag), (c, "vc" + tag)):
            await self.ip("-n", ns, "link", "set", "lo", "up")
            await self.ip("-n", ns, "link", "set", dev, "up")

    def _deleteNamespace(self, ns: str) -> defer.Deferred[tuple[bytes, bytes, int]]:
        deleted: defer.Deferred[tuple[bytes, bytes, int]] = utils.getProcessOutputAndValue(
            self.ipPath, ("netns", "del", ns), env=os.environ
        )
        return deleted

    async def engineInServer(self) -> int:
        """A fake engine inside the server namespace; returns its port there."""
        proto = _FirstLine()
        args = [
            self.ipPath,
            "netns",
            "exec",
            self.server,
            sys.executable,
            "-m",
            "nvpair.proxy.testing.fakeengine",
            "--port",
            "0",
            "--models",
            "m1",
            "--name",
            "ns-engine",
        ]
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        transport = reactor.spawnProcess(proto, self.ipPath, args, env=os.environ, path=root)

        def stop() -> defer.Deferred[None]:
            try:
                transport.signalProcess("KILL")
            except error.ProcessExitedAlready:
                pass
            return proto.ended

        self.addCleanup(stop)
        line = await proto.line.addTimeout(30, reactor)
        return int(json.loads(line)["port"])

    async def call(self, ns: str, host: str, port: int, **extra: Any) -> dict[str, Any]:
        """Run the stdlib client inside ``ns``; returns what it saw."""
        args = {"host": host, "port": port, "tls": False, "body": chat("m1"), **extra}
        out, err, code = await utils.getProcessOutputAndValue(
            self.ipPath,
            ("netns", "exec", ns, sys.executable, "-c", CLIENT, json.dumps(args)),
            env=os.environ,
        )
        self.assertEqual(code, 0, err)
        result: dict[str, Any] = json.loads(out)
        return result

    @defer.inlineCallbacks
    def test_gate(self):  # type: ignore[no-untyped-def]
        """From 10.203.0.2: plaintext closed unanswered, pinned TLS served, unpinned refused."""
        yield defer.Deferred.fromCoroutine(self.makeNamespaces())
        enginePort = yield defer.Deferred.fromCoroutine(self.engineInServer())
        node = ClusterNode(self, reactor, "node-s", engine=False)
        process = node.proxy.process
        process.command = [self.ipPath, "netns", "exec", self.server, *process.command]
        process.executable = self.ipPath
        clientCert, clientKey, clientFP = makeNodeCert("node-c")
        peer: Any = SimpleNamespace(name="node-c", fp=clientFP)
        yield defer.Deferred.fromCoroutine(node.start(pins=[peer]))
        node.proxy.notify(
            f"{ENGINE}:node/set-local-backend", {"url": f"http://127.0.0.1:{enginePort}"}
        )
        yield node.proxy.nodes(
            ENGINE, [{"id": "node-s", "self": True, "addresses": [], "models": ["m1"]}]
        )
        files = tempfile.mkdtemp(prefix="nvpair-netns-")
        self.addCleanup(shutil.rmtree, files, True)
        paths = {}
        for name, data in (("c.crt", clientCert), ("c.key", clientKey)):
            paths[name] = os.path.join(files, name)
            with open(paths[name], "wb") as f:
                f.write(data)
        outsider = makeNodeCert("node-x")
        for name, data in (("x.crt", outsider[0]), ("x.key", outsider[1])):
            paths[name] = os.path.join(files, name)
            with open(paths[name], "wb") as f:
                f.write(data)
        d = defer.Deferred.fromCoroutine

        local = yield d(self.call(self.server, "127.0.0.1", node.port, hostHeader="localhost"))
        self.assertTrue(local["head"].startswith("HTTP/1.1 200"), local)
        foreign = yield d(self.call(self.server, "127.0.0.1", node.port))  # Host: peer
        self.assertTrue(foreign["head"].startswith("HTTP/1.1 403"), foreign)

        plain = yield d(self.call(self.client, SERVER_IP, node.port))
        self.assertEqual(plain["received"], 0, plain)
        self.assertEqual(plain["head"], "")

        served = yield d(
            self.call(
                self.client,
                SERVER_IP,
                node.port,
                tls=True,
                cert=paths["c.crt"],
                key=paths["c.key"],
                serverFP=node.fp,
            )
        )
        self.assertIsNone(served["error"], served)
        self.assertTrue(served["pinOk"])
        self.assertTrue(served["head"].startswith("HTTP/1.1 200"), served)
        self.assertIn("X-Fake-Engine: ns-engine", served["head"])
        self.assertIn("tok0tok1tok2", served["body"])

        refused = yield d(
            self.call(
                self.client,
                SERVER_IP,
                node.port,
                tls=True,
                cert=paths["x.crt"],
                key=paths["x.key"],
                serverFP=node.fp,
            )
        )
        self.assertEqual(refused["head"], "", refused)
        self.assertEqual(refused["received"], 0)
