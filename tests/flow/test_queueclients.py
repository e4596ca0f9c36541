"""The queue's clients in the placement loop, on a Clock (spec §11 "The queue"; issue 32
items 2 and 3): a full queue gives the place of the client with the most waiting to one
with fewer, declared clients are matched by their key and shown by name, and the body's
identity fields tell unverified clients apart."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.flow.clients import DeclaredClient
from nvpair.proxy.flow.interfaces import QueueRefusal
from nvpair.proxy.ops.queuegauges import QueueCollector, queueStatus
from nvpair.proxy.routing.admission import factsOf
from nvpair.proxy.routing.facts import MAX_FIELD, Identity
from tests.support.cases.queuecase import QueueCase, client

IDE_KEY = b"Bearer sk-ide-secret-value"
IDE = DeclaredClient("ide", hashlib.sha256(IDE_KEY).hexdigest(), 1.0)


def body(**fields: object) -> bytes:
    """A chat body for model m1 with ``fields`` added."""
    return json.dumps({"model": "m1", "messages": [], **fields}).encode()


class DisplaceTests(QueueCase):
    """One client holding the whole queue cannot keep another out."""

    def test_newestOfTheLongestGivesWay(self) -> None:
        """k1 holds every place: k2's request takes the place of k1's newest, which is
        answered 503 queue_full with Retry-After at once and never sent; k2 (served
        before) goes at the next free slot."""
        self.start(client(b"k2"))
        self.commit(0).end()
        self.start(client(b"k1"))
        self.start(client(b"k1"))
        waiting = [self.start(client(b"k1")) for _ in range(4)]
        ex, request = self.start(client(b"k2"))
        newest, newestRequest = waiting[-1]
        self.assertEqual(newestRequest.code, 503)
        self.assertEqual(self.reason(newestRequest), "queue_full")
        self.assertGreaterEqual(int(newestRequest.header(b"retry-after")[0]), 1)  # type: ignore[index]
        self.assertNotIn(newest, self.context.exchanges)
        self.assertIsNone(request.code)
        self.assertEqual(self.depth(), 4)
        self.commit(1).end()
        self.assertIs(self.upstream.calls[3].headers, ex.forwardHeaders)
        self.assertTrue(all(r.code is None for _, r in waiting[:3]))
        self.assertFalse(any(c.headers is newest.forwardHeaders for c in self.upstream.calls))

    def test_timerOfTheDisplacedIsGone(self) -> None:
        """The displaced request's timer is cancelled: it is answered once, not again at
        its queue timeout."""
        self.start(client(b"k1"))
        self.start(client(b"k1"))
        waiting = [self.start(client(b"k1"))[1] for _ in range(4)]
        self.start(client(b"k2"))
        self.clock.advance(31)
        self.assertEqual(self.reason(waiting[-1]), "queue_full")
        self.assertEqual(self.queueing.refused[("llamacpp", QueueRefusal.FULL)], 1)


class DeclaredTests(QueueCase):
    """Declared clients: matched by key, shown by name, the rest unverified."""

    settings: dict[str, Any] = {"queueMax": 8, "queueTimeout": 30.0}

    def setUp(self) -> None:
        super().setUp()
        self.queueing.clients.setClients([IDE])

    def scrape(self) -> str:
        registry = CollectorRegistry()
        registry.register(QueueCollector(lambda: self.queueing))
        return generate_latest(registry).decode()

    def test_declaredGoesBeforeMintedKeys(self) -> None:
        """Unverified requests with a new key each wait; the declared client's request,
        though it came last, goes at the next free slot (its share is level with all of
        the unverified ones together)."""
        self.start(client(b"first"))
        self.start(client(b"second"))
        for i in range(5):
            self.start(client(b"minted-%d" % i))
        ex, _ = self.start(client(IDE_KEY))
        self.commit(0).end()
        self.assertIs(self.upstream.calls[2].headers, ex.forwardHeaders)

    def test_shownByNameNeverByKey(self) -> None:
        """/metrics and /status count waiting, dispatched and refused per declared name and
        ``unverified``; the keys and their digests appear nowhere."""
        self.start(client(IDE_KEY))
        self.start(client(b"Bearer sk-anon"))
        for _ in range(3):
            self.start(client(IDE_KEY))
        for _ in range(6):
            self.start(client(b"Bearer sk-anon"))  # the 6th: anon has the most waiting
        text = self.scrape()
        self.assertIn(
            'nvpair_proxy_queue_client_depth{client="ide",engine="llamacpp",model="m1"} 3.0',
            text,
        )
        self.assertIn(
            'nvpair_proxy_queue_client_depth{client="unverified",engine="llamacpp",model="m1"} 5.0',
            text,
        )
        self.assertIn(
            'nvpair_proxy_queue_client_dispatches_total{client="ide",engine="llamacpp"} 1.0', text
        )
        self.assertIn(
            'nvpair_proxy_queue_client_refusals_total{client="unverified",engine="llamacpp",'
            'reason="queue_full"} 1.0',
            text,
        )
        status = queueStatus(self.queueing)
        assert status is not None
        self.assertEqual(status["declaredClients"], ["ide"])
        self.assertEqual(
            status["clients"],
            {
                "llamacpp": {
                    "ide": {"waiting": 3, "dispatched": 1, "refused": {}},
                    "unverified": {"waiting": 5, "dispatched": 1, "refused": {"queue_full": 1}},
                }
            },
        )
        for shown in (text, repr(status)):
            self.assertNotIn("sk-", shown)
            self.assertNotIn(IDE.keySha256, shown)

    def test_removedNameCountsAsOther(self) -> None:
        """After a reload drops ``ide``, its requests still waiting and its counts show as
        ``other``: the label set stays declared names, ``unverified`` and ``other``."""
        self.start(client(IDE_KEY))
        self.start(client(IDE_KEY))
        self.start(client(IDE_KEY))
        self.queueing.clients.setClients([])
        text = self.scrape()
        self.assertIn(
            'nvpair_proxy_queue_client_depth{client="other",engine="llamacpp",model="m1"} 1.0',
            text,
        )
        self.assertIn(
            'nvpair_proxy_queue_client_dispatches_total{client="other",engine="llamacpp"} 2.0',
            text,
        )
        self.assertNotIn('client="ide"', text)


class IdentityTests(QueueCase):
    """Without Authorization the body's identity fields tell clients apart, in order."""

    settings: dict[str, Any] = {"queueMax": 64}

    def test_anthropicUserIdNamesClient(self) -> None:
        """Anthropic ``metadata.user_id`` separates clients (before ``user``): a client
        seen before is not stuck behind another's backlog."""
        light = body(metadata={"user_id": "agent-2"}, user="same")
        heavy = body(metadata={"user_id": "agent-1"}, user="same")
        self.start(body=light)
        self.commit(0).end()
        for _ in range(5):
            self.start(body=heavy)
        ex, _ = self.start(body=light)
        self.commit(1).end()
        self.assertIs(self.upstream.calls[3].headers, ex.forwardHeaders)

    def test_sameUserSameClient(self) -> None:
        """Requests that differ in nothing the rule reads are one client: FIFO."""
        same = body(user="same")
        self.start(body=same)
        self.commit(0).end()
        for _ in range(5):
            self.start(body=same)
        ex, _ = self.start(body=same)
        self.commit(1).end()
        self.assertIsNot(self.upstream.calls[3].headers, ex.forwardHeaders)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=300),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


class BodyIdentityTests(SynchronousTestCase):
    """The identity fields admission reads from a body a client controls (``factsOf``)."""

    @given(
        st.dictionaries(
            st.sampled_from(["metadata", "user", "safety_identifier", "model", "x"]), _JSON
        ),
        _JSON,
    )
    def test_anyBody(self, document: dict[str, object], userId: object) -> None:
        """Whatever the document holds, each field is None or a non-empty string of at
        most ``MAX_FIELD`` characters, taken from where the rule says."""
        if isinstance(document.get("metadata"), dict):
            document["metadata"] = {**document["metadata"], "user_id": userId}  # type: ignore[dict-item]
        identity = factsOf(document).identity
        for value in (identity.anthropicUser, identity.safetyIdentifier, identity.user):
            self.assertTrue(value is None or 0 < len(value) <= MAX_FIELD)
        if identity.user is not None:
            self.assertEqual(identity.user, document["user"])
        if identity.anthropicUser is not None:
            self.assertEqual(identity.anthropicUser, userId)
        self.assertEqual(factsOf({}).identity, Identity())
