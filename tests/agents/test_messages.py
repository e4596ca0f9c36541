"""Anthropic Messages through the real standalone proxy, driven by the official ``anthropic``
client (issue 30): ``messages.create``, ``messages.stream`` and ``messages.count_tokens``
over simulated llama.cpp engines; workloads and token counts in ``/status`` and
``/metrics``; the proxy's own errors as the client reads them; spreading and failover."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import treq
from twisted.internet import defer, task
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.simengine.agents.render import messagesWords
from tests.agents.agentkit import SECRET, AgentFleet, raises, reactor, sim

SYSTEM = " ".join(f"rule{i}" for i in range(300))
TOOLS: list[Any] = [
    {"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}}
]


def conversation(topic: str) -> list[Any]:
    """The first turn of a conversation about ``topic``."""
    return [{"role": "user", "content": f"tell me about {topic}"}]


def request(topic: str, tokens: int = 4, system: str = SYSTEM) -> dict[str, Any]:
    """The keyword arguments of one Messages request."""
    return {
        "model": "m",
        "max_tokens": tokens,
        "system": system,
        "tools": TOOLS,
        "messages": conversation(topic),
    }


class MessagesClientTests(TestCase):
    """The client's three calls, and what the proxy counts of them."""

    timeout = 120

    async def test_createStreamAndCount(self) -> None:
        """``create`` and ``stream`` answer whole; ``count_tokens`` is the engine's count and
        no workload; /status has two completed workloads with the engine's counts (prompt =
        input + cache read), /metrics the same prompt and cached tokens."""
        fleet = AgentFleet(self, "llamacpp")
        await fleet.start([sim("A", blockSize=4), sim("B", blockSize=4)])
        client = fleet.anthropic()

        def run() -> tuple[Any, Any, str, Any]:
            made = client.messages.create(**request("tides"))
            with client.messages.stream(**request("tides", tokens=5)) as stream:
                text = "".join(stream.text_stream)
                final = stream.get_final_message()
            counted = client.messages.count_tokens(
                model="m", system=SYSTEM, tools=TOOLS, messages=conversation("tides")
            )
            return made, final, text, counted

        made, final, text, counted = await deferToThread(run)
        self.assertEqual(made.content[0].text, "tok0 tok1 tok2 tok3")
        self.assertEqual(made.id[:4], "msg_")
        self.assertEqual(text, "tok0 tok1 tok2 tok3 tok4")
        self.assertEqual(final.usage.output_tokens, 5)
        words = messagesWords({"system": SYSTEM, "tools": TOOLS, "messages": conversation("x")})
        self.assertEqual(counted.input_tokens, len(words or []))
        prompts = [
            u.input_tokens + (u.cache_read_input_tokens or 0) for u in (made.usage, final.usage)
        ]
        cached = [u.cache_read_input_tokens or 0 for u in (made.usage, final.usage)]
        status = await fleet.ended(2)
        self.assertEqual(status["workloads"]["terminals"], {"completed": 2})
        stats = [w["stats"] for w in reversed(status["workloads"]["recent"])]
        self.assertEqual([s["promptTokens"] for s in stats], prompts)
        self.assertEqual([s.get("cachedTokens", 0) for s in stats], cached)
        self.assertEqual([s["completionTokens"] for s in stats], [4, 5])
        self.assertEqual(
            await fleet.metric("nvpair_proxy_engine_prompt_tokens_total"), float(sum(prompts))
        )
        self.assertEqual(
            await fleet.metric("nvpair_proxy_engine_cached_prompt_tokens_total"),
            float(sum(cached)),
        )
        served = await fleet.metric(
            "nvpair_proxy_requests_total", engine="llamacpp", route="inference", outcome="2xx"
        )
        self.assertEqual(served, 2.0)
        self.assertNotIn(SECRET, repr(fleet.proxy.logs))
        self.assertNotIn("rule299", repr(fleet.proxy.logs))

    async def test_errorsTheClientReads(self) -> None:
        """The proxy's own answers in Anthropic's shape: a model nobody serves is 502
        ``not_found_error`` (``no_owner``); a body the proxy refuses is 400."""
        fleet = AgentFleet(self, "llamacpp")
        await fleet.start([sim("A")])
        client = fleet.anthropic()

        def noOwner() -> None:
            client.messages.create(
                model="nobody", max_tokens=1, messages=conversation("x"), extra_body={}
            )

        caught = await raises(noOwner, anthropic.InternalServerError)
        self.assertEqual(caught.status_code, 502)
        self.assertEqual(caught.type, "not_found_error")
        self.assertEqual(
            caught.body,
            {
                "type": "error",
                "error": {
                    "type": "not_found_error",
                    "message": "no node advertises this model (no_owner)",
                },
            },
        )

        def badModel() -> None:
            client.messages.create(
                model="m", max_tokens=1, messages=conversation("x"), extra_body={"model": 7}
            )

        bad = await raises(badModel, anthropic.BadRequestError)
        self.assertEqual(bad.type, "invalid_request_error")
        self.assertIn("(bad_request)", repr(bad.body))
        status = await fleet.status()
        self.assertEqual(status["workloads"]["terminals"], {"failed": 1}, "no_owner only")

    async def test_queueFullAndRetryAfter(self) -> None:
        """A one-slot engine kept busy and the proxy's queue (one place) taken: 503
        ``overloaded_error`` (``queue_full``) with ``Retry-After``; a client allowed one
        retry waits that long and is then served, as is the one that waited."""
        fleet = AgentFleet(self, "llamacpp")
        config = sim(
            "A",
            slots=1,
            queueMax=0,
            decodeMs=50.0,
            prefillMs=0.0,
            slotsEndpoint=False,
            metricsEndpoint=False,
        )
        await fleet.start([config], "--affinity", "off", "--queue-max", "1", "--retry-after", "2")
        (engine,) = fleet.engines
        client = fleet.anthropic()
        # Served once: its 503s while ours run there now mean "busy".
        await deferToThread(lambda: client.messages.create(**request("warm", tokens=1)))
        busy = deferToThread(lambda: client.messages.create(**request("long", tokens=30)))
        await until(lambda: engine.stats.requests == 2)
        waiting = deferToThread(lambda: client.messages.create(**request("waits", tokens=1)))
        await until(lambda: engine.stats.refused == 1)  # bounced busy: it now waits in the proxy
        await untilAsync(lambda: queued(fleet))
        refused = await raises(
            lambda: client.messages.create(**request("refused", tokens=1)),
            anthropic.APIStatusError,
        )
        self.assertEqual(refused.status_code, 503)
        self.assertEqual(refused.type, "overloaded_error")
        self.assertIn("(queue_full)", repr(refused.body))
        wait = int(refused.response.headers["retry-after"])
        self.assertGreaterEqual(wait, 1)
        patient = fleet.anthropic(maxRetries=1)
        started = time.monotonic()
        served = await deferToThread(
            lambda: patient.messages.with_raw_response.create(**request("later", tokens=1))
        )
        self.assertGreaterEqual(time.monotonic() - started, wait)
        self.assertEqual(served.status_code, 200)
        self.assertEqual(served.parse().content[0].text, "tok0")
        for answer in (await busy, await waiting):
            self.assertEqual(answer.content[0].text[:4], "tok0")
        refusals = await fleet.metric("nvpair_proxy_queue_refusals_total")
        self.assertEqual(refusals, 2.0, "the first refusal, and the retried client's first")


