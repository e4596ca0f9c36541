"""A fleet file reloaded under load, end to end: the real process, fake engines, SIGHUP."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any, cast

import treq
from twisted.internet import defer, reactor, task
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.fakeengine import Answer, FakeEngine
from nvpair.proxy.testing.fakeengine.connection import EngineConnection
from tests.support.cases.command import COMMAND, TWISTD, run
from tests.support.cases.fleettext import backend
from tests.support.cases.requestcase import PLAIN
from tests.support.harness import reservedPort
from tests.support.standaloneharness import StandaloneProxy, backendUp

CHAT = "/v1/chat/completions"
STREAM = {"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


class _Held:
    """An engine connection whose timed steps wait for the engine's gate: the first one
    runs when ``passFirst`` (the stream commits on its first chunk), the rest are held."""

    def __init__(self, connection: EngineConnection, engine: GatedEngine, passFirst: bool) -> None:
        self.connection = connection
        self.engine = engine
        self.passFirst = passFirst

    def later(self, delay: float, f: Callable[[], None]) -> None:
        if self.passFirst:
            self.passFirst = False
            self.connection.later(delay, f)
            return
        self.engine.gate.addCallback(lambda _: self.connection.later(delay, f))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)


class GatedEngine(FakeEngine):
    """A fake engine whose inference answers wait for ``gate`` (``modes``: per request,
    True to send the first chunk before waiting, False to send only the headers)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate: defer.Deferred[None] = defer.Deferred()
        self.modes: list[bool] = []
        self.default = Answer(chunks=5, chunkDelay=0.001)

    def requestReceived(
        self,
        connection: EngineConnection,
        method: bytes,
        target: bytes,
        headers: dict[str, list[str]],
        body: bytes,
    ) -> None:
        if method == b"POST" and self.modes:
            connection = cast(EngineConnection, _Held(connection, self, self.modes.pop(0)))
        super().requestReceived(connection, method, target, headers, body)


def posts(engine: FakeEngine) -> int:
    """How many inference requests ``engine`` received."""
    return sum(1 for r in engine.requests if r.method == "POST")


