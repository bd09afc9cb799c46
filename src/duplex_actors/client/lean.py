"""``duplex-load --lean``: N paced sessions from one thread over raw sockets, cheap enough on
the client's side to measure what serving costs the server on the same machine.

::

    duplex-load --lean --url ws://127.0.0.1:8000/v1/realtime?duplex=1 --sessions 64 --seconds 12 --warmup 2
    duplex-load --lean --url ws://127.0.0.1:8000/v1/duplex --chunk-ms 20 --phases random --out lean/

``duplex-load`` costs some 0.5 ms of its own CPU per session-frame (trio, trio-websocket, typed
events); this mode costs about a fifth of that, and every report says what it measured of
itself: ``client_cpu_us_per_frame``, its CPU time (user and system, ``time.process_time``) over
the measurement window divided by the output frames it received in it. How:

- one thread and one epoll (else poll) loop over non-blocking sockets, with the minimal
  WebSocket framing of :mod:`.lean_wire`;
- the audio is a 1 kHz tone, so every chunk is the same bytes: the append is encoded and masked
  once and sent to every session (:class:`~.lean_wire.Messages`);
- replies are counted and timed, not parsed: an output audio delta is recognised by its first
  bytes and its frame index and ``input_samples_end`` read from its last (text), or from the
  header of a native binary frame. The few other messages a session gets are parsed as JSON.

Dialects, by the URL's path: ``/v1/realtime`` (``?duplex=1`` or not): JSON, base64 PCM16 appends,
opened with ``autostart=0`` and a ``session.update``; ``/v1/duplex``: native, opened with
``session.create`` and ``binary_output: true``, binary PCM16 in, binary frames out.

Sessions open concurrently (at most 32 upgrading at once), then all stream from one start:
``--chunk-ms`` (80 or 20, or 10/40/100) per append on absolute deadlines, start phases within
one 80 ms tick by ``--phases`` (``sync``: all on the same instant, the pre-tick burst;
``random``: uniform, from ``--seed``; ``spread``). With ``--align client`` (the default) an
80 ms stream follows the server's alignment hints as ``duplex-load`` does: the next chunk goes
``pad_ms`` early holding ``80 - pad_ms`` ms, with ``pad_ms`` on it, and the stream goes on
80 ms at a time from there; the server pads shorter chunks itself. Native binary frames state
``input_samples_end`` only for ``client`` sessions, so on ``/v1/duplex`` chunks under 80 ms take
``--align client`` or ``off`` (with server pads the frame index would not time them).

Each session streams ``--warmup`` + ``--seconds`` of audio, then waits up to ``--drain`` s for
its last frames and closes (``session.close``). The measurement window is the ``--seconds``
after the warm-up: as the loop passes its start and its end it prints ``lean: window start`` and
``lean: window end`` on stdout (bench/ceiling.py samples the server's CPU there). Reported:

- coverage (frames received / frames the sent input and the pads can produce), lost frames (gaps
  in the frame indices) and frames out of order, over the whole run;
- latency per output frame: its arrival minus the send time of the chunk that held the client
  sample just before its ``input_samples_end`` (the last input it depends on; at 20 ms chunks,
  the chunk that completed the frame; with pads, as the server counted them), for the frames
  whose chunk was sent inside the window; p50/p99/max;
- the client's own CPU per frame and % of a core over the window, and its send lag (a send's
  time past its deadline: when it grows, the client is what is late);
- the server's counters over the run, from ``/metrics`` before and after (step mean, frames out,
  deadline misses...).

Held: every session opened, coverage >= 0.99, no lost frame, latency p99 <= ``--max-p99-ms``.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import heapq
import json
import resource
import select
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import attrs

from ..audio import FRAME_SAMPLES, SAMPLE_RATE
from .lean_wire import (
    NO_END,
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    FrameReader,
    Messages,
    WebSocketViolation,
    binary_frame_position,
    close_payload,
    delta_position,
    handshake_key,
    handshake_request,
    masked_frame,
    parse_handshake,
    text_audio_delta,
)
from .phases import start_offsets
from .server_metrics import http_base, scrape_now, server_figures
from .stats import Delta, continuity, percentiles

OPEN_CONCURRENCY: Final = 32
# One receive buffer for every socket (one thread): recv(n) would allocate n bytes each call, and
# past malloc's mmap threshold that is an mmap and a munmap per message.
RECV_BYTES: Final = 256 * 1024
START_DELAY_S: Final = 0.2  # from the last session opened to the first send
CLOSE_TIMEOUT_S: Final = 3.0
WINDOW_START: Final = "lean: window start"
WINDOW_END: Final = "lean: window end"


@attrs.frozen
class LeanOptions:
    url: str
    sessions: int
    seconds: float
    warmup_s: float = 0.0
    chunk_ms: int = 80
    phases: str = "sync"
    seed: int = 0
    align: str = "client"  # duplex.alignment; "none": no duplex key (a stock client)
    drain_s: float = 2.0
    api_key: str | None = None
    voice: str | None = None
    persona: str | None = None
    min_coverage: float = 0.99
    max_p99_ms: float = 80.0
    open_timeout_s: float = 60.0


def dialect_of(url: str) -> str:
    """``realtime`` or ``native`` (binary both ways), from the URL's path."""
    path = urlsplit(url).path.rstrip("/")
    if path.endswith("/v1/realtime"):
        return "realtime"
    if path.endswith("/v1/duplex"):
        return "native"
    raise ValueError(f"--lean loads /v1/realtime or /v1/duplex, not {path or '/'}")


