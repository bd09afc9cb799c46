"""Values a hostile client can send that once killed its own session (docs/design.md §2 "Budgets and hardening"): refused at the
edge with one documented code, and the session goes on streaming."""

from __future__ import annotations

import json

from .helpers import FRAME_SAMPLES, Client, client_event_id, connect, error_code, feed, pcm16, tone_and_noise


async def _still_streams(c: Client) -> None:
    """The session still answers audio: two frames in, output deltas out, and no 1011."""
    before = c.output_frames()
    await feed(c, pcm16(tone_and_noise(2 * FRAME_SAMPLES / 24_000)), 2 * FRAME_SAMPLES * 2, pace=0)
    await c.wait_until(lambda: c.output_frames() >= before + 1, what="output audio")
    assert "internal_error" not in c.error_codes()
    assert not c.closed.is_set()


async def test_numbers_out_of_float_range_are_bad_event_and_the_session_goes_on(parrot_server):
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        await c.wait_for("session.updated")
        await c.send_raw('{"type":"session.update","event_id":"t1","session":{"temperature":1e400}}')
        await c.send_raw('{"type":"session.update","event_id":"t2","session":{"anything":[-1e400]}}')
        await c.send_raw('{"type":"playback.ack","event_id":"t3","played_ms":1e400}')
        await c.wait_until(lambda: len(c.errors()) >= 3, what="three errors")
        assert [(client_event_id(m), error_code(m)) for m in c.errors()] == [
            ("t1", "bad_event"),
            ("t2", "bad_event"),
            ("t3", "bad_event"),
        ]
        assert len(c.of_type("session.updated")) == 1
        await _still_streams(c)


async def test_native_session_create_with_1e400_is_bad_event_not_1011(parrot_server):
    # A malformed first native message is refused like any other (bad_event, close 1008);
    # before, 1e400 reached the echo and ended in internal_error + 1011.
    async with connect(f"{parrot_server.ws}/v1/duplex") as c:
        await c.send_raw('{"type":"session.create","event_id":"n1","session":{"seed":1e400}}')
        await c.wait_closed()
        assert c.error_codes() == ["bad_event"] and c.close_code == 1008
    async with connect(f"{parrot_server.ws}/v1/duplex") as c:
        await c.send({"type": "session.create", "event_id": "n2", "session": {"seed": 7}})
        await c.wait_for("session.created")
        await c.send_raw('{"type":"playback.ack","event_id":"n3","played_ms":-1e400}')
        await c.wait_error("bad_event")
        await _still_streams(c)


async def test_the_merged_config_is_bounded_and_the_echo_stays_under_256_kib(parrot_server):
    bound = 256 * 1024
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        await c.wait_for("session.updated")
        for i in range(40):
            await c.send({"type": "session.update", "event_id": f"u{i}", "session": {f"k{i}": "x" * 20_480}})
        await c.wait_until(lambda: len(c.of_type("session.updated", "error")) >= 41, what="40 answers")
        answers = c.of_type("session.updated", "error")[1:]
        outcome = [m["type"] for m in answers]
        # ~20 KiB per key: twelve fit beside the defaults, the thirteenth would pass 256 KiB.
        assert outcome == ["session.updated"] * 12 + ["error"] * 28
        for m in answers[12:]:
            assert error_code(m) == "invalid_value"
        server_owned = {"id", "object", "model", "capabilities"}
        for m in c.of_type("session.updated"):
            config = {k: v for k, v in m["session"].items() if k not in server_owned}
            assert len(json.dumps(config, separators=(",", ":"))) <= bound
            assert len(json.dumps(m)) < bound + 4096
        await _still_streams(c)


async def test_a_persona_the_model_cannot_hold_is_refused_at_update_and_the_session_goes_on(parrot_server):
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        await c.wait_for("session.updated")
        await c.send_raw('{"type":"session.update","event_id":"p1","session":{"instructions":"\\ud800 hi"}}')
        await c.send(
            {"type": "session.update", "event_id": "p2", "session": {"instructions": "many words " * 200}}
        )
        await c.wait_until(lambda: len(c.errors()) >= 2, what="two errors")
        assert [(client_event_id(m), error_code(m)) for m in c.errors()] == [
            ("p1", "invalid_duplex_runtime_config"),
            ("p2", "invalid_duplex_runtime_config"),
        ]
        assert len(c.of_type("session.updated")) == 1
        await c.send({"type": "session.update", "event_id": "p3", "session": {"instructions": "Be brief."}})
        updated = await c.wait_for("session.updated", count=2)
        assert updated["session"]["instructions"] == "Be brief."
        await _still_streams(c)


async def test_a_persona_too_long_in_the_opening_config_opens_with_the_defaults(parrot_server):
    # Native session.create and the Realtime opening update (autostart=0): as any invalid
    # opening config, the session opens with the defaults and an error names the message;
    # before, it opened with the persona and ended in 1011 when the context was prepared.
    long_persona = "many words " * 200
    openings = [
        (
            "/v1/duplex",
            {"type": "session.create", "event_id": "o1", "session": {"instructions": long_persona}},
        ),
        (
            "/v1/realtime?autostart=0",
            {"type": "session.update", "event_id": "o1", "session": {"instructions": long_persona}},
        ),
    ]
    for path, opening in openings:
        async with connect(f"{parrot_server.ws}{path}") as c:
            await c.send(opening)
            await c.wait_error("invalid_duplex_runtime_config")
            assert [(client_event_id(m), error_code(m)) for m in c.errors()] == [
                ("o1", "invalid_duplex_runtime_config")
            ]
            err = c.errors()[0]
            message = err["error"]["message"] if isinstance(err["error"], dict) else err["error"]
            assert "persona is too long" in message
            assert c.types()[:3] == ["session.created", "session.updated", "error"]
            assert c.events()[0]["session"]["instructions"] != long_persona
            await _still_streams(c)
