"""Prometheus metrics of ``maxfx serve``: MAX serve's ``maxserve_*`` names plus the engine's state.

Request-level figures (counts by route and status, end-to-end time, time to first
token, inter-token latency, token counters) are recorded by the routes as
responses finish. The engine's state (running and waiting requests, KV-page use,
prefix-cache hit rate, preemptions, compiled programs) is read from the
`Scheduler` when ``/metrics`` is scraped, so the engine thread never does metric
work. Each `Metrics` has its own registry: several servers (or tests) in one
process do not share counters.

Example:
    >>> m = Metrics(model_name="tiny")
    >>> m.request_done("/v1/completions", 200)
    >>> b'maxserve_request_count_total{code="200",path="/v1/completions"} 1.0' in m.render()
    True
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from maxfx.generation import compile_counts

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Milliseconds: CPU decode steps run from ~1 ms (tiny models) to seconds (long prefills).
_MS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000, 120000)


class _EngineCollector:
    """Gauges and counters read from the scheduler at scrape time."""

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler

    def collect(self):
        s = self.scheduler
        pool = s.runner.pool
        stats = s.stats
        yield GaugeMetricFamily(
            "maxserve_num_requests_running", "Requests admitted to the engine (holding KV pages).", value=s.num_running
        )
        yield GaugeMetricFamily(
            "maxserve_num_requests_queued", "Requests waiting for a batch row.", value=s.num_waiting
        )
        yield GaugeMetricFamily(
            "maxserve_kv_cache_usage_ratio", "Share of the KV pages that requests hold.", value=pool.usage
        )
        yield GaugeMetricFamily(
            "maxserve_kv_cache_pages_total",
            "KV pages in the pool (without the scratch page).",
            value=pool.num_pages - 1,
        )
        yield GaugeMetricFamily(
            "maxserve_cache_hit_rate",
            "Share of looked-up prompt tokens served from prefix-cached pages.",
            value=pool.stats.hit_rate,
        )
        yield CounterMetricFamily(
            "maxserve_cache_preemption_count", "Requests preempted because KV pages ran out.", value=stats.preemptions
        )
        yield CounterMetricFamily(
            "maxserve_cached_prompt_tokens",
            "Prompt tokens found in prefix-cached pages.",
            value=stats.cached_prompt_tokens,
        )
        mean = stats.decode_rows / stats.decode_steps if stats.decode_steps else 0.0
        yield GaugeMetricFamily("maxserve_batch_size", "Mean sequences per decode step since start.", value=mean)
        yield CounterMetricFamily("maxserve_decode_steps", "Decode steps the engine ran.", value=stats.decode_steps)
        yield CounterMetricFamily("maxserve_prefill_steps", "Prefill chunks the engine ran.", value=stats.prefill_steps)
        yield CounterMetricFamily(
            "maxfx_engine_compiles",
            "Programs the engine compiled (flat after warm-up).",
            value=compile_counts()["compiles"],
        )


class Metrics:
    """The server's metrics registry (see the module docstring).

    Args:
        model_name: the served name (label of ``maxserve_pipeline_load_total``).
        scheduler: the engine's `Scheduler` (None: request metrics only).
    """

    def __init__(self, model_name: str, scheduler: Any = None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "maxserve_request_count", "HTTP requests by route and status code.", ["code", "path"], registry=r
        )
        self.request_time = Histogram(
            "maxserve_request_time_milliseconds", "End-to-end time of a request.", buckets=_MS_BUCKETS, registry=r
        )
        self.ttft = Histogram(
            "maxserve_time_to_first_token_milliseconds",
            "Time from arrival to the first generated token.",
            buckets=_MS_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "maxserve_itl_milliseconds",
            "Time between consecutive streamed tokens of a request.",
            buckets=_MS_BUCKETS,
            registry=r,
        )
        self.input_tokens = Counter("maxserve_num_input_tokens", "Prompt tokens of finished requests.", registry=r)
        self.output_tokens = Counter("maxserve_num_output_tokens", "Generated tokens of finished requests.", registry=r)
        self.cancelled = Counter(
            "maxserve_request_cancelled", "Requests cancelled because the client went away.", registry=r
        )
        self.loads = Counter("maxserve_pipeline_load", "Pipelines loaded.", ["model"], registry=r)
        self.loads.labels(model=model_name).inc()
        if scheduler is not None:
            r.register(_EngineCollector(scheduler))

    def request_done(self, path: str, code: int) -> None:
        """Count one HTTP response."""
        self.requests.labels(code=str(code), path=path).inc()

    def generation_done(self, *, seconds: float, ttft_s: float | None, prompt_tokens: int, output_tokens: int) -> None:
        """Record a finished generation request."""
        self.request_time.observe(seconds * 1e3)
        if ttft_s is not None:
            self.ttft.observe(ttft_s * 1e3)
        self.input_tokens.inc(prompt_tokens)
        self.output_tokens.inc(output_tokens)

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)
