"""Health and Prometheus metrics for `memfabric serve` and the workers, on 127.0.0.1 only.

GET /healthz answers "ok"; GET /metrics answers the Prometheus text format. A metric is a
name and a callable read at scrape time; a callable that fails is counted, not fatal.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Gauge = Callable[[], float]
# A family of labelled samples, rendered whole at scrape time (e.g. RecallCounters).
Family = Callable[[], str]
# Recall latency buckets, in seconds (the database's own time for the recall).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class RecallCounters:
    """Per-tenant recall counters (by outcome: served, partial, empty, denied; and by mode)
    and latency histograms, fed from the audit: each recall event the tracer exports is
    observed once, after its export succeeded. Counters start at zero with the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str, str], int] = defaultdict(int)
        self._buckets: dict[str, list[int]] = {}
        self._sums: dict[str, float] = defaultdict(float)
        self._totals: dict[str, int] = defaultdict(int)

    def observe(self, tenant: str, outcome: str, mode: str, duration_ms: float | None) -> None:
        with self._lock:
            self._counts[(tenant, outcome, mode)] += 1
            if duration_ms is None:
                return
            seconds = float(duration_ms) / 1000
            buckets = self._buckets.setdefault(tenant, [0] * len(LATENCY_BUCKETS))
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    buckets[i] += 1
            self._sums[tenant] += seconds
            self._totals[tenant] += 1

    def exposition(self) -> str:
        with self._lock:
            lines = [
                "# HELP memfabric_recalls_total recalls answered, by tenant, outcome and mode",
                "# TYPE memfabric_recalls_total counter",
            ]
            for (tenant, outcome, mode), n in sorted(self._counts.items()):
                lines.append(
                    f'memfabric_recalls_total{{tenant="{_label(tenant)}",'
                    f'outcome="{_label(outcome)}",mode="{_label(mode)}"}} {n}'
                )
            lines += [
                "# HELP memfabric_recall_duration_seconds the database's time per recall",
                "# TYPE memfabric_recall_duration_seconds histogram",
            ]
            for tenant, buckets in sorted(self._buckets.items()):
                t = _label(tenant)
                bucket = "memfabric_recall_duration_seconds_bucket"
                for bound, n in zip(LATENCY_BUCKETS, buckets, strict=True):
                    lines.append(f'{bucket}{{tenant="{t}",le="{bound:g}"}} {n}')
                total = self._totals[tenant]
                lines += [
                    f'{bucket}{{tenant="{t}",le="+Inf"}} {total}',
                    f'memfabric_recall_duration_seconds_sum{{tenant="{t}"}} {self._sums[tenant]:g}',
                    f'memfabric_recall_duration_seconds_count{{tenant="{t}"}} {total}',
                ]
        return "\n".join(lines) + "\n"


def metrics_port(option: int | None) -> int | None:
    if option is not None:
        return option
    from memfabric.settings import Settings

    return Settings.from_env().metrics_port


def render(metrics: dict[str, tuple[str, str, Gauge]], families: Sequence[Family] = ()) -> str:
    """name -> (type, help, read), then each family's samples, as Prometheus exposition text."""
    lines: list[str] = []
    failed = 0
    for family in families:
        try:
            lines += family().splitlines()
        except Exception:
            failed += 1
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


def serve_metrics(
    port: int, metrics: dict[str, tuple[str, str, Gauge]], families: Sequence[Family] = ()
) -> ThreadingHTTPServer:
    """Start the endpoint on 127.0.0.1:`port` (0 picks a free port) in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                body, ctype = b"ok\n", "text/plain"
            elif self.path == "/metrics":
                body, ctype = render(metrics, families).encode(), "text/plain; version=0.0.4"
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
