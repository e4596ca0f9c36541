"""An engine reporting absurd usage through the real standalone proxy (issue 32 item 4):
counts like ``10**400`` and durations like ``1e400``, on every dialect's route, streamed and
not.  They count as not reported; the answers reach the client unchanged; ``/metrics``,
``/status`` and the page still answer; nothing is logged for them."""

from __future__ import annotations

import json
from typing import Any

import treq
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.fakeengine import Status
from tests.agents.agentkit import reactor
from tests.support.harness import reservedPort, startEngine
from tests.support.standaloneharness import StandaloneProxy, backendUp

HUGE = "1" + "0" * 400  # 10**400, as JSON digits
ABSURD_USAGE = (
    f'"usage":{{"prompt_tokens":{HUGE},"completion_tokens":{HUGE},'
    f'"prompt_tokens_details":{{"cached_tokens":{HUGE}}}}},'
    f'"timings":{{"prompt_ms":1e400,"cache_n":{HUGE}}}'
)
ANSWERS: list[tuple[str, bytes]] = [
    ("/v1/chat/completions", ('{"id":"c","choices":[],' + ABSURD_USAGE + "}").encode()),
    (
        "/v1/chat/completions",
        (
            'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices":[],' + ABSURD_USAGE
        ).encode()
        + b"}\n\ndata: [DONE]\n\n",
    ),
    (
        "/v1/messages",
        (
            '{"type":"message","content":[],"usage":{"input_tokens":' + HUGE + ","
            '"cache_read_input_tokens":1099511627775,"output_tokens":' + HUGE + "}}"
        ).encode(),
    ),
    (
        "/v1/responses",
        (
            'event: response.completed\ndata: {"type":"response.completed","response":{"usage":'
            '{"input_tokens":' + HUGE + ',"output_tokens":-1,"input_tokens_details":'
            '{"cached_tokens":1e400}}},"timings":{"prompt_ms":NaN}}\n\n'
        ).encode(),
    ),
]


class AbsurdUsageTests(TestCase):
    """A fake llama.cpp engine answering each route with absurd numbers."""

    timeout = 90

    async def test_absurdNumbersBreakNothing(self) -> None:
        """Each answer is relayed byte for byte and its workload completes without token
        counts; afterwards /metrics, /status and / answer 200 (twice: no state was
        poisoned), and no error was logged."""
        engine = startEngine(self, reactor, "openai", ["m1"], name="A")
        opsPort = reservedPort(self)
        proxy = StandaloneProxy(
            self, reactor, ["llamacpp"], [("llamacpp", engine.url)], ["--ops-port", str(opsPort)]
        )
        await proxy.start()
        await proxy.waitForLog(backendUp(engine.url))
        for path, body in ANSWERS:
            engine.script(Status(200, body))
            response = await treq.post(
                proxy.url("llamacpp") + path,
                json={"model": "m1", "messages": [{"role": "user", "content": "hi"}]},
                persistent=False,
            )
            self.assertEqual(response.code, 200)
            self.assertEqual(bytes(await treq.content(response)), body)
        for _ in range(2):
            for page in ("/metrics", "/status", "/", "/status/history"):
                answer = await treq.get(f"http://127.0.0.1:{opsPort}{page}", persistent=False)
                content = await treq.content(answer)
                self.assertEqual(answer.code, 200, (page, content[:300]))
        status: dict[str, Any] = json.loads(
            await treq.content(
                await treq.get(f"http://127.0.0.1:{opsPort}/status", persistent=False)
            )
        )
        self.assertEqual(status["workloads"]["terminals"], {"completed": len(ANSWERS)})
        for workload in status["workloads"]["recent"]:
            stats = workload["stats"] or {}
            self.assertFalse({"promptTokens", "cachedTokens", "promptMs"} & set(stats), stats)
            for value in stats.values():
                self.assertLess(abs(value), 2**40)
        noisy = [r for r in proxy.logs if r.get("level") in ("warn", "error", "critical")]
        self.assertEqual(noisy, [])