class FleetReloadTests(TestCase):
    """Rewriting the fleet file under load breaks nothing, and an invalid one is refused."""

    timeout = 120

    def engine(self, cls: type[FakeEngine] = FakeEngine) -> Any:
        engine = cls(reactor, dialect="openai", models=["m1"])
        engine.listen(0)
        self.addCleanup(engine.close)
        return engine

    def writeAtomically(self, text: str) -> None:
        """Write the fleet file the way an editor or config tool should: rename over it."""
        temp = self.fleet + ".tmp"
        with open(temp, "w") as f:
            f.write(text)
        os.replace(temp, self.fleet)

    async def status(self) -> Any:
        response = await treq.get(f"http://127.0.0.1:{self.opsPort}/status", persistent=False)
        return json.loads(await response.content())

    async def statusWhen(self, ready: Callable[[Any], bool], deadline: float = 30.0) -> Any:
        """``/status`` once ``ready`` holds for it, polled every 0.1 s up to ``deadline``."""
        doc = None
        for _ in range(int(deadline / 0.1)):
            doc = await self.status()
            if ready(doc):
                return doc
            await task.deferLater(reactor, 0.1, lambda: None)
        raise AssertionError(f"/status never became ready: {doc}")

    async def chat(self, proxy: StandaloneProxy) -> tuple[int, str]:
        response = await treq.post(proxy.url("llamacpp") + CHAT, json=PLAIN, persistent=False)
        await response.content()
        node = response.headers.getRawHeaders("x-nvpair-node", [""])[0]
        return response.code, node

    @defer.inlineCallbacks
    def test_reloadUnderLoad(self):  # type: ignore[no-untyped-def]
        """With a stream committed and an attempt pending on backend A, the file is
        rewritten to hold only C and SIGHUP sent: new requests go to C, A's two requests
        complete untouched; then invalid files (in place) are refused with the fleet kept,
        and a valid one written in place is picked up by the watch."""
        a = self.engine(GatedEngine)
        c = self.engine()
        d = self.engine()
        fd, self.fleet = tempfile.mkstemp(suffix=".toml")
        os.close(fd)
        self.addCleanup(os.remove, self.fleet)
        self.writeAtomically(backend(a.url, "alpha"))
        self.opsPort = reservedPort(self)
        proxy = StandaloneProxy(
            self,
            reactor,
            ("llamacpp",),
            extra=("--affinity", "off", "--ops-port", str(self.opsPort)),
            fleet=self.fleet,
        )
        yield defer.Deferred.fromCoroutine(proxy.start())
        yield proxy.waitForLog(backendUp(a.url))

        # A stream that has committed (first chunk sent), and an attempt still pending.
        a.modes = [True, False]
        streaming = yield treq.post(proxy.url("llamacpp") + CHAT, json=STREAM, persistent=False)
        self.assertEqual(streaming.code, 200)
        streamed = treq.content(streaming)
        pending = treq.post(proxy.url("llamacpp") + CHAT, json=STREAM, persistent=False)
        while posts(a) < 2:  # the second has reached A (bounded by the test's timeout)
            yield a.waitForRequest(len(a.requests) + 1)

        self.writeAtomically(backend(c.url, "charlie"))
        proxy.signal("HUP")
        loaded = yield proxy.waitForLog(
            lambda r: r.get("event") == "fleet-loaded" and r.get("generation") == 2
        )
        self.assertEqual(loaded["trigger"], "signal")
        yield proxy.waitForLog(backendUp(c.url))
        for _ in range(3):
            code, node = yield defer.Deferred.fromCoroutine(self.chat(proxy))
            self.assertEqual((code, node), (200, c.url))
        self.assertEqual(posts(a), 2)  # the removed backend took no new request
        status = yield defer.Deferred.fromCoroutine(self.status())
        self.assertEqual(status["fleet"]["generation"], 2)
        nodes = {n["id"]: n for n in status["facades"]["llamacpp"]["nodes"]}
        self.assertEqual(nodes[c.url]["name"], "charlie")
        self.assertEqual(nodes[a.url]["models"], 0)  # draining: listed, owning nothing

        a.gate.callback(None)
        body = yield streamed
        self.assertTrue(body.rstrip().endswith(b"data: [DONE]"), body[-80:])
        second = yield pending
        self.assertEqual(second.code, 200)
        self.assertEqual(second.headers.getRawHeaders("x-nvpair-node"), [a.url])
        self.assertIn(b"[DONE]", (yield treq.content(second)))
        yield proxy.waitForLog(lambda r: r.get("event") == "backend-removed")

        # An invalid file written in place: refused once, the fleet kept, shown with its line.
        with open(self.fleet, "w") as f:
            f.write(backend(d.url) + "weight = 3\n")
        refused = yield proxy.waitForLog(lambda r: r.get("event") == "fleet-invalid")
        self.assertIn(f"{self.fleet}:4: unknown key 'weight'", refused["problem"])
        proxy.signal("HUP")  # the same error again: counted, not logged again
        status = yield defer.Deferred.fromCoroutine(
            self.statusWhen(lambda doc: doc["fleet"]["reloads"]["invalid"] == 2)
        )
        self.assertEqual(status["fleet"]["generation"], 2)
        self.assertEqual(status["fleet"]["error"]["line"], 4)
        self.assertEqual(len(proxy.events("fleet-invalid")), 1)
        code, node = yield defer.Deferred.fromCoroutine(self.chat(proxy))
        self.assertEqual((code, node), (200, c.url))

        # A valid file written in place, in two steps: the watch loads it once it is whole.
        with open(self.fleet, "w") as f:
            f.write(backend(d.url)[:12])
            f.flush()
            f.write(backend(d.url)[12:])
        yield proxy.waitForLog(
            lambda r: r.get("event") == "fleet-loaded" and r.get("generation") == 3
        )
        yield proxy.waitForLog(backendUp(d.url))
        code, node = yield defer.Deferred.fromCoroutine(self.chat(proxy))
        self.assertEqual((code, node), (200, d.url))
        status = yield defer.Deferred.fromCoroutine(self.status())
        self.assertIsNone(status["fleet"]["error"])


class FleetCommandTests(TestCase):
    """The real command with a fleet file: ``--check-fleet`` and a bad file at start."""

    timeout = 60

    def badFile(self) -> str:
        fd, path = tempfile.mkstemp(suffix=".toml")
        os.write(fd, b'[[backend]]\nengine = "vllm"\nurl = "http://a:1"\n')
        os.close(fd)
        self.addCleanup(os.remove, path)
        return path

    async def test_checkFleet(self) -> None:
        """``--check-fleet`` on the shipped example exits 0 with one summary line; on a bad
        file 2 with one line naming the file, the line and the problem; nothing starts."""
        example = os.path.join(os.path.dirname(__file__), "..", "..", "demo", "fleet.example.toml")
        out, err, code, left = await run(COMMAND, ["--check-fleet", example])
        self.assertEqual((code, err, left), (0, b"", []))
        self.assertEqual(out.count(b"\n"), 1)
        self.assertIn(b"fleet OK: ollama: 1 backend, llamacpp: 1 backend (1 disabled)", out)
        bad = self.badFile()
        out, err, code, left = await run(COMMAND, ["--check-fleet", bad])
        self.assertEqual((code, out, left), (2, b"", []))
        self.assertEqual(
            err.decode().splitlines(),
            [
                f"nvpair-proxy: --check-fleet: {bad}:2: unknown engine 'vllm' "
                "(one of ollama, lmstudio, llamacpp)"
            ],
        )

    async def test_badFleetAtStart(self) -> None:
        """A malformed fleet file at start: exit 2, one stderr line, nothing on stdout."""
        bad = self.badFile()
        out, err, code, _ = await run(
            TWISTD, ["-n", "--pidfile=", "nvpair-proxy", "--standalone", "--fleet", bad]
        )
        self.assertEqual((code, out), (2, b""))
        self.assertEqual(
            err.decode().splitlines(),
            [
                f"nvpair-proxy: --fleet: {bad}:2: unknown engine 'vllm' "
                "(one of ollama, lmstudio, llamacpp)"
            ],
        )
