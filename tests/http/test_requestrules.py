"""Unit tests of the request-head rules llhttp leaves to the facade (``requestrules``)."""

from __future__ import annotations

import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.http.refusal import Refusal
from nvpair.proxy.http.rules import (
    checkHead,
    clientProtocol,
    headersOf,
    originForm,
    pathOf,
)


class OriginFormTests(SynchronousTestCase):
    """Absolute-form targets become origin form and an authority."""

    def test_converted(self) -> None:
        """Path and query are kept, the fragment dropped, the scheme's case ignored, and an
        IPv6 host is bracketed again."""
        self.assertEqual(originForm(b"http://h:8080/v1/x?a=1#f"), (b"/v1/x?a=1", b"h:8080"))
        self.assertEqual(originForm(b"HTTPS://H/x"), (b"/x", b"H"))
        self.assertEqual(originForm(b"http://h?q"), (b"/?q", b"h"))
        self.assertEqual(originForm(b"http://[::1]/"), (b"/", b"[::1]"))
        self.assertEqual(originForm(b"http://h/a%20b"), (b"/a%20b", b"h"))

    def test_refused(self) -> None:
        """No host, a bad port, another scheme, user information: 400."""
        for url in (
            b"http:///x",
            b"http://h:99999/x",
            b"http://h:/x",
            b"ftp://h/x",
            b"http://u@h/x",
            b"engine:443",
        ):
            with self.assertRaises(Refusal) as caught:
                originForm(url)
            self.assertEqual(caught.exception.status, 400, url)


class HeadRuleTests(SynchronousTestCase):
    """``checkHead``: Host, Transfer-Encoding and the target, on a built header set."""

    def check(
        self,
        fields: list[tuple[bytes, bytes]],
        proto: bytes = b"HTTP/1.1",
        url: bytes = b"/p?q",
        method: bytes = b"GET",
    ) -> bytes:
        headers = headersOf(fields)
        return checkHead(
            method, proto, url, headers[0], headers[0].getRawHeaders(b"transfer-encoding")
        )

    def refusal(self, fields: list[tuple[bytes, bytes]]) -> Refusal:
        with self.assertRaises(Refusal) as caught:
            self.check(fields)
        refusal: Refusal = caught.exception
        return refusal

    def test_hostValues(self) -> None:
        """Host names, addresses with ports, IPv6 literals and the empty value pass; other
        values are 400 with the path for the error shape."""
        for value in (
            b"",
            b"localhost",
            b"127.0.0.1:8080",
            b"[::1]:80",
            b"a.b-c_d~",
            b"127.0.0.1:",
        ):
            self.assertEqual(self.check([(b"Host", value)]), b"/p?q", value)
        for value in (b"[::1", b"host:port", b"a b", b"a/b"):
            refusal = self.refusal([(b"Host", value)])
            self.assertEqual((refusal.status, refusal.path), (400, b"/p"), value)

    def test_absoluteFormReplacesHost(self) -> None:
        """An absolute-form target's authority replaces the received Host (whatever it
        was), and the origin form is returned."""
        headers, _ = headersOf([(b"Host", b"not valid at all")])
        target = checkHead(b"POST", b"HTTP/1.1", b"http://e:1/v1/x", headers, None)
        self.assertEqual(target, b"/v1/x")
        self.assertEqual(headers.getRawHeaders(b"host"), [b"e:1"])

    def test_http10WithoutHost(self) -> None:
        """HTTP/1.0 needs no Host."""
        self.assertEqual(self.check([], proto=b"HTTP/1.0"), b"/p?q")

    def test_versions(self) -> None:
        """1.0 and 1.1 are served; 0.9 is 400; 2.0 is 505."""
        self.assertEqual(clientProtocol("1.1"), b"HTTP/1.1")
        self.assertEqual(clientProtocol("1.0"), b"HTTP/1.0")
        for version, status in (("0.9", 400), ("2.0", 505), ("3.0", 505)):
            with self.assertRaises(Refusal) as caught:
                clientProtocol(version)
            self.assertEqual(caught.exception.status, status)

    def test_headersOf(self) -> None:
        """Values lose trailing whitespace; the size counts each line as sent."""
        headers, size = headersOf([(b"A", b"x \t"), (b"a", b"y")])
        self.assertEqual(headers.getRawHeaders(b"a"), [b"x", b"y"])
        self.assertEqual(size, len(b"A: x \t\r\na: y\r\n"))

    def test_validHostRemembered(self) -> None:
        """A Host value found valid once passes again; an invalid one is refused every
        time (never remembered)."""
        for _ in range(2):
            self.assertEqual(self.check([(b"Host", b"again.local:1")]), b"/p?q")
            self.refusal([(b"Host", b"bad host")])

    def test_pathOf(self) -> None:
        """The path of an origin-form target; ``/`` for anything else."""
        self.assertEqual(pathOf(b"/api/chat?x"), b"/api/chat")
        self.assertEqual(pathOf(b"http://h/api/chat"), b"/")
        self.assertEqual(pathOf(b""), b"/")


class LeafImportTests(SynchronousTestCase):
    """The HTTP layer's interfaces import nothing concrete."""

    def test_interfacesLoadNoParser(self) -> None:
        """Importing ``http.interfaces`` (and with it ``Refusal``) in a fresh interpreter
        loads neither httptools nor the reactor."""
        probe = (
            "import sys, nvpair.proxy.http.interfaces; "
            "print(sorted({'httptools', 'twisted.internet.reactor'} & set(sys.modules)))"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
        )
        self.assertEqual(out.stdout.strip(), "[]")
