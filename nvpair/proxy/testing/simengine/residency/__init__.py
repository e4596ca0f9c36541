"""How a simulated engine holds models (``model``: installed, resident, serial loads,
idle-only LRU eviction, keep-alive) and the engines' own routes to manage them
(``routes``: Ollama's load and unload requests and ``/api/ps``, llama-server's router
mode, LM Studio's v1 REST API); spec §16."""
