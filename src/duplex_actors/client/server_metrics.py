"""The server's HTTP side as ``duplex-load`` reads it (both modes): the base URL of a WebSocket
URL, a GET, the counters of ``/metrics`` and what a run's two scrapes of them say."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from .stats import bucket_quantile, prometheus_buckets, prometheus_value, steps_per_tick


def http_base(ws_url: str) -> str:
    """``ws://host:port/...`` -> ``http://host:port`` (``wss`` -> ``https``)."""
    parts = urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


def http_get(url: str, api_key: str | None, timeout: float = 5.0) -> tuple[int, str]:
    """``(status, body)`` of a GET (status 0: no answer)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return 0, ""


METRICS: Final = {
    "deadline_misses": "duplex_deadline_misses_total",
    "step_seconds_sum": "duplex_step_duration_seconds_sum",
    "steps": "duplex_step_duration_seconds_count",
    "frames_dropped": "duplex_frames_dropped_total",
    "frames_out": "duplex_frames_out_total",
    "batch_size_sum": "duplex_batch_size_sum",
    "wait_sum": "duplex_frame_wait_seconds_sum",
    "wait_count": "duplex_frame_wait_seconds_count",
    "catchups": "duplex_catchup_steps_total",
    "align_pad_s": "duplex_align_pad_seconds_total",
}


def metrics_of(status: int, text: str) -> dict[str, float | None]:
    """The counters ``duplex-load`` reports from a ``/metrics`` answer (``None`` when it failed
    or the server does not export one); ``wait_bucket_<le>``: ``duplex_frame_wait_seconds``'s
    cumulative buckets."""
    if status != 200:
        return {**dict.fromkeys(METRICS), "drained": None}
    out: dict[str, float | None] = {key: prometheus_value(text, metric) for key, metric in METRICS.items()}
    out["drained"] = prometheus_value(text, "duplex_frames_dropped_total", reason="drained")
    if out["drained"] is None and out["frames_dropped"] is not None:
        out["drained"] = 0.0  # the counter is there, no frame was drained yet
    for le, count in prometheus_buckets(text, "duplex_frame_wait_seconds").items():
        out[f"wait_bucket_{le}"] = count
    return out


def scrape_now(base: str, api_key: str | None = None) -> dict[str, float | None]:
    """:func:`metrics_of` the server's ``/metrics`` now (blocking)."""
    return metrics_of(*http_get(base + "/metrics", api_key))


def server_figures(
    before: dict[str, float | None], after: dict[str, float | None], sessions: int
) -> dict[str, Any]:
    """The server side of a run from two scrapes: deltas, mean step, steps per tick (as
    docs/operations.md defines it), the added wait (``duplex_frame_wait_seconds``: mean and the
    p50/p99 bucket bounds), catch-up steps, alignment pad seconds, drained frames."""
    steps = _delta(after, before, "steps")
    step_sum = _delta(after, before, "step_seconds_sum")
    wait_n = _delta(after, before, "wait_count")
    wait_sum = _delta(after, before, "wait_sum")
    buckets: dict[float, float] = {}
    for key, value in after.items():
        if key.startswith("wait_bucket_") and value is not None:
            b = before.get(key)
            buckets[float(key.removeprefix("wait_bucket_"))] = value - (b or 0.0)
    p50, p99 = bucket_quantile(buckets, 0.5), bucket_quantile(buckets, 0.99)
    spt = steps_per_tick(steps, _delta(after, before, "batch_size_sum"), sessions)
    return {
        "deadline_misses": _delta(after, before, "deadline_misses"),
        "frames_dropped": _delta(after, before, "frames_dropped"),
        "steps": steps,
        "frames_out": _delta(after, before, "frames_out"),
        "step_ms_mean": round(1000 * step_sum / steps, 3) if steps and step_sum is not None else None,
        "steps_per_tick": round(spt, 4) if spt is not None else None,
        "wait_ms_mean": round(1000 * wait_sum / wait_n, 3) if wait_n and wait_sum is not None else None,
        "wait_ms_p50_le": None if p50 is None else round(1000 * p50, 3),
        "wait_ms_p99_le": None if p99 is None else round(1000 * p99, 3),
        "catchup_steps": _delta(after, before, "catchups"),
        "align_pad_s": _delta(after, before, "align_pad_s"),
        "drained_frames": _delta(after, before, "drained"),
    }


def _delta(after: dict[str, float | None], before: dict[str, float | None], key: str) -> float | None:
    a, b = after.get(key), before.get(key)
    return None if a is None or b is None else a - b
