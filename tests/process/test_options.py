"""Command-line options (protocol §1): every option, env fallback, durations, exit 2."""

from __future__ import annotations

import os
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.options import STANDALONE_OPS_PORT, Options, parseDuration
from tests.support.cases.optionparse import Capture, parse

# (flag, env var, a valid text, its parsed value, Settings field, a malformed text)
VALUED: list[tuple[str, str, str, Any, str, str]] = [
    ("state-dir", "NVPAIR_STATE_DIR", "/tmp/s", "/tmp/s", "stateDir", ""),
    ("cluster-dir", "NVPAIR_CLUSTER_DIR", "/tmp/c", "/tmp/c", "clusterDir", ""),
    (
        "response-header-timeout",
        "NVPAIR_PROXY_RESPONSE_HEADER_TIMEOUT",
        "90s",
        90.0,
        "responseHeaderTimeout",
        "soon",
    ),
    ("job-deadline", "NVPAIR_PROXY_JOB_DEADLINE", "2m", 120.0, "jobDeadline", "10x"),
    ("dial-timeout", "NVPAIR_PROXY_DIAL_TIMEOUT", "1.5", 1.5, "dialTimeout", "abc"),
    (
        "max-dispatch-attempts",
        "NVPAIR_PROXY_MAX_DISPATCH_ATTEMPTS",
        "3",
        3,
        "maxDispatchAttempts",
        "three",
    ),
    ("backoff-base", "NVPAIR_PROXY_BACKOFF_BASE", "100ms", 0.1, "backoffBase", "-1s"),
    ("backoff-max", "NVPAIR_PROXY_BACKOFF_MAX", "1h", 3600.0, "backoffMax", "1d"),
    (
        "client-write-timeout",
        "NVPAIR_PROXY_CLIENT_WRITE_TIMEOUT",
        "5s",
        5.0,
        "clientWriteTimeout",
        "s",
    ),
    ("retry-after", "NVPAIR_PROXY_RETRY_AFTER", "7", 7, "retryAfter", "1.5"),
    ("max-body", "NVPAIR_PROXY_MAX_BODY", "1024", 1024, "maxBody", "1k"),
    ("log-level", "NVPAIR_LOG_LEVEL", "debug", "debug", "logLevel", "loud"),
    ("ops-port", "NVPAIR_PROXY_OPS_PORT", "9999", 9999, "opsPort", "70000"),
]

DEFAULTS = {
    "responseHeaderTimeout": 1800.0,
    "jobDeadline": 600.0,
    "dialTimeout": 10.0,
    "maxDispatchAttempts": 5,
    "backoffBase": 0.25,
    "backoffMax": 5.0,
    "clientWriteTimeout": 60.0,
    "retryAfter": 10,
    "maxBody": 67108864,
    "logLevel": "info",
    "clusterDir": None,
    "opsPort": None,
    "standalone": False,
    "backends": (),
    "engines": ("ollama", "lmstudio", "llamacpp"),
}


class DurationTests(SynchronousTestCase):
    """``parseDuration`` accepts bare seconds and ms/s/m/h suffixes only."""

    def test_forms(self) -> None:
        """Each documented form parses to seconds."""
        cases = {
            "1.5": 1.5,
            "250ms": 0.25,
            "10s": 10.0,
            "30m": 1800.0,
            "1h": 3600.0,
            "0": 0.0,
            "2": 2.0,
            ".5": 0.5,
        }
        for text, seconds in cases.items():
            self.assertAlmostEqual(parseDuration(text), seconds, msg=text)

    def test_malformed(self) -> None:
        """Anything else is a ValueError."""
        for text in ("", "abc", "10x", "-1", "1e3", "s", "10 minutes", "1d", "1.2.3"):
            self.assertRaises(ValueError, parseDuration, text)


