"""Tests for nvpair.proxy.routing.cors: the browser rules of protocol §12."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.routing.cors import (
    CORS_PREFIX,
    PREFLIGHT_FORWARD_HEADERS,
    invalidListCors,
    isPreflight,
    listCors,
    originAllowed,
    preflightAnswer,
    preflightHeaders,
    stripCors,
)

ORIGIN = "http://app.example"


def allow(**extra: str) -> dict[str, str]:
    """A responder header map allowing ORIGIN, with extra ``access-control-*`` headers."""
    headers = {"access-control-allow-origin": ORIGIN}
    headers.update({"access-control-" + k.replace("_", "-"): v for k, v in extra.items()})
    return headers


class PreflightDetectionTests(SynchronousTestCase):
    """isPreflight and the forwarded header set."""

    def test_preflight(self) -> None:
        """OPTIONS with Origin and Access-Control-Request-Method is a preflight (bytes or str)."""
        headers = {"origin": ORIGIN, "access-control-request-method": "POST"}
        self.assertTrue(isPreflight(b"OPTIONS", headers))
        self.assertTrue(isPreflight("OPTIONS", headers))

    def test_notPreflight(self) -> None:
        """Another method, or a missing Origin or request method, is not a preflight."""
        self.assertFalse(
            isPreflight(b"GET", {"origin": ORIGIN, "access-control-request-method": "POST"})
        )
        self.assertFalse(isPreflight(b"OPTIONS", {"origin": ORIGIN}))
        self.assertFalse(isPreflight(b"OPTIONS", {"access-control-request-method": "POST"}))

    def test_forwardedHeaders(self) -> None:
        """Only Origin and Access-Control-Request-* travel; credentials never do."""
        request = {
            "origin": ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "content-type",
            "access-control-request-private-network": "true",
            "cookie": "s=1",
            "authorization": "Bearer x",
            "proxy-authorization": "Basic y",
            "user-agent": "ua",
        }
        self.assertEqual(
            preflightHeaders(request),
            {
                "origin": ORIGIN,
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type",
                "access-control-request-private-network": "true",
            },
        )
        for credential in ("cookie", "authorization", "proxy-authorization"):
            self.assertNotIn(credential, PREFLIGHT_FORWARD_HEADERS)


class OriginTests(SynchronousTestCase):
    """originAllowed."""

    def test_allowed(self) -> None:
        """``*`` or the exact origin allows it."""
        self.assertTrue(originAllowed(ORIGIN, {"access-control-allow-origin": "*"}))
        self.assertTrue(originAllowed(ORIGIN, {"access-control-allow-origin": ORIGIN}))

    def test_denied(self) -> None:
        """Absence, another origin, or a list of values does not allow it."""
        self.assertFalse(originAllowed(ORIGIN, {}))
        self.assertFalse(originAllowed(ORIGIN, {"access-control-allow-origin": "http://x"}))
        self.assertFalse(originAllowed(ORIGIN, {"access-control-allow-origin": f"{ORIGIN}, *"}))


class PreflightAnswerTests(SynchronousTestCase):
    """preflightAnswer intersects every responder's grant."""

    def test_allStar(self) -> None:
        """``*`` from every responder stays ``*`` without Vary."""
        star = {"access-control-allow-origin": "*"}
        self.assertEqual(
            preflightAnswer(ORIGIN, [star, star]), {"Access-Control-Allow-Origin": "*"}
        )

    def test_mixedOrigin(self) -> None:
        """A mix of ``*`` and the origin answers the origin with Vary: Origin."""
        self.assertEqual(
            preflightAnswer(ORIGIN, [{"access-control-allow-origin": "*"}, allow()]),
            {"Access-Control-Allow-Origin": ORIGIN, "Vary": "Origin"},
        )

    def test_oneDenies(self) -> None:
        """A responder that did not allow the origin removes Allow-Origin and Vary."""
        answer = preflightAnswer(
            ORIGIN, [allow(allow_methods="GET"), {"access-control-allow-methods": "GET"}]
        )
        self.assertEqual(answer, {"Access-Control-Allow-Methods": "GET"})

    def test_noResponders(self) -> None:
        """With no responders nothing is granted."""
        self.assertEqual(preflightAnswer(ORIGIN, []), {})

    def test_methodsIntersection(self) -> None:
        """Methods intersect case-insensitively in the first responder's spelling and order."""
        answer = preflightAnswer(
            ORIGIN, [allow(allow_methods="POST, get,PUT"), allow(allow_methods="GET, Post, DELETE")]
        )
        self.assertEqual(answer["Access-Control-Allow-Methods"], "POST, get")

    def test_methodsWildcard(self) -> None:
        """``*`` matches any method; the other responder's list survives whole."""
        answer = preflightAnswer(
            ORIGIN, [allow(allow_methods="*"), allow(allow_methods="GET, POST")]
        )
        self.assertEqual(answer["Access-Control-Allow-Methods"], "GET, POST")

    def test_allWildcardStays(self) -> None:
        """``*`` from every responder stays ``*``."""
        answer = preflightAnswer(ORIGIN, [allow(allow_headers="*"), allow(allow_headers=" * ")])
        self.assertEqual(answer["Access-Control-Allow-Headers"], "*")

    def test_headerWildcardExcludesAuthorization(self) -> None:
        """A ``*`` in Allow-Headers does not grant Authorization (Fetch rule)."""
        answer = preflightAnswer(
            ORIGIN, [allow(allow_headers="*"), allow(allow_headers="Authorization, Content-Type")]
        )
        self.assertEqual(answer["Access-Control-Allow-Headers"], "Content-Type")

    def test_missingListOmitted(self) -> None:
        """A responder without Allow-Methods/Allow-Headers omits the header from the answer."""
        answer = preflightAnswer(ORIGIN, [allow(allow_methods="GET", allow_headers="x-a"), allow()])
        self.assertNotIn("Access-Control-Allow-Methods", answer)
        self.assertNotIn("Access-Control-Allow-Headers", answer)

    def test_emptyIntersectionOmitted(self) -> None:
        """Disjoint lists leave the header out."""
        answer = preflightAnswer(ORIGIN, [allow(allow_headers="x-a"), allow(allow_headers="x-b")])
        self.assertNotIn("Access-Control-Allow-Headers", answer)

    def test_maxAgeSmallest(self) -> None:
        """Max-Age is the smallest integer."""
        answer = preflightAnswer(
            ORIGIN, [allow(max_age="600"), allow(max_age=" 86400"), allow(max_age="5")]
        )
        self.assertEqual(answer["Access-Control-Max-Age"], "5")

    def test_maxAgeAbsent(self) -> None:
        """Max-Age is absent when any responder omitted it or sent a non-integer."""
        for other in ({}, {"max_age": "ten"}, {"max_age": "-1"}, {"max_age": "1.5"}):
            answer = preflightAnswer(ORIGIN, [allow(max_age="600"), allow(**other)])
            self.assertNotIn("Access-Control-Max-Age", answer, other)

    def test_credentials(self) -> None:
        """Allow-Credentials: true only when every responder said true."""
        both = preflightAnswer(ORIGIN, [allow(allow_credentials="true")] * 2)
        self.assertEqual(both["Access-Control-Allow-Credentials"], "true")
        for other in ({}, {"allow_credentials": "false"}):
            answer = preflightAnswer(ORIGIN, [allow(allow_credentials="true"), allow(**other)])
            self.assertNotIn("Access-Control-Allow-Credentials", answer)

    def test_privateNetwork(self) -> None:
        """Allow-Private-Network: true only when every responder said true."""
        both = preflightAnswer(ORIGIN, [allow(allow_private_network="true")] * 2)
        self.assertEqual(both["Access-Control-Allow-Private-Network"], "true")
        one = preflightAnswer(ORIGIN, [allow(allow_private_network="true"), allow()])
        self.assertNotIn("Access-Control-Allow-Private-Network", one)

    def test_fullAnswer(self) -> None:
        """Every rule together yields the complete header set."""
        answer = preflightAnswer(
            ORIGIN,
            [
                allow(
                    allow_methods="GET, POST",
                    allow_headers="Content-Type, X-Key",
                    max_age="600",
                    allow_credentials="true",
                ),
                {
                    "access-control-allow-origin": "*",
                    "access-control-allow-methods": "*",
                    "access-control-allow-headers": "content-type",
                    "access-control-max-age": "60",
                    "access-control-allow-credentials": "true",
                },
            ],
        )
        self.assertEqual(
            answer,
            {
                "Access-Control-Allow-Origin": ORIGIN,
                "Vary": "Origin",
                "Access-Control-Allow-Methods": "GET, POST",
                "Access-Control-Allow-Headers": "Content-Type",
                "Access-Control-Max-Age": "60",
                "Access-Control-Allow-Credentials": "true",
            },
        )

    @given(
        st.lists(
            st.lists(st.sampled_from(["GET", "get", "POST", "PUT", "*", "DELETE"]), max_size=5),
            min_size=1,
            max_size=4,
        )
    )
    def test_intersectionProperty(self, lists: list[list[str]]) -> None:
        """The answer's methods are granted by every responder and include all common ones."""
        answer = preflightAnswer(ORIGIN, [allow(allow_methods=", ".join(ms)) for ms in lists])
        granted = {
            m.lower() for m in answer.get("Access-Control-Allow-Methods", "").split(", ") if m
        }
        sets = [{m.lower() for m in ms} for ms in lists]
        common = set.intersection(*sets)
        for method in granted - {"*"}:
            self.assertTrue(all(method in s or "*" in s for s in sets))
        self.assertLessEqual(common, granted)
        self.assertEqual("*" in granted, all("*" in s for s in sets))


