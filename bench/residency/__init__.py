"""The residency benchmark (``python -m bench.residency``): more models in use than the fleet
holds, Zipf popularity; routers compared by the loads they cause and their time to first
token (issue 33)."""
