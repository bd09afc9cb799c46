"""The front end's ceiling: how many real-time sessions the serving process carries when the model
step costs the host nothing, as on a GPU (the step is device time and releases the GIL).

::

    .venv/bin/python bench/ceiling.py                          # every arm, the server as it is
    .venv/bin/python bench/ceiling.py --frontends 1,2          # K front ends (serve --frontends K)
    .venv/bin/python bench/ceiling.py --tiny                   # the tiny model: step idle vs under traffic
    .venv/bin/python bench/ceiling.py --arms realtime-80 --ns 4 --seconds 2 --warmup 1 --no-bisect  # a smoke

Each trial starts a fresh ``duplex-actors serve --model standin:25`` (``--step-ms``: the stand-in
engine's step sleeps that long with the GIL released and returns silence; ``--max-sessions`` N
unless ``--max-sessions`` is given; ``--frontends K`` only when ``--frontends`` lists K; anything
in ``--serve-args`` appended), waits for ``/ready``, then drives N paced sessions with the lean
client (``duplex-load --lean``, client/lean.py) pinned with ``taskset -c`` to ``--client-cpus``
(the last CPU the bench may use: 1 on a 2-core machine; ``--client-nice`` gives it a nice
increment, e.g. -10 so that the server's threads do not delay the instrument where they share its
core): a ``--warmup`` (2 s), then ``--seconds``
(12) of load, then the drain. As the client passes the start and the end of that window it
prints a marker, and the bench samples the server there:

- CPU (``/proc/PID/stat`` utime + stime, and per thread) of the serve process and every
  descendant, each labelled by its name (``/proc/PID/comm``, which ``prctl(PR_SET_NAME)`` sets)
  and command line: the engine core (``--engine-pattern``, default ``engine``; today's
  ``--engine-process`` child too), helpers (multiprocessing's, Opus workers, a process named
  ``*supervisor*``), and the front ends (every other process; today's single process, engine
  thread included, is one; their main threads, the event loops, are also counted apart). Front-end CPU per session-frame = their CPU over the
  window / the frames the server sent in it (``duplex_frames_out_total``); the busiest one's % of
  a core; the engine core's CPU per tick (per step);
- the step's wall time from ``/metrics`` (``duplex_step_duration_seconds`` sum / count over the
  window) against ``--step-ms``;
- the other load on the machine (all busy CPU less the server's and the client's), so that a
  trial disturbed by something else shows it;
- the machine's speed as the interpreter sees it, just before the trial: nanoseconds per call
  of a function that returns at once (``python_call_ns``, column ``call ns``; bench/machine.py).
  A shared VM's host moves it by 3x between hours, and every CPU figure per message with it;
- how much the host's caches cost this hour: the CPU of a pass over a working set shaped like a
  front end's per-session state, back to back and after 80 ms of sleep (``touch_warm_us``,
  ``touch_stale_us``, their ratio in column ``stale x``; ``stale_touch_us`` in bench/machine.py).
  A front end touches each session once per frame, so its CPU per frame follows the stale pass,
  which ``call ns`` (a loop that stays in the cache) does not see;
- run-queue waits per tick (``/proc/.../schedstat``: time runnable but not on a CPU): the front
  ends' event loops, the engine core's main thread, and every thread of the client, whose
  receipt times are the latency's end (column ``rq loop/cli ms``).

From the client's report: coverage and lost frames (whole run), latency p50/p99 per output frame
(arrival minus the send time of the chunk that completed it, frames sent in the window), the
client's own CPU per frame and its send lag. A trial *held* when every session opened, coverage
>= ``--min-coverage`` (0.99), lost frames <= ``--max-lost`` (0) and latency p99 <= the step +
``--p99-margin-ms`` (40).

Arms: ``realtime-80``, ``realtime-20`` (``/v1/realtime?duplex=1``, JSON, base64 appends),
``native-80``, ``native-20`` (``/v1/duplex``, binary audio both ways), at ``--phases`` (sync: all
sessions send on the same instant, the pre-tick burst). For each arm and each K, N runs up the
list ``--ns`` (16, 32, 48, 64, 96, 128, 160, 192, 256) until a trial breaks, then bisects
between the largest N that held and the smallest that broke down to ``--resolution`` (8); the
(arm, K) searches run interleaved, one trial of each per round, so a noisy minute of a shared
machine falls on all of them alike.

``--tiny``: the tiny model (``--model tiny``), ``--tiny-sessions`` (20) sessions at random phases
with 20 ms chunks on the Realtime dialect, against a trial of one session on the same server
configuration (the engine steps its whole batch of slots either way, so that step is the idle
one): the step under traffic / idle, and the latency p99 (targets: <= 1.2x, <= 100 ms).

Every run writes one JSON file, ``bench/results/ceiling-<UTC time>.json`` (``--out`` to choose),
rewritten after every trial: the command, the machine, the commit, the configuration and every
trial's row; and prints a row per trial and a summary table. Servers and clients are this
script's children and are stopped by their process ids.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from machine import machine_line, python_call_ns, stale_touch_us

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from duplex_actors.client.server_metrics import metrics_of, server_figures  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")
WINDOW_START, WINDOW_END = "lean: window start", "lean: window end"  # client/lean.py's markers


@dataclass(frozen=True)
class Arm:
    name: str
    dialect: str  # realtime | native
    chunk_ms: int

    @property
    def path(self) -> str:
        return "/v1/realtime?duplex=1" if self.dialect == "realtime" else "/v1/duplex"


ARMS = {a.name: a for a in (Arm(f"{d}-{c}", d, c) for d in ("realtime", "native") for c in (80, 20))}
DEFAULT_NS = (16, 32, 48, 64, 96, 128, 160, 192, 256)


# -- the search (pure) --------------------------------------------------------------------------
@dataclass
class Ramp:
    """One (arm, K)'s search: N up the list until a trial breaks, then bisection between the
    largest N held and the smallest broken down to ``resolution``. ``next_n()``: the next N to
    try (None: done); ``record`` its outcome. A state machine, so that searches interleave."""

    ns: Sequence[int]
    resolution: int = 8
    good: int = 0
    bad: int | None = None
    _next: int = 0
    tried: list[int] = field(default_factory=list)

    def next_n(self) -> int | None:
        if self.bad is None:
            while self._next < len(self.ns) and self.ns[self._next] <= self.good:
                self._next += 1
            return self.ns[self._next] if self._next < len(self.ns) else None
        if self.bad - self.good <= max(1, self.resolution):
            return None
        return (self.good + self.bad) // 2

    def record(self, n: int, held: bool) -> None:
        self.tried.append(n)
        if held:
            self.good = max(self.good, n)
        else:
            self.bad = n if self.bad is None else min(self.bad, n)


def held(report: dict[str, Any], step_ms: float, args: argparse.Namespace) -> tuple[bool, list[str]]:
    """This bench's criterion on the lean client's report."""
    a = report["aggregate"]
    reasons: list[str] = []
    if a["failed_sessions"]:
        reasons.append(f"{a['failed_sessions']} session(s) failed ({', '.join(sorted(a['failures']))})")
    if a["coverage"] < args.min_coverage:
        reasons.append(f"coverage {a['coverage']:.4f} < {args.min_coverage}")
    if a["lost_frames"] > args.max_lost:
        reasons.append(f"{a['lost_frames']} lost frame(s)")
    p99, bound = a["latency_ms"]["p99"], step_ms + args.p99_margin_ms
    if p99 is None or p99 > bound:
        reasons.append(f"latency p99 {p99} ms > {bound:g} ms")
    return not reasons, reasons


# -- processes ---------------------------------------------------------------------------------
def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _cpu_of_stat(text: str) -> float:
    fields = text.rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / HZ if len(fields) > 12 else 0.0


def _nice_of_stat(text: str) -> int | None:
    fields = text.rsplit(")", 1)[-1].split()
    return int(fields[16]) if len(fields) > 16 else None


def _runqueue_wait_of(schedstat: str) -> float:
    """Seconds a thread has waited runnable for a CPU (``/proc/.../schedstat``, second field)."""
    fields = schedstat.split()
    return int(fields[1]) / 1e9 if len(fields) > 1 else 0.0


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        for children in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                todo += [int(c) for c in children.read_text().split()]
    return out


def snapshot(root: int) -> dict[int, dict[str, Any]]:
    """CPU seconds of every process of the tree and of each of its threads, with their names,
    and how long each thread has waited runnable for a CPU: ``threads`` maps a thread id to
    ``(name, cpu_s, runqueue_wait_s)``."""
    out: dict[int, dict[str, Any]] = {}
    for pid in process_tree(root):
        stat = _read(f"/proc/{pid}/stat")
        if not stat:
            continue
        threads = {}
        for task in Path(f"/proc/{pid}/task").glob("*"):
            tstat = _read(f"{task}/stat")
            if tstat:
                threads[int(task.name)] = (
                    _read(f"{task}/comm").strip(),
                    _cpu_of_stat(tstat),
                    _runqueue_wait_of(_read(f"{task}/schedstat")),
                )
        out[pid] = {
            "comm": _read(f"/proc/{pid}/comm").strip(),
            "cmdline": " ".join(_read(f"/proc/{pid}/cmdline").split("\0")).strip(),
            "cpu_s": _cpu_of_stat(stat),
            "nice": _nice_of_stat(stat),
            "threads": threads,
        }
    return out


def role(pid: int, proc: dict[str, Any], root: int, engine_pattern: str, engine_process: bool) -> str:
    """``engine``, ``helper`` (multiprocessing's tracker, Opus workers) or ``frontend``."""
    text = f"{proc['comm']} {proc['cmdline']}"
    if re.search(engine_pattern, proc["comm"]) or re.search(engine_pattern, proc["cmdline"]):
        return "engine"
    if re.search(r"resource_tracker|semaphore_tracker|forkserver|opus|supervisor", text):
        return "helper"
    if engine_process and pid != root and "multiprocessing" in text:
        return "engine"  # today's --engine-process child: a spawned multiprocessing process
    return "frontend"


def cpu_window(
    before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]], root: int, window_s: float,
    frames: float | None, ticks: float | None, engine_pattern: str, engine_process: bool,
) -> dict[str, Any]:  # fmt: skip
    """The server's CPU over the window, per process and role: front-end CPU per session-frame,
    the busiest front end's % of a core, the engine core's CPU per tick; and how long the front
    ends' event loops and the engine core's main thread waited runnable for a CPU, per tick."""
    procs: list[dict[str, Any]] = []
    totals: dict[str, float] = {"frontend": 0.0, "engine": 0.0, "helper": 0.0}
    main_thread = 0.0  # the front ends' main threads: their event loops
    main_waits: dict[str, float] = {"frontend": 0.0, "engine": 0.0, "helper": 0.0}
    for pid, now in after.items():
        then = before.get(pid)
        cpu = now["cpu_s"] - (then["cpu_s"] if then else 0.0)  # a process born in the window: all of it
        kind = role(pid, now, root, engine_pattern, engine_process)
        totals[kind] += cpu
        threads = []
        for tid, (name, tcpu, twait) in now["threads"].items():
            _, t0, w0 = then["threads"].get(tid, (name, 0.0, 0.0)) if then else (name, 0.0, 0.0)
            if tid == pid:
                main_waits[kind] += twait - w0
                if kind == "frontend":
                    main_thread += tcpu - t0
            if tcpu - t0 > 0:
                threads.append({"tid": tid, "name": name, "cpu_pct": round(100 * (tcpu - t0) / window_s, 1)})
        procs.append(
            {
                "pid": pid,
                "role": kind,
                "comm": now["comm"],
                "cmdline": now["cmdline"][:200],
                "root": pid == root,
                "cpu_pct": round(100 * cpu / window_s, 1) if window_s > 0 else None,
                "us_per_frame": round(1e6 * cpu / frames, 1) if frames else None,
                "threads": sorted(threads, key=lambda t: -t["cpu_pct"])[:6],
            }
        )
    frontends = [p for p in procs if p["role"] == "frontend"]
    return {
        "processes": procs,
        "frontends": len(frontends),
        "frontend_cpu_s": round(totals["frontend"], 3),
        "frontend_us_per_frame": round(1e6 * totals["frontend"] / frames, 1) if frames else None,
        "frontend_main_thread_us_per_frame": round(1e6 * main_thread / frames, 1) if frames else None,
        "frontend_busiest_pct": max((p["cpu_pct"] or 0.0 for p in frontends), default=None),
        "engine_cpu_s": round(totals["engine"], 3) if any(p["role"] == "engine" for p in procs) else None,
        "engine_cpu_ms_per_tick": (
            round(1000 * totals["engine"] / ticks, 3)
            if ticks and any(p["role"] == "engine" for p in procs)
            else None
        ),
        "helper_cpu_s": round(totals["helper"], 3),
        "frontend_runqueue_ms_per_tick": round(1000 * main_waits["frontend"] / ticks, 3) if ticks else None,
        "engine_runqueue_ms_per_tick": (
            round(1000 * main_waits["engine"] / ticks, 3)
            if ticks and any(p["role"] == "engine" for p in procs)
            else None
        ),
    }


