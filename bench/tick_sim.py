"""Simulate the tick policies (scheduler/policy.py) on synthetic arrival traces; no server, no model.

The same ``decide``/``after_step`` functions the scheduler uses drive a discrete-event model
of the scheduler actor: N sessions each send chunks of ``--chunk-ms`` at a start phase
(``sync``: all at once; ``spread``: session i at i*80/N ms; ``random``: uniform, ``--seed``)
over an in-order link with a jitter profile (``loopback``, ``lan``, ``wan``: WAN adds late
bursts, a stall after which the held chunks arrive together). A chunk completes the 80 ms
frames it finishes; the engine steps its whole fixed batch of N slots at a cost
C(N) = a + b*N ms (times a lognormal noise), whatever the number of frames in the step.

The simulated server is warm: its grid's ticks are at 10 ms + n * 80 ms. ``--align`` runs the
server's own ``Aligner`` (session/alignment.py) in that mode on each session's appends, as the
session actor does: ``server`` pads sessions whose chunks are shorter than 80 ms and divide it
(10, 20, 40 ms), before their first frame completes and again on drift or a margin change;
``client`` does that too and, for whole 80 ms chunks, hints, and the simulated client applies
the hint to its next chunk (sent ``pad_ms`` early, ``80 - pad_ms`` ms of audio); 30 ms, 100 ms
and 80 ms chunks without the hint stay unaligned, waiting U[0, 80) ms for the tick. The margin
adapts to each session's lateness (p99 + 2 ms, clamped 3-40 ms, re-checked after 1 s and then
every 4 s). Sessions whose alignment is not ``off`` accept the grid policy's drains (a jitter
backlog of 2-6 frames no catch-up clears loses a queued frame), counted per scenario.

Per scenario and policy it prints the capacity (the largest N, found by a ramp and bisection
as bench/serving.py does, at which the p99 of frame latency, completion to the end of its
step, is within the tick budget), and at that N: steps per tick (steps / (frames stepped /
sessions), the definition /metrics and duplex-load use), the mean and p99 added wait
(completion to the start of its step), catch-up steps, drained frames, the mean pad per session,
the mean (max) margin the sessions ended with, and the re-alignments after the first. The
defaults for a and b are a least-squares fit of the tiny model's median step times on the 2-core CPU box (BENCHMARKS.md,
"Component costs (2-core CPU VM)", bench/engine.py, 2026-11-30). The model leaves out the event loop's own work
(the GIL it shares with the engine thread), the client and the network, so served capacity is
lower than simulated; steps per tick and waits are what it is for.

Without --chunk-ms/--phases/--jitter/--align it runs DEFAULT_SCENARIOS; with any of them,
every combination (defaults 80 ms, random, loopback, off).

    .venv/bin/python bench/tick_sim.py [--policies grid,deadline,window] [--chunk-ms 80,20]
        [--phases sync,spread,random] [--jitter loopback,lan,wan] [--align off,server,client] [--seconds 8]
        [--cost-a MS] [--cost-b MS] [--cost-sigma 0.12] [--max-n 48] [--at-n 4,8] [--max-align-pad-ms 1000]
"""

from __future__ import annotations

import argparse
import datetime
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from duplex_actors.config import TICK_POLICIES
from duplex_actors.scheduler.policy import (
    RECENT_STEPS,
    Policy,
    PolicyState,
    SchedulerView,
    SlotView,
    StepNow,
    make_policy,
    percentile,
)
from duplex_actors.session.alignment import FRAME, Aligner, ClientHint, Grid, ServerPad

TICK_MS = 80.0
# Median ms per step of the tiny model against B (BENCHMARKS.md, bench/engine.py, 2026-11-30).
ENGINE_MEDIANS_MS = {1: 16.2, 2: 19.2, 4: 22.5, 8: 22.9, 16: 32.9, 32: 46.4}


