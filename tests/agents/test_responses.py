"""OpenAI Responses through the real standalone proxy, driven by the official ``openai``
client (issue 30): ``responses.create`` streamed and not, ``input_tokens.count``, and
``previous_response_id`` on a one-node LM Studio fleet; workloads and token counts in
``/status`` and ``/metrics``; the proxy's own errors in OpenAI's shape."""

from __future__ import annotations

from typing import Any

import openai
from twisted.internet import defer
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.simengine.agents.render import responsesWords
from tests.agents.agentkit import AgentFleet, raises, sim

INSTRUCTIONS = " ".join(f"policy{i}" for i in range(200))


class ResponsesClientTests(TestCase):
    """The client's calls, and what the proxy counts of them."""

    timeout = 120

    async def test_createStreamedAndNot(self) -> None:
        """A response and a streamed one answer whole; the input count is the engine's and
        no workload; /status has both workloads with the engine's counts, /metrics its
        prompt and cached tokens."""
        fleet = AgentFleet(self, "llamacpp")
        await fleet.start([sim("A", blockSize=4), sim("B", blockSize=4)])
        client = fleet.openai()
        ask: dict[str, Any] = {
            "model": "m",
            "instructions": INSTRUCTIONS,
            "input": "what is new",
            "max_output_tokens": 3,
        }

        def run() -> tuple[Any, list[Any], Any]:
            made = client.responses.create(**ask)
            events = list(client.responses.create(**ask, stream=True))
            counted = client.responses.input_tokens.count(
                model="m", instructions=INSTRUCTIONS, input="what is new"
            )
            return made, events, counted

        made, events, counted = await deferToThread(run)
        self.assertEqual(made.output_text, "tok0 tok1 tok2")
        self.assertEqual(made.id[:5], "resp_")
        self.assertEqual(events[0].type, "response.created")
        self.assertEqual(events[-1].type, "response.completed")
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        self.assertEqual("".join(deltas), "tok0 tok1 tok2")
        streamed = events[-1].response
        self.assertEqual(counted.input_tokens, len(responsesWords(ask) or []))
        usages = [made.usage, streamed.usage]
        prompts = [u.input_tokens for u in usages]
        cached = [u.input_tokens_details.cached_tokens for u in usages]
        status = await fleet.ended(2)
        self.assertEqual(status["workloads"]["terminals"], {"completed": 2})
        stats = [w["stats"] for w in reversed(status["workloads"]["recent"])]
        self.assertEqual([s["promptTokens"] for s in stats], prompts)
        self.assertEqual([s["cachedTokens"] for s in stats], cached)
        self.assertEqual([s["completionTokens"] for s in stats], [3, 3])
        self.assertIn("promptMs", stats[1], "llama.cpp's timings on the completed event")
        self.assertEqual(
            await fleet.metric("nvpair_proxy_engine_prompt_tokens_total"), float(sum(prompts))
        )
        self.assertEqual(
            await fleet.metric("nvpair_proxy_engine_cached_prompt_tokens_total"),
            float(sum(cached)),
        )

    async def test_followUpOnOneLMStudio(self) -> None:
        """LM Studio keeps its responses: a follow-up naming one continues it (its prompt is
        the stored conversation and the new input, found cached); an id it never made
        comes back as its own 404 ``previous_response_not_found``."""
        fleet = AgentFleet(self, "lmstudio")
        await fleet.start([sim("L", dialect="lmstudio", blockSize=4)], "--backoff-base", "10ms")
        (engine,) = fleet.engines
        client = fleet.openai()

        def run() -> tuple[Any, Any]:
            first = client.responses.create(
                model="m", instructions=INSTRUCTIONS, input="first", max_output_tokens=3
            )
            second = client.responses.create(
                model="m", input="second", previous_response_id=first.id, max_output_tokens=3
            )
            return first, second

        first, second = await deferToThread(run)
        self.assertEqual(second.previous_response_id, first.id)
        self.assertEqual(second.usage.input_tokens, first.usage.input_tokens + 3 + 3)
        self.assertGreaterEqual(engine.stats.cachedTokens, first.usage.input_tokens - 4)
        status = await fleet.ended(2)
        stats = [w["stats"] for w in reversed(status["workloads"]["recent"])]
        self.assertEqual(
            [s["promptTokens"] for s in stats],
            [first.usage.input_tokens, second.usage.input_tokens],
        )
        self.assertNotIn("cachedTokens", stats[1], "LM Studio reports no cached count")

        def unknown() -> None:
            client.responses.create(model="m", input="x", previous_response_id="resp_gone")

        missing = await raises(unknown, openai.NotFoundError)
        self.assertEqual(missing.code, "previous_response_not_found")
        self.assertEqual(missing.param, "previous_response_id")

    async def test_noOwnerInOpenAIShape(self) -> None:
        """A model nobody serves: 502 in OpenAI's shape, the reason as its code."""
        fleet = AgentFleet(self, "llamacpp")
        await fleet.start([sim("A")])
        client = fleet.openai()
        caught = await raises(
            lambda: client.responses.create(model="nobody", input="x"),
            openai.InternalServerError,
        )
        self.assertEqual(caught.status_code, 502)
        self.assertEqual((caught.code, caught.type), ("no_owner", "proxy_error"))


