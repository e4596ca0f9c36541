"""Unit tests of the upstream client's framing (``nvpair.proxy.httpframing``).

The chunked decoder has a fast path for runs of chunks whose size lines it has seen before
(two caches) and the general per-line state machine; the property tests decode the same
bytes, split any way, with the fast path off, cold and warm, and require the same outcome.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.iweb import UNKNOWN_LENGTH

from nvpair.proxy import httpframing
from nvpair.proxy.httpframing import (
    CHUNKED,
    CLOSE,
    LENGTH,
    MAX_LINE,
    BadResponse,
    ChunkDecoder,
    parseHead,
    splitHead,
)


def frame(payload: bytes, size: bytes | None = None) -> bytes:
    """One chunk: its size line (``size`` as given, else lower-case hex), data and CRLF."""
    return b"%s\r\n%s\r\n" % (b"%x" % len(payload) if size is None else size, payload)


def sseBody(events: int = 50) -> tuple[bytes, bytes]:
    """A streamed chat answer as an engine frames it: the chunked body and its payload."""
    pieces = [
        b'data: {"choices":[{"index":0,"delta":{"content":"tok%d"},"finish_reason":null}]}\n\n'
        % i for i in range(events)
    ]
    pieces.append(b"data: [DONE]\n\n")
    return b"".join(frame(p) for p in pieces) + b"0\r\n\r\n", b"".join(pieces)


Outcome = tuple[Any, ...]


def decode(pieces: list[bytes]) -> Outcome:
    """Feed ``pieces`` in order: ("done", payload, bytes after the body incl. unfed reads),
    ("open", payload, state) if the body has not ended, or ("error", problem)."""
    decoder = ChunkDecoder()
    payload = []
    for i, piece in enumerate(pieces):
        try:
            data, rest = decoder.feed(piece)
        except BadResponse as e:
            return ("error", str(e))
        payload.append(data)
        if rest is not None:
            return ("done", b"".join(payload), rest + b"".join(pieces[i + 1:]))
    return ("open", b"".join(payload), decoder.state, decoder.remaining)


def cut(raw: bytes, points: list[int]) -> list[bytes]:
    """``raw`` cut at ``points`` (any order, repeats allowed: empty reads)."""
    bounds = [0, *sorted(p % (len(raw) + 1) for p in points), len(raw)]
    return [raw[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


class ChunkDecoderTests(SynchronousTestCase):
    """The chunked framing rules, piece by piece."""

    def test_wholeBodyOneRead(self) -> None:
        """A 50-event body in one read: all payloads in one piece, the end, nothing after."""
        raw, payload = sseBody()
        for _ in range(2):  # cold, then with the size lines known
            self.assertEqual(decode([raw]), ("done", payload, b""))

    def test_bytesAfterTheEnd(self) -> None:
        """The bytes after the last chunk's empty line are handed back."""
        self.assertEqual(decode([frame(b"ab") + b"0\r\n\r\nHTTP/1.1"]),
                         ("done", b"ab", b"HTTP/1.1"))

    def test_extensionsIgnored(self) -> None:
        """Chunk extensions after ``;`` are ignored, on data and last chunks alike."""
        raw = b"5;foo=bar\r\nhello\r\n1 ; x\r\n!\r\n0;last=1\r\n\r\n"
        self.assertEqual(decode([raw]), ("done", b"hello!", b""))

    def test_hexForms(self) -> None:
        """Sizes in upper case, mixed case or with leading zeros are the same sizes."""
        data = b"x" * 0xAB
        for size in (b"AB", b"aB", b"00ab", b"0000000000000ab"):
            raw = frame(data, size) * 3 + b"0\r\n\r\n"
            self.assertEqual(decode([raw]), ("done", data * 3, b""), size)

    def test_badSizes(self) -> None:
        """Sizes that are not 1-16 hex digits fail the body."""
        for size in (b"zz", b"0x5", b"+5", b"-5", b"5_0", b"1" * 17, b"", b";x"):
            self.assertEqual(decode([size + b"\r\n"]), ("error", "bad chunk size"), size)

    def test_sixteenDigitsAccepted(self) -> None:
        """A 16-digit size is a size: the decoder waits for that much data."""
        self.assertEqual(decode([b"f" * 16 + b"\r\nab"]),
                         ("open", b"ab", httpframing.DATA, 2 ** 64 - 3))

    def test_dataNotFollowedByCRLF(self) -> None:
        """Data followed by anything but CRLF (or LF) fails, also when what follows looks
        like a size line the fast path knows."""
        known = frame(b"a") + frame(b"bc") + b"0\r\n\r\n"
        self.assertEqual(decode([known])[0], "done")
        decode([frame(b"z" * 0xABCD)])  # a 4-digit size line known too
        for raw in (b"1\r\naX\r\n", b"1\r\na1\r\nb\r\n", b"2\r\nbc2\r\nbc\r\n",
                    frame(b"bc") + b"2\r\nbc1\r\n", b"1\r\naabcd\r\n"):
            self.assertEqual(decode([raw]), ("error", "chunk not followed by CRLF"), raw)

    def test_bareLineFeeds(self) -> None:
        """Bare LF line ends are accepted for size lines, after data and in trailers."""
        self.assertEqual(decode([b"5\nhello\n0\nA: b\n\n"]), ("done", b"hello", b""))

    def test_trailers(self) -> None:
        """Trailer lines are skipped up to the empty line."""
        raw = frame(b"hi") + b"0\r\nA: b\r\nC-D: e f\r\n\r\nnext"
        self.assertEqual(decode([raw]), ("done", b"hi", b"next"))
        self.assertEqual(decode([raw[:-6]]), ("open", b"hi", httpframing.TRAILER, 0))

    def test_splitInsideCRLFAfterData(self) -> None:
        """A read ending between the CR and LF after the data continues correctly."""
        self.assertEqual(decode([b"5\r\nhello\r", b"\n0\r\n\r\n"]), ("done", b"hello", b""))
        self.assertEqual(decode([b"5\r\nhello", b"\r", b"\n", b"0\r\n\r\n"]),
                         ("done", b"hello", b""))

    def test_sizeLineSplitAcrossReads(self) -> None:
        """A size line cut anywhere (digits, CR, LF, extension) is joined with the next read."""
        raw = b"1a;e=1\r\n" + b"y" * 26 + b"\r\n0\r\n\r\n"
        for i in range(1, 9):
            self.assertEqual(decode([raw[:i], raw[i:]]), ("done", b"y" * 26, b""), i)

    def test_chunkLargerThanTheRead(self) -> None:
        """A chunk bigger than the reads comes out read by read, each read as it came."""
        decoder = ChunkDecoder()
        self.assertEqual(decoder.feed(b"3e8\r\n" + b"a" * 95), (b"a" * 95, None))
        for _ in range(9):
            self.assertEqual(decoder.feed(b"b" * 100), (b"b" * 100, None))
        self.assertEqual(decoder.remaining, 5)
        self.assertEqual(decoder.feed(b"c" * 5 + b"\r\n0\r\n\r\n"), (b"c" * 5, b""))

    def test_readEndsRightAfterAKnownSizeLine(self) -> None:
        """A read ending just after a size line shorter than the previous one (a key the
        fast path sees cut short) leaves the whole next chunk to come."""
        raw = frame(b"x" * 0x11) + frame(b"y") + b"0\r\n\r\n"
        decode([raw])  # both size lines known
        at = raw.index(b"\r\n1\r\n") + 5
        self.assertEqual(decode([raw[:at], raw[at:]]), ("done", b"x" * 0x11 + b"y", b""))

    def test_lineTooLong(self) -> None:
        """A line without LF over MAX_LINE bytes fails; one at the limit still waits."""
        self.assertEqual(decode([b"1" * MAX_LINE])[0], "open")
        self.assertEqual(decode([b"1" * (MAX_LINE + 1)]), ("error", "chunk line too long"))
        self.assertEqual(decode([b"0\r\n" + b"T" * (MAX_LINE + 1)]),
                         ("error", "chunk line too long"))

    def test_resetForTheNextBody(self) -> None:
        """``reset`` forgets a body left half-way."""
        decoder = ChunkDecoder()
        decoder.feed(b"5\r\nab")
        decoder.reset()
        self.assertEqual(decoder.feed(b"2\r\nok\r\n0\r\n\r\n"), (b"ok", b""))


