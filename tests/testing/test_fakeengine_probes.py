"""The fake engine and the proxy's engine-state probes (spec §11.2)."""

from __future__ import annotations

import treq

from nvpair.proxy.testing.fakeengine import Status
from tests.support.cases.enginecase import CHAT, EngineTestCase


class StateProbeTests(EngineTestCase):
    """A fake engine has no state endpoints, and polls of them leave its script alone."""

    async def test_stateProbesNotScripted(self) -> None:
        """The proxy's engine-state probes get 404 (no such endpoint) without taking a
        scripted behaviour or being recorded, so they cannot race a test's script."""
        self.engine.script(Status(503))
        for path in ("/slots", "/metrics", "/api/ps"):
            probe = await self.http.get(self.engine.url + path)
            await treq.content(probe)
            self.assertEqual(probe.code, 404)
        self.assertEqual((self.engine.requests, self.engine.requestCount), ([], 0))
        answer = await self.post("/v1/chat/completions", CHAT)
        await treq.content(answer)
        self.assertEqual(answer.code, 503)
