"""DNS rebinding end to end (protocol §8, issue 19): the real process refuses a foreign ``Host``.

A rebinding page's script reaches the proxy from the loopback address, but its requests
carry the page's own name: ``Host: evil.example:PORT`` and ``Origin: http://evil.example:PORT``.
Sent byte for byte over a raw socket, such requests get 403 ``host_denied`` on every route
class (inference, fleet lists, preflights, verbatim routes) of every listener (primary
ports, an alias, the ops listener) and reach no engine, while the official ``openai`` and
``ollama`` clients keep working.  The refusals are counted in ``/metrics`` and logged once
per name, without path or body.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import ollama
import openai
import treq
from openai.types.chat import ChatCompletionMessageParam
from twisted.internet import reactor
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.wire import splitAnswer
from tests.support.cases.metricstext import labels, parse
from tests.support.cases.requestcase import asyncTest
from tests.support.harness import (
    CANARY,
    ProxyFixture,
    directNode,
    rawExchange,
    reservedPort,
    startEngine,
)
from tests.support.standaloneharness import StandaloneProxy

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
CHAT = json.dumps({"model": "m1", "messages": [{"role": "user", "content": CANARY}]}).encode()
PULL = json.dumps({"model": "m1", "insecure": CANARY}).encode()
PREFLIGHT = (
    b"Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\n"
)


def rebinding(
    port: int,
    method: bytes,
    path: bytes,
    body: bytes = b"",
    extra: bytes = b"",
    host: bytes = b"evil.example",
) -> bytes:
    """A request as a rebinding page's script sends it to ``host:port``."""
    authority = b"%s:%d" % (host, port)
    head = b"%s %s HTTP/1.1\r\nHost: %s\r\nOrigin: http://%s\r\nConnection: close\r\n" % (
        method,
        path,
        authority,
        authority,
    )
    if body:
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    return head + extra + b"\r\n" + body