async def until(check: Callable[[], bool]) -> None:
    """Poll ``check()`` every 10 ms, for at most 10 s."""
    for _ in range(1000):
        if check():
            return
        await task.deferLater(reactor, 0.01, lambda: None)
    raise AssertionError("condition not reached in time")


async def untilAsync(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``await check()`` every 10 ms, for at most 10 s."""
    for _ in range(1000):
        if await check():
            return
        await task.deferLater(reactor, 0.01, lambda: None)
    raise AssertionError("condition not reached in time")


async def queued(fleet: AgentFleet) -> bool:
    """Whether a request waits in the proxy's queue of the llama.cpp facade."""
    queues = (await fleet.status())["queueing"]["queues"].get("llamacpp", {})
    return any(entry["depth"] for entry in queues.values())


class SpreadAndFailoverTests(TestCase):
    """Two evenly loaded owners share the work; one that refuses is failed over."""

    timeout = 180

    async def test_spreadThenFailover(self) -> None:
        """Twenty new conversations of twenty agents (each its own system prompt: no
        prefix to keep together), ten at a time: none of the two owners serves more than
        70 %; then one engine answers 500 to everything: every stream still comes whole from
        the other (failed over before its first byte)."""
        fleet = AgentFleet(self, "llamacpp")
        await fleet.start([sim("A", decodeMs=20.0), sim("B", decodeMs=20.0)])
        client = fleet.anthropic()

        def one(topic: str) -> tuple[str, str]:
            raw = client.messages.with_raw_response.create(**request(topic, system=topic + SYSTEM))
            return raw.headers["x-nvpair-node"], raw.parse().content[0].text

        served: Counter[str] = Counter()
        for batch in range(2):
            answers = await defer.gatherResults(
                [deferToThread(one, f"topic {batch}-{i}") for i in range(10)]
            )
            for node, text in answers:
                self.assertEqual(text, "tok0 tok1 tok2 tok3")
                served[node] += 1
        self.assertEqual(sum(served.values()), 20)
        self.assertLessEqual(max(served.values()), 14, served)
        bad, good = fleet.engines
        response = await treq.post(
            fleet.urls[0] + "/sim/fail", json={"status": 500}, persistent=False
        )
        self.assertEqual(response.code, 200)
        await response.content()

        def streamed(topic: str) -> tuple[str, str]:
            with client.messages.stream(**request(topic, system=topic + SYSTEM)) as stream:
                text = "".join(stream.text_stream)
                return stream.response.headers["x-nvpair-node"], text

        answers = await defer.gatherResults(
            [deferToThread(streamed, f"after {i}") for i in range(6)]
        )
        self.assertEqual(answers, [(fleet.urls[1], "tok0 tok1 tok2 tok3")] * 6)
        self.assertGreaterEqual(bad.stats.failed, 1, "the failing engine was tried first")
        status = await fleet.ended(26)
        self.assertEqual(status["workloads"]["terminals"], {"completed": 26})


class OllamaMessagesTests(TestCase):
    """Ollama's ``/v1/messages`` through its facade: its own usage, Anthropic's errors."""

    timeout = 90

    async def test_ollamaFacade(self) -> None:
        """A model named without its tag is served (``m`` is ``m:latest``), the workload
        counts Ollama's usage (no cached count); a model nobody has is Anthropic's 502, and
        ``count_tokens``, which Ollama does not serve, is its 404 from every owner."""
        fleet = AgentFleet(self, "ollama")
        await fleet.start([sim("O", dialect="ollama")])
        client = fleet.anthropic()
        made = await deferToThread(lambda: client.messages.create(**request("rivers")))
        self.assertEqual(made.content[0].text, "tok0 tok1 tok2 tok3")
        status = await fleet.ended(1)
        [workload] = status["workloads"]["recent"]
        self.assertEqual(workload["model"], "m:latest")
        self.assertEqual(workload["stats"]["promptTokens"], made.usage.input_tokens)
        self.assertNotIn("cachedTokens", workload["stats"])
        caught = await raises(
            lambda: client.messages.create(**{**request("x"), "model": "nobody"}),
            anthropic.InternalServerError,
        )
        self.assertEqual(caught.type, "not_found_error")
        missing = await raises(
            lambda: client.messages.count_tokens(model="m", messages=conversation("x")),
            anthropic.NotFoundError,
        )
        self.assertEqual(missing.status_code, 404)
