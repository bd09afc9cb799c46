"""Does bench/tick_sim.py predict the served scheduler? Steps per tick, simulated against served.

For each tick policy and N: one ``duplex-actors serve --model tiny --max-sessions N
--tick-policy P`` process and ``duplex-load --sessions N`` at spread phases (session i starts at
i*80/N ms, duplex-load's default) for ``--seconds``; steps per tick (steps / (frames stepped /
sessions)) from the server's /metrics deltas over the run (the warm-up session taken away),
against ``tick_sim.py``'s simulation of the same scenario (80 ms chunks, spread phases,
loopback jitter, no alignment) with its fitted step cost. The bar: within 15 %.

    .venv/bin/python bench/sim_validation.py [--policies window,deadline,grid] [--n 4,8] [--seconds 8]

Run it on a quiet machine: the served figure moves with anything else on the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from machine import machine_line
from serving import Server, child_env, load_cmd, read_load, running, wait_quiet
from tick_sim import ENGINE_MEDIANS_MS, Scenario, fit_cost, run_one

AGREE = 0.15


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def scrape(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        return resp.read().decode()


def served(policy: str, n: int, seconds: float, workdir: Path) -> dict[str, float]:
    server = Server("tiny", n, workdir, f"{policy}-{n}", extra=("--tick-policy", policy))
    with running([server]):
        before = scrape(server.base)
        out = workdir / f"{policy}-{n}-load"
        proc = subprocess.run(
            load_cmd(server.url, n, seconds, out, sync=False),
            capture_output=True, text=True, env=child_env(), timeout=seconds + 120,
        )  # fmt: skip
        report = read_load(out, proc)
        after = scrape(server.base)
    steps = metric(after, "duplex_step_duration_seconds_count") - metric(
        before, "duplex_step_duration_seconds_count"
    )
    frames = metric(after, "duplex_batch_size_sum") - metric(before, "duplex_batch_size_sum")
    waits = metric(after, "duplex_frame_wait_seconds_count") - metric(
        before, "duplex_frame_wait_seconds_count"
    )
    wait_sum = metric(after, "duplex_frame_wait_seconds_sum") - metric(
        before, "duplex_frame_wait_seconds_sum"
    )
    agg = report["aggregate"]
    return {
        "steps_per_tick": steps * n / frames if frames else float("nan"),
        "wait_mean_ms": 1000 * wait_sum / waits if waits else float("nan"),
        "rtt_p99_ms": agg["round_trip_ms"]["p99"],
        "coverage": agg["coverage"],
    }


def simulated(policy: str, n: int, seconds: float, seed: int) -> dict[str, float]:
    a, b = fit_cost(ENGINE_MEDIANS_MS)
    args = argparse.Namespace(seed=seed, cost_sigma=0.12, seconds=seconds)
    r = run_one(policy, Scenario(80, "spread", "loopback", "off"), n, args, a, b)
    return {"steps_per_tick": r.steps_per_tick, "wait_mean_ms": 1000 * sum(r.waits) / len(r.waits)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="window,deadline,grid")
    parser.add_argument("--n", default="4,8", help="comma list of session counts")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(
        f"sim_validation: {machine_line()}; {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}"
    )
    print(
        "\n| policy | N | served steps/tick | simulated | difference | served wait mean ms | simulated | rtt p99 ms | coverage |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="sim-validation-") as tmp:
        for policy in args.policies.split(","):
            for n in (int(x) for x in args.n.split(",")):
                wait_quiet(60.0, 60.0, lambda m: print(m, file=sys.stderr))
                s = served(policy, n, args.seconds, Path(tmp))
                m = simulated(policy, n, args.seconds, args.seed)
                diff = m["steps_per_tick"] / s["steps_per_tick"] - 1
                worst = max(worst, abs(diff))
                print(
                    f"| {policy} | {n} | {s['steps_per_tick']:.2f} | {m['steps_per_tick']:.2f} | {100 * diff:+.0f} % | "
                    f"{s['wait_mean_ms']:.1f} | {m['wait_mean_ms']:.1f} | {s['rtt_p99_ms']:.1f} | {s['coverage']:.3f} |",
                    flush=True,
                )
    verdict = "within" if worst <= AGREE else "NOT within"
    print(f"\nlargest difference {100 * worst:.0f} %: {verdict} the {100 * AGREE:.0f} % bar")
    return 0 if worst <= AGREE else 1


if __name__ == "__main__":
    raise SystemExit(main())
