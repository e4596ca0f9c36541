"""Loading and unloading models through the engines' own APIs, only where the fleet file says
so (protocol §9; spec §11, "Model residency"); standalone mode only.

* **Preload**: at start and after every applied reload, each backend's ``preload`` models
  are loaded one after the other (``modelapi``), each once its residency is known: a model
  the node holds (or is loading) is skipped; one it does not is loaded.  While the engine's
  state stays unknown (``KNOWN_WAIT`` s at most, asking every ``KNOWN_POLL`` s) an engine
  whose load is harmless to repeat is asked anyway, LM Studio (a second instance) is not.
  A transport failure, a time-out or a 5xx is tried again after ``RETRY_FIRST`` s, doubling
  up to ``RETRY_MAX``, at most ``ATTEMPTS`` times; a refusal (404: no such route or model)
  is logged once and the next model goes on.  A load that answers once done (Ollama, LM
  Studio) tells the residency view it is done and what it took.
* **Unload**: ``unload(node, model)`` is offered to placement and does something only for a
  backend with ``unload_idle = true``, and only while none of our requests run on that
  model there; never otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.application.service import IServiceCollection, Service
from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nvpair.proxy.facade.fleet import collect
from nvpair.proxy.facade.fleetfile import Backend
from nvpair.proxy.facade.modelapi import MODEL_APIS, ApiCall, ModelApi, Outcome, loadSeconds
from nvpair.proxy.facade.reload import IFleetFollower
from nvpair.proxy.interfaces import IUpstream
from nvpair.proxy.nodestate.interfaces import IModelActions, ModelState
from nvpair.proxy.nodestate.residency import Residency
from nvpair.proxy.routing.nodes import Node

SERVICE_NAME = "model-actions"
LOAD_TIMEOUT = 900.0  # a load answered once done: a large model from a slow disk
CALL_TIMEOUT = 30.0
RETRY_FIRST = 5.0
RETRY_MAX = 60.0
ATTEMPTS = 8
KNOWN_POLL = 1.0
KNOWN_WAIT = 30.0
MAX_ANSWER = 65536
_JSON = Headers({b"content-type": [b"application/json"]})


@implementer(IFleetFollower)
class _Follower:
    """One engine's fleet, followed for the actor."""

    def __init__(self, actor: ModelActions, engineId: str) -> None:
        self.actor = actor
        self.engineId = engineId

    def setBackends(self, backends: Sequence[Backend]) -> None:
        self.actor.setBackends(self.engineId, backends)


