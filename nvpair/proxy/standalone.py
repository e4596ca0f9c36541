"""Standalone mode (protocol §9): facades without a broker, fleets of direct engines."""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from nvpair.proxy.engines import ENGINES
from nvpair.proxy.facade import BindError

log = Logger()


def startStandalone(service: Any) -> None:
    """Enable the facades named by ``--engines`` on their standalone ports."""
    for engineId in service.settings.engines:
        engine = ENGINES[engineId]
        try:
            service.enableFacade(engine, engine.standalonePort, [], False)
        except BindError as e:
            log.error("bind-failed", engine=engineId, port=e.port, reason=e.reason)