_SIZES = st.one_of(st.integers(1, 20), st.sampled_from([0xBA, 0xBB, 0xFF, 0x100, 0x1FF]))
_DATA = st.sampled_from(b"a\r\n;0")


@st.composite
def chunkedBodies(draw: st.DrawFn) -> tuple[bytes, bytes, list[int]]:
    """A valid chunked body (sizes in any hex form, extensions, bare LFs, trailers), its
    payload, and where its size lines end (cuts there meet the fast path's edge cases)."""
    raw, payload, lineEnds = [], [], []
    at = 0
    for size in draw(st.lists(_SIZES, max_size=12)):
        pattern = bytes(draw(st.lists(_DATA, min_size=1, max_size=6)))
        data = (pattern * size)[:size]
        line = draw(st.sampled_from([b"%x", b"%X", b"0%x"])) % size
        line += draw(st.sampled_from([b""] * 4 + [b";a=b", b" ; x"]))
        eol, after = draw(st.sampled_from([(b"\r\n", b"\r\n")] * 6 + [(b"\n", b"\n")]))
        raw.append(line + eol + data + after)
        payload.append(data)
        lineEnds.append(at + len(line) + len(eol))
        at += len(raw[-1])
    raw.append(b"0\r\n" + draw(st.sampled_from([b"", b"T: 1\r\n", b"A: b\nC: d\r\n"])) + b"\r\n")
    return b"".join(raw), b"".join(payload), lineEnds


