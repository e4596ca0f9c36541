"""The placement benchmark: seeded workloads through each router, on fresh engines.

``python -m bench.routing`` (see ``__main__`` and ``options``) starts simulated llama.cpp
engines (``nvpair.proxy.testing.simengine``) or real llama-servers (``llamaserver``), fresh
for each router, replays one workload through each router in turn and writes its section of
``bench/RESULTS.md``. The workloads: ``workload`` (multi-tenant chat, replayed by
``client``), ``agents`` (apps' agents over Messages, replayed by ``messages``) and
``freeslot`` (routed requests beside direct clients); ``routers`` starts each router and the
engines; ``direct`` measures waits inside engines; ``report`` and ``sections`` write the
figures.
"""