def opening_message(opts: LeanOptions, dialect: str) -> str:
    """``session.update`` (Realtime, with autostart=0) or ``session.create`` (native, with
    ``binary_output``) carrying the session config."""
    session: dict[str, Any] = {"input_audio_format": "pcm16", "sample_rate_hz": SAMPLE_RATE}
    if opts.align != "none":
        session["duplex"] = {"alignment": opts.align}
    if opts.voice is not None:
        session["voice"] = opts.voice
    if opts.persona is not None:
        session["instructions"] = opts.persona
    if dialect == "native":
        return json.dumps({"type": "session.create", "session": session, "binary_output": True})
    return json.dumps({"type": "session.update", "session": session})


def wire_target(url: str, dialect: str) -> tuple[str, int, str, str]:
    """``(host, port, request target, Host header)``; the Realtime target gets ``autostart=0``."""
    parts = urlsplit(url)
    if parts.scheme != "ws":
        raise ValueError(f"--lean speaks plain ws://, not {parts.scheme}://")
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    query = parts.query
    if dialect == "realtime":
        pairs = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "autostart"]
        query = urlencode([*pairs, ("autostart", "0")])
    target = urlunsplit(("", "", parts.path or "/", query, ""))
    return host, port, target, parts.netloc


# -- one session -------------------------------------------------------------------------------
@attrs.define(eq=False, slots=True)
class LeanSession:
    """One connection's state and record; the loop appends, :func:`analyse` reads."""

    index: int
    offset: float
    sock: socket.socket | None = None
    state: str = "new"  # new, upgrading, opening, open, streaming, draining, closing, closed
    key: str = ""
    head: bytes = b""  # the upgrade answer until its head is whole
    reader: FrameReader = attrs.Factory(FrameReader)
    pending: bytearray | None = None  # bytes the socket did not take yet
    session_id: str | None = None
    failure: str | None = None
    errors: list[str] = attrs.Factory(list)
    close_code: int | None = None
    close_reason: str | None = None
    closed_reason: str | None = None  # session.closed's
    deadline: float = 0.0  # opening, draining or closing: until when
    # streaming
    generation: int = 0  # of the session's entry in the send heap
    next_due: float = 0.0
    chunks_left: int = 0
    samples_sent: int = 0
    pending_pad: int = 0
    send_at: list[float] = attrs.Factory(list)
    send_due: list[float] = attrs.Factory(list)
    send_end: list[int] = attrs.Factory(list)  # client samples sent after each append
    hints: list[tuple[float, int, str]] = attrs.Factory(list)
    pads: list[tuple[float, int]] = attrs.Factory(list)
    hints_ignored: int = 0
    # replies
    arrivals: list[float] = attrs.Factory(list)
    indices: list[int] = attrs.Factory(list)
    ends: list[int] = attrs.Factory(list)
    pad_seen: int = 0  # 24 kHz pad samples the deltas show (the most (k + 1) * 1920 - end)
    other_messages: int = 0
    parsed_deltas: int = 0  # deltas the cheap reading missed (parsed whole)

    def on_frame(self, now: float, index: int, end: int) -> None:
        self.arrivals.append(now)
        self.indices.append(index)
        self.ends.append(end)
        if end > NO_END:
            pad = (index + 1) * FRAME_SAMPLES - end
            if pad > self.pad_seen:
                self.pad_seen = pad

    def frames_expected(self) -> int:
        """Frames the client's samples and the pads can produce."""
        client_pads = sum(p for _, p in self.pads) * SAMPLE_RATE // 1000
        return (self.samples_sent + max(self.pad_seen, client_pads)) // FRAME_SAMPLES