_SOUP = st.lists(
    st.sampled_from([b"1", b"2", b"a", b"A", b"f", b"0", b"\r", b"\n", b"\r\n", b";", b" ",
                     b"x", b"ba", b"\r\n1\r\n", b"11\r\n", b"\r\n11\r\n", b"x" * 17,
                     b"0\r\n\r\n"]), max_size=60).map(b"".join)


class ChunkDecoderPropertyTests(SynchronousTestCase):
    """Any split of the same bytes, fast path off, cold or warm: the same outcome."""

    def decodeModes(self, pieces: list[bytes]) -> list[Outcome]:
        """The outcome of ``pieces`` without the fast path, with it cold, and warm."""
        outcomes = []
        self.patch(httpframing, "_learn", lambda line, size: None)
        self.patch(httpframing, "_LINES", {})
        self.patch(httpframing, "_FRAMES", {})
        outcomes.append(decode(pieces))  # no size line ever known: the general path only
        self.patch(httpframing, "_learn", _LEARN)
        outcomes.append(decode(pieces))  # cold: learning as it goes
        outcomes.append(decode(pieces))  # warm: every plain size line known
        return outcomes

    @settings(max_examples=300)
    @given(chunkedBodies(), st.lists(st.integers(0, 10_000), max_size=6),
           st.lists(st.integers(0, 100), max_size=3), st.binary(max_size=4))
    def test_splitsDecodeTheSame(self, body: tuple[bytes, bytes, list[int]], points: list[int],
                                 afterLines: list[int], after: bytes) -> None:
        """A valid body cut anywhere (also right after size lines) decodes to its payload,
        ends, and hands back what follows it, in every mode."""
        raw, payload, lineEnds = body
        points += [lineEnds[k % len(lineEnds)] for k in afterLines if lineEnds]
        for outcome in self.decodeModes(cut(raw + after, points)):
            self.assertEqual(outcome, ("done", payload, after))

    @settings(max_examples=300)
    @given(chunkedBodies(), st.integers(0, 10_000))
    def test_bytewiseAndWhole(self, body: tuple[bytes, bytes, list[int]], at: int) -> None:
        """Byte by byte, whole, and cut once: the same payload and the same end."""
        raw, payload, _ = body
        for pieces in ([raw[i:i + 1] for i in range(len(raw))], [raw], cut(raw, [at])):
            self.assertEqual(decode(pieces), ("done", payload, b""))

    @settings(max_examples=500)
    @given(_SOUP, st.lists(st.integers(0, 10_000), max_size=6))
    def test_arbitraryBytesSameOutcome(self, raw: bytes, points: list[int]) -> None:
        """Arbitrary short framing-ish bytes: split or whole, with or without the fast path,
        the same end, error or payload so far (errors drop the failing read's payload, so
        only their reason is compared)."""
        whole = self.decodeModes([raw])
        for outcome in whole + self.decodeModes(cut(raw, points)):
            if whole[0][0] == "open":  # the state and remaining may be met mid-line
                self.assertEqual(outcome[:2], whole[0][:2])
            else:
                self.assertEqual(outcome, whole[0])


_LEARN = httpframing._learn


