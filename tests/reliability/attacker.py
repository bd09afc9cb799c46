"""A hostile client in a process of its own (run niced by tests/reliability/test_hostile_input.py,
as a real attacker would be on another machine): ``python -m tests.reliability.attacker PORT MODE
SECONDS``. Modes: ``flood`` (80 ms pcm16 appends as fast as TCP takes them), ``tiny`` (appends
of one sample each), ``upload:S`` (S seconds of audio at once, then nothing), ``config``
(a value of 1e400, a persona with a lone surrogate and one far past the model's context, then
session.update after session.update, each adding a new 200 KB key, over and over). On a close it
reconnects, as a determined attacker would. Prints one JSON object: what it sent per second,
and every error code and close code the server gave it."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter

import trio

from .conftest import OP_CLOSE, OP_TEXT, RawWS, append_text, frame_bytes, tone_pcm16


async def _reader(ws: RawWS, seen: Counter[str], closes: Counter[int]) -> None:
    while True:
        try:
            frame = await ws.recv(timeout=3600)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        if frame is None:
            return
        if frame[0] == OP_TEXT and b'"error"' in frame[1][:40]:
            seen[json.loads(frame[1])["error"]["code"]] += 1
        elif frame[0] == OP_CLOSE:
            closes[ws.close_code or 1005] += 1
            return
        ws.messages.clear()


async def main(port: int, mode: str, seconds: float) -> None:
    if mode == "tiny":
        one = frame_bytes(OP_TEXT, append_text(tone_pcm16(1)[:2]).encode())
        batch, per_batch = one * 64, 64
    elif mode == "config":
        # The small hostile values first: the 200 KB updates are held to the control-byte
        # budget (a few per connection), so values after them would never be read.
        updates = [
            {"temperature": "1e400"},
            {"instructions": "\ud800 hi"},
            {"instructions": "many words " * 200},
        ] + [{f"k{i}": "x" * 200_000} for i in range(40)]
        texts = [
            json.dumps({"type": "session.update", "event_id": f"a{i}", "session": u}).replace(
                '"1e400"', "1e400"
            )
            for i, u in enumerate(updates)
        ]
        batch, per_batch = b"".join(frame_bytes(OP_TEXT, t.encode()) for t in texts), len(texts)
        one = batch
    elif mode == "flood" or mode.startswith("upload"):
        one = frame_bytes(OP_TEXT, append_text(tone_pcm16(1)).encode())
        batch, per_batch = one * 4, 4
    else:
        raise SystemExit(f"unknown mode {mode}")
    upload = int(float(mode.split(":")[1]) / 0.08) if mode.startswith("upload") else None
    sent_per_s: Counter[int] = Counter()
    seen: Counter[str] = Counter()
    closes: Counter[int] = Counter()
    t0 = time.monotonic()
    connections = 0
    with trio.move_on_after(seconds):
        while True:
            ws = await RawWS.connect(port, "/v1/realtime")
            connections += 1
            async with trio.open_nursery() as nursery:

                async def read_then_stop(ws: RawWS = ws) -> None:
                    await _reader(ws, seen, closes)
                    nursery.cancel_scope.cancel()  # closed: reconnect

                nursery.start_soon(read_then_stop)
                try:
                    if upload is not None:
                        for _ in range(upload):
                            await ws.send(one)
                            sent_per_s[int(time.monotonic() - t0)] += 1
                        await trio.sleep(seconds)
                    while True:
                        await ws.send(batch)
                        sent_per_s[int(time.monotonic() - t0)] += per_batch
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
                nursery.cancel_scope.cancel()
            await ws.aclose()
            await trio.sleep(0.05)
    out = {
        "sent_per_s": [sent_per_s[i] for i in range(int(seconds) + 1)],
        "errors": dict(seen),
        "closes": {str(k): v for k, v in closes.items()},
        "connections": connections,
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), sys.argv[2], float(sys.argv[3]))
