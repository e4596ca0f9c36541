"""OpenTelemetry traces (``--otel``): the seam (``interfaces``) the request path calls, and the
implementation over the OpenTelemetry SDK (``spans``, ``setup``), imported only when on."""