def runqueue_wait_s(before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]]) -> float:
    """Seconds all threads of a process tree waited runnable for a CPU between two snapshots."""
    total = 0.0
    for pid, now in after.items():
        then = before.get(pid, {"threads": {}})["threads"]
        for tid, (_, _, wait) in now["threads"].items():
            total += wait - then.get(tid, ("", 0.0, 0.0))[2]
    return total


def system_busy_s() -> float:
    """CPU-seconds the whole machine has been busy (all cores)."""
    fields = [int(x) for x in _read("/proc/stat").split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / HZ


def wait_quiet(limit_pct: float, timeout_s: float, log: Callable[[str], None]) -> float:
    """Until the machine's busy CPU over 2 s is under ``limit_pct`` of a core (at most
    ``timeout_s``); the last reading."""
    deadline, said = time.monotonic() + timeout_s, False
    while True:
        b0, t0 = system_busy_s(), time.monotonic()
        time.sleep(2.0)
        pct = 100 * (system_busy_s() - b0) / (time.monotonic() - t0)
        if pct < limit_pct or time.monotonic() > deadline:
            return pct
        if not said:
            log(f"  (machine busy: {pct:.0f}% of a core used by others; waiting up to {timeout_s:.0f} s)")
            said = True


# -- one trial ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return int(err.code), ""
    except (OSError, ValueError):
        return 0, ""


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("DUPLEX_FAULTS", None)
    return env


def default_client_cpu() -> str:
    allowed = sorted(os.sched_getaffinity(0))
    return str(allowed[-1]) if len(allowed) > 1 else ""


def taskset(cpus: str) -> list[str]:
    return ["taskset", "-c", cpus] if cpus and shutil.which("taskset") else []


def nice(increment: int) -> list[str]:
    return ["nice", "-n", str(increment)] if increment else []


class Server:
    """``duplex-actors serve`` as a child of this script."""

    def __init__(
        self, model: str, slots: int, frontends: int | None, extra: Sequence[str], workdir: Path, cpus: str
    ) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ceiling-", dir=workdir))
        self.cmd = [
            *taskset(cpus), sys.executable, "-m", "duplex_actors.cli", "serve", "--model", model,
            "--max-sessions", str(slots), "--host", "127.0.0.1", "--port", str(self.port),
            "--log-dir", str(self.dir / "sessions"), "--drain-timeout", "3",
            *(["--frontends", str(frontends)] if frontends is not None else []), *extra,
        ]  # fmt: skip
        self._log = open(self.dir / "server.log", "wb")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env()
        )
        self.ready_s: float | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.tail()}")
            status, body = http(self.base + "/ready", timeout=1.0)
            if status == 200 and '"ready":true' in body.replace(" ", ""):
                self.ready_s = time.monotonic() - self.t0
                return
            time.sleep(0.1)
        raise TimeoutError(f"the server was not ready within {timeout:.0f} s:\n{self.tail()}")

    def tail(self) -> str:
        return (self.dir / "server.log").read_text(errors="replace")[-3000:]

    def metrics(self) -> dict[str, float | None]:
        return metrics_of(*http(self.base + "/metrics"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            for pid in reversed(process_tree(self.proc.pid)):  # its own children, by their ids
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_client(
    server: Server,
    arm: Arm,
    n: int,
    phases: str,
    args: argparse.Namespace,
    on_marker: Callable[[str, int], None],
    out: Path,
) -> dict[str, Any]:
    """The lean client, pinned; ``on_marker(marker, client_pid)`` at its window markers; its
    report."""
    cmd = [
        *taskset(args.client_cpus), *nice(args.client_nice), sys.executable, "-m", "duplex_actors.client.load", "--lean",
        "--url", f"ws://127.0.0.1:{server.port}{arm.path}", "--sessions", str(n),
        "--seconds", str(args.seconds), "--warmup", str(args.warmup), "--chunk-ms", str(arm.chunk_ms),
        "--phases", phases, "--seed", str(args.seed), "--drain", str(args.drain),
        "--max-p99-ms", str(args.step_ms + args.p99_margin_ms), "--out", str(out),
    ]  # fmt: skip
    limit = args.warmup + args.seconds + args.drain + 120 + n * 0.5
    with open(out.parent / f"{out.name}.stderr", "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=child_env())
        watchdog = threading.Timer(limit, proc.kill)  # this client only, by its id
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() in (WINDOW_START, WINDOW_END):
                    on_marker(line.strip(), proc.pid)
            rc = proc.wait()
        finally:
            watchdog.cancel()
    report_path = out / "load.json"
    if rc != 0 or not report_path.exists():
        raise RuntimeError(
            f"the lean client exited with {rc}: {(out.parent / f'{out.name}.stderr').read_text()[-2000:]}"
        )
    report: dict[str, Any] = json.loads(report_path.read_text())
    return report


def trial(
    arm: Arm, k: int | None, n: int, args: argparse.Namespace, workdir: Path, log: Callable[[str], None], *,
    model: str, step_ms: float | None, phases: str, slots: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One fresh server, one lean run of N sessions, the row."""
    other_before = wait_quiet(args.wait_quiet, args.wait_quiet_s, log) if args.wait_quiet > 0 else None
    call_ns = python_call_ns()
    touch_warm_us, touch_stale_us = stale_touch_us()
    server = Server(model, slots or args.max_sessions or n, k, args.serve_args, workdir, args.server_cpus)
    marks: dict[str, tuple[float, float, dict[int, dict[str, Any]], dict[str, float | None]]] = {}
    client_snaps: dict[str, dict[int, dict[str, Any]]] = {}
    client_nice: list[int | None] = []  # as the kernel saw the client at the markers
    engine_process = "--engine-process" in args.serve_args

    def on_marker(line: str, client_pid: int) -> None:
        name = "start" if line == WINDOW_START else "end"
        t, busy = time.monotonic(), system_busy_s()
        if name == "start":
            metrics, snap = server.metrics(), snapshot(server.proc.pid)
        else:
            snap, metrics = snapshot(server.proc.pid), server.metrics()
        marks[name] = (t, busy, snap, metrics)
        client_snaps[name] = snapshot(client_pid)
        client_nice.append(client_snaps[name].get(client_pid, {}).get("nice"))

    try:
        server.wait_ready()
        report = run_client(server, arm, n, phases, args, on_marker, server.dir / "client")
    except Exception:
        log(f"  server log tail:\n{server.tail()}")
        server.stop()
        raise
    server.stop()
    if "start" not in marks or "end" not in marks:
        raise RuntimeError("the lean client printed no window markers")
    (t0, busy0, snap0, m0), (t1, busy1, snap1, m1) = marks["start"], marks["end"]
    window_s = t1 - t0
    figures = server_figures(m0, m1, report["aggregate"]["opened"])
    frames = figures.get("frames_out") or report["aggregate"]["frames_received_in_window"]
    cpu = cpu_window(
        snap0,
        snap1,
        server.proc.pid,
        window_s,
        frames,
        figures.get("steps"),
        args.engine_pattern,
        engine_process,
    )
    steps = figures.get("steps")
    client_wait_s = runqueue_wait_s(client_snaps["start"], client_snaps["end"])
    server_cpu = sum(s1["cpu_s"] - snap0.get(pid, {"cpu_s": 0.0})["cpu_s"] for pid, s1 in snap1.items())
    client_cpu = report["aggregate"]["client_cpu_s_window"]
    step = figures["step_ms_mean"]
    ok, reasons = held(report, step_ms if step_ms is not None else (step or 0.0), args)
    a = report["aggregate"]
    return {
        "arm": arm.name,
        "dialect": arm.dialect,
        "chunk_ms": arm.chunk_ms,
        "phases": phases,
        "k": k,
        "n": n,
        "model": model,
        "held": ok,
        "reasons": reasons,
        "coverage": a["coverage"],
        "lost": a["lost_frames"],
        "failed": a["failed_sessions"],
        "lat_p50": a["latency_ms"]["p50"],
        "lat_p99": a["latency_ms"]["p99"],
        "lat_max": a["latency_ms"]["max"],
        "step_ms": step,
        "steps": figures.get("steps"),
        "deadline_misses": figures.get("deadline_misses"),
        "frames": frames,
        "window_s": round(window_s, 3),
        **{
            key: cpu[key]
            for key in (
                "frontends",
                "frontend_us_per_frame",
                "frontend_main_thread_us_per_frame",
                "frontend_busiest_pct",
                "engine_cpu_ms_per_tick",
                "frontend_runqueue_ms_per_tick",
                "engine_runqueue_ms_per_tick",
            )
        },
        "client_runqueue_ms_per_tick": round(1000 * client_wait_s / steps, 3) if steps else None,
        "client_us_per_frame": a["client_cpu_us_per_frame"],
        "client_cpu_pct": a["client_cpu_pct"],
        "client_send_lag_p99_ms": a["send_lag_ms"]["p99"],
        "other_cpu_pct": round(100 * max(0.0, busy1 - busy0 - server_cpu - client_cpu) / window_s, 1)
        if window_s > 0
        else None,
        "other_cpu_pct_before": None if other_before is None else round(other_before, 1),
        "python_call_ns": round(call_ns, 1),
        "touch_warm_us": round(touch_warm_us, 1),
        "touch_stale_us": round(touch_stale_us, 1),
        "client_nice": client_nice[0] if client_nice else None,
        "server_ready_s": None if server.ready_s is None else round(server.ready_s, 2),
        "server": figures,
        "cpu": cpu,
        "client": {
            key: a[key]
            for key in (
                "frames_received",
                "frames_received_in_window",
                "frames_expected",
                "messages_sent",
                "latency_frames",
                "alignment_hints",
                "client_pads_applied",
                "error_events",
                "send_lag_ms",
                "client_cpu_us_per_message_sent",
            )
        },
    }


# -- output ------------------------------------------------------------------------------------
def _f(v: Any, digits: int = 1) -> str:
    return "-" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


COLUMNS = (
    "arm",
    "K",
    "N",
    "held",
    "cover",
    "lost",
    "p50 ms",
    "p99 ms",
    "step ms",
    "fe us/fr",
    "loop us/fr",
    "fe max %",
    "eng ms/tick",
    "cli us/fr",
    "lag p99",
    "other %",
    "rq loop/cli ms",
    "call ns",
    "stale x",
)


def row_cells(r: dict[str, Any]) -> list[str]:
    return [
        r["arm"], _f(r["k"]), str(r["n"]), "yes" if r["held"] else "NO", _f(r["coverage"], 4), _f(r["lost"]),
        _f(r["lat_p50"]), _f(r["lat_p99"]), _f(r["step_ms"]), _f(r["frontend_us_per_frame"]),
        _f(r["frontend_main_thread_us_per_frame"]), _f(r["frontend_busiest_pct"]),
        _f(r["engine_cpu_ms_per_tick"], 2), _f(r["client_us_per_frame"]), _f(r["client_send_lag_p99_ms"], 2),
        _f(r["other_cpu_pct"]),
        f"{_f(r.get('frontend_runqueue_ms_per_tick'), 2)}/{_f(r.get('client_runqueue_ms_per_tick'), 2)}",
        _f(r.get("python_call_ns")),
        _f(_ratio(r.get("touch_stale_us"), r.get("touch_warm_us"))),
    ]  # fmt: skip


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    lines = [
        "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def summary(result: dict[str, Any]) -> str:
    rows = []
    for s in result["searches"]:
        best = next(
            (
                r
                for r in result["trials"]
                if (r["arm"], r["k"], r["n"]) == (s["arm"], s["k"], s["largest_n_held"])
            ),
            None,
        )
        rows.append(
            [
                s["arm"], _f(s["k"]), str(s["largest_n_held"]), _f(s["smallest_n_broken"]),
                _f(best["frontend_us_per_frame"]) if best else "-", _f(best["lat_p99"]) if best else "-",
                _f(best["step_ms"]) if best else "-",
            ]
        )  # fmt: skip
    return table(("arm", "K", "N held", "N broke", "fe us/frame at N held", "p99 ms", "step ms"), rows)


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (
        out.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
        if out.returncode == 0
        else None
    )


# -- the runs ----------------------------------------------------------------------------------
def run_ramps(
    args: argparse.Namespace,
    result: dict[str, Any],
    save: Callable[[], None],
    workdir: Path,
    log: Callable[[str], None],
) -> None:
    model = f"standin:{args.step_ms:g}"
    ns = sorted(set(args.ns))
    searches = [
        (ARMS[name], k, Ramp(ns, args.resolution if args.bisect else 10**9))
        for name in args.arms
        for k in args.frontends
    ]
    log("  ".join(COLUMNS))
    while True:
        todo = [(arm, k, ramp, n) for arm, k, ramp in searches if (n := ramp.next_n()) is not None]
        if not todo:
            break
        for arm, k, ramp, n in todo:
            try:
                row = trial(
                    arm, k, n, args, workdir, log, model=model, step_ms=args.step_ms, phases=args.phases
                )
            except (RuntimeError, TimeoutError) as exc:
                log(f"{arm.name} K={_f(k)} N={n}: the trial failed: {exc}")
                row = {
                    "arm": arm.name,
                    "k": k,
                    "n": n,
                    "held": False,
                    "reasons": [f"trial failed: {exc}"],
                    "error": str(exc),
                }
                ramp.record(n, False)
                result["trials"].append(row)
                save()
                continue
            ramp.record(n, row["held"])
            result["trials"].append(row)
            log("  ".join(row_cells(row)) + ("" if row["held"] else "  " + "; ".join(row["reasons"])))
            result["searches"] = [
                {
                    "arm": a.name,
                    "k": kk,
                    "largest_n_held": r.good,
                    "smallest_n_broken": r.bad,
                    "tried": r.tried,
                }
                for a, kk, r in searches
            ]
            save()


def run_tiny(
    args: argparse.Namespace,
    result: dict[str, Any],
    save: Callable[[], None],
    workdir: Path,
    log: Callable[[str], None],
) -> None:
    arm = ARMS["realtime-20"]
    out: list[dict[str, Any]] = []
    for k in args.frontends:
        pair: dict[str, Any] = {"k": k, "sessions": args.tiny_sessions}
        for label, n in (("idle", 1), ("traffic", args.tiny_sessions)):
            row = trial(
                arm,
                k,
                n,
                args,
                workdir,
                log,
                model="tiny",
                step_ms=None,
                phases="random",
                slots=args.tiny_sessions,
            )
            pair[label] = row
            log(
                f"tiny K={_f(k)} {label} (N={n}): step {_f(row['step_ms'], 2)} ms, latency p50 {_f(row['lat_p50'])} / p99 {_f(row['lat_p99'])} ms, coverage {_f(row['coverage'], 4)}, front-end processes {_f(row['frontend_us_per_frame'])} us per frame (their main threads {_f(row['frontend_main_thread_us_per_frame'])})"
            )
        idle, busy = pair["idle"]["step_ms"], pair["traffic"]["step_ms"]
        pair["step_ratio"] = round(busy / idle, 3) if idle and busy else None
        pair["targets"] = {
            "step_within_1.2x_idle": pair["step_ratio"] is not None and pair["step_ratio"] <= 1.2,
            "p99_within_100_ms": pair["traffic"]["lat_p99"] is not None
            and pair["traffic"]["lat_p99"] <= 100.0,
        }
        log(
            f"tiny K={_f(k)}: step under traffic / idle = {_f(pair['step_ratio'], 3)} (target <= 1.2), p99 {_f(pair['traffic']['lat_p99'])} ms (target <= 100)"
        )
        out.append(pair)
        result["tiny"] = out
        save()


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def frontend_values(text: str) -> list[int | None]:
    """``--frontends``: K values; ``default`` runs the server without the flag."""
    return [None if x.strip() == "default" else int(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/ceiling.py", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--arms",
        type=lambda s: [a for a in s.split(",") if a],
        default=list(ARMS),
        help=f"comma-separated, of {', '.join(ARMS)} (default all)",
    )
    p.add_argument(
        "--frontends",
        type=frontend_values,
        default=[],
        help="K values, e.g. 1,2: serve --frontends K per search; 'default' runs serve without the "
        "flag, e.g. default,1,2 (default: the flag is never passed)",
    )
    p.add_argument("--ns", type=ints, default=list(DEFAULT_NS), help="the N ramp (default %(default)s)")
    p.add_argument(
        "--resolution", type=int, default=8, help="bisect until the broken N is within this of the held one"
    )
    p.add_argument("--no-bisect", dest="bisect", action="store_false", help="only the --ns list")
    p.add_argument("--seconds", type=float, default=12.0, help="the measured window per trial (default 12)")
    p.add_argument("--warmup", type=float, default=2.0, help="load before the window (default 2)")
    p.add_argument("--drain", type=float, default=2.0)
    p.add_argument("--step-ms", type=float, default=25.0, help="the stand-in engine's step (default 25)")
    p.add_argument("--phases", choices=("sync", "random", "spread"), default="sync")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-sessions", type=int, default=0, help="the server's slots (default: N of the trial)")
    p.add_argument(
        "--serve-args", type=shlex.split, default=[], help='appended to serve, e.g. "--tick-policy grid"'
    )
    p.add_argument(
        "--client-cpus",
        default=default_client_cpu(),
        help="taskset -c for the lean client (default: the last CPU this process may use, when it "
        "may use two or more; '' to not pin)",
    )
    p.add_argument("--server-cpus", default="", help="taskset -c for the server (default: not pinned)")
    p.add_argument(
        "--client-nice",
        type=int,
        default=0,
        help="nice increment for the lean client, e.g. -10 (root) so that the server's threads do not "
        "delay the instrument on a machine whose cores they share (default 0: as the server)",
    )
    p.add_argument("--min-coverage", type=float, default=0.99)
    p.add_argument("--max-lost", type=int, default=0)
    p.add_argument(
        "--p99-margin-ms", type=float, default=40.0, help="held: latency p99 <= step + this (default 40)"
    )
    p.add_argument(
        "--engine-pattern",
        default="engine",
        help="regex on a process's name or command line that marks the engine core",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=20.0,
        metavar="PCT",
        help="before each trial wait until others use under PCT%% of a core (0: do not wait)",
    )
    p.add_argument("--wait-quiet-s", type=float, default=300.0)
    p.add_argument(
        "--tiny", action="store_true", help="the tiny model's step idle vs under traffic instead of the ramps"
    )
    p.add_argument("--tiny-sessions", type=int, default=20)
    p.add_argument(
        "--out", type=Path, default=None, help="the JSON file (default bench/results/ceiling-<UTC time>.json)"
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where servers keep their logs during a trial (default: a temp dir)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown or not args.ns or any(n < 1 for n in args.ns) or args.seconds <= 0:
        print(
            f"ceiling.py: bad arguments (arms {unknown}, ns {args.ns}, seconds {args.seconds})",
            file=sys.stderr,
        )
        return 2
    if args.client_nice < 0 and os.geteuid() != 0:
        print("ceiling.py: a negative --client-nice needs root (nice would ignore it)", file=sys.stderr)
        return 2
    args.frontends = args.frontends or [None]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or ROOT / "bench" / "results" / f"ceiling-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "bench": "ceiling",
        "command": shlex.join([sys.executable, *sys.argv])
        if argv is None
        else shlex.join(["bench/ceiling.py", *argv]),
        "machine": machine_line(libraries=(), torch_threads=None),
        "commit": git_commit(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "trials": [],
        "searches": [],
    }

    def save() -> None:
        out.write_text(json.dumps(result, indent=1))

    def log(line: str) -> None:
        print(line, flush=True)

    log(result["machine"])
    workdir = Path(tempfile.mkdtemp(prefix="ceiling-", dir=args.workdir))
    t0 = time.monotonic()
    try:
        if args.tiny:
            run_tiny(args, result, save, workdir, log)
        else:
            run_ramps(args, result, save, workdir, log)
    except KeyboardInterrupt:
        log("interrupted: the results so far are saved")
        return 130
    finally:
        result["total_s"] = round(time.monotonic() - t0, 1)
        save()
        shutil.rmtree(workdir, ignore_errors=True)
    if not args.tiny:
        log("\n" + summary(result))
    log(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
