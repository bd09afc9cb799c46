"""GPU serving benchmark: the full-size random-weight PersonaPlex architecture served, ``duplex-load --ramp``.

No checkpoint is available on the GPU machine, so the server process builds its engine the way
``bench/engine_gpu.py`` does (its ``Setup``: the 7B LM with an 8-step depformer on the meta
device, materialised with random bf16 weights, the full Mimi with random codebooks, the tiny
SentencePiece tokenizer, a synthetic ``NATF2.pt`` voice prompt; ``MoshiEngine(slots=S)`` over
them) and hands it to the unchanged server: ``duplex_actors.model.factory.open_engine`` is
replaced in that process before ``duplex_actors.cli.main(["serve", ...])`` runs, so everything
else (hypercorn, the WebSocket routes, scheduler, session actors, fsynced session logs, the
warm-up session, /ready, /metrics) is the production code.

This process then waits for ``/ready``, runs ``duplex-load --ramp --sync-start`` (N = 1, 2, 4,
... up to the slot count, then bisection; the default criteria: coverage >= 0.99, round-trip
p99 <= 80 ms, no loss) in a subprocess, prints its table, and stops the server. Everything lands
in ``$OUT`` when set (``gpu_serving.json``, the ramp's ``load.json``, the server log; no PNG
without matplotlib). A server steps all its slots whatever the number of sessions, so if no N
held on the first slot count (``--slots 32,8``: 32) the next one is tried while time is left.

    python bench/gpu_serving.py [--slots 32,8] [--seconds 8] [--budget 280]
    python bench/gpu_serving.py --dry-run-cpu      # the same path on CPU, tiny dims, float32

**Arms** (the default, ``--mode arms``; the arms as ``bench/serving.py`` names them):
one server per tick policy, of B slots, each arm one ``duplex-load`` trial of N = B sessions
(no ramp: the 5 minutes hold one server build per policy and a trial per arm). B is the largest
of ``--slots`` whose p90 engine step (``duplex_step_duration_seconds`` over the first grid trial)
fits the 80 ms tick less ``--guard-ms``: a larger B that does not fit is stopped and the next one
tried. Grid arms first (client alignment 80 ms spread, server padding 20 ms random, unaligned,
80 ms random without opt-in, 100 ms, WAN jitter), then window/sync (the reference) and
window/spread, then deadline/spread, while time is left. The K-processes control is not run here
(K copies of a 7B model). Per arm: held, coverage, latency p50/p99 (per output frame, from
``input_samples_end``), steps per tick, added wait, catch-ups, pad seconds, drained frames.
``--mode ramp`` is the former run: ``duplex-load --ramp --sync-start`` on one server.

    python bench/gpu_serving.py [--slots 32,16,8] [--seconds 6] [--arms grid-client-80,window-sync]
    python bench/gpu_serving.py --dry-run-cpu      # the arms on CPU, tiny dims, B = 2

On the GPU machine run it through ``bench/gpu_serving.sh`` (installs the carried wheels).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(BENCH))
os.environ.setdefault("NO_TORCH_COMPILE", "1")  # as bench/engine_gpu.py: no compile time in the budget

VOICE = "NATF2.pt"
MODEL_ID = "random-personaplex-7b"


# -- the server process ------------------------------------------------------------------------
def serve(argv: list[str]) -> int:
    """``_serve --port P --slots S --log-dir D [--dry-run-cpu]``: build, patch, serve."""
    parser = argparse.ArgumentParser(prog="gpu_serving.py _serve")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--dry-run-cpu", action="store_true")
    parser.add_argument("--tick-policy", default=None)
    args = parser.parse_args(argv)

    import torch

    from duplex_actors import cli
    from duplex_actors.model import factory
    from duplex_actors.model.moshi_engine import MoshiEngine
    from engine_gpu import Setup, machine_info

    if args.dry_run_cpu:
        device, dtype = torch.device("cpu"), torch.float32
    else:
        if not torch.cuda.is_available():
            print("gpu_serving: no CUDA device (use --dry-run-cpu)", file=sys.stderr)
            return 2
        device, dtype = torch.device("cuda"), torch.bfloat16
    workdir = Path(tempfile.mkdtemp(prefix="gpu-serving-model-"))
    started = time.perf_counter()
    setup = Setup(device, dtype, tiny=args.dry_run_cpu, workdir=workdir)
    # The log header records the LM file's SHA-256: a small stand-in file names these weights.
    setup.files.lm.write_bytes(b"random weights: bench/gpu_serving.py, engine_gpu.Setup.build_lm(seed=0)\n")
    dims = {k: setup.lm_kwargs[k] for k in ("dim", "num_layers", "num_heads", "context", "dep_q")}
    print(f"gpu_serving server: LM {dims} {dtype}, setup {time.perf_counter() - started:.1f} s", flush=True)
    print(f"gpu_serving server: {json.dumps(machine_info(device))}", flush=True)

    def open_engine(model: str = MODEL_ID, *, slots: int = 8, **kwargs: Any) -> MoshiEngine:
        t0 = time.perf_counter()
        lm = setup.build_lm(seed=0)
        engine = MoshiEngine(
            setup.checkpoint(lm, setup.mimi_template),  # one engine: the pristine Mimi itself
            slots=slots,
            family=kwargs.get("family"),
            prefill=kwargs.get("prefill", "snapshot"),
            torch_threads=kwargs.get("torch_threads", 1),
        )
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            mem = torch.cuda.memory_allocated(device) / 1024**3
            print(
                f"gpu_serving server: engine built in {time.perf_counter() - t0:.1f} s, {mem:.1f} GiB",
                flush=True,
            )
        return engine

    factory.open_engine = open_engine  # the app imports it from the module when it loads
    serve_args = [
        "serve", "--model", MODEL_ID, "--max-sessions", str(args.slots), "--port", str(args.port),
        "--device", str(device), "--log-dir", args.log_dir, "--torch-threads", "1", "--drain-timeout", "5",
    ]  # fmt: skip
    if args.tick_policy:
        serve_args += ["--tick-policy", args.tick_policy]
    return cli.main(serve_args)


# -- the driver --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(errors="replace")
    except (OSError, ValueError):
        return 0, ""


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            with contextlib.suppress(ValueError):
                return float(line.rsplit(" ", 1)[1])
    return None


class ServedModel:
    """One ``_serve`` subprocess of ``slots`` slots and tick policy ``policy``."""

    def __init__(self, slots: int, policy: str | None, args: argparse.Namespace, out: Path) -> None:
        self.slots, self.policy = slots, policy
        self.started = time.perf_counter()
        self.work = Path(tempfile.mkdtemp(prefix="gpu-serving-"))
        out.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = child_env()
        self.log = open(out / "server.log", "wb")
        cmd = [sys.executable, str(Path(__file__).resolve()), "_serve", "--port", str(self.port)]
        cmd += ["--slots", str(slots), "--log-dir", str(self.work / "sessions")]
        cmd += (["--dry-run-cpu"] if args.dry_run_cpu else []) + (["--tick-policy", policy] if policy else [])
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env
        )
        self.ready_s: float | None = None
        print(
            f"gpu_serving: server pid {self.proc.pid}, {slots} slots, policy {policy}, port {self.port}",
            flush=True,
        )

    def wait_ready(self, deadline: float) -> None:
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}: see its server.log")
            status, _ = get(self.base + "/ready")
            if status == 200:
                self.ready_s = round(time.perf_counter() - self.started, 1)
                print(f"gpu_serving: ready after {self.ready_s} s", flush=True)
                return
            if deadline - time.perf_counter() < 30:
                raise TimeoutError(
                    f"the server was not ready after {time.perf_counter() - self.started:.0f} s"
                )
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # the server this run started, by its id
                self.proc.wait()
        self.log.close()


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def step_p90_ms(before: str, after: str) -> float | None:
    """The p90 engine step (bucket upper bound, ms) between two /metrics scrapes."""
    from duplex_actors.client.stats import bucket_quantile, prometheus_buckets

    b0 = prometheus_buckets(before, "duplex_step_duration_seconds")
    b1 = prometheus_buckets(after, "duplex_step_duration_seconds")
    q = bucket_quantile({le: c - b0.get(le, 0.0) for le, c in b1.items()}, 0.9)
    return None if q is None else round(q * 1000, 1)


def arm_trial(
    server: ServedModel, arm: Any, n: int, seconds: float, seed: int, out: Path, limit: float
) -> dict[str, Any]:
    """One ``duplex-load`` trial of ``n`` sessions for ``arm``: its aggregate, in brief."""
    load = [
        sys.executable, "-m", "duplex_actors.client.load", "--url", f"ws://127.0.0.1:{server.port}/v1/realtime?duplex=1",
        "--sessions", str(n), "--seconds", f"{seconds:g}", "--voice", VOICE, "--out", str(out), *arm.load_args(seed),
    ]  # fmt: skip
    _, before = get(server.base + "/metrics")
    row: dict[str, Any] = {"arm": arm.name, "label": arm.label, "n": n, "slots": server.slots}
    try:
        proc = subprocess.run(
            load, env=server.env, timeout=limit, stdin=subprocess.DEVNULL, capture_output=True, text=True
        )
        row["load_exit"] = proc.returncode
    except subprocess.TimeoutExpired:
        row["load_exit"] = "timeout"
    _, after = get(server.base + "/metrics")
    row["step_p90_ms"] = step_p90_ms(before, after)
    report = out / "load.json"
    if report.exists():
        t = json.loads(report.read_text())
        a = t["aggregate"]
        row.update(
            held=t["held"], reasons=t["reasons"], coverage=a["coverage"], lat_p50=a["latency_ms"]["p50"],
            lat_p99=a["latency_ms"]["p99"], step_ms=a["server_step_ms_mean"],
            steps_per_tick=a.get("server_steps_per_tick"), wait_ms=a.get("server_wait_ms_mean"),
            catchups=a.get("server_catchup_steps"), pad_s=_round(a.get("server_align_pad_s")),
            drained=a.get("server_drained_frames"), hints=a.get("alignment_hints"),
        )  # fmt: skip
    else:
        row.update(held=False, reasons=["no load.json"])
    print(
        f"gpu_serving: [{arm.name}] N={n}: {'held' if row['held'] else 'broke: ' + '; '.join(row['reasons'])}; "
        f"latency p99 {row.get('lat_p99')} ms, steps/tick {row.get('steps_per_tick')}, wait {row.get('wait_ms')} ms, "
        f"step p90 {row['step_p90_ms']} ms",
        flush=True,
    )
    return row


def run_arms(
    args: argparse.Namespace, sizes: list[int], seconds: float, out: Path, deadline: float
) -> dict[str, Any]:
    """The arms, one server per tick policy, at the largest B of ``sizes`` whose p90 step fits."""
    from serving import ARMS  # bench/serving.py's table of arms

    chosen = None if args.arms == "all" else {a.strip() for a in args.arms.split(",") if a.strip()}
    arms = [a for a in ARMS if not a.processes and (chosen is None or a.name in chosen)]
    policies = [p for p in ("grid", "window", "deadline") if any(a.policy == p for a in arms)]
    result: dict[str, Any] = {"mode": "arms", "rows": [], "servers": [], "skipped": []}
    per_trial = seconds + 15.0  # open, stream, drain, close, scrape

    def left() -> float:
        return deadline - time.perf_counter()

    b: int | None = None
    for policy in policies:
        todo = [a for a in arms if a.policy == policy]
        candidates = sizes if b is None else [b]
        for i, slots in enumerate(candidates):
            if left() < 60 + per_trial:
                break
            server = ServedModel(slots, policy, args, out / f"{policy}-S{slots}")
            info: dict[str, Any] = {"policy": policy, "slots": slots}
            result["servers"].append(info)
            try:
                server.wait_ready(deadline)
                info["ready_s"] = server.ready_s
                done = 0
                for arm in todo:
                    if left() < per_trial + 15:
                        result["skipped"].append(f"{arm.name}: no time left")
                        continue
                    row = arm_trial(
                        server, arm, slots, seconds, args.seed, out / f"{arm.name}-N{slots}", per_trial + 30
                    )
                    result["rows"].append(row)
                    done += 1
                    if b is None and done == 1:
                        p90 = row.get("step_p90_ms")
                        fits = p90 is not None and p90 <= 80 - args.guard_ms
                        info["step_p90_ms"], info["fits"] = p90, fits
                        if not fits and i + 1 < len(candidates):
                            print(
                                f"gpu_serving: B={slots}: p90 step {p90} ms does not fit; next size",
                                flush=True,
                            )
                            break
                        b = slots
            except (RuntimeError, TimeoutError) as exc:
                info["error"] = str(exc)
                print(f"gpu_serving: {exc}", flush=True)
            finally:
                server.stop()
            if b is not None:
                break
        for arm in todo:
            if not any(r["arm"] == arm.name for r in result["rows"]) and not any(
                s.startswith(arm.name + ":") for s in result["skipped"]
            ):
                result["skipped"].append(f"{arm.name}: no time left")
    result["B"] = b
    return result


def print_arms(result: dict[str, Any]) -> None:
    print(
        "| arm | N = B | held | coverage | latency p50 ms | latency p99 ms | step ms | step p90 ms | steps/tick | wait ms | catch-ups | pad s | drained | hints |"
    )
    print("|---|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        print(
            f"| {r['arm']} | {r['n']} | {'yes' if r['held'] else 'no'} | {r.get('coverage')} | {r.get('lat_p50')} "
            f"| {r.get('lat_p99')} | {r.get('step_ms')} | {r.get('step_p90_ms')} | {r.get('steps_per_tick')} "
            f"| {r.get('wait_ms')} | {r.get('catchups')} | {r.get('pad_s')} | {r.get('drained')} | {r.get('hints')} |"
        )
    for s in result["skipped"]:
        print(f"skipped: {s}")
    print("not run here: the K processes x 1 slot control (K copies of the model)")


def run_server(
    slots: int, seconds: float, args: argparse.Namespace, out: Path, deadline: float
) -> dict[str, Any]:
    """One server of ``slots`` slots, ``duplex-load --ramp`` against it, the server stopped."""
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="gpu-serving-"))
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    result: dict[str, Any] = {"slots": slots, "seconds": seconds, "out": str(out)}

    def left() -> float:
        return deadline - time.perf_counter()

    server_log = open(out / "server.log", "wb")
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "_serve",
        "--port",
        str(port),
        "--slots",
        str(slots),
    ]
    cmd += ["--log-dir", str(work / "sessions")] + (["--dry-run-cpu"] if args.dry_run_cpu else [])
    server = subprocess.Popen(
        cmd, stdout=server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
    )
    print(f"gpu_serving: server pid {server.pid}, {slots} slots, port {port}", flush=True)
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}: see {out / 'server.log'}")
            status, body = get(base + "/ready")
            if status == 200:
                ready = json.loads(body)
                break
            if left() < 30:
                raise TimeoutError(f"the server was not ready after {time.perf_counter() - started:.0f} s")
            time.sleep(0.5)
        result["ready_s"] = round(time.perf_counter() - started, 1)
        result["ready"] = ready
        print(f"gpu_serving: ready after {result['ready_s']} s: {ready}", flush=True)

        load = [
            sys.executable, "-m", "duplex_actors.client.load", "--url", f"ws://127.0.0.1:{port}/v1/realtime?duplex=1",
            "--ramp", "--max-n", str(slots), "--seconds", f"{seconds:g}", "--retries", str(args.retries),
            "--voice", VOICE, "--out", str(out / "ramp"),
        ]  # fmt: skip
        if not args.spread:
            load.append("--sync-start")
        result["load_command"] = "duplex-load " + " ".join(load[3:])
        print(f"gpu_serving: {result['load_command']}", flush=True)
        _, before = get(base + "/metrics")
        limit = max(20.0, left() - 12)
        try:
            proc = subprocess.run(load, env=env, timeout=limit, stdin=subprocess.DEVNULL)
            result["load_exit"] = proc.returncode
        except subprocess.TimeoutExpired:
            result["load_exit"] = "timeout"
            print(f"gpu_serving: duplex-load stopped after {limit:.0f} s (budget)", flush=True)
        _, after = get(base + "/metrics")
        steps = [metric(t, "duplex_step_duration_seconds_count") for t in (before, after)]
        sums = [metric(t, "duplex_step_duration_seconds_sum") for t in (before, after)]
        if None not in steps and None not in sums and steps[1] != steps[0]:
            result["server_step_ms_mean"] = round(1000 * (sums[1] - sums[0]) / (steps[1] - steps[0]), 2)  # type: ignore[operator]
        report = out / "ramp" / "load.json"
        if report.exists():
            ramp = json.loads(report.read_text())
            result["largest_n_held"] = ramp.get("largest_n_held")
            result["trials"] = [
                {
                    "n": t["n"],
                    "attempt": t["attempt"],
                    "held": t["held"],
                    "reasons": t["reasons"],
                    "rtt_p50": t["aggregate"]["round_trip_ms"]["p50"],
                    "rtt_p99": t["aggregate"]["round_trip_ms"]["p99"],
                    "coverage": t["aggregate"]["coverage"],
                    "step_ms": t["aggregate"]["server_step_ms_mean"],
                }
                for t in ramp["trials"]
            ]
        print(
            f"gpu_serving: largest N held {result.get('largest_n_held')} on {slots} slots; "
            f"server step mean over the ramp {result.get('server_step_ms_mean')} ms",
            flush=True,
        )
    except (RuntimeError, TimeoutError) as exc:
        result["error"] = str(exc)
        print(f"gpu_serving: {exc}", flush=True)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()  # the server this run started, by its id
                server.wait()
        server_log.close()
        result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_serve"]:
        return serve(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--slots",
        help="engine slots = ramp cap; a comma list is tried in order, the next only when no N held "
        "on the previous (a server steps all its slots) and time is left (GPU: 32,8; dry run: 2,1)",
    )
    parser.add_argument("--seconds", type=float, help="audio per session per trial (GPU: 8; dry run: 3)")
    parser.add_argument("--retries", type=int, default=1, help="duplex-load --retries")
    parser.add_argument("--spread", action="store_true", help="spread starts instead of --sync-start")
    parser.add_argument("--budget", type=float, default=280.0, help="seconds for the whole run")
    parser.add_argument("--dry-run-cpu", action="store_true", help="tiny dims, float32, on CPU")
    parser.add_argument(
        "--mode", choices=("arms", "ramp"), default="arms", help="the tick-policy arms, or one ramp"
    )
    parser.add_argument("--arms", default="all", help="arms mode: comma list (bench/serving.py's names)")
    parser.add_argument("--seed", type=int, default=0, help="arms mode: seed of random phases and jitter")
    parser.add_argument(
        "--guard-ms", type=float, default=8.0, help="arms mode: B fits if p90 step <= 80 - this"
    )
    args = parser.parse_args(argv)
    arms_mode = args.mode == "arms"
    default_sizes = (
        ("2" if arms_mode else "2,1") if args.dry_run_cpu else ("32,16,8" if arms_mode else "32,8")
    )
    sizes = [int(x) for x in (args.slots or default_sizes).split(",") if x.strip()]
    seconds = args.seconds or (3.0 if args.dry_run_cpu else (6.0 if arms_mode else 8.0))
    started = time.perf_counter()
    deadline = started + args.budget
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-serving-out-"))
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"dry_run_cpu": args.dry_run_cpu, "sync_start": not args.spread, "runs": []}

    def dump() -> None:
        (out / "gpu_serving.json").write_text(json.dumps(result, indent=1) + "\n")

    if arms_mode:
        try:
            result.update(run_arms(args, sizes, seconds, out, deadline))
        finally:
            result["total_s"] = round(time.perf_counter() - started, 1)
            dump()
        print()
        print_arms(result)
        print(
            f"gpu_serving: B = {result.get('B')}; total {result['total_s']} s; results in {out}", flush=True
        )
        return 0 if result["rows"] else 1
    try:
        for i, slots in enumerate(sizes):
            if i and deadline - time.perf_counter() < 100:
                print(f"gpu_serving: no time left for {slots} slots", flush=True)
                break
            run = run_server(slots, seconds, args, out / f"S{slots}", deadline)
            result["runs"].append(run)
            dump()
            if run.get("largest_n_held"):
                break
    finally:
        result["total_s"] = round(time.perf_counter() - started, 1)
        dump()
    print()
    print(
        "| slots | server ready s | N | attempt | held | coverage | rtt p50 ms | rtt p99 ms | server step ms |"
    )
    print("|---:|---:|---:|---:|:---:|---:|---:|---:|---:|")
    for run in result["runs"]:
        for t in run.get("trials", []):
            print(
                f"| {run['slots']} | {run.get('ready_s')} | {t['n']} | {t['attempt']} | {'yes' if t['held'] else 'no'} "
                f"| {t['coverage']:.3f} | {t['rtt_p50']} | {t['rtt_p99']} | {t['step_ms']} |"
            )
    print()
    for run in result["runs"]:
        print(f"slots {run['slots']}: largest N held {run.get('largest_n_held')} {run.get('error', '')}")
    print(f"gpu_serving: total {result['total_s']} s; results in {out}", flush=True)
    return 0 if any("largest_n_held" in r for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
