"""The agents' routes through the exchange (spec §8): a Messages or Responses answer's usage
becomes its workload's statistics, and a client that hangs up once the stream's end event
has passed is served, not cancelled."""

from __future__ import annotations

import json

from tests.support.exchangecase import LoopCase
from tests.support.fakerequest import FakeRequest
from tests.support.statsbodies import messagesStream, responsesStream

MESSAGES = json.dumps(
    {"model": "m1", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
).encode()
START = {"cache_read_input_tokens": 30, "input_tokens": 5, "output_tokens": 0}


class AgentsExchangeTests(LoopCase):
    """Owners A and B of ``m1`` on the llama.cpp facade."""

    def test_messagesStreamStats(self) -> None:
        """A streamed Messages answer: prompt = input + cache read, cached = cache read."""
        ex, request = self.start(request=FakeRequest(b"POST", b"/v1/messages"), body=MESSAGES)
        response = self.upstream.last().respond(200)
        response.send(messagesStream(["a", "b", "c"], START, {"output_tokens": 3}))
        response.end()
        stats = self.terminal()["stats"]
        self.assertEqual(
            (stats["promptTokens"], stats["cachedTokens"], stats["completionTokens"]), (35, 30, 3)
        )
        self.assertEqual(self.terminal()["state"], "completed")
        self.assertReleased()

    def test_clientGoneAfterMessageStop(self) -> None:
        """The client hangs up once ``message_stop`` has passed, before the engine ends the
        body: completed, with statistics; one that leaves before it is cancelled."""
        whole = messagesStream(["a", "b"], START, {"output_tokens": 2})
        ex, request = self.start(request=FakeRequest(b"POST", b"/v1/messages"), body=MESSAGES)
        response = self.upstream.last().respond(200)
        response.send(whole)
        request.lose()
        self.clock.advance(0)
        self.assertEqual(self.terminal()["state"], "completed")
        self.assertEqual(self.terminal()["stats"]["promptTokens"], 35)
        self.context.sink.sent.clear()
        ex, request = self.start(request=FakeRequest(b"POST", b"/v1/messages"), body=MESSAGES)
        response = self.upstream.last().respond(200)
        response.send(whole[: whole.index(b"event: message_stop")])
        request.lose()
        self.clock.advance(0)
        self.assertEqual(self.terminal()["state"], "cancelled")

    def test_responsesStats(self) -> None:
        """A streamed Responses answer: its ``response.completed`` usage and timings."""
        usage = {
            "input_tokens": 40,
            "output_tokens": 2,
            "input_tokens_details": {"cached_tokens": 32},
        }
        ex, request = self.start(
            request=FakeRequest(b"POST", b"/v1/responses"),
            body=b'{"model":"m1","input":"hi","stream":true}',
        )
        response = self.upstream.last().respond(200)
        response.send(responsesStream(["a", "b"], usage, {"prompt_ms": 4.0}))
        request.lose()  # after response.completed: delivered whole
        self.clock.advance(0)
        stats = self.terminal()["stats"]
        self.assertEqual(
            (stats["promptTokens"], stats["cachedTokens"], stats["promptMs"]), (40, 32, 4.0)
        )
