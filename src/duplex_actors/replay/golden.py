"""The golden corpus: short recorded sessions replayed by CI at logic and model level.

``python -m duplex_actors.replay.golden record replay/`` re-records every scenario (run it when
behaviour changes on purpose, then review and commit the new logs and ``expected.json``;
``--only NAME`` re-records that scenario alone and keeps the other logs and entries as they are);
``python -m duplex_actors.replay.golden check replay/`` replays them and compares digests.

Scenarios run in virtual time with fixed session ids, so a re-recording on the same kind of
machine gives the same events and audio (the header's ``created_at`` is the only difference).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from .. import error_codes

EXPECTED = "expected.json"


def speechlike(seed: int, seconds: float) -> npt.NDArray[np.float32]:
    rs = np.random.RandomState(seed)
    t = np.arange(int(seconds * 24_000)) / 24_000
    pitch = rs.uniform(100, 300)
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t)
    audio = 0.3 * env * np.sin(2 * np.pi * pitch * t + 2 * np.sin(2 * np.pi * 4 * t)) + 0.03 * rs.randn(
        len(t)
    )
    out: npt.NDArray[np.float32] = audio.astype(np.float32)
    return out


@attrs.frozen
class Scenario:
    name: str
    model: str
    family: str | None
    script: Callable[[Any], Awaitable[None]]
    tick_policy: str = "window"


async def _stream(session: Any, audio: npt.NDArray[np.float32], chunks: list[int]) -> None:
    import trio

    i = 0
    k = 0
    while i < len(audio):
        n = chunks[k % len(chunks)]
        await session.append(audio[i : i + n])
        await trio.sleep(n / 24_000)
        i += n
        k += 1


async def tiny_greedy(server: Any) -> None:
    import trio

    s = await server.open_session({"voice": "NATF2.pt"})
    await _stream(s, speechlike(1, 1.6), [1920])
    await trio.sleep(0.3)
    await s.close()


async def tiny_seeded_cancel(server: Any) -> None:
    import trio

    s = await server.open_session(
        {"voice": "NATM1.pt", "instructions": "You sell bicycles.", "temperature": 0.8, "seed": 42}
    )
    audio = speechlike(2, 2.0)
    await _stream(s, audio[:24_000], [1000, 3001, 777])
    await s.cancel(client_event_id="cancel-1")
    await _stream(s, audio[24_000:], [2500])
    await trio.sleep(0.3)
    await s.close()


async def parrot_clears_updates_disconnect(server: Any) -> None:
    import trio

    s = await server.open_session({})
    await s.update({"voice": "NATM1.pt", "instructions": "Echo everything."}, client_event_id="u1")
    audio = speechlike(3, 2.0)
    await _stream(s, audio[:12_000], [480])
    await s.append_bytes(b"\x01\x02\x03", "pcm16", client_event_id="bad-1")  # refused: bad_audio
    await s.update({"voice": "NATF2.pt"}, client_event_id="u2")  # refused: voice locked
    await s.clear_input(client_event_id="ci")
    await s.heartbeat(client_event_id="hb")
    await s.playback_ack({"frame_index": 3}, client_event_id="pa")
    pcm16 = (audio[12_000:30_000] * 32767).astype("<i2").tobytes()
    for j in range(0, len(pcm16), 3840):
        await s.append_bytes(pcm16[j : j + 3840], "pcm16")
        await trio.sleep(0.08)
    await s.clear_output(client_event_id="co")
    await _stream(s, audio[30_000:], [1920])
    await s.reject(
        "input_audio_buffer.commit", error_codes.COMMIT_UNSUPPORTED, "no commits for a lockstep model"
    )
    await trio.sleep(0.2)
    await s.disconnect()


async def moshi_plain(server: Any) -> None:
    import trio

    s = await server.open_session({})
    await _stream(s, speechlike(4, 1.2), [960, 2880])
    await trio.sleep(0.3)
    await s.close()


async def grid_server_pad(server: Any) -> None:
    """20 ms chunks at an arbitrary phase on the grid: the server pads by itself (reason
    start), and again after an input clear (reason clear). Log format 4."""
    import trio

    s = await server.open_session({"voice": "NATF2.pt"})
    await trio.sleep(0.0517)
    audio = speechlike(5, 3.2)
    await _stream(s, audio[:40_320], [480])
    await s.clear_input(client_event_id="ci")
    await trio.sleep(0.0113)
    await _stream(s, audio[40_320:], [480])
    await trio.sleep(0.3)
    await s.close()


async def grid_client_hint(server: Any) -> None:
    """80 ms chunks from a client that opted in (duplex.alignment client): it applies the
    server's hint (its next chunk early, short by pad_ms, with pad_ms on it); then it stalls and
    sends its backlog at once, a jitter burst the scheduler catches up or drains. Log format 4."""
    import trio

    from ..audio import float_to_pcm16
    from ..session import events as ev

    s = await server.open_session({"voice": "NATM1.pt", "duplex": {"alignment": "client"}})
    hints: list[int] = []

    async def watch() -> None:
        async for event in s.events():
            if isinstance(event, ev.AlignmentHint):
                hints.append(event.pad_ms)

    pcm = float_to_pcm16(speechlike(6, 4.0))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        await trio.sleep(0.0471)
        at = 0
        k = 0
        while at + 3840 <= len(pcm):
            pad_ms = hints.pop() if hints else 0
            n = 2 * (1920 - pad_ms * 24)
            await s.append_bytes(pcm[at : at + n], "pcm16", pad_ms=pad_ms, client_event_id=f"a{k}")
            at += n
            k += 1
            if k == 20:  # a stall of 5 frames, then the backlog at once
                await trio.sleep(0.4)
                for _ in range(5):
                    await s.append_bytes(pcm[at : at + 3840], "pcm16")
                    at += 3840
            await trio.sleep(0.08 - pad_ms / 1000)
        await trio.sleep(0.3)
        await s.close()


SCENARIOS = [
    Scenario("tiny-greedy", "tiny", None, tiny_greedy),
    Scenario("tiny-seeded-cancel", "tiny", None, tiny_seeded_cancel),
    Scenario("parrot-clears-updates-disconnect", "tiny-parrot", None, parrot_clears_updates_disconnect),
    Scenario("tiny-moshi-family", "tiny", "moshi", moshi_plain),
    Scenario("tiny-grid-server-pad", "tiny", None, grid_server_pad, "grid"),
    Scenario("tiny-grid-client-hint", "tiny", None, grid_client_hint, "grid"),
]


def _golden_id(name: str) -> str:
    return "sess_golden-" + name


def record(out_dir: Path, only: list[str] | None = None) -> dict[str, Any]:
    import trio
    import trio.testing

    from ..model.factory import open_engine
    from ..server import open_duplex_server
    from .replayer import replay_logic

    out_dir.mkdir(parents=True, exist_ok=True)
    expected: dict[str, Any] = {}
    if only:
        unknown = set(only) - {s.name for s in SCENARIOS}
        if unknown:
            raise ValueError(f"no such scenario: {', '.join(sorted(unknown))}")
        if (out_dir / EXPECTED).exists():
            expected = json.loads((out_dir / EXPECTED).read_text())
    for scenario in SCENARIOS:
        if only and scenario.name not in only:
            continue
        path = out_dir / f"{_golden_id(scenario.name)}.dlog"
        path.unlink(missing_ok=True)
        engine = open_engine(scenario.model, slots=2, family=scenario.family)

        async def run(scenario: Scenario = scenario, engine: Any = engine) -> None:
            async with open_duplex_server(
                engine,
                log_dir=out_dir,
                virtual_time=True,
                tick_policy=scenario.tick_policy,
                session_ids=lambda: _golden_id(scenario.name),
            ) as server:
                await scenario.script(server)

        trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
        report = replay_logic(path)
        end = report.records_list[-1][1]
        expected[path.name] = {
            "model": scenario.model,
            "family": scenario.family,
            "events": getattr(end, "events", None),
            "frames_out": getattr(end, "frames_out", None),
            "events_sha256": getattr(end, "events_sha256", None),
            "audio_sha256": getattr(end, "audio_sha256", None),
        }
        print(
            f"recorded {path.name}: {report.records} records, {report.frames_out} frames out", file=sys.stderr
        )
    (out_dir / EXPECTED).write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    return expected


def check(corpus: Path, *, model_level: bool = True) -> list[str]:
    """Replay every golden log; return the problems found (empty: all identical)."""
    from ..log import records as r
    from ..model.factory import open_engine
    from .replayer import header_of, logged_batch_width, replay_logic, replay_model

    expected = json.loads((corpus / EXPECTED).read_text())
    problems = []
    engines: dict[tuple[str, str | None, int], Any] = {}
    for name, want in sorted(expected.items()):
        report = replay_logic(corpus / name)
        end = report.records_list[-1][1]
        if not isinstance(end, r.End) or not report.identical:
            problems.append(f"{name}: logic replay: {report.summary()}")
            continue
        for key in ("events", "frames_out", "events_sha256", "audio_sha256"):
            if getattr(end, key) != want[key]:
                problems.append(f"{name}: {key} is {getattr(end, key)}, expected.json says {want[key]}")
        if model_level:
            width = logged_batch_width(header_of(report))
            key2 = (want["model"], want["family"], width)
            if key2 not in engines:
                engines[key2] = open_engine(want["model"], slots=width, family=want["family"])
            replay_model(report, engines[key2])
            if not report.identical:
                problems.append(f"{name}: model replay: {report.summary()}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m duplex_actors.replay.golden", description=__doc__)
    parser.add_argument("command", choices=["record", "check"])
    parser.add_argument("corpus", type=Path, nargs="?", default=Path("replay"))
    parser.add_argument("--only", action="append", metavar="NAME", help="record: this scenario alone")
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.corpus, args.only)
        return 0
    problems = check(args.corpus)
    for p in problems:
        print(p)
    print(f"{len(json.loads((args.corpus / EXPECTED).read_text()))} golden logs, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
