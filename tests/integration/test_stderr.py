"""A reader that stops draining stderr never stalls the real process (``logoutlet``).

The proxy logs at debug, every request fails fast on a dead backend (one ``attempt-failed``
record each), and the test stops reading the process's stderr: far more log text than a
pipe holds is produced while every request is still answered at once.  Once stderr is read
again the records arrive, and at SIGTERM the process still writes its last ones and exits 0.
"""

from __future__ import annotations

import treq
from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.support.harness import freePort
from tests.support.standaloneharness import StandaloneProxy

REQUESTS = 1200  # ~200 bytes of debug log each: several times a pipe's 64 KiB
PARALLEL = 8


class BlockedStderrTests(TestCase):
    timeout = 60

    def test_servingWhileStderrIsNotRead(self) -> defer.Deferred[None]:
        return defer.Deferred.fromCoroutine(self._serving())

    async def _serving(self) -> None:
        dead = freePort()  # nothing listens: every attempt is refused at once
        proxy = StandaloneProxy(
            self,
            reactor,
            ["llamacpp"],
            [("llamacpp", f"http://127.0.0.1:{dead}")],
            extra=["--log-level", "debug"],
        )
        await proxy.start()
        pool = HTTPConnectionPool(reactor)
        self.addCleanup(pool.closeCachedConnections)
        url = proxy.url("llamacpp") + "/props"
        proxy.holdLog()
        codes: list[int] = []

        async def client(count: int) -> None:
            for _ in range(count):
                response = await treq.get(url, pool=pool)
                await treq.content(response)
                codes.append(response.code)

        await defer.gatherResults(
            [defer.Deferred.fromCoroutine(client(REQUESTS // PARALLEL)) for _ in range(PARALLEL)]
        )
        self.assertEqual(codes, [502] * REQUESTS)
        failedBefore = len(proxy.events("attempt-failed"))
        self.assertLess(failedBefore, REQUESTS, "stderr was held: most records still wait")

        proxy.releaseLog()
        await proxy.waitForLog(
            lambda r: (
                r.get("event") == "attempt-failed"
                and len(proxy.events("attempt-failed")) >= REQUESTS
            )
        )
        code = await proxy.stop()
        self.assertEqual(code, 0)
        self.assertEqual(len(proxy.events("attempt-failed")), REQUESTS)
        self.assertEqual(proxy.events("log-lines-dropped"), [])
        self.assertEqual(len(proxy.events("stopping")), 1, "the last records are written at exit")