class OptionTests(SynchronousTestCase):
    """Every option of §1: default, flag, env fallback, flag precedence, malformed → exit 2."""

    def test_defaults(self) -> None:
        """With no flag and no environment every option takes the documented default."""
        settings = parse([])
        for field, value in DEFAULTS.items():
            self.assertEqual(getattr(settings, field), value, field)
        self.assertEqual(settings.stateDir, os.path.expanduser("~/.nvpair"))

    def test_flags(self) -> None:
        """Each valued option is read from its flag."""
        for flag, _env, text, value, field, _bad in VALUED:
            settings = parse([f"--{flag}", text])
            self.assertEqual(getattr(settings, field), value, flag)

    def test_environment(self) -> None:
        """Each valued option falls back to its environment variable."""
        for flag, env, text, value, field, _bad in VALUED:
            settings = parse([], {env: text})
            self.assertEqual(getattr(settings, field), value, flag)

    def test_flagWins(self) -> None:
        """When both are given, the flag wins over the environment."""
        settings = parse(
            ["--dial-timeout", "3s", "--max-body=5"],
            {"NVPAIR_PROXY_DIAL_TIMEOUT": "9s", "NVPAIR_PROXY_MAX_BODY": "7"},
        )
        self.assertEqual(settings.dialTimeout, 3.0)
        self.assertEqual(settings.maxBody, 5)

    def test_emptyEnvironmentIgnored(self) -> None:
        """An empty environment variable is as good as unset."""
        self.assertEqual(parse([], {"NVPAIR_PROXY_DIAL_TIMEOUT": ""}).dialTimeout, 10.0)

    def test_zeroResponseTimeout(self) -> None:
        """``--response-header-timeout 0`` is accepted (it disables both caps)."""
        self.assertEqual(parse(["--response-header-timeout", "0"]).responseHeaderTimeout, 0.0)

    def test_malformedFlag(self) -> None:
        """A malformed flag value exits 2 with one stderr line naming it and nothing on stdout."""
        for flag, _env, _text, _value, _field, bad in VALUED:
            if not bad:
                continue
            capture = Capture(self)
            with self.assertRaises(SystemExit) as cm:
                parse([f"--{flag}={bad}"])
            self.assertEqual(cm.exception.code, 2, flag)
            lines = capture.stderr.getvalue().splitlines()
            self.assertEqual(len(lines), 1, flag)
            self.assertIn(f"--{flag}", lines[0])
            self.assertEqual(capture.stdout.getvalue(), "")

    def test_malformedEnvironment(self) -> None:
        """A malformed environment value exits 2 naming the option (and the variable)."""
        for flag, env, _text, _value, _field, bad in VALUED:
            if not bad:
                continue
            capture = Capture(self)
            with self.assertRaises(SystemExit) as cm:
                parse([], {env: bad})
            self.assertEqual(cm.exception.code, 2, flag)
            line = capture.stderr.getvalue()
            self.assertEqual(len(line.splitlines()), 1)
            self.assertIn(f"--{flag}", line)
            self.assertIn(env, line)
            self.assertEqual(capture.stdout.getvalue(), "")

    def test_unknownOption(self) -> None:
        """An unknown flag, or a valued flag without its value, exits 2 (not twistd's exit 1)."""
        for argv in (["--bogus"], ["--max-body"], ["stray"]):
            capture = Capture(self)
            with self.assertRaises(SystemExit) as cm:
                parse(argv)
            self.assertEqual(cm.exception.code, 2, argv)
            self.assertEqual(len(capture.stderr.getvalue().splitlines()), 1)
            self.assertEqual(capture.stdout.getvalue(), "")

    def test_logLevelWarning(self) -> None:
        """``warning`` is taken as ``warn`` and levels are case-insensitive."""
        self.assertEqual(parse(["--log-level", "WARNING"]).logLevel, "warn")
        self.assertEqual(parse(["--log-level", "Error"]).logLevel, "error")

    def test_opsPort(self) -> None:
        """The ops listener is off under a broker, on a default port standalone, 0 turns it off."""
        self.assertIsNone(parse([]).opsPort)
        self.assertEqual(parse(["--standalone"]).opsPort, STANDALONE_OPS_PORT)
        self.assertIsNone(parse(["--standalone", "--ops-port", "0"]).opsPort)
        self.assertEqual(parse(["--ops-port", "1234"]).opsPort, 1234)

    def test_standaloneBackendsAndEngines(self) -> None:
        """``--backend`` repeats in order and ``--engines`` picks facades."""
        settings = parse(
            [
                "--standalone",
                "--backend",
                "ollama=http://h1:1/",
                "--backend",
                "ollama=http://h2:2",
                "--engines",
                "llamacpp,ollama",
            ]
        )
        self.assertTrue(settings.standalone)
        self.assertEqual(settings.backends, (("ollama", "http://h1:1"), ("ollama", "http://h2:2")))
        self.assertEqual(settings.engines, ("llamacpp", "ollama"))

    def test_badBackendAndEngines(self) -> None:
        """A malformed ``--backend`` or ``--engines`` exits 2 naming the option."""
        cases = [
            (["--standalone", "--backend", "vllm=http://h:1"], "--backend"),
            (["--standalone", "--backend", "ollama"], "--backend"),
            (["--standalone", "--backend", "ollama=https://h:1"], "--backend"),
            (["--standalone", "--engines", "ollama,vllm"], "--engines"),
            (["--standalone", "--engines", ","], "--engines"),
            (["--backend", "ollama=http://h:1"], "--backend"),
        ]
        for argv, name in cases:
            capture = Capture(self)
            with self.assertRaises(SystemExit) as cm:
                parse(argv)
            self.assertEqual(cm.exception.code, 2, argv)
            self.assertIn(name, capture.stderr.getvalue())
            self.assertEqual(len(capture.stderr.getvalue().splitlines()), 1)

    def test_helpListsEveryOption(self) -> None:
        """The usage text names every option of §1."""
        text = str(Options({}))
        for flag, *_ in VALUED:
            self.assertIn(f"--{flag}", text)
        for flag in ("--standalone", "--backend", "--engines"):
            self.assertIn(flag, text)
