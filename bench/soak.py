"""Soak: a real ``duplex-actors serve`` under churn for minutes; does anything leak or get lost?

``--sessions`` lanes (default 16) each run sessions back to back until ``--minutes`` (default 10)
are up. A session lasts a random 5-60 s (``--min-session-s``/``--max-session-s``) of speech-like
audio paced in real time on 80 ms deadlines (the ``duplex-load`` way: pre-encoded appends on the
Realtime route); ``--abrupt`` of them (default 0.2) are cut at a random point by closing the TCP
connection with an RST and no WebSocket close frame, the others close with ``session.close``
after waiting for their last frame. Every ``--sample-s`` seconds the server's RSS
(``/proc/<pid>/status`` VmRSS), open file descriptors (``/proc/<pid>/fd``), threads, slots in use
and open sessions are sampled.

At the end: every lane stops, the slots must be back to 0 (``/metrics`` duplex_slots_in_use), the
idle RSS and fd count are compared with the idle start, the server is stopped with SIGTERM (exit 0
expected), and ``duplex-replay`` replays every log (exit 0: each is identical, or consistent for a
log without its end record). Lost frames: for each gracefully closed session, input frames that
got no output frame (sent - received) plus gaps in the output frame indices; 0 expected.

    .venv/bin/python bench/soak.py --minutes 10 --out build/soak
    .venv/bin/python bench/soak.py --minutes 0.5 --sessions 4 --max-session-s 10   # a quick check

Writes ``soak.json`` (every sample, every session) into ``--out``, prints a summary; exit 0 when
every check held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, cast

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.client.audio import EncodedAudio, encode_audio, speech_like
from duplex_actors.client.connection import open_duplex_client
from duplex_actors.client.errors import DuplexError, ResourceExhausted
from duplex_actors.client.events import AudioDelta, Error, ServerEvent
from machine import machine_line

FRAME_S = 0.08
BIN = Path(sys.executable).parent


# -- the server process ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()
    except OSError:
        return 0, ""


def metric_sum(text: str, name: str) -> float | None:
    """Sum of every sample of ``name`` (all label sets) in Prometheus text; None if absent."""
    values = [
        float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    ]
    return sum(values) if values else None


def proc_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                out[key] = int(value.split()[0])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return out


@attrs.define
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log_dir: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"


def start_server(out: Path, model: str, max_sessions: int, extra: list[str]) -> Server:
    port = free_port()
    log_dir = out / "sessions"
    log = open(out / "server.log", "wb")  # the server process owns it for its life
    proc = subprocess.Popen(
        [
            *(str(BIN / "duplex-actors"), "serve", "--model", model, "--port", str(port)),
            *("--max-sessions", str(max_sessions), "--log-dir", str(log_dir), *extra),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Server(proc, port, log_dir)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"soak: the server exited at start-up; see {out / 'server.log'}")
        if http_get(server.base + "/ready", timeout=2)[0] == 200:
            return server
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("soak: the server was not ready within 120 s")


# -- one session ----------------------------------------------------------------------------------
@attrs.define
class SessionResult:
    lane: int
    index: int
    planned_s: float
    abrupt: bool
    session_id: str | None = None
    frames_sent: int = 0
    frames_received: int = 0
    index_gaps: int = 0
    errors: list[str] = attrs.Factory(list)
    close_reason: str | None = None
    close_code: int | None = None
    failure: str | None = None
    refused: bool = False  # every slot was taken (an abruptly closed session's not yet freed)
    wall_s: float = 0.0

    @property
    def lost(self) -> int:
        """Frames lost by a gracefully closed session (0 for an abrupt one: it left on purpose)."""
        if self.abrupt or self.failure or self.refused:
            return 0
        return max(0, self.frames_sent - self.frames_received) + self.index_gaps


async def one_session(
    url: str, audio: EncodedAudio, result: SessionResult, rng: random.Random, drain_s: float
) -> None:
    frames = max(1, round(result.planned_s / FRAME_S))
    messages = audio.messages[:frames]
    enc = EncodedAudio(messages, len(messages) * FRAME_SAMPLES, audio.input_format)
    cut_at = rng.uniform(0.5, result.planned_s) if result.abrupt else None
    expected_index = [0]

    def on_event(event: ServerEvent) -> None:
        if type(event) is AudioDelta:
            if event.epoch == 0 and event.frame_index > expected_index[0]:
                result.index_gaps += event.frame_index - expected_index[0]
            expected_index[0] = max(expected_index[0], event.frame_index + event.frames)
        elif type(event) is Error:
            result.errors.append(event.code)

    t0 = time.monotonic()
    try:
        async with open_duplex_client(url, queue_events=False, on_event=on_event) as client:
            result.session_id = client.session_id
            if cut_at is None:
                await client.stream(enc)
                await client.wait_frames(enc.frames, timeout=drain_s)
            else:
                with trio.move_on_after(cut_at):
                    await client.stream(enc)
                # Abrupt: RST, no close frame, then leave without a goodbye.
                result.frames_sent = client.frames_sent
                result.frames_received = client.frames_received
                sock = cast(trio.SocketStream, client.ws._stream).socket
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                await client.ws._stream.aclose()
                raise _Cut
            result.frames_sent = client.frames_sent
            result.frames_received = client.frames_received
        result.close_reason = client.closed_event.reason if client.closed_event else None
        result.close_code = client.close_code
    except* _Cut:
        pass
    except* ResourceExhausted:
        result.refused = True
    except* (DuplexError, trio.TooSlowError, OSError) as group:
        result.failure = "; ".join(f"{type(e).__name__}: {e}" for e in group.exceptions)
    result.wall_s = round(time.monotonic() - t0, 3)


class _Cut(Exception):
    pass


# -- the run ----------------------------------------------------------------------------------------
async def soak(args: argparse.Namespace, server: Server, out: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    audio = encode_audio(speech_like(args.max_session_s + 1, seed=args.seed), "pcm16")
    results: list[SessionResult] = []
    samples: list[dict[str, Any]] = []
    t_start = time.monotonic()
    deadline = t_start + args.minutes * 60
    counter = [0]
    server_died: list[float | None] = [None]

    async def sample(phase: str) -> dict[str, Any]:
        status, text = await trio.to_thread.run_sync(http_get, server.base + "/metrics")
        row: dict[str, Any] = {
            "t_s": round(time.monotonic() - t_start, 1),
            "phase": phase,
            **proc_status(server.proc.pid),
            "slots_in_use": metric_sum(text, "duplex_slots_in_use") if status == 200 else None,
            "sessions_active": metric_sum(text, "duplex_sessions_active") if status == 200 else None,
            "sessions_opened": metric_sum(text, "duplex_sessions_opened_total") if status == 200 else None,
            "connection_errors": metric_sum(text, "duplex_connection_errors_total")
            if status == 200
            else None,
        }
        samples.append(row)
        return row

    async def sampler() -> None:
        while True:
            await trio.sleep(args.sample_s)
            row = await sample("load")
            print(
                f"soak: t={row['t_s']:6.0f} s  rss {row.get('VmRSS', 0) / 1024:7.1f} MiB  fds "
                f"{row.get('fds')}  threads {row.get('Threads')}  slots {row['slots_in_use']}  "
                f"sessions so far {len(results)}",
                flush=True,
            )

    async def lane(i: int) -> None:
        lane_rng = random.Random(rng.random())
        await trio.sleep(lane_rng.uniform(0, 2))  # stagger the first opens
        while True:
            left = deadline - time.monotonic()
            if left < args.min_session_s:
                return
            planned = lane_rng.uniform(args.min_session_s, min(args.max_session_s, left))
            counter[0] += 1
            result = SessionResult(i, counter[0], round(planned, 2), lane_rng.random() < args.abrupt)
            results.append(result)
            await one_session(server.url, audio, result, lane_rng, args.drain_s)
            if result.refused:
                await trio.sleep(0.1)  # a slot is still being freed: try again shortly
            elif result.failure:
                await trio.sleep(0.5)  # never spin on a failing server
            if server.proc.poll() is not None:
                server_died[0] = round(time.monotonic() - t_start, 1)
                return

    start_sample = await sample("idle start")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler)
        async with trio.open_nursery() as lanes:
            for i in range(args.sessions):
                lanes.start_soon(lane, i)
        nursery.cancel_scope.cancel()
    load_s = time.monotonic() - t_start
    # Slots back to 0 (bounded wait), then the idle end sample.
    slots_back_s = None
    t_idle = time.monotonic()
    with trio.move_on_after(30):
        while True:
            row = await sample("drain")
            if server.proc.poll() is not None:
                break
            if row["slots_in_use"] == 0 and row["sessions_active"] == 0:
                slots_back_s = round(time.monotonic() - t_idle, 3)
                break
            await trio.sleep(0.1)
    await trio.sleep(1.0)
    end_sample = await sample("idle end")
    load_rows = [s for s in samples if s["phase"] == "load"]
    return {
        "load_s": round(load_s, 1),
        "start": start_sample,
        "end": end_sample,
        "first_load_sample": load_rows[0] if load_rows else None,
        "max_rss_kib": max((s.get("VmRSS", 0) for s in samples), default=0),
        "max_fds": max((s.get("fds", 0) for s in samples), default=0),
        "slots_back_to_0_s": slots_back_s,
        "server_exited_during_load_at_s": server_died[0],
        "samples": samples,
        "sessions": [attrs.asdict(r) | {"lost": r.lost} for r in results],
    }


def replay_all(log_dir: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "duplex-replay"), str(log_dir)], capture_output=True, text=True, timeout=1800
    )
    lines = proc.stdout.strip().splitlines()
    results = [line for line in lines[1:-1]]
    return {
        "exit_code": proc.returncode,
        "summary": lines[-1] if lines else proc.stderr.strip()[-500:],
        "logs": len(results),
        "identical": sum(1 for line in results if "identical" in line),
        "consistent_without_end": sum(1 for line in results if "consistent" in line),
        "not_reproduced": [line for line in results if not re.search(r"identical|consistent", line)][:20],
        "seconds": round(time.monotonic() - t0, 1),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="soak.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--sessions", type=int, default=16, help="concurrent lanes (and server slots)")
    p.add_argument("--min-session-s", type=float, default=5.0)
    p.add_argument("--max-session-s", type=float, default=60.0)
    p.add_argument("--abrupt", type=float, default=0.2, help="fraction of sessions cut by an RST")
    p.add_argument("--drain-s", type=float, default=10.0, help="wait for the last frames of a session")
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="tiny-parrot")
    p.add_argument("--out", default="build/soak")
    p.add_argument("--max-fd-growth", type=int, default=4, help="idle end - idle start fds allowed")
    p.add_argument("--server-arg", action="append", default=[], help="extra `serve` argument")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "sessions").exists() and any((out / "sessions").iterdir()):
        print(f"soak: {out / 'sessions'} is not empty; use a fresh --out", file=sys.stderr)
        return 2
    server = start_server(out, args.model, args.sessions, args.server_arg)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    try:
        report = trio.run(soak, args, server, out)
    finally:
        alive = server.proc.poll() is None
        t0 = time.monotonic()
        if alive:
            server.proc.send_signal(signal.SIGTERM)
        try:
            rc = server.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            rc = server.proc.wait()
        exit_s = round(time.monotonic() - t0, 3)
    replay = replay_all(server.log_dir)
    attempts = report["sessions"]
    sessions = [s for s in attempts if not s["refused"]]
    graceful = [s for s in sessions if not s["abrupt"]]
    start, end = report["start"], report["end"]
    first = report["first_load_sample"] or start
    summary = {
        "command": "bench/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_line(libraries=()),
        "started": started,
        "minutes": args.minutes,
        "lanes": args.sessions,
        "load_s": report["load_s"],
        "sessions": len(sessions),
        "sessions_graceful": len(graceful),
        "sessions_abrupt": len(sessions) - len(graceful),
        "refused_resource_exhausted": len(attempts) - len(sessions),
        "session_failures": [s for s in sessions if s["failure"] and not s["abrupt"]][:20],
        "error_events": sum(len(s["errors"]) for s in sessions),
        "frames_sent_graceful": sum(s["frames_sent"] for s in graceful),
        "frames_lost": sum(s["lost"] for s in sessions),
        "rss_mib": {
            "idle_start": round(start.get("VmRSS", 0) / 1024, 1),
            "first_load_sample": round(first.get("VmRSS", 0) / 1024, 1),
            "max": round(report["max_rss_kib"] / 1024, 1),
            "idle_end": round(end.get("VmRSS", 0) / 1024, 1),
        },
        "fds": {"idle_start": start.get("fds"), "max": report["max_fds"], "idle_end": end.get("fds")},
        "threads": {"idle_start": start.get("Threads"), "idle_end": end.get("Threads")},
        "slots_in_use_end": end.get("slots_in_use"),
        "slots_back_to_0_s": report["slots_back_to_0_s"],
        "connection_errors_end": end.get("connection_errors"),
        "server_exit_code": rc,
        "server_exit_s": exit_s,
        "server_alive_until_sigterm": alive,
        "server_exited_during_load_at_s": report["server_exited_during_load_at_s"],
        "replay": replay,
    }
    checks = {
        "server alive until SIGTERM, exit 0": alive and rc == 0,
        "slots back to 0": end.get("slots_in_use") == 0,
        "0 frames lost": summary["frames_lost"] == 0,
        "no failed graceful session": not summary["session_failures"],
        "fds back to idle": (end.get("fds") or 0) - (start.get("fds") or 0) <= args.max_fd_growth,
        "every log replays (duplex-replay exit 0)": replay["exit_code"] == 0,
    }
    summary["checks"] = checks
    summary["ok"] = all(checks.values())
    (out / "soak.json").write_text(
        json.dumps({**summary, "samples": report["samples"], "all_sessions": attempts}, indent=1)
    )
    print(json.dumps(summary, indent=1))
    for name, ok in checks.items():
        print(f"soak: {'ok  ' if ok else 'FAIL'} {name}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
