"""``twistd nvpair-proxy``: the service maker (options in ``options``, the process in ``service``)."""

from __future__ import annotations

from typing import Any

from twisted.application.service import IService

from nvpair.proxy.options import Options
from nvpair.proxy.service import ProxyService, stderrStream

__all__ = ["Options", "makeService"]


def makeService(options: Options) -> IService:
    """Build the process's service tree from parsed options."""
    from twisted.internet import reactor

    settings = options.settings
    assert settings is not None
    trust: Any = None
    if settings.clusterDir is not None:
        from nvpair.proxy.cluster import ClusterTrust

        service: list[ProxyService] = []
        trust = ClusterTrust(
            settings.clusterDir, reactor, lambda message: service[0].clusterProblem(message)
        )
        proxy = ProxyService(settings, reactor, stderrStream(), trust)
        service.append(proxy)
        return proxy
    return ProxyService(settings, reactor, stderrStream(), trust)