class RebindingTests(TestCase):
    """A foreign ``Host`` is refused everywhere; the official clients are served."""

    timeout = 120

    def assertHostDenied(self, raw: bytes, native: bool, label: object) -> None:
        status, headers, body = splitAnswer(raw)
        self.assertEqual(status, 403, (label, raw[:200]))
        self.assertFalse([h for h in headers if h.startswith(b"access-control-")], label)
        doc = json.loads(body)
        reason = doc["reason"] if native else doc["error"]["code"]
        self.assertEqual(reason, "host_denied", label)
        self.assertNotIn(CANARY.encode(), raw)

    @asyncTest
    async def test_underBroker(self) -> None:
        """Every route class on both facades, an alias and the ops listener refuses the
        rebinding page; the clients still work; counted; logged once, without path or body."""
        ollamaEngine = startEngine(self, reactor, "ollama", ["m1"], name="O")
        llamaEngine = startEngine(self, reactor, "openai", ["m1"], name="L")
        opsPort = reservedPort(self)
        proxy = ProxyFixture(self, reactor, ["--ops-port", str(opsPort)])
        await proxy.start()
        aliasPort = reservedPort(self)
        ollamaPort = await proxy.enable("ollama", aliases=[f"127.0.0.1:{aliasPort}"])
        llamaPort = await proxy.enable("llamacpp")
        await proxy.nodes("ollama", [directNode("O", ollamaEngine)])
        await proxy.nodes("llamacpp", [directNode("L", llamaEngine)])

        ollamaRoutes = [
            (b"POST", b"/api/chat", CHAT, b"", True),  # inference
            (b"POST", b"/v1/chat/completions", CHAT, b"", False),  # inference
            (b"GET", b"/api/tags", b"", b"", True),  # fleet list
            (b"GET", b"/v1/models", b"", b"", False),  # fleet list
            (b"OPTIONS", b"/api/chat", b"", PREFLIGHT, True),  # preflight
            (b"DELETE", b"/api/delete", b'{"model": "m1"}', b"", True),  # verbatim
            (b"POST", b"/api/pull", PULL, b"", True),  # verbatim
        ]
        llamaRoutes = [
            (b"POST", b"/v1/chat/completions", CHAT, b"", False),
            (b"GET", b"/models", b"", b"", False),
            (b"OPTIONS", b"/v1/chat/completions", b"", PREFLIGHT, False),
            (b"POST", b"/slots/0?action=save", b'{"filename": "x"}', b"", False),
        ]
        counts = {"ollama": 0, "llamacpp": 0}
        for engineId, port, routes in (
            ("ollama", ollamaPort, ollamaRoutes),
            ("ollama", aliasPort, ollamaRoutes),
            ("llamacpp", llamaPort, llamaRoutes),
        ):
            for method, path, body, extra, native in routes:
                raw = await rawExchange(
                    port, rebinding(port, method, path, body, extra), timeout=20
                )
                self.assertHostDenied(raw, native, (port, method, path))
                counts[engineId] += 1
        opsAnswer = splitAnswer(
            await rawExchange(opsPort, rebinding(opsPort, b"GET", b"/status"), timeout=20)
        )
        self.assertEqual(opsAnswer[0], 403)
        self.assertNotIn(b"runId", opsAnswer[2])
        await proxy.sync()
        self.assertEqual(ollamaEngine.requests, [], "nothing reached an engine")
        self.assertEqual(llamaEngine.requests, [])
        self.assertEqual(proxy.methods("workload:"), [], "no workload event")
        self.assertEqual(proxy.methods("discovery:node-activity"), [])

        # The official clients, on the primary port, the alias and the other facade.
        for port in (ollamaPort, aliasPort):
            client = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=30.0)
            reply = await deferToThread(client.chat, model="m1", messages=MESSAGES)
            self.assertTrue(reply.message.content)
            listed = await deferToThread(client.list)
            self.assertEqual([m.model for m in listed.models], ["m1"])
        oa = openai.OpenAI(
            base_url=f"http://localhost:{llamaPort}/v1",
            api_key="unused",
            max_retries=0,
            timeout=30.0,
        )
        completion = await deferToThread(
            lambda: oa.chat.completions.create(model="m1", messages=MESSAGES)
        )
        self.assertTrue(completion.choices[0].message.content)
        await proxy.waitFor("workload:completed")

        response = await treq.get(f"http://127.0.0.1:{opsPort}/metrics", persistent=False)
        samples = parse((await treq.content(response)).decode())
        denied = "nvpair_proxy_host_denied_total"
        self.assertEqual(samples[denied, labels(listener="ollama")], counts["ollama"])
        self.assertEqual(samples[denied, labels(listener="llamacpp")], counts["llamacpp"])
        self.assertEqual(samples[denied, labels(listener="ops")], 1)
        self.assertEqual(
            samples["nvpair_proxy_errors_total", labels(engine="ollama", reason="host_denied")],
            counts["ollama"],
        )

        self.assertEqual(await proxy.stop(), 0)  # every log line has been read once it exits
        denials = [r for r in proxy.logs if r.get("event") == "host-denied"]
        self.assertEqual(len(denials), 1, denials)
        self.assertEqual((denials[0]["level"], denials[0]["host"]), ("warn", "evil.example"))
        text = "\n".join(json.dumps(r) for r in proxy.logs)
        for secret in (CANARY, "/api/pull", "/slots", "/api/delete"):
            self.assertNotIn(secret, text)

    @asyncTest
    async def test_standalone(self) -> None:
        """Standalone mode applies the same rule; ``NVPAIR_PROXY_ALLOWED_HOSTS`` adds a name."""
        engine = startEngine(self, reactor, "ollama", ["m1"], name="O")
        proxy = StandaloneProxy(
            self,
            reactor,
            ["ollama"],
            [("ollama", engine.url)],
            env={"NVPAIR_PROXY_ALLOWED_HOSTS": "llm.example"},
        )
        await proxy.start()
        port = proxy.ports["ollama"]
        for method, path, body in (
            (b"POST", b"/api/chat", CHAT),
            (b"GET", b"/api/tags", b""),
            (b"POST", b"/api/pull", PULL),
        ):
            raw = await rawExchange(port, rebinding(port, method, path, body), timeout=20)
            self.assertHostDenied(raw, True, path)
        allowed = splitAnswer(
            await rawExchange(
                port, rebinding(port, b"GET", b"/api/version", host=b"LLM.example"), timeout=20
            )
        )
        self.assertEqual(allowed[0], 200)
        client = ollama.Client(host=proxy.url("ollama"), timeout=30.0)
        reply = await deferToThread(lambda: client.chat(model="m1", messages=MESSAGES))
        self.assertTrue(reply.message.content)
        paths = [r.path for r in engine.requests]
        self.assertEqual(paths.count("/api/chat"), 1, "only the client's chat reached it")
        self.assertNotIn("/api/pull", paths)
        record: dict[str, Any] = await proxy.waitForLog(lambda r: r.get("event") == "host-denied")
        self.assertEqual(
            (record["level"], record["host"], record["engine"]), ("warn", "evil.example", "ollama")
        )
        self.assertEqual(len(proxy.events("host-denied")), 1)

    @asyncTest
    async def test_localNames(self) -> None:
        """A ``.local`` or ``.internal`` name other than this machine's own is refused (a LAN
        host can answer it over mDNS, spec §4.1, issue 32); the machine's own ``.local``
        name passes; ``--allowed-hosts '*.local'`` restores the protocol's wider rule."""
        engine = startEngine(self, reactor, "ollama", ["m1"], name="O")
        own = socket.gethostname().lower().rstrip(".").split(".")[0].encode()
        for env, allowed in (({}, False), ({"NVPAIR_PROXY_ALLOWED_HOSTS": "*.local"}, True)):
            proxy = StandaloneProxy(self, reactor, ["ollama"], [("ollama", engine.url)], env=env)
            await proxy.start()
            port = proxy.ports["ollama"]
            verdicts = {}
            for host in (b"printer.local", b"host.docker.internal", own + b".local"):
                raw = await rawExchange(
                    port, rebinding(port, b"GET", b"/api/version", host=host), timeout=20
                )
                verdicts[host] = splitAnswer(raw)[0]
            self.assertEqual(
                verdicts,
                {
                    b"printer.local": 200 if allowed else 403,
                    b"host.docker.internal": 403,
                    own + b".local": 200,
                },
                env,
            )
            self.assertEqual(await proxy.stop(), 0)
