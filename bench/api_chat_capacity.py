"""Capacity of the ``/api/chat`` dialect (binary Ogg/Opus) next to the Realtime dialect, in one run.

For each dialect, the largest N of concurrent sessions one ``duplex-actors serve`` process holds
in real time, found as ``bench/serving.py`` finds the batched figure: a fresh server of exactly N
slots per N (a MoshiEngine steps its whole batch), N = 1, 2, 4, ... until real time breaks, then
bisection; each trial is one ``duplex-load`` run (same session code, analysis and criteria:
every session opened, coverage >= 0.99, round-trip p99 <= 80 ms, 0 lost frames; a broken trial
retried ``--retries`` times). The Realtime ramp runs first, then the ``/api/chat`` one, with
the same tiny checkpoint and seconds per trial. ``duplex-load --dialect api-chat`` pre-encodes its Opus once and
times replies from the Opus packet durations (decoding every 8th session), so it is not the
bottleneck; its CPU is reported.

Also measured per trial, from /proc: the server process's CPU and its children's (the Opus codec
workers of ``/api/chat``), as ms of CPU per session-frame (one session's 80 ms). The codec
figure gives the ceiling per codec worker: 80 ms / (codec ms per session-frame) sessions per
worker core, whatever the engine (on a GPU machine the engine no longer shares these cores).

    .venv/bin/python bench/api_chat_capacity.py [--seconds 10] [--max-n 32] [--json out.json]
    .venv/bin/python bench/api_chat_capacity.py --quick      # a smoke run: N = 1, 2, 3 s trials

Target: api-chat's largest N >= 75 % of the Realtime dialect's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import serving
from serving import HZ, CpuMeter, Server, fmt, load_cmd, ramp, read_load, summarize, wait_quiet, with_retry

FRAME_MS = 80.0
DIALECTS = ("realtime", "api-chat")


def children_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of every live direct child of ``pid`` (the server's codec workers)."""
    out: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / HZ
    return out


class ServerCpu:
    """The server's own CPU and its children's over a trial (children that exit mid-trial are
    missed: the codec workers live as long as the server)."""

    def __init__(self, server: Server) -> None:
        self.pid = server.proc.pid
        self.main0 = serving.process_cpu_s(self.pid)
        self.kids0 = children_cpu_s(self.pid)

    def read(self) -> tuple[float, float]:
        main = serving.process_cpu_s(self.pid) - self.main0
        kids = sum(cpu - self.kids0.get(pid, 0.0) for pid, cpu in children_cpu_s(self.pid).items())
        return main, kids


class ChildAwareMeter(CpuMeter):  # type: ignore[misc]  # bench/ is not a package: serving is Any
    """:class:`serving.CpuMeter`, with the server's children (codec workers) counted as the server's."""

    def __init__(self, server: Server, cpu: ServerCpu) -> None:
        super().__init__([server])
        self.cpu = cpu

    def other_pct(self) -> float:
        wall = time.monotonic() - self.t0
        _, kids = self.cpu.read()
        return max(0.0, super().other_pct() - (100 * kids / wall if wall > 0 else 0.0))


def url_of(server: Server, dialect: str) -> str:
    return server.url if dialect == "realtime" else f"ws://127.0.0.1:{server.port}/api/chat"


