"""The broker's side of the proxy process, as a library: spawn it, talk JSON-RPC over its stdio,
replay state.
"""
