"""Who the client is (protocol §9's client rule; spec §11 "The queue"): declared clients
matched by the SHA-256 of their key, then digests of the identity fields in order; and the
bounded labels the queue counts them under."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.flow.clientbook import ClientBook
from nvpair.proxy.flow.clients import (
    LOCAL,
    OTHER,
    UNVERIFIED,
    Client,
    DeclaredClient,
    Roster,
    clientKey,
)
from nvpair.proxy.flow.interfaces import QueueRefusal
from nvpair.proxy.routing.facts import Identity

KEY = b"Bearer sk-declared-secret"
IDE = DeclaredClient("ide", hashlib.sha256(KEY).hexdigest(), 2.0)
ALL = Identity(anthropicUser="ant", safetyIdentifier="safe", user="usr")


class ClientKeyTests(SynchronousTestCase):
    """The rule's order, and what a key holds."""

    def test_declaredFirst(self) -> None:
        """A request whose whole ``Authorization`` value hashes to a declared key is that
        client's: its name is its share, with its weight."""
        client = clientKey(KEY, ALL, Roster([IDE]), "peer1")
        self.assertEqual(client, Client("d:ide", "ide", 2.0))
        self.assertEqual(client.label, "ide")

    def test_order(self) -> None:
        """Each source is used only when those before it are absent: Authorization,
        metadata.user_id, safety_identifier, user, peer, local; all unverified."""
        roster = Roster([IDE])
        seen = [
            clientKey(b"Bearer other", ALL, roster, "peer1"),
            clientKey(None, ALL, roster, "peer1"),
            clientKey(None, Identity(None, "safe", "usr"), roster, "peer1"),
            clientKey(None, Identity(None, None, "usr"), roster, "peer1"),
            clientKey(None, Identity(), roster, "peer1"),
            clientKey(None, Identity(), roster, None),
        ]
        self.assertEqual([c.key[:2] for c in seen], ["a:", "m:", "s:", "u:", "p:", LOCAL[:2]])
        self.assertEqual(seen[-1].key, LOCAL)
        self.assertTrue(all(c.share is None and c.label == UNVERIFIED for c in seen))

    def test_sameValueDifferentFieldsDiffer(self) -> None:
        """The same string in different identity fields names different clients."""
        keys = {
            clientKey(None, Identity("x", None, None)).key,
            clientKey(None, Identity(None, "x", None)).key,
            clientKey(None, Identity(None, None, "x")).key,
        }
        self.assertEqual(len(keys), 3)

    def test_stableAndDistinct(self) -> None:
        """The same credential is the same client; different ones differ."""
        none = Identity()
        self.assertEqual(clientKey(b"k1", none), clientKey(b"k1", none))
        self.assertNotEqual(clientKey(b"k1", none), clientKey(b"k2", none))

    @given(st.binary(min_size=1, max_size=64), st.text(min_size=1, max_size=256))
    def test_neverHoldsTheValue(self, auth: bytes, user: str) -> None:
        """A key is a fixed-size digest whatever the input: no credential or identity in
        clear."""
        for client in (
            clientKey(auth, Identity()),
            clientKey(None, Identity(user, None, None)),
            clientKey(None, Identity(None, user, None)),
            clientKey(None, Identity(None, None, user)),
        ):
            self.assertRegex(client.key, r"^[asmu]:[0-9a-f]{16}$")


class RosterTests(SynchronousTestCase):
    """Declared clients, matched and labelled."""

    def test_matchesTheWholeHeaderValue(self) -> None:
        """Only the whole value matches (the scheme is part of it)."""
        roster = Roster([IDE])
        self.assertIs(roster.match(KEY), IDE)
        self.assertIsNone(roster.match(b"sk-declared-secret"))
        self.assertIsNone(Roster().match(KEY))

    def test_labels(self) -> None:
        """Declared names are their own label, the unverified share ``unverified``, a name
        no longer declared ``other``."""
        roster = Roster([IDE])
        self.assertEqual(roster.label("ide"), "ide")
        self.assertEqual(roster.label(None), UNVERIFIED)
        self.assertEqual(roster.label("gone"), OTHER)


class BookTests(SynchronousTestCase):
    """The declared clients in force, and per-client counts under a bounded set of labels
    across reloads."""

    def test_clientOfFollowsTheRoster(self) -> None:
        """A key is a declared client's once declared, unverified again once removed."""
        book = ClientBook()
        self.assertIsNone(book.clientOf(KEY, Identity()).share)
        book.setClients([IDE])
        self.assertEqual(book.clientOf(KEY, Identity()).share, "ide")
        book.setClients([])
        self.assertIsNone(book.clientOf(KEY, Identity()).share)

    def test_removedNamesFoldIntoOther(self) -> None:
        """A reload that removes a declared name moves its counts to ``other``: totals
        never go back, and only declared names, ``unverified`` and ``other`` remain."""
        tally = ClientBook()
        tally.setClients([IDE, DeclaredClient("batch", "0" * 64)])
        for _ in range(3):
            tally.countDispatch("llamacpp", Client("d:ide", "ide"))
        tally.countDispatch("llamacpp", Client("d:batch", "batch"))
        tally.countDispatch("llamacpp", Client("a:1"))
        tally.countRefusal("llamacpp", Client("d:ide", "ide"), QueueRefusal.FULL)
        tally.setClients([DeclaredClient("batch", "0" * 64)])
        tally.countDispatch("llamacpp", Client("d:ide", "ide"))  # one still waiting then
        self.assertEqual(
            tally.dispatched,
            {("llamacpp", OTHER): 4, ("llamacpp", "batch"): 1, ("llamacpp", UNVERIFIED): 1},
        )
        self.assertEqual(tally.refused, {("llamacpp", OTHER, QueueRefusal.FULL): 1})

    def test_labelsBoundedWhateverIsMinted(self) -> None:
        """However many keys clients mint, undeclared counts go under one label."""
        tally = ClientBook()
        for i in range(5000):
            tally.countDispatch("ollama", Client(f"a:{i}"))
            tally.countRefusal("ollama", Client(f"a:{i}"), QueueRefusal.FULL)
        self.assertEqual(tally.dispatched, {("ollama", UNVERIFIED): 5000})
        self.assertEqual(len(tally.refused), 1)