# -- the loop ----------------------------------------------------------------------------------
class _Poller:
    """epoll where there is one, else poll (``register``/``modify``/``unregister``/``poll``)."""

    def __init__(self) -> None:
        self._epoll = getattr(select, "epoll", None)
        if self._epoll is not None:
            self._p: Any = self._epoll()
            self.IN, self.OUT = select.EPOLLIN, select.EPOLLOUT
        else:
            self._p = select.poll()
            self.IN, self.OUT = select.POLLIN, select.POLLOUT

    def register(self, fd: int, mask: int) -> None:
        self._p.register(fd, mask)

    def modify(self, fd: int, mask: int) -> None:
        self._p.modify(fd, mask)

    def unregister(self, fd: int) -> None:
        with contextlib.suppress(KeyError, OSError, ValueError):
            self._p.unregister(fd)

    def poll(self, timeout_s: float) -> list[tuple[int, int]]:
        timeout_s = max(0.0, timeout_s)
        if self._epoll is not None:
            return list(self._p.poll(timeout_s))
        return list(self._p.poll(timeout_s * 1000))

    def close(self) -> None:
        if self._epoll is not None:
            self._p.close()


def _cpu_s() -> float:
    return time.process_time()  # user + system, at the clock's resolution (os.times: 10 ms ticks)


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(
                resource.RLIMIT_NOFILE,
                (hard if hard == resource.RLIM_INFINITY else min(hard, max(needed, soft)), hard),
            )


