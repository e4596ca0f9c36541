"""The ``nvpair-proxy`` console command is the same process as ``twistd -n nvpair-proxy``.

Each test runs the installed command (beside this interpreter, as pip puts it) the way the
broker or a user would, and where the contract fixes an output, runs twistd the same way
and compares.
"""

from __future__ import annotations

import os
import signal

import treq
from twisted.internet import reactor
from twisted.trial.unittest import TestCase

from tests.support.cases.command import COMMAND, TWISTD, run
from tests.support.harness import ProxyFixture, freePort


class ConsoleCommandTests(TestCase):
    timeout = 90

    async def started(self) -> ProxyFixture:
        """The command spawned as the broker spawns the proxy (stdin and stdout the
        JSON-RPC channel), brought up with the supervisor's handshake."""
        proxy = ProxyFixture(self, reactor)
        args = proxy.process.command[proxy.process.command.index("nvpair-proxy") + 1 :]
        proxy.process.executable = COMMAND
        proxy.process.command = [COMMAND, *args]
        await proxy.start()
        return proxy

    async def test_underBroker(self) -> None:
        """The broker's channel works through the command: a facade enables and answers
        through admission, the stdout channel stays JSON-RPC only, the log is JSON on
        stderr (twistd's start-up record names the proxy's reactor), stdin EOF ends it with
        status 0 and no pidfile is left behind."""
        proxy = await self.started()
        port = freePort()
        result = await proxy.request("facade/enable", {"engine": "llamacpp", "port": port})
        self.assertEqual(result, {"engine": "llamacpp", "port": port, "aliases": []})
        response = await treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m1", "messages": []},
            persistent=False,
        )
        self.assertEqual(response.code, 502)
        self.assertEqual((await response.json())["error"]["code"], "no_owner")
        self.assertEqual(await proxy.process.stop(5.0), 0)
        self.assertEqual(proxy.protocolErrors, [])
        records = await proxy.someLogs()
        self.assertTrue(all(r.get("component") == "nvpair-proxy" for r in records), records)
        reactors = {r["reactor"] for r in records if "reactor" in r}
        self.assertEqual(reactors, {"nvpair.proxy.runtime.eventloop.ProxyReactor"})
        self.assertEqual(os.listdir(proxy.workDir), [])

    async def test_sigterm(self) -> None:
        """SIGTERM ends the command with status 0, as it ends twistd."""
        proxy = await self.started()
        pid = proxy.process.pid
        assert pid is not None
        exited = proxy.process.whenExited()
        os.kill(pid, signal.SIGTERM)
        self.assertEqual(await exited, 0)

    async def test_malformedOptionAsTwistd(self) -> None:
        """A malformed option: status 2, the same single stderr line as twistd's, nothing on
        stdout, nothing left in the working directory."""
        bad = "--dial-timeout=abc"
        mine = await run(COMMAND, [bad])
        theirs = await run(TWISTD, ["-n", "--pidfile=", "nvpair-proxy", bad])
        self.assertEqual(mine, theirs)
        out, err, code, left = mine
        self.assertEqual((out, code, left), (b"", 2, []))
        self.assertEqual(len(err.decode().splitlines()), 1)
        self.assertIn("dial-timeout", err.decode())

    async def test_reactorPlugin(self) -> None:
        """twistd lists the proxy's reactor by name, from the project's plugin."""
        out, err, code, _ = await run(TWISTD, ["--help-reactors"])
        self.assertEqual(code, 0, err)
        names = {line.split()[0] for line in out.decode().splitlines() if line.strip()}
        self.assertIn("nvpair", names)

    async def test_helpAsTwistd(self) -> None:
        """``--help`` prints the plugin's option list, the same text twistd prints."""
        mine = await run(COMMAND, ["--help"])
        theirs = await run(TWISTD, ["-n", "--pidfile=", "nvpair-proxy", "--help"])
        self.assertEqual(mine, theirs)
        self.assertIn("--stream-idle-timeout", mine[0].decode())
        self.assertEqual(mine[2], 0)