def trial(server: Server, dialect: str, n: int, seconds: float, out: Path, sync: bool) -> dict[str, Any]:
    server.wait_idle()
    cpu = ServerCpu(server)
    meter = ChildAwareMeter(server, cpu)
    proc = subprocess.run(
        load_cmd(url_of(server, dialect), n, seconds, out, sync),
        capture_output=True, text=True, env=serving.child_env(), timeout=seconds + 120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    main_s, kids_s = cpu.read()
    report = read_load(out, proc)
    frames = (report.get("aggregate") or {}).get("frames_received") or 0
    agg = report.get("aggregate") or {}
    return summarize(
        [report],
        {
            "other_cpu": meter.other_pct(),
            "server_cpu_ms_per_frame": 1000 * main_s / frames if frames else None,
            "codec_cpu_ms_per_frame": 1000 * kids_s / frames if frames else None,
            "client_cpu_per_session": agg.get("client_cpu_pct_per_session"),
            "audible_fraction": agg.get("audible_fraction"),
        },
    )


def run(args: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    sync = not args.spread
    rows: dict[str, list[dict[str, Any]]] = {d: [] for d in DIALECTS}
    largest: dict[str, int] = {}

    def tester(dialect: str) -> Callable[[int], dict[str, Any]]:
        def test(n: int) -> dict[str, Any]:
            server = Server(args.model, n, workdir, f"{dialect}-S{n}")
            with serving.running([server]):
                row = with_retry(
                    lambda a: trial(server, dialect, n, args.seconds, workdir / f"{dialect}-N{n}-a{a}", sync),
                    args.retries,
                )(n)
            row.update(n=n, slots=n, dialect=dialect)
            return row

        return test

    for dialect in DIALECTS:
        log(f"[{dialect}] one server process, N sessions on N slots")
        largest[dialect], rows[dialect] = ramp(tester(dialect), args.max_n, lambda n: n * 2, log)
    return {"largest": largest, "rows": rows, "sync": sync}


def print_report(res: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"Trials: {args.seconds:g} s of synthetic speech per session, {'sync' if res['sync'] else 'spread'} "
        "starts, criteria coverage >= 0.99, round-trip p99 <= 80 ms, 0 lost (duplex-load); server CPU "
        "and codec-worker CPU in ms per session-frame (80 ms of one session); load gen CPU: duplex-load's, "
        "% of one core (per session in brackets)."
    )
    print()
    print(
        "| dialect | N | held | coverage | rtt p50 ms | rtt p99 ms | lost | step ms | server CPU ms/frame "
        "| codec CPU ms/frame | load gen CPU % | other procs CPU % | why not |"
    )
    print("|---|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for dialect in DIALECTS:
        for r in sorted(res["rows"][dialect], key=lambda r: r["n"]):
            attempt = f" (#{r['attempt']})" if r.get("attempt", 1) > 1 else ""
            print(
                f"| {dialect} | {r['n']} | {'yes' if r['held'] else 'no'}{attempt} | {fmt(r['coverage'], '.3f')} "
                f"| {fmt(r['rtt_p50'])} | {fmt(r['rtt_p99'])} | {fmt(r['lost'], '.0f')} | {fmt(r['step_ms'])} "
                f"| {fmt(r['server_cpu_ms_per_frame'], '.2f')} | {fmt(r['codec_cpu_ms_per_frame'], '.2f')} "
                f"| {fmt(r['client_cpu'])} ({fmt(r['client_cpu_per_session'], '.2f')}) "
                f"| {fmt(r.get('other_cpu'), '.0f')} | {'; '.join(r['reasons'])[:160]} |"
            )
    print()
    rt, ac = res["largest"]["realtime"], res["largest"]["api-chat"]
    ratio = f"{ac / rt:.2f}" if rt else "-"
    cap = args.max_n
    print("| largest N, Realtime | largest N, /api/chat | ratio (target >= 0.75) |")
    print("|---:|---:|---:|")
    print(f"| {rt}{' (cap)' if rt == cap else ''} | {ac}{' (cap)' if ac == cap else ''} | {ratio} |")
    codec = [r["codec_cpu_ms_per_frame"] for r in res["rows"]["api-chat"] if r.get("codec_cpu_ms_per_frame")]
    if codec:
        per = sorted(codec)[len(codec) // 2]
        print()
        print(
            f"codec CPU per session-frame (median over the api-chat trials): {per:.2f} ms; ceiling per codec "
            f"worker (one core): {FRAME_MS / per:.0f} sessions (80 ms / {per:.2f} ms), before headroom"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seconds", type=float, default=10.0, help="audio per session per trial")
    parser.add_argument("--max-n", type=int, default=32, help="ramp cap (sessions = slots)")
    parser.add_argument("--retries", type=int, default=1, help="re-runs of a trial that broke")
    parser.add_argument("--spread", action="store_true", help="spread start phases (default: --sync-start)")
    parser.add_argument(
        "--opus-workers", type=int, default=None, help="serve --opus-workers (server default)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 s trials, N <= 2, no retry")
    parser.add_argument("--keep", type=Path, help="keep the work dir (load.json, PNGs, logs) here")
    parser.add_argument("--json", type=Path, help="also write every number as JSON here")
    parser.add_argument("--wait-quiet", type=float, default=300.0, help="as bench/serving.py's")
    parser.add_argument("--quiet-pct", type=float, default=15.0, help="%% of one core")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.max_n, args.retries = 3.0, 2, 0
    if args.opus_workers is not None:  # the servers' children inherit it (serve reads it)
        os.environ["DUPLEX_OPUS_WORKERS"] = str(args.opus_workers)
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {msg}", file=sys.stderr, flush=True)

    serving.QUIET.update(pct=args.quiet_pct, wait=args.wait_quiet, log=log)
    busy = wait_quiet(args.quiet_pct, args.wait_quiet, log) if args.wait_quiet > 0 else None
    workdir = Path(tempfile.mkdtemp(prefix="bench-api-chat-"))
    for line in serving.machine_lines():
        print(line)
    if busy is not None:
        print(f"CPU used by other processes just before the run: {busy:.0f}% of one core")
    print()
    try:
        res = run(args, workdir, log)
    finally:
        if args.keep:
            shutil.copytree(workdir, args.keep, dirs_exist_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)
    print_report(res, args)
    if args.json:
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **res}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
