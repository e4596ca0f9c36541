"""nvpair-proxy: the data plane that carries inference to the node that should serve it."""