class ListCorsTests(SynchronousTestCase):
    """listCors and invalidListCors for fleet model lists."""

    def test_allStar(self) -> None:
        """All ``*`` answers ``*``."""
        star = {"access-control-allow-origin": "*"}
        self.assertEqual(listCors(ORIGIN, [star, star]), {"Access-Control-Allow-Origin": "*"})

    def test_originWithVary(self) -> None:
        """Any responder naming the origin makes the answer the origin plus Vary."""
        self.assertEqual(
            listCors(ORIGIN, [allow(), {"access-control-allow-origin": "*"}]),
            {"Access-Control-Allow-Origin": ORIGIN, "Vary": "Origin"},
        )

    def test_denial(self) -> None:
        """One responder not allowing the origin yields None (403)."""
        self.assertIsNone(listCors(ORIGIN, [allow(), {}]))
        self.assertIsNone(listCors(ORIGIN, [allow(), {"access-control-allow-origin": "http://x"}]))

    def test_emptyFleet(self) -> None:
        """No responders is no denial, and grants nothing."""
        self.assertEqual(listCors(ORIGIN, []), {})

    def test_credentialsAndExpose(self) -> None:
        """Credentials only if all said true; Expose-Headers is the intersection."""
        headers = listCors(
            ORIGIN,
            [
                allow(allow_credentials="true", expose_headers="X-A, X-B"),
                allow(allow_credentials="true", expose_headers="x-b, x-c"),
            ],
        )
        self.assertEqual(
            headers,
            {
                "Access-Control-Allow-Origin": ORIGIN,
                "Vary": "Origin",
                "Access-Control-Allow-Credentials": "true",
                "Access-Control-Expose-Headers": "X-B",
            },
        )
        partial = listCors(ORIGIN, [allow(allow_credentials="true", expose_headers="X-A"), allow()])
        self.assertEqual(partial, {"Access-Control-Allow-Origin": ORIGIN, "Vary": "Origin"})

    def test_invalidAllAllowed(self) -> None:
        """The invalid-inventory 502 keeps Allow-Origin (and Vary) when all allowed."""
        self.assertEqual(
            invalidListCors(ORIGIN, [allow(allow_credentials="true"), allow()]),
            {"Access-Control-Allow-Origin": ORIGIN, "Vary": "Origin"},
        )
        star = {"access-control-allow-origin": "*"}
        self.assertEqual(invalidListCors(ORIGIN, [star]), {"Access-Control-Allow-Origin": "*"})

    def test_invalidSomeDenied(self) -> None:
        """The invalid-inventory 502 carries nothing when any responder denied, or none."""
        self.assertEqual(invalidListCors(ORIGIN, [allow(), {}]), {})
        self.assertEqual(invalidListCors(ORIGIN, []), {})


class StripTests(SynchronousTestCase):
    """stripCors."""

    def test_strip(self) -> None:
        """Access-Control-* headers go in any case; others stay in order."""
        headers = [
            (b"Content-Type", b"application/json"),
            (b"Access-Control-Allow-Origin", b"*"),
            (b"access-control-max-age", b"5"),
            (b"Vary", b"Origin"),
            (b"X-Access-Control-Note", b"kept"),
        ]
        self.assertEqual(
            stripCors(headers),
            [
                (b"Content-Type", b"application/json"),
                (b"Vary", b"Origin"),
                (b"X-Access-Control-Note", b"kept"),
            ],
        )
        self.assertEqual(CORS_PREFIX, "access-control-")