class StoredResponsesTests(TestCase):
    """Two LM Studio engines, each keeping the responses it made (issue 30 item 3)."""

    timeout = 120

    async def test_followUpsFindTheirNode(self) -> None:
        """Eight conversations of four turns chained by ``previous_response_id``: every
        follow-up reaches the engine that stored its predecessor at its first attempt (none
        sent to the other engine, which would answer 404), and continues it from that
        engine's cache; once that engine is down
        its conversations' next follow-up gets ``previous_response_not_found`` at once."""
        fleet = AgentFleet(self, "lmstudio")
        await fleet.start(
            [sim("L1", dialect="lmstudio", blockSize=4), sim("L2", dialect="lmstudio", blockSize=4)]
        )
        client = fleet.openai()

        def conversation(topic: str) -> list[Any]:
            made = client.responses.with_raw_response.create(
                model="m", input=f"tell me about {topic}", max_output_tokens=2
            )
            answers = [made]
            for turn in range(3):
                made = client.responses.with_raw_response.create(
                    model="m",
                    input=f"and then {turn}",
                    previous_response_id=made.parse().id,
                    max_output_tokens=2,
                )
                answers.append(made)
            return answers

        chains = await defer.gatherResults(
            [deferToThread(conversation, f"topic {i}") for i in range(8)]
        )
        # Every call above succeeded (the client does not retry): no follow-up met an engine
        # that did not store its predecessor (it would have answered 404).
        nodes = set()
        for answers in chains:
            homes = {a.headers["x-nvpair-node"] for a in answers}
            self.assertEqual(len(homes), 1, "a conversation stays on its node")
            attempts = [a.headers["x-nvpair-attempts"] for a in answers]
            self.assertEqual(attempts, ["1"] * 4, "sent there first, not retried there")
            nodes |= homes
        self.assertEqual(nodes, set(fleet.urls), "conversations spread over both nodes")
        cached = sum(engine.stats.cachedTokens for engine in fleet.engines)
        self.assertGreater(cached, 0, "follow-ups continue from the storing engine's cache")
        down = fleet.urls[0]
        last = next(a[-1].parse().id for a in chains if a[-1].headers["x-nvpair-node"] == down)
        await fleet.engines[0].close()
        await fleet.proxy.waitForLog(
            lambda r: r.get("event") == "backend-down" and r.get("url") == down
        )
        error = await raises(
            lambda: client.responses.create(
                model="m", input="again", previous_response_id=last, max_output_tokens=2
            ),
            openai.NotFoundError,
        )
        body = error.body
        assert isinstance(body, dict)
        self.assertEqual(
            (body.get("code"), body.get("param")),
            ("previous_response_not_found", "previous_response_id"),
        )