@implementer(IModelActions)
class ModelActions(Service):
    """Preloads and unloads through the engines' APIs (the module docstring says when)."""

    log = Logger()
    name = SERVICE_NAME

    def __init__(self, upstream: IUpstream, clock: IReactorTime, residency: Residency) -> None:
        self.upstream = upstream
        self.clock = clock
        self.residency = residency
        self.backends: dict[str, Backend] = {}  # url -> backend, every engine
        self._preloading: dict[str, defer.Deferred[None]] = {}
        self.preloaded = 0  # loads this actor got done
        self.unloaded = 0

    def follower(self, engineId: str) -> IFleetFollower:
        """The fleet follower to register for ``engineId`` (``FleetReloader.follow``)."""
        return _Follower(self, engineId)

    def setBackends(self, engineId: str, backends: Sequence[Backend]) -> None:
        """``engineId``'s backends are now ``backends``: preload theirs again."""
        for url in [u for u, b in self.backends.items() if b.engine == engineId]:
            del self.backends[url]
            self._stopPreload(url)
        for backend in backends:
            self.backends[backend.url] = backend
        if self.running:
            for backend in backends:
                self._startPreload(backend)

    def startService(self) -> None:
        """Preload every backend's models."""
        super().startService()
        for backend in list(self.backends.values()):
            self._startPreload(backend)

    def stopService(self) -> None:
        """Abandon the preloads under way."""
        super().stopService()
        for url in list(self._preloading):
            self._stopPreload(url)

    def _startPreload(self, backend: Backend) -> None:
        self._stopPreload(backend.url)
        api = MODEL_APIS.get(backend.engine)
        if not backend.preload or api is None:
            return
        d = defer.Deferred.fromCoroutine(self._preload(backend, api))
        self._preloading[backend.url] = d

        def ended(result: object) -> None:
            if self._preloading.get(backend.url) is d:
                del self._preloading[backend.url]

        d.addErrback(lambda f: f.trap(defer.CancelledError)).addBoth(ended)

    def _stopPreload(self, url: str) -> None:
        d = self._preloading.pop(url, None)
        if d is not None:
            d.cancel()

    async def _preload(self, backend: Backend, api: ModelApi) -> None:
        for model in backend.preload:
            state = await self._known(backend.url, model)
            if state in (ModelState.LOADED, ModelState.LOADING, ModelState.SLEEPING):
                continue
            if state is ModelState.UNKNOWN and not api.idempotent:
                self.log.warn("model-preload-skipped", url=backend.url, model=model,
                              reason="the engine's models are not known")  # fmt: skip
                continue
            await self._load(backend, api, model)

    async def _known(self, url: str, model: str) -> ModelState:
        """The model's state once known (at most ``KNOWN_WAIT`` s of waiting)."""
        waited = 0.0
        while True:
            state = self.residency.state(url, model)
            if state is not ModelState.UNKNOWN or waited >= KNOWN_WAIT:
                return state
            await task.deferLater(self.clock, KNOWN_POLL)
            waited += KNOWN_POLL

    async def _load(self, backend: Backend, api: ModelApi, model: str) -> None:
        delay = RETRY_FIRST
        for attempt in range(1, ATTEMPTS + 1):
            started = self.clock.seconds()
            self.residency.loadStarted(backend.url, model)
            timeout = CALL_TIMEOUT if api.asynchronous else LOAD_TIMEOUT
            status, body, problem = await self._call(backend.url, api.load(model), timeout)
            outcome = Outcome.RETRY if status is None else api.outcome(status)
            if outcome is Outcome.DONE:
                self.preloaded += 1
                if not api.asynchronous:
                    seconds = loadSeconds(body)
                    took = self.clock.seconds() - started if seconds is None else seconds
                    self.residency.loadDone(backend.url, model, took)
                self.log.info("model-preloaded", url=backend.url, model=model,
                              asynchronous=api.asynchronous)  # fmt: skip
                return
            self.residency.loadDone(backend.url, model)  # not loading after all
            if outcome is Outcome.REFUSED:
                self.log.warn("model-preload-refused", url=backend.url, model=model,
                              status=status)  # fmt: skip
                return
            if attempt == ATTEMPTS:
                break
            await task.deferLater(self.clock, delay)
            delay = min(RETRY_MAX, delay * 2)
        self.log.warn("model-preload-failed", url=backend.url, model=model,
                      attempts=ATTEMPTS, problem=problem or f"status {status}")  # fmt: skip

    async def _call(self, url: str, call: ApiCall, timeout: float) -> tuple[int | None, bytes, str]:
        """Send ``call`` to the engine at ``url``: (status, body, "") or (None, b"", why)."""
        node = Node(url, False, (url,), frozenset())

        async def exchange() -> tuple[int, bytes]:
            response = await self.upstream.request(
                node, url, call.method, call.path, _JSON.copy(), call.body
            )
            return response.code, await collect(response, MAX_ANSWER)

        d = defer.Deferred.fromCoroutine(exchange()).addTimeout(timeout, self.clock)
        try:
            status, body = await d
        except defer.CancelledError:
            raise
        except defer.TimeoutError:
            return None, b"", "timed out"
        except Exception as e:  # the engine is down, or answered too much
            return None, b"", type(e).__name__
        return status, body, ""

    def allowsUnload(self, nodeId: str) -> bool:
        """Whether the fleet file lets the proxy unload models on ``nodeId``."""
        backend = self.backends.get(nodeId)
        return backend is not None and backend.unloadIdle and backend.engine in MODEL_APIS

    def unload(self, nodeId: str, model: str) -> defer.Deferred[bool]:
        """Unload ``model`` on ``nodeId`` if the fleet file allows it there and none of our
        requests run on it; fires with whether the engine did (or had nothing to do)."""
        if not self.allowsUnload(nodeId) or self.residency.running(nodeId, model):
            return defer.succeed(False)
        return defer.Deferred.fromCoroutine(self._unload(nodeId, model))

    async def _unload(self, nodeId: str, model: str) -> bool:
        backend = self.backends[nodeId]
        api = MODEL_APIS[backend.engine]
        call = api.unload(model, self.residency.instance(nodeId, model))
        self.residency.unloadAsked(nodeId, model)
        status, _, problem = await self._call(nodeId, call, CALL_TIMEOUT)
        done = status is not None and api.outcome(status) is Outcome.DONE
        if done:
            self.unloaded += 1
        self.log.info("model-unload", url=nodeId, model=model, done=done,
                      problem=problem or f"status {status}")  # fmt: skip
        return done

    def status(self) -> dict[str, object]:
        """``/status``: what the fleet file allows, and what was done."""
        return {
            "preload": {u: list(b.preload) for u, b in sorted(self.backends.items()) if b.preload},
            "unloadIdle": sorted(u for u in self.backends if self.allowsUnload(u)),
            "preloading": sorted(self._preloading),
            "preloaded": self.preloaded,
            "unloaded": self.unloaded,
        }


def findModelActions(services: IServiceCollection) -> ModelActions | None:
    """The process's model actions (standalone), if it runs them."""
    try:
        service = services.getServiceNamed(SERVICE_NAME)
    except KeyError:
        return None
    return service if isinstance(service, ModelActions) else None