class HeadTests(SynchronousTestCase):
    """Status line and headers: the response's code, headers, length and framing."""

    def parse(self, head: bytes, isHead: bool = False) -> Any:
        """Parse twice (the second time with every name known): the same result."""
        first = parseHead(head, isHead)
        second = parseHead(head, isHead)
        if first is None:
            self.assertIsNone(second)
            return None
        code, phrase, headers, length, mode, remaining, reusable = first
        self.assertEqual(second[2]._rawHeaders, headers._rawHeaders)
        self.assertEqual(second[:2] + second[3:], first[:2] + first[3:])
        return code, phrase, headers._rawHeaders, length, mode, remaining, reusable

    def test_typicalHead(self) -> None:
        """Names canonical, repeats kept in order, framing headers left out."""
        head = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nContent-Length: 12\r\n"
                b"X-A: 1\r\nx-a:2\r\nETAG:  \"v\" \r\nConnection: keep-alive\r\nServer: e")
        self.assertEqual(self.parse(head), (
            200, b"OK",
            {b"Content-Type": [b"application/json"], b"X-A": [b"1", b"2"], b"ETag": [b'"v"'],
             b"Server": [b"e"]},
            12, LENGTH, 12, True))

    def test_framings(self) -> None:
        """Chunked, Content-Length, close-delimited, HEAD and no-body codes."""
        base = b"HTTP/1.1 200 OK\r\n"
        self.assertEqual(self.parse(base + b"Transfer-Encoding: gzip, Chunked")[3:],
                         (UNKNOWN_LENGTH, CHUNKED, 0, True))
        self.assertEqual(self.parse(base + b"Content-Length: 5, 5\r\nContent-Length: 5")[3:],
                         (5, LENGTH, 5, True))
        self.assertEqual(self.parse(base + b"X: y")[3:], (UNKNOWN_LENGTH, CLOSE, 0, False))
        self.assertEqual(self.parse(base + b"Content-Length: 7", isHead=True)[2:],
                         ({b"Content-Length": [b"7"]}, 0, LENGTH, 0, True))
        for code in (b"204", b"304"):
            self.assertEqual(self.parse(b"HTTP/1.1 %s X\r\nContent-Length: 7" % code)[3:5],
                             (0, LENGTH))

    def test_notReusable(self) -> None:
        """HTTP/1.0 and Connection: close (any case, any token position) are not reused."""
        for head in (b"HTTP/1.0 200 OK\r\nContent-Length: 0",
                     b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: x, Close"):
            self.assertFalse(self.parse(head)[6], head)

    def test_interim(self) -> None:
        """A 1xx head is an interim answer: None."""
        self.assertIsNone(self.parse(b"HTTP/1.1 100 Continue"))

    def test_continuation(self) -> None:
        """A continuation line extends the previous header's last value."""
        head = b"HTTP/1.1 200 OK\r\nX-A: a\r\n  b \r\n\tc\r\nContent-Length: 0"
        self.assertEqual(self.parse(head)[2], {b"X-A": [b"a b c"]})

    def test_malformed(self) -> None:
        """Bad status lines, header lines, names, lengths and codings are refused, also
        for names seen before in good lines."""
        parseHead(b"HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: 1", False)
        for head in (b"SSH-2.0", b"HTTP/1.1 2000 OK", b"HTTP/1.1", b"HTTP/1.1 abc",
                     b"HTTP/1.1 200 OK\r\n cont", b"HTTP/1.1 200 OK\r\nServer",
                     b"HTTP/1.1 200 OK\r\nContent-Length", b"HTTP/1.1 200 OK\r\nServer : x",
                     b"HTTP/1.1 200 OK\r\n: x", b"HTTP/1.1 200 OK\r\nBad Name: x",
                     b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2",
                     b"HTTP/1.1 200 OK\r\nContent-Length: -1",
                     b"HTTP/1.1 200 OK\r\nContent-Length: x",
                     b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip"):
            for _ in range(2):
                self.assertRaises((BadResponse, ValueError), parseHead, head, False)

    def test_splitHead(self) -> None:
        """The head ends at the first empty line, CRLF or bare LF; None until complete."""
        self.assertEqual(splitHead(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody"),
                         (b"HTTP/1.1 200 OK\r\nA: b", b"body"))
        self.assertEqual(splitHead(b"HTTP/1.1 200 OK\nA: b\n\nbody\r\n\r\n"),
                         (b"HTTP/1.1 200 OK\nA: b", b"body\r\n\r\n"))
        self.assertEqual(splitHead(b"HTTP/1.1 200 OK\r\nA: b\n\r\nbody"),
                         (b"HTTP/1.1 200 OK\r\nA: b", b"body"))
        self.assertIsNone(splitHead(b"HTTP/1.1 200 OK\r\nA: b\r\n"))
