"""OpenAI Responses follow-ups (spec §11 "Stored responses", issue 30 item 3): the proxy
learns which node stored each response from the committed answer, and sends a follow-up
(``previous_response_id``) there, or answers 404 when that node is gone."""

from __future__ import annotations

import json

from tests.support.exchangecase import LoopCase
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import setNodes

RESPONSES = b"/v1/responses"


def body(previous: str | None = None, stream: bool = False) -> bytes:
    document: dict[str, object] = {"model": "m1", "input": "next", "stream": stream}
    if previous is not None:
        document["previous_response_id"] = previous
    return json.dumps(document).encode()


def created(responseId: str) -> bytes:
    """The first event of a streamed Responses answer."""
    event = {"type": "response.created", "response": {"id": responseId, "object": "response"}}
    return b"event: response.created\ndata: " + json.dumps(event).encode() + b"\n\n"


class FollowUpTests(LoopCase):
    """Owners A and B; the first answer stored on one of them."""

    nodes = ("A", "B", "C")

    def ask(self, previous: str | None = None, stream: bool = False) -> FakeRequest:
        return self.start(FakeRequest(b"POST", RESPONSES), body=body(previous, stream))[1]

    def test_followUpGoesWhereItsPredecessorIs(self) -> None:
        """A JSON answer's id is learnt against the node that served it; every follow-up
        goes to that node, however loaded, and is retried there (never elsewhere)."""
        self.ask()
        first = self.upstream.last()
        first.answer(200, b'{"id": "resp_1", "object": "response", "output": []}')
        for _ in range(3):  # the other nodes now look lighter: still there
            self.context.reservations.reserve(first.nodeId)
        self.ask(previous="resp_1")
        follow = self.upstream.last()
        self.assertEqual(follow.nodeId, first.nodeId)
        follow.answer(503)
        self.clock.advance(self.context.settings.backoffBase)
        self.assertEqual(self.upstream.last().nodeId, first.nodeId)

    def test_streamedIdLearntAtItsFirstEvent(self) -> None:
        """A stream's id is known from its first event, before the stream ends."""
        self.ask(stream=True)
        first = self.upstream.last()
        response = first.respond(200)
        response.send(created("resp_s"))
        self.ask(previous="resp_s")
        self.assertEqual(self.upstream.last().nodeId, first.nodeId)
        response.end()

    def test_predecessorGone(self) -> None:
        """The node that stored the predecessor left: 404 ``previous_response_not_found``
        in OpenAI's shape at once, no engine asked."""
        self.ask()
        first = self.upstream.last()
        first.answer(200, b'{"id": "resp_2", "object": "response"}')
        setNodes(self.facade, [n for n in self.facade.snapshot.nodes if n.id != first.nodeId])
        calls = len(self.upstream.calls)
        request = self.ask(previous="resp_2")
        self.assertEqual(len(self.upstream.calls), calls)
        self.assertEqual(request.code, 404)
        error = json.loads(request.body)["error"]
        self.assertEqual(
            (error["type"], error["param"], error["code"]),
            ("invalid_request_error", "previous_response_id", "previous_response_not_found"),
        )

    def test_unknownPredecessorPlacedAsUsual(self) -> None:
        """An id the proxy never saw served (another proxy's, or before a restart): placed
        as usual; the engine answers for it."""
        request = self.ask(previous="resp_unknown")
        self.upstream.last().answer(404, b'{"error": {"code": "previous_response_not_found"}}')
        self.assertIsNone(request.code)  # 404 is retried on inference routes

    def test_failedAnswerStoresNothing(self) -> None:
        """A non-2xx answer names no stored response."""
        request = self.ask()
        for call in list(self.upstream.pending()):
            call.answer(400, b'{"id": "resp_bad"}')
        self.assertEqual(request.code, 400)
        self.assertIsNone(self.context.responses.nodeOf("resp_bad"))
