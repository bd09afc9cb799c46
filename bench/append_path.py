"""Where the time of one client message goes, in CPU time: the per-append path from the socket to
the session's log and back.

Everything is measured as CPU time of the thread that does the work (``time.thread_time``, or
the front end's main thread from ``/proc/PID/task/PID/stat``), never as wall time, so that the
figures hold on a machine other processes load; ratios are measured within one run.

Arms (all by default; ``--arms`` picks some):

* ``server``: a real ``duplex-actors serve --model tiny-parrot`` process with the message and
  byte budgets lifted; one Realtime client (this process) sends N ``input_audio_buffer.append``
  messages of 1 sample and of 480 samples (20 ms), 64 WebSocket frames per ``send``, then a
  heartbeat, and waits for its ack. CPU per append = its front end's event-loop thread's CPU over
  that span / N (everything: hypercorn and wsproto, quart, the dialect, the session actor, the
  core, the log records). Also 200 KB ``session.update`` messages (refused past the 256 KiB
  config bound after the first, as the config attacker of tests/reliability sends them).
* ``inproc``: the same appends through ``web.connection.Connection`` over an in-memory
  transport (no socket, no hypercorn/quart), with the real server objects (scheduler, session
  actor, core, log writer with fdatasync in its threads): CPU per append of the event-loop
  thread, then a cProfile of the same run grouped by layer (profiling inflates every call; the
  shares are what matters).
* ``components``: each step of the path alone, N times in a loop: JSON, the event parse, base64,
  the dialect's parse into a command, the budget, the core's apply, the log record's encoding.
* ``gil``: the engine thread's share of the GIL: ``engine.step`` (tiny-parrot, 2 slots) timed
  in a thread, idle and while the event loop runs the in-process storm (1-sample appends as
  fast as it can, and 200 KB session.updates), in one run: the step's wall time ratio, and the
  longest single hold of the GIL by one message seen as the step's worst case.

    .venv/bin/python bench/append_path.py [--arms server,inproc,components,gil] [-n 5000]
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import itertools
import json
import os
import pstats
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from duplex_actors.client.frames import client_frame
from machine import machine_line

REPO = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("duplex-actors"))
CLK_TCK = os.sysconf("SC_CLK_TCK")
UNLIMITED = ["--max-messages-per-s", "1e9", "--message-burst", "1e9", "--max-bytes-per-s", "1e12"]
UNLIMITED += ["--byte-burst", "1e12", "--input-budget", "600", "--idle-timeout", "600"]
# (the control bytes of non-audio messages have no flag: the 200 KB updates below are held to
# 128 KiB/s after a 1 MiB burst, so their wall time shows the budget; their CPU is the work)


def append_text(samples: int) -> str:
    pcm = (b"\x10\x00") * samples
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


def update_text(i: int) -> str:
    return json.dumps({"type": "session.update", "event_id": f"u{i}", "session": {f"k{i}": "x" * 200_000}})


# -- a minimal WebSocket client (masked frames, as RFC 6455 asks of clients) ---------------------
def frame(payload: bytes, opcode: int = 1) -> bytes:
    return client_frame(opcode, payload)


class Client:
    def __init__(self, port: int, path: str = "/v1/realtime") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        self.buf = b""
        self.deltas = 0  # audio deltas seen by wait_for
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        assert b" 101 " in head.split(b"\r\n")[0], head

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def wait_for(self, needle: bytes, timeout: float = 120.0, count: int = 1) -> None:
        """Read server frames until ``count`` of them hold ``needle`` (the server's frames are
        unmasked); counts the audio deltas it reads on the way in ``deltas``."""
        self.sock.settimeout(timeout)
        while True:
            if count <= 0:
                return
            while len(self.buf) >= 2:
                n, at = self.buf[1] & 0x7F, 2
                if n == 126:
                    n, at = struct.unpack(">H", self.buf[2:4])[0], 4
                elif n == 127:
                    n, at = struct.unpack(">Q", self.buf[2:10])[0], 10
                if len(self.buf) < at + n:
                    break
                payload, self.buf = self.buf[at : at + n], self.buf[at + n :]
                is_delta = b"output_audio.delta" in payload[:64]
                self.deltas += is_delta
                if needle in payload[:64]:
                    count -= 1
                    if count <= 0:
                        return
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError("server closed the connection")
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def thread_cpu_s(pid: int, tid: int | None = None) -> float:
    """utime + stime of one thread of ``pid`` (its main thread by default), in seconds."""
    fields = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# -- arm: a real server ------------------------------------------------------------------------
def start_server(
    log_dir: Path, *args: str, profile: Path | None = None
) -> tuple[subprocess.Popen[str], int, int]:
    """``serve`` with one front end: its process, its port, and its front end's pid (the
    process whose event loop reads the appends; ``profile``: its cProfile statistics go to
    ``profile.0`` when it exits, through ``DUPLEX_FRONTEND_PROFILE``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        EXE,
        "serve",
        "--model",
        "tiny-parrot",
        "--port",
        str(port),
        "--log-dir",
        str(log_dir),
        "--frontends",
        "1",
        *args,
    ]
    env = dict(os.environ)
    if profile is not None:
        env["DUPLEX_FRONTEND_PROFILE"] = str(profile)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if b" 200 " in s.recv(4096):
                    return proc, port, frontend_pid(proc.pid)
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server not ready in 120 s")


