"""``serve`` from the command to ``/ready`` 200, with the engine core's start-up phases as
``/ready`` reports them (docs/operations.md, section 4, "Start-up").

Each tree in ``--trees`` (default: this checkout) is served with its own ``src`` first on
``PYTHONPATH`` and this checkout's ``.venv``, the trees alternating round by round, so that an
A/B of two commits sees the same machine; wall times, so compare trees within one run.

    .venv/bin/python bench/startup.py [--model tiny-parrot] [--rounds 5] [--trees /tmp/base,.]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ceiling import free_port
from machine import machine_line

REPO = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("duplex-actors"))


def ready(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as reply:
            body: dict[str, Any] = json.loads(reply.read())
            return body
    except (urllib.error.URLError, OSError, ValueError):
        return None


def one_start(tree: Path, model: str, timeout_s: float) -> dict[str, Any]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as logs:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [EXE, "serve", "--model", model, "--port", str(port), "--log-dir", logs],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while (body := ready(port)) is None or not body.get("ready"):
                if proc.poll() is not None:
                    raise RuntimeError(f"serve exited with {proc.returncode} before /ready")
                if time.perf_counter() - started > timeout_s:
                    raise RuntimeError(f"no /ready 200 within {timeout_s:g} s")
                time.sleep(0.05)
            ready_s = time.perf_counter() - started
        finally:
            proc.send_signal(2)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return {"ready_s": round(ready_s, 2), "phases_s": body.get("phases_done_s", {})}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny-parrot")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trees", default=str(REPO), help="comma-separated checkouts, alternated")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds one start may take")
    parser.add_argument("--out", default=None, help="JSON (default bench/results/startup-<UTC time>.json)")
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    print(machine_line())
    runs: dict[str, list[dict[str, Any]]] = {str(t): [] for t in trees}
    for r in range(args.rounds):
        for tree in trees:
            result = one_start(tree, args.model, args.timeout)
            runs[str(tree)].append(result)
            print(
                f"round {r + 1} {tree}: ready in {result['ready_s']} s, phases {result['phases_s']}",
                flush=True,
            )
    summary = {}
    for name, results in runs.items():
        times = [x["ready_s"] for x in results]
        loads = [x["phases_s"].get("load", float("nan")) for x in results]
        summary[name] = {"ready_s_median": statistics.median(times), "ready_s": times, "load_s": loads}
        print(f"{name}: ready median {statistics.median(times)} s ({min(times)}-{max(times)}), load {loads}")
    commits = {
        str(t): subprocess.run(
            ["git", "-C", str(t), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        for t in trees
    }
    out = (
        Path(args.out)
        if args.out
        else REPO / "bench/results" / time.strftime("startup-%Y%m%dT%H%M%SZ.json", time.gmtime())
    )
    out.write_text(
        json.dumps(
            {
                "bench": "startup",
                "command": " ".join([sys.executable, *sys.argv]),
                "machine": machine_line(),
                "model": args.model,
                "commits": commits,
                "summary": summary,
                "runs": runs,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
