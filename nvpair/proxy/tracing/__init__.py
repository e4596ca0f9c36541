"""OpenTelemetry traces (``--otel``): the seam (``interfaces``) the request path calls, and the
implementation over the OpenTelemetry SDK (``spans``, ``setup``), imported only when on."""

TRUE = ("1", "true", "yes", "on")  # values of NVPAIR_PROXY_OTEL that turn tracing on


def available() -> bool:
    """Whether the ``otel`` extra is installed (its SDK and OTLP exporter import); imports
    them, so it is asked only when tracing is wanted."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True