def frontend_pid(parent: int) -> int:
    """The pid of ``parent``'s child named ``duplex-fe-0`` (``serve``'s one front end)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        if ppid == parent and comm == "duplex-fe-0":
            return int(stat.parent.name)
    raise RuntimeError(f"serve (pid {parent}) has no front end named duplex-fe-0")


def server_arm(n: int, profile: Path | None = None, top: int = 0) -> dict[str, float]:
    out: dict[str, float] = {}
    cpu: dict[int, tuple[float, int]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-append-") as tmp:
        proc, port, fe = start_server(Path(tmp), "--max-sessions", "2", *UNLIMITED, profile=profile)
        try:
            client = Client(port)
            client.wait_for(b"session.updated")
            heartbeat = frame(b'{"type":"session.heartbeat"}')
            # (label, samples per append, appends): 1-sample appends make no frame; the 20 ms
            # and 80 ms arms carry the same 10 s of audio, and are timed until its last output
            # frame is back, so the difference between them is the cost of 375 more messages.
            arms = (
                ("warm-up", 1, 1024),
                ("1 sample", 1, n),
                ("480 samples (20 ms)", 480, 500),
                ("1920 samples (80 ms)", 1920, 125),
            )
            for label, samples, count in arms:
                per_send = min(64, count)
                batch = frame(append_text(samples).encode()) * per_send
                sent = count // per_send * per_send
                frames = sent * samples // 1920
                t0, p0, w0 = thread_cpu_s(fe), process_cpu_s(fe), time.perf_counter()
                for _ in range(count // per_send):
                    client.send(batch)
                client.send(heartbeat)
                client.wait_for(b"heartbeat_ack")
                if frames:
                    client.wait_for(b"output_audio.delta", count=frames - client.deltas)
                t1, p1, w1 = thread_cpu_s(fe), process_cpu_s(fe), time.perf_counter()
                client.deltas = 0
                if label != "warm-up":
                    out[f"server {label}: event-loop CPU us/append"] = 1e6 * (t1 - t0) / sent
                    out[f"server {label}: process CPU us/append"] = 1e6 * (p1 - p0) / sent
                    out[f"server {label}: wall us/append"] = 1e6 * (w1 - w0) / sent
                    cpu[samples] = (t1 - t0, sent)
            (c20, n20), (c80, n80) = cpu[480], cpu[1920]
            out["server 20 ms vs 80 ms chunks, same audio: event-loop CPU us per extra message"] = (
                1e6 * (c20 - c80) / (n20 - n80)
            )
            # Held to a rate (the storm as the message budget admits it, 200/s, and 400/s: 20
            # sessions' 20 ms chunks): CPU above the idle session's, per append.
            t0, w0 = thread_cpu_s(fe), time.perf_counter()
            time.sleep(2.0)
            idle_per_s = (thread_cpu_s(fe) - t0) / (time.perf_counter() - w0)
            one = frame(append_text(1).encode())
            for rate in (200, 400):
                per_tick, seconds = rate // 100, 4.0
                t0, w0 = thread_cpu_s(fe), time.perf_counter()
                for k in range(int(seconds * 100)):
                    client.send(one * per_tick)
                    time.sleep(max(0.0, w0 + (k + 1) * 0.01 - time.perf_counter()))
                client.send(heartbeat)
                client.wait_for(b"heartbeat_ack")
                spent = thread_cpu_s(fe) - t0 - idle_per_s * (time.perf_counter() - w0)
                out[f"server 1 sample paced at {rate}/s: event-loop CPU us/append above idle"] = (
                    1e6 * spent / (seconds * rate)
                )
            client.close()
            client = Client(port)
            client.wait_for(b"session.updated")
            updates = 20
            t0, w0 = thread_cpu_s(fe), time.perf_counter()
            for i in range(updates):
                client.send(frame(update_text(i).encode()))
            client.send(heartbeat)
            client.wait_for(b"heartbeat_ack")
            t1, w1 = thread_cpu_s(fe), time.perf_counter()
            out["server 200 KB session.update: event-loop CPU ms/update"] = 1e3 * (t1 - t0) / updates
            out["server 200 KB session.update: wall ms/update"] = 1e3 * (w1 - w0) / updates
            client.close()
        finally:
            proc.terminate()
            proc.wait(30)
    if profile is not None:
        print_layers(pstats.Stats(f"{profile}.0"), "the front end's event loop (cProfile, whole run)", top)
    return out


# -- arm: in process ---------------------------------------------------------------------------
async def _inproc_run(engine: Any, messages: list[str], profile: cProfile.Profile | None) -> float:
    import attrs
    import trio

    from duplex_actors.counters import Counters
    from duplex_actors.server import open_duplex_server
    from duplex_actors.web.budget import RateLimits
    from duplex_actors.web.connection import Connection, Transport, capabilities
    from duplex_actors.web.dialects import RealtimeDialect

    unlimited = RateLimits(messages_per_s=1e9, message_burst=1e9, bytes_per_s=1e12, byte_burst=1e12)
    if hasattr(unlimited, "control_bytes_per_s"):  # measure the work, not the budget
        unlimited = attrs.evolve(unlimited, control_bytes_per_s=1e12, control_byte_burst=1e12)
    with tempfile.TemporaryDirectory(prefix="bench-append-") as tmp:
        async with open_duplex_server(engine, log_dir=tmp, fsync=True) as server:
            queue = iter([*messages, '{"type":"session.close"}'])

            async def receive() -> str:
                try:
                    return next(queue)
                except StopIteration:
                    await trio.sleep_forever()
                    raise

            async def ignore(*_: Any) -> None:
                pass

            dialect = RealtimeDialect(model="m", capabilities=capabilities(2), beta=False)
            conn = Connection(
                server,
                Transport(receive, ignore, ignore),
                dialect=dialect,
                idle_timeout_s=600,
                counters=Counters(),
                rate_limits=unlimited,
            )
            await trio.sleep(0.3)
            t0 = time.thread_time()
            if profile is not None:
                profile.enable()
            await conn.run()
            if profile is not None:
                profile.disable()
            return time.thread_time() - t0


LAYERS = (
    (
        "trio scheduling (checkpoints, cancel scopes, wake-ups, epoll)",
        ("/trio/", "epoll", "contextlib", "outcome"),
    ),
    ("JSON (json.loads/dumps)", ("json/", "'loads'", "'dumps'", "encode_basestring", "scan_once")),
    ("protocol parse (codec, events, cattrs)", ("protocol/", "cattrs", "<cattrs")),
    ("hypercorn + wsproto + h11", ("hypercorn", "wsproto", "h11")),
    ("quart + quart-trio", ("quart",)),
    ("dialect + connection + budget (web/)", ("web/",)),
    ("server handle + session actor + inbox", ("server.py", "session/actor.py", "session/inbox.py")),
    ("session core (_append, refusal_for)", ("session/core.py",)),
    ("audio decode (audio.py, numpy)", ("audio.py", "numpy")),
    ("log record encode + writer", ("log/",)),
)


def layer_of(key: tuple[str, int, str]) -> str:
    text = f"{key[0]}:{key[2]!r}"
    for name, needles in LAYERS:
        if any(n in text for n in needles):
            return name
    return "other (builtins, attrs, ...)"


def _open_engine() -> Any:
    from duplex_actors.model.factory import open_engine

    return open_engine("tiny-parrot", slots=2)


def inproc(n: int, top: int) -> dict[str, float]:
    import trio

    engine = _open_engine()
    out: dict[str, float] = {}
    for label, samples in (("1 sample", 1), ("480 samples (20 ms)", 480)):
        cpu = trio.run(_inproc_run, engine, [append_text(samples)] * n, None)
        out[f"inproc {label}: event-loop CPU us/append"] = 1e6 * cpu / n
    cpu = trio.run(_inproc_run, engine, [update_text(i) for i in range(20)], None)
    out["inproc 200 KB session.update: event-loop CPU ms/update"] = 1e3 * cpu / 20
    profile = cProfile.Profile()
    trio.run(_inproc_run, engine, [append_text(1)] * n, profile)
    print_layers(pstats.Stats(profile), f"the in-process 1-sample path ({n} appends)", top)
    return out


def print_layers(stats: pstats.Stats, what: str, top: int) -> None:
    by_layer: dict[str, float] = {}
    total = 0.0
    for key, (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        by_layer[layer_of(key)] = by_layer.get(layer_of(key), 0.0) + tottime
        total += tottime
    print(f"cProfile of {what}; shares of the profiled time:")
    for name, t in sorted(by_layer.items(), key=lambda kv: -kv[1]):
        print(f"  {100 * t / total:5.1f} %  {name}")
    if top:
        stats.sort_stats("tottime").print_stats(top)


# -- arm: components ---------------------------------------------------------------------------
def per_call_us(fn: Callable[[], object], count: int) -> float:
    fn()
    t0 = time.thread_time()
    for _ in range(count):
        fn()
    return 1e6 * (time.thread_time() - t0) / count


def components(n: int) -> dict[str, float]:
    from duplex_actors.web.budget import InputBudget, RateLimits

    out: dict[str, float] = {}
    for label, samples in (("1 sample", 1), ("480 samples", 480)):
        out.update(_components_of(label, samples, n))
    budget = InputBudget(RateLimits(messages_per_s=1e9, message_burst=1e9), 0.0)
    ticks = itertools.count()
    out["budget.admit"] = per_call_us(lambda: budget.admit(next(ticks) * 1e-4, 100), n)
    return out


def _components_of(label: str, samples: int, n: int) -> dict[str, float]:
    import wsproto
    import wsproto.events

    from duplex_actors.log import records as r
    from duplex_actors.log.segment import encode_record
    from duplex_actors.protocol import audio_formats, parsing
    from duplex_actors.session.core import SessionCore
    from duplex_actors.web.connection import capabilities
    from duplex_actors.web.dialects import RealtimeDialect

    out: dict[str, float] = {}
    dialect = RealtimeDialect(model="m", capabilities=capabilities(2), beta=False)
    config = {"voice": "v", "instructions": "p"}
    text = append_text(samples)
    event: Any = parsing.parse_client_text(text, dialect="realtime")
    assert type(event).__name__ == "InputAudioBufferAppend"
    out[f"{label}: json.loads (plain)"] = per_call_us(lambda: json.loads(text), n)
    out[f"{label}: parsing.parse_client_text"] = per_call_us(
        lambda: parsing.parse_client_text(text, dialect="realtime"), n
    )
    out[f"{label}: audio_formats.decode_append (format + base64)"] = per_call_us(
        lambda: audio_formats.decode_append(event, config), n
    )
    out[f"{label}: dialect.parse (all of the above)"] = per_call_us(lambda: dialect.parse(text, config), n)
    record = r.Append(b"\x10\x00" * samples)
    out[f"{label}: log encode_record(append)"] = per_call_us(lambda: encode_record(7, record), n)
    core = _core_for_bench(SessionCore)
    k = max(1, n // 4)
    t0 = time.thread_time()
    for _ in range(k):
        core.apply(record)
        if core.buffered_samples > 20 * 24000:
            core = _core_for_bench(SessionCore)
    out[f"{label}: core.apply(append)"] = 1e6 * (time.thread_time() - t0) / k

    ws = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
    ws.receive_data(
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    request = next(ws.events())
    ws.send(wsproto.events.AcceptConnection())
    assert isinstance(request, wsproto.events.Request)
    wire = frame(text.encode()) * 64

    def ws_receive() -> None:
        ws.receive_data(wire)
        for _ in ws.events():
            pass

    out[f"{label}: wsproto frame receipt"] = per_call_us(ws_receive, max(1, n // 64)) / 64
    return out


def _core_for_bench(core_cls: Any) -> Any:
    from duplex_actors.log import records as r

    class Prompt:
        voice = persona = None

    class Policy:
        def session_prompt(self, **_: Any) -> Prompt:
            return Prompt()

        def check_context(self, prompt: Any) -> None:
            pass

    core = core_cls("sess_bench", Policy())
    core.apply(r.Open({}))
    return core


# -- arm: the engine thread's share of the GIL -------------------------------------------------
def gil_arm(n: int) -> dict[str, float]:
    """engine.step in a thread (as the scheduler runs it) beside the in-process storm, at the
    server's switch interval (0.5 ms): the steps that ran wholly inside the storm against those
    of the idle spans before and after it, in one run."""
    import numpy as np
    import trio

    sys.setswitchinterval(0.0005)  # what `duplex-actors serve` sets (--switch-interval-ms)
    engine = _open_engine()
    prompt = engine.family.session_prompt(voice=None, persona=None, sampling={}, extra=None)
    for slot in range(engine.slots):
        engine.reset(slot, prompt)
    rng = np.random.default_rng(0)
    frames = {s: (0.1 * rng.standard_normal(1920)).astype(np.float32) for s in range(2)}
    steps: list[tuple[float, float]] = []  # (start, end), perf_counter
    stop = threading.Event()

    def stepper() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            engine.step(frames)
            steps.append((t0, time.perf_counter()))
            time.sleep(0.005)

    def within(t0: float, t1: float) -> list[float]:
        return [e - s for s, e in steps if s >= t0 and e <= t1]

    out: dict[str, float] = {}
    engine_for_server = _open_engine()
    thread = threading.Thread(target=stepper, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)
        for label, messages in (
            ("1-sample append storm", [append_text(1)] * n),
            ("200 KB session.update stream", [update_text(i % 40) for i in range(60)]),
        ):
            i0 = time.perf_counter()
            time.sleep(2.0)
            b0 = time.perf_counter()
            cpu = trio.run(_inproc_run, engine_for_server, messages, None)
            b1 = time.perf_counter()
            time.sleep(2.0)
            i1 = time.perf_counter()
            idle = within(i0, b0) + within(b1, i1)
            busy = within(b0, b1)
            if not busy:
                print(f"gil {label}: no step finished inside the {b1 - b0:.2f} s run")
                continue
            base = float(np.median(idle))
            out[f"gil {label}: step median ms idle"] = 1e3 * base
            out[f"gil {label}: step median ms under it"] = 1e3 * float(np.median(busy))
            out[f"gil {label}: step max ms under it"] = 1e3 * max(busy)
            out[f"gil {label}: step median ratio (under it / idle)"] = float(np.median(busy)) / base
            out[f"gil {label}: steps under it"] = len(busy)
            out[f"gil {label}: event-loop CPU per message us"] = 1e6 * cpu / len(messages)
    finally:
        stop.set()
        thread.join()
    return out


def print_table(results: dict[str, float]) -> None:
    print()
    print("| measurement | value |")
    print("|---|---:|")
    for key, value in results.items():
        print(f"| {key} | {value:.2f} |")
    print(flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default="server,inproc,components,gil")
    parser.add_argument("-n", type=int, default=5000, help="appends per measurement")
    parser.add_argument("--profile-server", type=Path, help="run the server under cProfile, stats here")
    parser.add_argument("--top", type=int, default=0, help="also print the profile's top N functions")
    args = parser.parse_args(argv)
    arms = set(args.arms.split(","))
    print(machine_line())
    print(f"uptime: {Path('/proc/loadavg').read_text().split()[:3]} (load average)")
    if "server" in arms:
        print_table(server_arm(args.n, args.profile_server, args.top))
    if "inproc" in arms:
        print_table(inproc(args.n, args.top))
    if "components" in arms:
        print_table(components(args.n))
    if "gil" in arms:
        print_table(gil_arm(args.n))


if __name__ == "__main__":
    main()