class LeanLoad:
    """One run of N sessions (:meth:`run`); ``say`` prints the window markers."""

    def __init__(self, opts: LeanOptions, say: Callable[[str], None] | None = None) -> None:
        self.opts = opts
        self.dialect = dialect_of(opts.url)
        if self.dialect == "native" and opts.align in ("server", "none") and opts.chunk_ms != 80:
            # Binary frames state input_samples_end for "client" sessions only, and the frame
            # index is no measure once the server pads ("server", the default without a duplex
            # key, pads chunks shorter than 80 ms): the latency could not be measured.
            raise ValueError(
                "native binary frames carry input_samples_end only with --align client (the "
                f"server pads {opts.chunk_ms} ms chunks the same way for it): use --align client"
            )
        self.host, self.port, self.target, self.host_header = wire_target(opts.url, self.dialect)
        self.messages = Messages(
            opts.chunk_ms, binary=self.dialect == "native", opening=opening_message(opts, self.dialect)
        )
        self.chunk_s = opts.chunk_ms / 1000
        self.total_chunks = max(1, round((opts.warmup_s + opts.seconds) * 1000 / opts.chunk_ms))
        self.say = say or (lambda line: print(line, flush=True))
        self.sessions = [
            LeanSession(i, off) for i, off in enumerate(start_offsets(opts.sessions, opts.phases, opts.seed))
        ]
        self.poller = _Poller()
        self._recv_buffer = bytearray(RECV_BYTES)
        self._recv_view = memoryview(self._recv_buffer)
        self.by_fd: dict[int, LeanSession] = {}
        self.heap: list[tuple[float, int, int]] = []  # (due, session index, generation)
        self.t0 = 0.0
        self.window = (0.0, 0.0)
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}

    # -- sockets -------------------------------------------------------------------------------
    def _connect(self, s: LeanSession) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=10)
        except OSError as exc:
            s.failure, s.state = f"connect_failed: {exc}", "closed"
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        s.sock, s.key, s.state = sock, handshake_key(), "upgrading"
        s.deadline = time.monotonic() + self.opts.open_timeout_s
        self.by_fd[sock.fileno()] = s
        self.poller.register(sock.fileno(), self.poller.IN)
        self._send(s, handshake_request(self.host_header, self.target, s.key, self.opts.api_key))

    def _send(self, s: LeanSession, data: bytes) -> None:
        sock = s.sock
        if sock is None:
            return
        if s.pending is not None:
            s.pending += data
            return
        try:
            n = sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError as exc:
            self._lost(s, f"send failed: {exc}")
            return
        if n < len(data):
            s.pending = bytearray(data[n:])
            self.poller.modify(sock.fileno(), self.poller.IN | self.poller.OUT)

    def _flush(self, s: LeanSession) -> None:
        sock, pending = s.sock, s.pending
        if sock is None or pending is None:
            return
        try:
            n = sock.send(pending)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(s, f"send failed: {exc}")
            return
        del pending[:n]
        if not pending:
            s.pending = None
            self.poller.modify(sock.fileno(), self.poller.IN)

    def _shut(self, s: LeanSession) -> None:
        if s.sock is not None:
            self.poller.unregister(s.sock.fileno())
            self.by_fd.pop(s.sock.fileno(), None)
            with contextlib.suppress(OSError):
                s.sock.close()
            s.sock = None
        s.state = "closed"

    def _lost(self, s: LeanSession, why: str) -> None:
        """The connection ended: a failure unless we were closing it."""
        if s.state not in ("closing", "closed") and s.failure is None:
            s.failure = why if s.state in ("upgrading", "opening") else f"disconnected while {s.state}: {why}"
        self._shut(s)

    # -- receiving -----------------------------------------------------------------------------
    def _readable(self, s: LeanSession) -> None:
        sock = s.sock
        if sock is None:
            return
        try:
            got = sock.recv_into(self._recv_buffer)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(s, f"recv failed: {exc}")
            return
        if not got:
            self._lost(s, f"closed by the server ({s.close_code} {s.close_reason or ''})".strip())
            return
        now = time.monotonic()
        data = self._recv_view[:got].tobytes()
        if s.state == "upgrading":
            answer = parse_handshake(s.head + data, s.key)
            if answer is None:
                s.head += data
                return
            status, problem, data = answer
            s.head = b""
            if problem:
                s.failure = ("unauthorized: " if status in (401, 403) else "upgrade refused: ") + problem
                self._shut(s)
                return
            s.state = "opening"
            self._send(s, self.messages.opening)
            if not data:
                return
        try:
            messages = s.reader.feed(data)
        except WebSocketViolation as exc:
            self._lost(s, f"websocket: {exc}")
            return
        for opcode, payload in messages:
            if opcode == OP_BINARY:
                index, end = binary_frame_position(payload)
                s.on_frame(now, index, end)
            elif opcode == OP_TEXT:
                position = text_audio_delta(payload)
                if position is not None:
                    s.on_frame(now, position[0], position[1])
                else:
                    self._event(s, payload, now)
            elif opcode == OP_PING:
                self._send(s, masked_frame(OP_PONG, payload))
            elif opcode == OP_CLOSE:
                s.close_code, reason = close_payload(payload)
                s.close_reason = reason
                self._send(s, self.messages.close)  # the closing handshake's answer
                self._lost(s, f"closed by the server ({s.close_code} {reason})".strip())
                return

    def _event(self, s: LeanSession, payload: bytes, now: float) -> None:
        try:
            event = json.loads(payload)
        except ValueError:
            s.errors.append("unparsable_message")
            return
        if not isinstance(event, dict):
            return
        position = delta_position(event)
        if position is not None:
            s.parsed_deltas += 1
            s.on_frame(now, position[0], position[1])
            return
        s.other_messages += 1
        kind = event.get("type")
        if kind == "session.created":
            session = event.get("session")
            sid = event.get("session_id") or (session.get("id") if isinstance(session, dict) else None)
            s.session_id = sid if isinstance(sid, str) else None
        elif kind == "session.updated":
            if s.state == "opening":
                s.state = "open"
        elif kind == "input_audio_buffer.alignment":
            self._hint(s, event, now)
        elif kind == "error":
            code = event.get("code")
            if not isinstance(code, str):  # Realtime: under error
                err = event.get("error")
                code = err.get("code") if isinstance(err, dict) else None
            s.errors.append(str(code))
            if s.state == "opening" and s.failure is None:
                s.failure = str(code)
        elif kind == "session.closed":
            reason = event.get("reason")
            s.closed_reason = reason if isinstance(reason, str) else None

    def _hint(self, s: LeanSession, event: dict[str, Any], now: float) -> None:
        pad, reason = event.get("pad_ms"), event.get("reason")
        if not isinstance(pad, int) or not 0 < pad < 80:
            s.hints_ignored += 1
            return
        s.hints.append((now, pad, str(reason)))
        if self.opts.chunk_ms != 80 or self.opts.align != "client" or s.state != "streaming":
            s.hints_ignored += 1  # the server pads other chunk sizes itself
            return
        if s.pending_pad:
            s.hints_ignored += 1  # superseded before a chunk could apply it
        s.pending_pad = pad
        s.generation += 1
        heapq.heappush(self.heap, (s.next_due - pad / 1000, s.index, s.generation))

    # -- sending -------------------------------------------------------------------------------
    def _send_chunk(self, s: LeanSession) -> None:
        pad = s.pending_pad
        if pad:
            frame, samples = self.messages.padded(pad)
            due = s.next_due - pad / 1000
            s.pending_pad = 0
        else:
            frame, samples = self.messages.chunk, self.messages.chunk_samples
            due = s.next_due
        self._send(s, frame)
        now = time.monotonic()
        if pad:
            s.pads.append((now, pad))
        s.samples_sent += samples
        s.send_at.append(now)
        s.send_due.append(due)
        s.send_end.append(s.samples_sent)
        s.chunks_left -= 1
        if s.chunks_left > 0 and s.state == "streaming":
            s.next_due = due + self.chunk_s
            heapq.heappush(self.heap, (s.next_due, s.index, s.generation))
        elif s.state == "streaming":
            s.state = "draining"
            s.deadline = now + self.opts.drain_s

    # -- the phases ----------------------------------------------------------------------------
    def _open_all(self) -> None:
        todo = list(reversed(self.sessions))
        deadline = time.monotonic() + self.opts.open_timeout_s
        while True:
            upgrading = sum(1 for s in self.sessions if s.state in ("upgrading", "opening"))
            while todo and upgrading < OPEN_CONCURRENCY:
                self._connect(todo.pop())
                upgrading += 1
            if not todo and upgrading == 0:
                return
            now = time.monotonic()
            if now > deadline:
                for s in self.sessions:
                    if s.state in ("upgrading", "opening", "new"):
                        s.failure = s.failure or f"not open within {self.opts.open_timeout_s:g} s"
                        self._shut(s)
                return
            self._dispatch(self.poller.poll(0.05))

    def _dispatch(self, events: list[tuple[int, int]]) -> None:
        out = self.poller.OUT
        for fd, mask in events:
            s = self.by_fd.get(fd)
            if s is None:
                continue
            if mask & out:
                self._flush(s)
            if mask & ~out:
                self._readable(s)

    def _stream(self) -> None:
        opened = [s for s in self.sessions if s.state == "open"]
        self.t0 = t0 = time.monotonic() + START_DELAY_S
        self.window = (t0 + self.opts.warmup_s, t0 + self.opts.warmup_s + self.opts.seconds)
        for s in opened:
            s.state = "streaming"
            s.next_due = t0 + s.offset
            s.chunks_left = self.total_chunks
            heapq.heappush(self.heap, (s.next_due, s.index, s.generation))
        self.cpu["start"], self.wall["start"] = _cpu_s(), time.monotonic()
        marks = [(self.window[0], "window_start", WINDOW_START), (self.window[1], "window_end", WINDOW_END)]
        heap, sessions = self.heap, self.sessions
        heappop, monotonic = heapq.heappop, time.monotonic
        while True:
            now = monotonic()
            while heap and heap[0][0] <= now:
                _, i, generation = heappop(heap)
                s = sessions[i]
                if generation == s.generation and s.state == "streaming":
                    self._send_chunk(s)
            if marks and marks[0][0] <= now:
                _, name, line = marks.pop(0)
                self.cpu[name], self.wall[name] = _cpu_s(), monotonic()
                self.say(line)
            if not heap:
                if not self._wind_down(now):
                    break
            wake = heap[0][0] if heap else now + 0.01
            if marks:
                wake = min(wake, marks[0][0])
            self._dispatch(self.poller.poll(wake - monotonic()))
        self.cpu["end"], self.wall["end"] = _cpu_s(), monotonic()
        while marks:  # a run shorter than its window (every session failed)
            _, name, line = marks.pop(0)
            self.cpu[name], self.wall[name] = self.cpu["end"], self.wall["end"]
            self.say(line)

    def _wind_down(self, now: float) -> bool:
        """Drained sessions close, closing ones are cut at their deadline; False once none is
        left (every send is done by then)."""
        alive = False
        for s in self.sessions:
            if s.state == "draining":
                if len(s.arrivals) >= s.frames_expected() or now >= s.deadline:
                    self._send(s, self.messages.session_close)
                    s.state, s.deadline = "closing", now + CLOSE_TIMEOUT_S
            if s.state == "closing" and now >= s.deadline:
                self._shut(s)
            if s.state not in ("closed", "new", "open"):
                alive = True
        return alive

    def run(self) -> dict[str, Any]:
        """Open, stream, drain, close; the report (see :func:`analyse`)."""
        _raise_fd_limit(self.opts.sessions + 64)
        base = http_base(self.opts.url)
        before = scrape_now(base, self.opts.api_key)
        try:
            self._open_all()
            self._stream()
        finally:
            for s in self.sessions:
                self._shut(s)
            self.poller.close()
        time.sleep(0.2)  # the server's counters settle after the closes
        after = scrape_now(base, self.opts.api_key)
        opened = sum(1 for s in self.sessions if s.send_at)
        server = server_figures(before, after, opened)
        return analyse(self, server)


