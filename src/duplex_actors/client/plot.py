"""PNG charts of a ``duplex-load`` run (matplotlib, Agg backend, imported only when drawing)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .stats import Delta, round_trips_ms


def plot_trial(
    path: Path,
    sessions: Sequence[tuple[Sequence[float], Sequence[Delta]]],
    *,
    t0: float,
    title: str,
    budget_ms: float = 80.0,
) -> None:
    """Round-trip histogram (all frames of all sessions) over a per-session timeline (round trip
    of each frame against its send time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (hist, timeline) = plt.subplots(2, 1, figsize=(10, 8), height_ratios=[1, 1.4])
    all_rtt: list[float] = []
    for index, (send_times, deltas) in enumerate(sessions):
        points = round_trips_ms(send_times, deltas)
        all_rtt.extend(r for _, r in points)
        if points:
            timeline.plot(
                [t - t0 for t, _ in points], [r for _, r in points], lw=0.8, alpha=0.8, label=f"s{index}"
            )
    if all_rtt:
        hist.hist(all_rtt, bins=60, color="tab:blue", alpha=0.85)
    hist.axvline(budget_ms, color="tab:red", ls="--", lw=1, label=f"{budget_ms:g} ms")
    hist.set_xlabel("frame round trip (ms): input frame k sent -> output frame k received")
    hist.set_ylabel("frames")
    hist.set_title(title)
    hist.legend(loc="upper right")
    timeline.axhline(budget_ms, color="tab:red", ls="--", lw=1)
    timeline.set_xlabel("send time (s since the streams started)")
    timeline.set_ylabel("round trip (ms)")
    timeline.set_title("per-session timeline")
    if 0 < len(sessions) <= 12:
        timeline.legend(loc="upper right", fontsize="small", ncols=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_ramp(path: Path, trials: Sequence[dict[str, Any]], *, budget_ms: float = 80.0) -> None:
    """Round trip p50/p99 and coverage against the number of sessions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = {t["n"]: t for t in sorted(trials, key=lambda t: (t["n"], t.get("attempt", 1)))}
    rows = [last[n] for n in sorted(last)]
    ns = [t["n"] for t in rows]
    p50 = [t["aggregate"]["round_trip_ms"]["p50"] or 0.0 for t in rows]
    p99 = [t["aggregate"]["round_trip_ms"]["p99"] or 0.0 for t in rows]
    cover = [t["aggregate"]["coverage"] for t in rows]
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.plot(ns, p50, "o-", label="round trip p50")
    ax.plot(ns, p99, "s-", label="round trip p99")
    ax.axhline(budget_ms, color="tab:red", ls="--", lw=1)
    for t in rows:
        ax.annotate("held" if t["held"] else "broke", (t["n"], t["aggregate"]["round_trip_ms"]["p99"] or 0.0))
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("ms")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    cov = ax.twinx()
    cov.plot(ns, cover, "^:", color="tab:green", label="coverage")
    cov.set_ylim(0, 1.05)
    cov.set_ylabel("coverage")
    lines = ax.get_legend_handles_labels()
    more = cov.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left")
    ax.set_title("duplex-load ramp")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
