"""One codec worker process: ``python -m duplex_actors.opus.worker`` (started by :mod:`.pool`).

Reads requests from stdin, runs them one at a time on the streams it owns and answers on
stdout (:mod:`.wire`). It ends on EOF of stdin, which also happens when the server dies, so it
ignores SIGINT and SIGTERM: a Ctrl-C or a service manager's SIGTERM to the process group must
not kill the codec under a server that is still draining its sessions.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import BinaryIO

import numpy as np

from . import wire
from .codec import OggOpusDecoder, OggOpusEncoder, OpusUndecodable


class _Stream:
    __slots__ = ("decoder", "encoder")

    def __init__(self) -> None:
        self.decoder: OggOpusDecoder | None = None
        self.encoder: OggOpusEncoder | None = None


def _read_exact(inp: BinaryIO, n: int) -> bytes | None:
    data = inp.read(n)
    if data is None or len(data) < n:
        return None
    return data


def _run(stream: _Stream, op: int, payload: bytes) -> bytes:
    if op == wire.DECODE or op == wire.DISCARD:
        if stream.decoder is None:
            stream.decoder = OggOpusDecoder()
        if op == wire.DISCARD:
            stream.decoder.discard(payload)
            return b""
        return stream.decoder.feed(payload).tobytes()
    if op == wire.ENCODE:
        if stream.encoder is None:
            stream.encoder = OggOpusEncoder()
        return stream.encoder.encode(np.frombuffer(payload, dtype=np.float32))
    raise ValueError(f"unknown op {op}")


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    streams: dict[int, _Stream] = {}
    out.write(wire.response(wire.READY_ID, wire.OK, 0.0, str(os.getpid()).encode()))
    out.flush()
    while True:
        header = _read_exact(inp, wire.REQUEST.size)
        if header is None:
            return
        request_id, stream_id, op, length = wire.REQUEST.unpack(header)
        payload = _read_exact(inp, length) if length else b""
        if payload is None:
            return
        if op == wire.CLOSE:
            streams.pop(stream_id, None)
            continue
        stream = streams.get(stream_id)
        if stream is None:
            stream = streams[stream_id] = _Stream()
        started = time.process_time()
        try:
            result, status = _run(stream, op, payload), wire.OK
        except OpusUndecodable as exc:
            result, status = str(exc).encode(), wire.UNDECODABLE
        except Exception as exc:
            result, status = f"{type(exc).__name__}: {exc}".encode(), wire.FAILED
        out.write(wire.response(request_id, status, time.process_time() - started, result))
        out.flush()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The protocol gets its own copy of stdout; fd 1 then points at stderr, so that a library
    # printing to stdout cannot corrupt the frames.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        serve(sys.stdin.buffer, out)
    except BrokenPipeError:
        pass


if __name__ == "__main__":
    main()