def fit_cost(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares a, b of C(B) = a + b*B."""
    n = len(points)
    mx = sum(points) / n
    my = sum(points.values()) / n
    b = sum((x - mx) * (y - my) for x, y in points.items()) / sum((x - mx) ** 2 for x in points)
    return my - b * mx, b


# -- arrival traces ------------------------------------------------------------------------------
@attrs.frozen
class Jitter:
    """One-way delay of each chunk (ms): base + exponential(mean); bursts: stalls per second."""

    base_ms: float
    mean_ms: float
    cap_ms: float
    bursts_per_s: float = 0.0
    burst_ms: tuple[float, float] = (0.0, 0.0)

    def delays(self, n: int, chunk_ms: float, rng: random.Random) -> list[float]:
        out = []
        for _ in range(n):
            d = self.base_ms + min(self.cap_ms, rng.expovariate(1 / self.mean_ms) if self.mean_ms else 0.0)
            if self.bursts_per_s and rng.random() < self.bursts_per_s * chunk_ms / 1000:
                d += rng.uniform(*self.burst_ms)
            out.append(d)
        return out


JITTER = {
    "loopback": Jitter(base_ms=0.1, mean_ms=0.2, cap_ms=5),
    "lan": Jitter(base_ms=0.5, mean_ms=1.0, cap_ms=15),
    "wan": Jitter(base_ms=30, mean_ms=6.0, cap_ms=60, bursts_per_s=0.2, burst_ms=(100, 300)),
}


def phases(kind: str, n: int, rng: random.Random) -> list[float]:
    if kind == "sync":
        return [0.0] * n
    if kind == "spread":
        return [i * TICK_MS / n for i in range(n)]
    if kind == "random":
        return [rng.uniform(0, TICK_MS) for _ in range(n)]
    raise ValueError(f"unknown phases {kind!r}")


# The simulated server has been running: its grid's ticks are at this origin + n * 80 ms (the
# sessions' phases are relative to 0; the 10 ms is the lead a fresh grid would take).
WARM_ORIGIN = 0.010
SAMPLES_PER_MS = 24


@attrs.frozen
class Trace:
    """One session at the server: when each of its 80 ms frames completed (seconds), the pad
    the aligner had inserted (24 kHz samples), its margin at the end, and its decisions."""

    completions: tuple[float, ...]
    pad_samples: int = 0
    margin_ms: float = 0.0
    decisions: tuple[str, ...] = ()  # "pad:<reason>" / "hint:<reason>", in order
    # Per completion: the frame holds alignment pad samples (the scheduler's ``SlotView.padded``:
    # a padded frame that comes second for one tick is a re-alignment's double, owed a catch-up).
    padded: tuple[bool, ...] = ()


def session_trace(
    chunk_ms: float, phase_ms: float, delays: list[float], align: str, max_pad_samples: int
) -> Trace:
    """Play one session's appends through the real ``Aligner`` as the session actor does.

    The client sends ``chunk_ms`` chunks in real time from ``phase_ms`` over an in-order link
    (chunk j delayed ``delays[j]`` ms, never overtaking the one before). A server pad is
    inserted before the append it was decided at; a hint is applied by the client to its next
    chunk (sent ``pad_ms`` early, with ``80 - pad_ms`` ms of audio and the pad on it)."""
    chunk = round(chunk_ms * SAMPLES_PER_MS)
    aligner = Aligner(mode=align, max_total_pad_samples=max_pad_samples)
    grid = Grid(origin=WARM_ORIGIN, period=TICK_MS / 1000)
    completions: list[float] = []
    padded: list[bool] = []
    decisions: list[str] = []
    tail = sent = 0
    fill_padded = False
    last = 0.0
    hint: int | None = None
    for delay in delays:
        size, pad = chunk, 0
        if hint is not None:
            pad, size, hint = hint * SAMPLES_PER_MS, chunk - hint * SAMPLES_PER_MS, None
            aligner.client_padded(pad)
        sent += size
        now = last = max(last, (phase_ms + sent / SAMPLES_PER_MS + delay) / 1000)
        decision = aligner.before_append(now, grid, size, tail)
        if isinstance(decision, ServerPad):
            pad += decision.samples
            decisions.append(f"pad:{decision.reason}")
        elif isinstance(decision, ClientHint):
            hint = decision.pad_ms
            decisions.append(f"hint:{decision.reason}")
        # As the session core fills frames: the pad's samples first, then the chunk's; a frame
        # that holds any pad sample is padded.
        for samples, is_pad in ((pad, True), (size, False)):
            while samples:
                k = min(FRAME - tail, samples)
                tail, samples = tail + k, samples - k
                fill_padded = fill_padded or is_pad
                if tail == FRAME:
                    tail = 0
                    completions.append(now)
                    padded.append(fill_padded)
                    fill_padded = False
    return Trace(
        tuple(completions), aligner.total_pad_samples, aligner.margin_ms, tuple(decisions), tuple(padded)
    )


def traces_for(
    n: int,
    chunk_ms: float,
    phase_kind: str,
    jitter: Jitter,
    align: str,
    seconds: float,
    seed: int,
    max_pad_samples: int = 24_000,
) -> list[Trace]:
    rng = random.Random(seed * 1_000_003 + n)
    starts = phases(phase_kind, n, rng)
    chunks = int(seconds * 1000 // chunk_ms)
    delays = [jitter.delays(chunks, chunk_ms, rng) for _ in starts]
    return [
        session_trace(chunk_ms, p, d, align, max_pad_samples) for p, d in zip(starts, delays, strict=True)
    ]


# -- the scheduler ---------------------------------------------------------------------------------
@attrs.define
class Result:
    sessions: int
    steps: int = 0
    frames: int = 0
    catchups: int = 0
    drained: int = 0
    waits: list[float] = attrs.field(factory=list)
    latencies: list[float] = attrs.field(factory=list)
    pad_ms: list[float] = attrs.field(factory=list)  # per session: total pad inserted
    margin_ms: list[float] = attrs.field(factory=list)  # per session: margin at the end
    realigned: int = 0  # alignments after the first (drift, margin, clear)

    @property
    def steps_per_tick(self) -> float:
        return self.steps / (self.frames / self.sessions) if self.frames else math.nan

    def p99_latency_ms(self) -> float:
        return percentile(self.latencies, 99) * 1000 if self.latencies else math.inf

    def wait_mean_ms(self) -> float:
        return 1000 * sum(self.waits) / len(self.waits) if self.waits else math.nan


def simulate(
    policy: Policy, traces: list[Trace], cost: Callable[[], float], drainable: bool = True
) -> Result:
    """The scheduler actor over ``traces``; ``drainable``: sessions accept the policy's drains
    (alignment not "off"), dropping their oldest queued frame (synthetic frames have no
    energy to choose by)."""
    arrivals = sorted(
        (c, i, p)
        for i, tr in enumerate(traces)
        for c, p in zip(tr.completions, tr.padded or [False] * len(tr.completions), strict=True)
    )
    queues: list[deque[tuple[float, bool]]] = [deque() for _ in traces]
    recent: deque[float] = deque(maxlen=RECENT_STEPS)
    state = PolicyState(origin=WARM_ORIGIN)
    out = Result(sessions=len(traces))
    for tr in traces:
        out.pad_ms.append(tr.pad_samples / SAMPLES_PER_MS)
        out.margin_ms.append(tr.margin_ms)
        out.realigned += max(0, len(tr.decisions) - 1)

    # A session whose last frame was stepped has ended (its client closes): its slot is no
    # longer active, so no tick is held for frames it will not send.
    remaining = [len(tr.completions) for tr in traces]

    def slot(i: int) -> SlotView:
        head = [queues[i][k] for k in range(min(2, len(queues[i])))]
        return SlotView(
            i,
            active=remaining[i] > 0,
            frames=tuple(c for c, _ in head),
            padded=tuple(p for _, p in head),
            queued=len(queues[i]),
        )

    slots = [slot(i) for i in range(len(traces))]  # rebuilt when a queue changes
    t, a = 0.0, 0
    while a < len(arrivals) or any(queues):
        while a < len(arrivals) and arrivals[a][0] <= t + 1e-9:
            c, i, p = arrivals[a]
            queues[i].append((c, p))
            slots[i] = slot(i)
            a += 1
        view = SchedulerView(tuple(slots), tuple(recent), state)
        decision = policy.decide(t, view)
        if isinstance(decision, StepNow):
            duration = cost()
            for i in decision.slots:
                c, _ = queues[i].popleft()
                remaining[i] -= 1
                slots[i] = slot(i)
                out.waits.append(t - c)
                out.latencies.append(t + duration - c)
            state = policy.after_step(state, view, decision, t)
            if drainable:
                for i in state.drain:
                    queues[i].popleft()
                    remaining[i] -= 1
                    slots[i] = slot(i)
                    out.drained += 1
            out.steps += 1
            out.frames += len(decision.slots)
            out.catchups += decision.kind == "catchup"
            recent.append(duration)
            t += duration
        else:
            t = max(t, min(decision.at, arrivals[a][0] if a < len(arrivals) else math.inf))
            assert t < math.inf, "waiting forever with frames queued"
    return out


@attrs.frozen
class Scenario:
    chunk_ms: float
    phases: str
    jitter: str
    align: str

    def label(self) -> str:
        return f"{self.chunk_ms:g} ms chunks, {self.phases} phases, {self.jitter}, align {self.align}"


DEFAULT_SCENARIOS = (
    Scenario(80, "sync", "loopback", "off"),  # the reference: every stream starts together
    Scenario(80, "spread", "loopback", "off"),  # bench/serving.py's default phases
    Scenario(80, "random", "loopback", "off"),  # a stock client that does not opt in
    Scenario(80, "random", "loopback", "client"),  # the alignment hint
    Scenario(20, "random", "loopback", "off"),  # short chunks, not aligned
    Scenario(20, "random", "loopback", "server"),  # short chunks, padded by the server
    Scenario(100, "random", "loopback", "server"),  # chunks that do not divide the tick: unaligned
    Scenario(80, "random", "lan", "client"),  # a little jitter
    Scenario(80, "random", "wan", "client"),  # jitter and late bursts: margin, drains
    Scenario(20, "random", "wan", "server"),
)


def run_one(name: str, sc: Scenario, n: int, args: argparse.Namespace, a_ms: float, b_ms: float) -> Result:
    rng = random.Random(args.seed * 7919 + n)
    mean = (a_ms + b_ms * n) / 1000
    sigma = args.cost_sigma

    def cost() -> float:
        # Lognormal noise with mean 1: the engine's p90/median on the box is 1.05-1.4.
        return mean * math.exp(rng.gauss(-sigma * sigma / 2, sigma)) if sigma else mean

    max_pad = round(getattr(args, "max_align_pad_ms", 1000.0) * SAMPLES_PER_MS)
    traces = traces_for(
        n, sc.chunk_ms, sc.phases, JITTER[sc.jitter], sc.align, args.seconds, args.seed, max_pad
    )
    return simulate(make_policy(name), traces, cost, drainable=sc.align != "off")


def holds(r: Result, budget_ms: float) -> bool:
    return r.p99_latency_ms() <= budget_ms


def capacity(
    name: str, sc: Scenario, args: argparse.Namespace, a_ms: float, b_ms: float
) -> tuple[int, Result | None]:
    """Largest N that holds: ramp 1, 2, 4, ... then bisection (as bench/serving.py)."""
    results: dict[int, Result] = {}

    def ok(n: int) -> bool:
        results[n] = run_one(name, sc, n, args, a_ms, b_ms)
        return holds(results[n], args.budget_ms)

    good, bad, n = 0, None, 1
    while n <= args.max_n:
        if ok(n):
            good, n = n, n * 2
        else:
            bad = n
            break
    if bad is None and good < args.max_n:
        if ok(args.max_n):
            good = args.max_n
        else:
            bad = args.max_n
    if bad is not None:
        while bad - good > 1:
            mid = (good + bad) // 2
            if ok(mid):
                good = mid
            else:
                bad = mid
    return good, results.get(good)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=",".join(TICK_POLICIES))
    # Without any of these four: the DEFAULT_SCENARIOS; with any, every combination of them.
    parser.add_argument("--chunk-ms", help="comma list of 10,20,40,80,100 (any ms; default 80)")
    parser.add_argument("--phases", help="comma list of sync,spread,random (default random)")
    parser.add_argument("--jitter", help=f"comma list of {','.join(JITTER)} (default loopback)")
    parser.add_argument("--align", help="comma list of off,server,client (default off)")
    parser.add_argument("--seconds", type=float, default=8.0, help="audio per session")
    parser.add_argument("--seed", type=int, default=1)
    fit_a, fit_b = fit_cost(ENGINE_MEDIANS_MS)
    parser.add_argument("--cost-a", type=float, default=fit_a, help=f"ms per step (default {fit_a:.2f})")
    parser.add_argument("--cost-b", type=float, default=fit_b, help=f"ms per slot (default {fit_b:.3f})")
    parser.add_argument("--cost-sigma", type=float, default=0.12, help="lognormal step-cost noise")
    parser.add_argument("--budget-ms", type=float, default=TICK_MS, help="p99 frame latency bound")
    parser.add_argument("--max-n", type=int, default=48)
    parser.add_argument("--max-align-pad-ms", type=float, default=1000.0, help="total pad per session")
    parser.add_argument(
        "--at-n", default="", help="also report these N, e.g. 4,8 (to compare with served runs)"
    )
    args = parser.parse_args(argv)

    names = [p for p in args.policies.split(",") if p]
    for p in names:
        make_policy(p)  # a clear error for an unknown name
    at_n = [int(x) for x in args.at_n.split(",") if x]
    if all(v is None for v in (args.chunk_ms, args.phases, args.jitter, args.align)):
        scenarios = list(DEFAULT_SCENARIOS)
    else:
        scenarios = [
            Scenario(float(c), ph, j, al)
            for al in (args.align or "off").split(",")
            for j in (args.jitter or "loopback").split(",")
            for c in (args.chunk_ms or "80").split(",")
            for ph in (args.phases or "random").split(",")
        ]
    for sc in scenarios:
        if sc.jitter not in JITTER:
            parser.error(f"unknown jitter profile {sc.jitter!r}; choose from {', '.join(JITTER)}")
        if sc.phases not in ("sync", "spread", "random"):
            parser.error(f"unknown phases {sc.phases!r}; choose from sync, spread, random")
        if sc.align not in ("off", "server", "client"):
            parser.error(f"unknown alignment {sc.align!r}; choose from off, server, client")
    started = time.perf_counter()
    print(
        f"tick_sim: C(B) = {args.cost_a:.2f} + {args.cost_b:.3f}*B ms (noise sigma {args.cost_sigma}), "
        f"{args.seconds:g} s per session, seed {args.seed}, latency budget p99 <= {args.budget_ms:g} ms; "
        f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}"
    )
    header = (
        "| policy | capacity N | steps/tick | wait mean ms | wait p99 ms | latency p99 ms | catch-ups "
        "| drained | pad ms/session | margin ms mean (max) | re-aligned |"
    )
    at_header = "".join(f" steps/tick @{n} | wait mean @{n} | drained @{n} | margin @{n} |" for n in at_n)
    for sc in scenarios:
        print(f"\n{sc.label()}\n")
        print(header + at_header)
        print("|---|" + "---:|" * (10 + 4 * len(at_n)))
        for name in names:
            n, r = capacity(name, sc, args, args.cost_a, args.cost_b)
            if r is None:
                row = f"| {name} | 0 |" + " |" * 9
            else:
                row = (
                    f"| {name} | {n} | {r.steps_per_tick:.2f} | {r.wait_mean_ms():.1f} | "
                    f"{1000 * percentile(r.waits, 99):.1f} | {r.p99_latency_ms():.1f} | {r.catchups} | "
                    f"{r.drained} | {sum(r.pad_ms) / n:.1f} | "
                    f"{sum(r.margin_ms) / n:.1f} ({max(r.margin_ms):.1f}) | {r.realigned} |"
                )
            for k in at_n:
                rk = run_one(name, sc, k, args, args.cost_a, args.cost_b)
                margin = sum(rk.margin_ms) / len(rk.margin_ms)
                row += f" {rk.steps_per_tick:.2f} | {rk.wait_mean_ms():.1f} | {rk.drained} | {margin:.1f} |"
            print(row)
    print(f"\n({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
