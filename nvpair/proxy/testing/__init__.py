"""nvpair-proxy's testing kit: fakes and helpers for testing the proxy and what talks to it.

Installed with the project (like ``treq.testing``), never imported by the proxy itself:

* ``fakeengine``: a scriptable fake inference engine in the Ollama and OpenAI-style
  dialects (llama.cpp, vLLM, LM Studio routes), with scripted faults (status answers,
  hangs, slow first bytes, streams that die, dropped connections); in process, or as a
  process with ``python -m nvpair.proxy.testing.fakeengine``;
* ``certs``: self-signed node certificates and cluster directories;
* ``wire``: in-memory HTTP exchanges with a facade site and JSON lines to and from a broker
  channel, and a TCP ``StringTransport`` for the proxy's listeners;
* ``upstreamspy``: the connector to nodes as a spy (``upstreamSpy(clock)`` returns an
  ``IUpstream`` and the list of frozen ``UpstreamCall`` records the test answers);
* ``fakecontext``: the request context (``FakeContext``, an ``IRequestContext`` recording its
  reports), the settings defaults, a recording broker sink, and ``ExchangeReport``.
"""