# -- the report --------------------------------------------------------------------------------
def frame_latencies(s: LeanSession, since: float) -> tuple[list[float], bool]:
    """Latency (s) of the session's output frames whose input chunk was sent at or after
    ``since``, and whether they came from ``input_samples_end`` (else by frame index: frame k
    ends at client sample (k + 1) * 1920, exact without pads)."""
    out: list[float] = []
    from_end = False
    ends, send_at = s.send_end, s.send_at
    for arrival, index, end in zip(s.arrivals, s.indices, s.ends, strict=True):
        if end == NO_END:
            sample = (index + 1) * FRAME_SAMPLES
        elif end <= 0:
            continue  # only pad: depends on no client sample
        else:
            sample, from_end = end, True
        i = bisect.bisect_left(ends, sample)  # the first append whose end reaches the sample
        if i < len(send_at) and send_at[i] >= since:
            out.append(arrival - send_at[i])
    return out, from_end


def _ms(values: list[float]) -> dict[str, float | None]:
    return percentiles([v * 1000 for v in values])


def analyse(run: LeanLoad, server: dict[str, Any]) -> dict[str, Any]:
    opts = run.opts
    w0, w1 = run.window
    per_session: list[dict[str, Any]] = []
    latencies: list[float] = []
    lags: list[float] = []
    any_end = False
    for s in run.sessions:
        session_latencies, from_end = frame_latencies(s, w0)
        any_end = any_end or from_end
        latencies += session_latencies
        lags += [a - d for a, d in zip(s.send_at, s.send_due, strict=True) if a >= w0]
        lost, out_of_order = continuity([Delta(0.0, 0, k, 1) for k in s.indices]) if s.indices else (0, 0)
        expected = s.frames_expected()
        per_session.append(
            {
                "index": s.index,
                "session_id": s.session_id,
                "start_offset_ms": round(s.offset * 1000, 3),
                "failure": s.failure,
                "errors": s.errors,
                "close": [s.close_code, s.close_reason],
                "closed_reason": s.closed_reason,
                "messages_sent": len(s.send_at),
                "frames_sent": -(-s.samples_sent // FRAME_SAMPLES),
                "frames_expected": expected,
                "frames_received": len(s.arrivals),
                "coverage": round(len(s.arrivals) / expected, 4) if expected else 0.0,
                "lost_frames": lost,
                "out_of_order": out_of_order,
                "latency_ms": _ms(session_latencies),
                "alignment_hints": [[round((t - run.t0) * 1000, 1), p, why] for t, p, why in s.hints],
                "pads_applied_ms": [p for _, p in s.pads],
                "hints_ignored": s.hints_ignored,
                "other_messages": s.other_messages,
                "parsed_deltas": s.parsed_deltas,
            }
        )
    failed = [s for s in run.sessions if s.failure]
    expected = sum(p["frames_expected"] for p in per_session)
    received = sum(p["frames_received"] for p in per_session)
    in_window = sum(1 for s in run.sessions for t in s.arrivals if w0 <= t < w1)
    sent_in_window = sum(1 for s in run.sessions for t in s.send_at if w0 <= t < w1)
    cpu_window = run.cpu.get("window_end", 0.0) - run.cpu.get("window_start", 0.0)
    wall_window = run.wall.get("window_end", 0.0) - run.wall.get("window_start", 0.0)
    cpu_run = run.cpu.get("end", 0.0) - run.cpu.get("start", 0.0)
    wall_run = run.wall.get("end", 0.0) - run.wall.get("start", 0.0)
    lat = _ms(latencies)
    agg: dict[str, Any] = {
        "sessions": opts.sessions,
        "opened": sum(1 for s in run.sessions if s.send_at),
        "failed_sessions": len(failed),
        "failures": dict(Counter((s.failure or "").split(":")[0] for s in failed)),
        "messages_sent": sum(p["messages_sent"] for p in per_session),
        "frames_sent": sum(p["frames_sent"] for p in per_session),
        "frames_expected": expected,
        "frames_received": received,
        "coverage": round(received / expected, 4) if expected else 0.0,
        "lost_frames": sum(p["lost_frames"] for p in per_session),
        "out_of_order": sum(p["out_of_order"] for p in per_session),
        "latency_ms": lat,
        "latency_frames": len(latencies),
        "latency_source": "input_samples_end" if any_end else "frame_index",
        "send_lag_ms": _ms(lags),
        "alignment_hints": sum(len(s.hints) for s in run.sessions),
        "client_pads_applied": sum(len(s.pads) for s in run.sessions),
        "hints_ignored": sum(s.hints_ignored for s in run.sessions),
        "error_events": dict(Counter(e for s in run.sessions for e in s.errors)),
        "parsed_deltas": sum(s.parsed_deltas for s in run.sessions),
        "window_s": round(wall_window, 3),
        "frames_received_in_window": in_window,
        "messages_sent_in_window": sent_in_window,
        "client_cpu_s_window": round(cpu_window, 4),
        "client_cpu_pct": round(100 * cpu_window / wall_window, 2) if wall_window > 0 else None,
        "client_cpu_us_per_frame": round(1e6 * cpu_window / in_window, 2) if in_window else None,
        "client_cpu_us_per_message_sent": round(1e6 * cpu_window / sent_in_window, 2)
        if sent_in_window
        else None,
        "client_cpu_us_per_frame_run": round(1e6 * cpu_run / received, 2) if received else None,
        "client_cpu_pct_run": round(100 * cpu_run / wall_run, 2) if wall_run > 0 else None,
    }
    reasons: list[str] = []
    if failed:
        reasons.append(f"{len(failed)} session(s) failed ({', '.join(sorted(agg['failures']))})")
    if agg["coverage"] < opts.min_coverage:
        reasons.append(f"coverage {agg['coverage']:.4f} < {opts.min_coverage}")
    if agg["lost_frames"]:
        reasons.append(f"{agg['lost_frames']} lost frame(s)")
    p99 = lat["p99"]
    if p99 is None or p99 > opts.max_p99_ms:
        reasons.append(f"latency p99 {p99} ms > {opts.max_p99_ms:g} ms")
    return {
        "mode": "lean",
        "url": opts.url,
        "dialect": run.dialect,
        "binary": run.dialect == "native",
        "sessions": opts.sessions,
        "seconds": opts.seconds,
        "warmup_s": opts.warmup_s,
        "chunk_ms": opts.chunk_ms,
        "phases": opts.phases,
        "seed": opts.seed,
        "align": opts.align,
        "input": f"{TONE_DESCRIPTION}, pcm16@24000",
        "criteria": {"min_coverage": opts.min_coverage, "max_p99_latency_ms": opts.max_p99_ms, "lost": 0},
        "held": not reasons,
        "reasons": reasons,
        "aggregate": agg,
        "server": server,
        "per_session": per_session,
    }


TONE_DESCRIPTION: Final = "1 kHz tone at -20 dBFS"


def summary(report: dict[str, Any]) -> str:
    a, srv = report["aggregate"], report["server"]
    lat, lag = a["latency_ms"], a["send_lag_ms"]
    verdict = "held real time" if report["held"] else "broke real time: " + "; ".join(report["reasons"])

    def num(v: Any, digits: int = 1) -> str:
        return "-" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))

    return "\n".join(
        [
            f"lean: N={report['sessions']} {report['dialect']}{' (binary)' if report['binary'] else ''}, "
            f"{report['chunk_ms']} ms chunks, phases {report['phases']}: {verdict}",
            f"  frames: sent {a['frames_sent']} ({a['messages_sent']} messages), received {a['frames_received']} "
            f"of {a['frames_expected']} (coverage {a['coverage']:.4f}), lost {a['lost_frames']}, "
            f"out of order {a['out_of_order']}; sessions opened {a['opened']}/{report['sessions']}",
            f"  latency ({a['latency_source']}, {a['latency_frames']} frames after {report['warmup_s']:g} s "
            f"warm-up): p50 {num(lat['p50'])} ms, p99 {num(lat['p99'])} ms, max {num(lat['max'])} ms",
            f"  client: {num(a['client_cpu_us_per_frame'])} us CPU per frame received "
            f"({num(a['client_cpu_us_per_message_sent'])} per message sent, {num(a['client_cpu_pct'])}% of a core), "
            f"send lag p99 {num(lag['p99'], 2)} ms, max {num(lag['max'], 2)} ms",
            f"  server: step mean {num(srv.get('step_ms_mean'), 2)} ms, frames out {num(srv.get('frames_out'), 0)}, "
            f"deadline misses {num(srv.get('deadline_misses'), 0)}, hints {a['alignment_hints']} "
            f"({a['client_pads_applied']} applied)",
        ]
    )


