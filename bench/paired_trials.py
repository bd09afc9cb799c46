"""Interleaved paired trials at one N: arms (code revisions or settings) alternate trial by trial.

The ramps of ``bench/serving.py`` find each arm's largest N, but one trial per N means a slow
spell of a shared host (steps 30 ms in one minute, 45 ms ten minutes later on the 2-core box)
moves an arm by more than a change to the tick policy does. Here every repetition runs one
trial of every arm at the same N, back to back, in alternating order, so each spell falls on
all arms alike and the arms compare within a repetition. What it reports per arm: trials held
(duplex-load's criteria), the latency p99 of each trial, the frames over 80 ms (the p99 allows
1 %: the start doubles, a stall's frames), the mean step and steps per tick; and, per
repetition, which arm had the fewest frames over 80 ms.

An arm is ``NAME|REV|SERVE ARGS|LOAD ARGS``: ``REV`` is ``.`` for this checkout or a git
revision, checked out in a temporary worktree and put first on ``PYTHONPATH`` of its server and
of its ``duplex-load`` (this checkout's ``.venv`` is used for both); ``--serve-args`` go to
every server (e.g. ``--engine-process``).

    .venv/bin/python bench/paired_trials.py --n 20 --reps 6 --serve-args=--engine-process \\
        --arm "sync|.|--tick-policy window|--phases sync" --arm "grid-before|c15885c||" \\
        --arm "grid|.||" [--seconds 10] [--out DIR]

Every server is stopped (SIGTERM, then SIGKILL) and every worktree removed in ``finally`` blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
LATE_MS = 80.0


@attrs.frozen
class Arm:
    name: str
    rev: str
    serve_args: tuple[str, ...]
    load_args: tuple[str, ...]

    @classmethod
    def parse(cls, spec: str) -> Arm:
        parts = spec.split("|")
        if len(parts) != 4 or not parts[0] or not parts[1]:
            raise argparse.ArgumentTypeError(f"an arm is NAME|REV|SERVE ARGS|LOAD ARGS, not {spec!r}")
        return cls(parts[0], parts[1], tuple(shlex.split(parts[2])), tuple(shlex.split(parts[3])))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(port: int, server: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server on port {port} was not ready in {timeout:.0f} s")


def trial(arm: Arm, src: Path | None, n: int, seconds: float, serve_args: list[str], out: Path) -> dict:
    """One server of ``n`` slots and one ``duplex-load --sessions n`` against it."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    serve = [str(BIN / "duplex-actors"), "serve", "--model", "tiny", "--max-sessions", str(n)]
    serve += ["--port", str(port), "--log-dir", str(out / "logs"), *serve_args, *arm.serve_args]
    with open(out / "server.out", "wb") as server_out:
        server = subprocess.Popen(serve, env=env, stdout=server_out, stderr=subprocess.STDOUT)
        try:
            wait_ready(port, server)
            load = [str(BIN / "duplex-load"), "--url", f"ws://127.0.0.1:{port}/v1/realtime?duplex=1"]
            load += [
                "--sessions",
                str(n),
                "--seconds",
                str(seconds),
                "--out",
                str(out / "load"),
                *arm.load_args,
            ]
            try:
                done = subprocess.run(
                    load, env=env, capture_output=True, text=True, timeout=seconds * 6 + 120
                )
            except subprocess.TimeoutExpired as exc:
                return {"arm": arm.name, "held": False, "error": f"duplex-load timed out: {exc}"}
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    report_path = out / "load" / "load.json"
    if not report_path.exists():
        return {"arm": arm.name, "held": False, "error": (done.stdout + done.stderr)[-400:]}
    report = json.loads(report_path.read_text())
    series = [v for s in report["sessions"] for v in s["latency_series_ms"] if v is not None]
    server_figures = report.get("server") or {}
    return {
        "arm": arm.name,
        "held": report["held"],
        "p99_ms": report["aggregate"]["latency_ms"]["p99"],
        "late_frames": sum(1 for v in series if v > LATE_MS),
        "frames": len(series),
        "step_ms": server_figures.get("step_ms_mean"),
        "steps_per_tick": server_figures.get("steps_per_tick"),
        "reasons": report.get("reasons"),
    }


def summary(arms: list[Arm], results: list[dict], reps: int) -> str:
    lines = [f"{'arm':16} held  p99 ms median [each]          frames > {LATE_MS:.0f} ms  step ms  steps/tick"]
    for arm in arms:
        mine = [r for r in results if r["arm"] == arm.name]
        p99 = [round(r["p99_ms"]) for r in mine if r.get("p99_ms") is not None]
        steps = [r["step_ms"] for r in mine if r.get("step_ms") is not None]
        spt = [r["steps_per_tick"] for r in mine if r.get("steps_per_tick") is not None]
        lines.append(
            f"{arm.name:16} {sum(r['held'] for r in mine)}/{len(mine)}  "
            f"{statistics.median(p99) if p99 else float('nan'):5.0f} {p99!s:24} "
            f"{[r.get('late_frames') for r in mine]!s:24} "
            f"{statistics.median(steps) if steps else float('nan'):6.1f}  "
            f"{statistics.median(spt) if spt else float('nan'):.3f}"
        )
    wins = {arm.name: 0 for arm in arms}
    ties = 0
    for rep in range(reps):
        this = [r for r in results if r["rep"] == rep and r.get("late_frames") is not None]
        if len(this) == len(arms):
            fewest = min(r["late_frames"] for r in this)
            best = [r["arm"] for r in this if r["late_frames"] == fewest]
            if len(best) == 1:
                wins[best[0]] += 1
            else:
                ties += 1
    counts = ", ".join(f"{k} {v}" for k, v in wins.items())
    lines.append(f"fewest frames over 80 ms, per repetition: {counts}; ties {ties}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, required=True, help="sessions (= server slots) in every trial")
    parser.add_argument("--reps", type=int, default=4, help="repetitions (one trial of every arm each)")
    parser.add_argument("--seconds", type=float, default=10.0, help="audio per session per trial")
    parser.add_argument("--arm", type=Arm.parse, action="append", required=True, help="NAME|REV|SERVE|LOAD")
    parser.add_argument("--serve-args", default="", help="arguments for every server")
    parser.add_argument("--out", type=Path, help="keep every trial's load.json, logs and output here")
    args = parser.parse_args()
    arms: list[Arm] = args.arm
    if len({a.name for a in arms}) != len(arms):
        parser.error("arm names must differ")
    out = args.out or Path(tempfile.mkdtemp(prefix="paired-trials-"))
    worktrees: dict[str, Path] = {}
    results: list[dict] = []
    try:
        for rev in sorted({a.rev for a in arms} - {"."}):
            path = Path(tempfile.mkdtemp(prefix="paired-rev-"))
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True
            )
            worktrees[rev] = path
        for rep in range(args.reps):
            for arm in arms if rep % 2 == 0 else arms[::-1]:
                src = worktrees[arm.rev] / "src" if arm.rev in worktrees else None
                result = trial(
                    arm, src, args.n, args.seconds, shlex.split(args.serve_args), out / f"{arm.name}-{rep}"
                )
                result["rep"] = rep
                results.append(result)
                print(json.dumps(result), flush=True)
    finally:
        for path in worktrees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)
        (out / "results.json").parent.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
    print()
    print(summary(arms, results, args.reps))
    print(f"trials kept in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
