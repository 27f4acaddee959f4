"""Health and Prometheus metrics for `memfabric serve` and the workers, on 127.0.0.1 only.

GET /healthz answers "ok"; GET /metrics answers the Prometheus text format. A metric is a
name and a callable read at scrape time; a callable that fails is counted, not fatal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Gauge = Callable[[], float]


def metrics_port(option: int | None) -> int | None:
    if option is not None:
        return option
    from memfabric.settings import Settings

    return Settings.from_env().metrics_port


def render(metrics: dict[str, tuple[str, str, Gauge]]) -> str:
    """name -> (type, help, read) as Prometheus exposition text."""
    lines: list[str] = []
    failed = 0
    for name, (kind, text, read) in sorted(metrics.items()):
        try:
            value = float(read())
        except Exception:
            failed += 1
            continue
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value:g}"]
    lines += [
        "# HELP memfabric_metric_read_errors metrics that could not be read at this scrape",
        "# TYPE memfabric_metric_read_errors gauge",
        f"memfabric_metric_read_errors {failed}",
    ]
    return "\n".join(lines) + "\n"


def serve_metrics(port: int, metrics: dict[str, tuple[str, str, Gauge]]) -> ThreadingHTTPServer:
    """Start the endpoint on 127.0.0.1:`port` (0 picks a free port) in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                body, ctype = b"ok\n", "text/plain"
            elif self.path == "/metrics":
                body, ctype = render(metrics).encode(), "text/plain; version=0.0.4"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="memfabric-metrics").start()
    return server