# -- the command (duplex-load --lean) -------------------------------------------------------------
def lean_problems(args: argparse.Namespace) -> list[str]:
    """The ``duplex-load`` options given that ``--lean`` does not take."""
    out: list[str] = []
    if args.ramp:
        out.append("--ramp")
    if args.jitter != "loopback" or any(
        v is not None for v in (args.jitter_mean_ms, args.jitter_burst_ms, args.jitter_burst_every)
    ):
        out.append("--jitter")
    if args.input is not None:
        out.append("--input (the lean client sends a tone)")
    if str(args.input_format) != "pcm16@24000" or args.output_format is not None:
        out.append("--input-format/--output-format (pcm16@24000 only)")
    if args.dialect == "api-chat":
        out.append("--dialect api-chat")
    if args.sync_start and args.phases not in ("sync", "spread"):
        out.append("--sync-start with --phases")
    return out


def main_lean(args: argparse.Namespace) -> int:
    """``duplex-load --lean`` (exit codes as ``duplex-load``'s)."""
    problems = lean_problems(args)
    if problems:
        print(f"duplex-load --lean does not take {', '.join(problems)}", file=sys.stderr)
        return 2
    opts = LeanOptions(
        url=args.url,
        sessions=args.sessions,
        seconds=args.seconds,
        warmup_s=args.warmup,
        chunk_ms=args.chunk_ms,
        phases="sync" if args.sync_start else args.phases,
        seed=args.seed,
        align=args.align,
        drain_s=args.drain,
        api_key=args.api_key,
        voice=args.voice,
        persona=args.persona,
        max_p99_ms=args.max_p99_ms,
    )
    try:
        load = LeanLoad(opts)
    except ValueError as exc:
        print(f"duplex-load: {exc}", file=sys.stderr)
        return 2
    report = load.run()
    failures = [s.failure or "" for s in load.sessions]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(json.dumps(report, indent=1))
    if all(f.startswith("unauthorized") for f in failures):
        print(f"duplex-load: {failures[0]}", file=sys.stderr)
        return 3
    if all(f.startswith("connect_failed") for f in failures):
        print(f"duplex-load: {failures[0]}", file=sys.stderr)
        return 5
    if all(failures):
        print(f"duplex-load: no session could be opened: {sorted(set(failures))}", file=sys.stderr)
        return 4
    print(summary(report), flush=True)
    return 0
