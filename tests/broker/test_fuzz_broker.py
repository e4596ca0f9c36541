"""Fuzzing the JSON-RPC channel (issue 8): a real ``ProxyService`` behind a ``BrokerChannel``.

Whatever arrives on stdin — arbitrary bytes, over-long lines, deep or huge JSON, wrong types
in every param of every message — the channel never raises, answers every request exactly
once with a result or a documented error (-32600, -32601, -32602, -32004, -32010), reports
everything else with ``errors:report`` (kind protocol), and keeps serving.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.broker.channel import BrokerChannel
from nvpair.proxy.options import Options
from nvpair.proxy.service import ProxyService
from nvpair.proxy.testing.wire import drainLines, sendLine
from tests.facade.facadekit import BusyReactor

DOCUMENTED = {-32600, -32601, -32602, -32004, -32010}
# Notifications the process may send while handling broker messages.
EXPECTED_NOTIFICATIONS = {"errors:report", "discovery:node-activity"}
ENGINES = ("ollama", "lmstudio", "llamacpp")

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

# Every message of protocol §4 with well-formed params.
VALID: dict[str, dict[str, Any]] = {
    "facade/enable": {
        "engine": "lmstudio",
        "port": 5001,
        "aliases": ["127.0.0.1:5002"],
        "ignorePersistedPort": True,
    },
    "node/set-priority": {
        "generation": 3,
        "order": ["a", "b"],
        "load": {"a": {"pending": 1, "gpuPressure": 0.5}},
    },
    "log/set-level": {"level": "debug"},
    "ollama:set-port": {"port": 5003},
    "ollama:discovery:nodes": {
        "nodes": [{"id": "a", "self": False, "addresses": ["http://127.0.0.1:9"], "models": ["m"]}]
    },
    "ollama:node/select": {"nodeId": "a"},
    "ollama:node/set-local-backend": {"url": "http://127.0.0.1:11435"},
}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place inside a params object where a value can be replaced."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(copy[path[0]], path[1:], new)
    return copy


MUTATIONS = [(method, path) for method, params in VALID.items() for path in _paths(params)]


class ChannelFuzzTests(SynchronousTestCase):
    """A ``BrokerChannel`` in front of a real ``ProxyService`` on a memory reactor."""

    def setUp(self) -> None:
        options = Options({})
        options.parseOptions(["--state-dir", tempfile.mkdtemp(prefix="nvpair-fuzz-")])
        assert options.settings is not None
        self.reactor = BusyReactor()
        self.service = ProxyService(options.settings, self.reactor)
        self.channel = BrokerChannel(self.service.handlers, lambda: None)
        self.service.sinks.target = self.channel
        self.transport = StringTransport()
        self.channel.makeConnection(self.transport)
        self.nextId = 1000
        self.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "facade/enable",
                "params": {"engine": "ollama", "port": 5000},
            }
        )
        out = self.output()
        self.assertIn("result", out[0], out)

    def send(self, data: bytes | dict[str, Any]) -> None:
        sendLine(self.channel, data)

    def output(self) -> list[dict[str, Any]]:
        """Every line written since the last call, each checked to be JSON-RPC 2.0."""
        raw, messages = drainLines(self.transport)
        self.assertTrue(raw == b"" or raw.endswith(b"\n"), raw[-100:])
        for m in messages:
            self.assertEqual(m.get("jsonrpc"), "2.0", m)
            if "id" in m and "method" not in m:
                if "error" in m:
                    self.assertIn(m["error"]["code"], DOCUMENTED, m)
                else:
                    self.assertIn("result", m)
            else:
                self.assertNotIn("id", m)
                method = m["method"]
                if method.endswith((":ready", ":discovery:subscribe", ":errors:report", ":error")):
                    continue
                self.assertIn(method, EXPECTED_NOTIFICATIONS, m)
                if method == "errors:report":
                    self.assertEqual(m["params"]["kind"], "protocol", m)
        return messages

    def assertServing(self) -> None:
        """A well-formed request still gets its answer."""
        self.nextId += 1
        self.send(
            {
                "jsonrpc": "2.0",
                "id": self.nextId,
                "method": "log/set-level",
                "params": {"level": "info"},
            }
        )
        answers = [m for m in self.output() if m.get("id") == self.nextId]
        self.assertEqual(
            answers, [{"jsonrpc": "2.0", "id": self.nextId, "result": {"level": "info"}}]
        )

    def requestAnswered(self, method: str, params: Any) -> dict[str, Any]:
        """Send one request; exactly one answer with its id comes back."""
        self.nextId += 1
        msgId = self.nextId
        self.channel.dataReceived(
            json.dumps({"jsonrpc": "2.0", "id": msgId, "method": method, "params": params}).encode()
            + b"\n"
        )
        answers = [m for m in self.output() if m.get("id") == msgId]
        self.assertEqual(len(answers), 1, (method, params, answers))
        return answers[0]

    @FUZZ
    @given(st.binary(max_size=400))
    def test_arbitraryBytes(self, data: bytes) -> None:
        """Arbitrary bytes, terminated by a newline, never break the channel."""
        self.send(data + b"\n")
        self.output()
        self.assertServing()

    @FUZZ
    @given(st.lists(st.binary(max_size=60), max_size=8))
    def test_arbitraryChunking(self, chunks: list[bytes]) -> None:
        """Bytes split anywhere (partial lines, several lines per chunk) never break it."""
        for chunk in chunks:
            self.send(chunk)
        self.send(b"\n")
        self.output()
        self.assertServing()

    @FUZZ
    @given(st.sampled_from(MUTATIONS), json_values)
    def test_wrongTypesInEveryParam(
        self, mutation: tuple[str, tuple[Any, ...]], value: Any
    ) -> None:
        """Any value in any param of any message: a result or a documented error, once."""
        method, path = mutation
        params = _replace(VALID[method], path, value)
        answer = self.requestAnswered(method, params)
        if "error" in answer:
            self.assertIn(answer["error"]["code"], DOCUMENTED, answer)
        self.assertServing()

    @FUZZ
    @given(st.sampled_from(sorted(VALID)), json_values)
    def test_paramsOfAnyShape(self, method: str, params: Any) -> None:
        """Params that are not even an object get -32602, never a crash."""
        answer = self.requestAnswered(method, params)
        if not isinstance(params, dict) and params is not None:
            self.assertEqual(answer["error"]["code"], -32602, answer)
        self.assertServing()

    @FUZZ
    @given(st.text(max_size=40), json_values, st.booleans())
    def test_anyMethod(self, method: str, params: Any, asNotification: bool) -> None:
        """Any method name, as a request or a notification: documented error or report only."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if asNotification:
            self.send(message)
            for m in self.output():
                self.assertNotIn("id", m)
        else:
            self.requestAnswered(method, params)
        self.assertServing()

    @FUZZ
    @given(
        st.dictionaries(
            st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error"]),
            json_values,
            max_size=5,
        )
    )
    def test_envelopeFields(self, message: dict[str, Any]) -> None:
        """Any envelope (odd ids, responses from the broker, missing method) is survived."""
        self.send(message)
        out = self.output()
        self.assertLessEqual(len([m for m in out if "id" in m]), 1, out)
        self.assertServing()

    def test_notificationsWithBadParamsAreReported(self) -> None:
        """A notification with bad params gets only an ``errors:report``, naming no value."""
        for method, path in MUTATIONS:
            params = _replace(VALID[method], path, {"secret": "CANARY-x"})
            self.send({"jsonrpc": "2.0", "method": method, "params": params})
            for m in self.output():
                self.assertNotIn("id", m)
                self.assertNotIn("CANARY-x", json.dumps(m))
        self.assertServing()

    def test_lineOverTheLimit(self) -> None:
        """A line over 1 MiB is dropped and reported once; the next line is served."""
        self.send(
            b'{"jsonrpc":"2.0","id":5,"method":"log/set-level","params":{"x":"'
            + b"a" * (1 << 20)
            + b'"}}\n'
        )
        out = self.output()
        self.assertEqual([m["method"] for m in out], ["errors:report"])
        self.assertServing()
        # arriving in small pieces
        for _ in range(300):
            self.send(b"b" * 4096)
        self.send(b"\n")
        self.assertEqual([m["method"] for m in self.output()], ["errors:report"])
        self.assertServing()

    def test_deepJSON(self) -> None:
        """Deeply nested JSON (past the parser's recursion limit) is reported, not fatal."""
        for depth in (100, 1000, 100_000):
            self.send(b"[" * depth + b"]" * depth + b"\n")
            self.output()
            nested = b'{"a":' * depth + b"1" + b"}" * depth
            self.send(
                b'{"jsonrpc":"2.0","id":9,"method":"ollama:discovery:nodes","params":'
                + nested
                + b"}\n"
            )
            self.output()
            self.assertServing()

    def test_hugeJSON(self) -> None:
        """A line just under the limit with a huge valid document is handled normally."""
        nodes = [
            {"id": f"n{i}", "addresses": ["http://127.0.0.1:9"], "models": ["m"] * 20}
            for i in range(2000)
        ]
        line = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 77,
                "method": "ollama:discovery:nodes",
                "params": {"nodes": nodes},
            }
        ).encode()
        self.assertLess(len(line), 1 << 20)
        self.send(line + b"\n")
        self.assertEqual(
            [m for m in self.output() if m.get("id") == 77],
            [{"jsonrpc": "2.0", "id": 77, "result": {}}],
        )
        self.assertEqual(len(self.service.facades["ollama"].snapshot.nodes), 2000)
        self.assertServing()
