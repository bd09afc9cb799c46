"""The Realtime dialect end to end: handshake, capabilities, autostart, lockstep accounting,
cancel / output-buffer clear epochs, voice and persona rules, GA vs beta names (docs/protocol.md §2-§4)."""

from __future__ import annotations

import base64
import itertools
import re

import pytest
import trio

from duplex_actors.log import records as r
from duplex_actors.model.personaplex import SINE_TOKENS
from duplex_actors.replay.replayer import replay_logic

from .helpers import (
    FRAME_PCM16_BYTES,
    FRAME_SAMPLES,
    TERMINAL_GA,
    Client,
    client_event_id,
    connect,
    error_code,
    feed,
    log_path,
    pcm16,
    read_records,
    steps,
    tone_and_noise,
)

DEFAULT_PERSONA = (
    "You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way."
)
CAPABILITIES = {
    "implementation_level": "model_native_duplex",
    "chunk_period_ms": 80,
    "supports_client_commit": False,
    "supports_external_turn_signal": False,
    "supports_barge_in": False,
    "supports_session_resume": True,  # --resume-grace-s 30 by default
    "supports_audio_truncate": False,
    "supports_playback_ack": True,
    "supports_input_append": True,
    "supports_multi_session": True,  # --max-sessions 2
    "supports_multi_session_same_replica": True,
    "input_modes": ["append_audio_chunk"],
}


def frames(n: int, seed: int = 0) -> bytes:
    return pcm16(tone_and_noise(n * FRAME_SAMPLES / 24_000, seed=seed))


async def barrier(c: Client, event_id: str = "barrier") -> None:
    """An ordering barrier: send ``session.heartbeat`` and wait for its ack. The session core
    answers commands in order, so everything the commands sent before it caused (and every step
    result already in) has arrived before the ack."""
    before = len(c.messages)
    await c.send({"type": "session.heartbeat", "event_id": event_id})
    ack = await c.wait_for("session.heartbeat_ack", since=before)
    assert ack["client_event_id"] == event_id


# -- handshake ---------------------------------------------------------------------------------
@pytest.mark.parametrize("query", ["", "?duplex=1", "?duplex=1&model=tiny-parrot"])
async def test_session_created_at_connect_then_updated_with_the_same_session(parrot_server, query):
    async with connect(f"{parrot_server.ws}/v1/realtime{query}") as c:
        await c.wait_for("session.updated")
        await barrier(c)
        assert c.types() == ["session.created", "session.updated", "session.heartbeat_ack"]
        created, updated, _ = c.events()
        assert created["session"] == updated["session"]
        session = created["session"]
        assert re.fullmatch(r"sess_[0-9a-f]{24}", session["id"])
        assert session["object"] == "realtime.session" and session["type"] == "realtime"
        assert session["model"] == "tiny-parrot"
        assert session["capabilities"] == CAPABILITIES
        assert session["voice"] == "NATF2.pt"
        assert session["instructions"] == DEFAULT_PERSONA
        assert created["event_id"] != updated["event_id"]


async def test_session_ids_are_unique_and_client_ids_are_ignored(parrot_server):
    ids = set()
    for _ in range(3):
        async with connect(f"{parrot_server.ws}/v1/realtime?autostart=0") as c:
            await c.send({"type": "session.update", "session": {"id": "sess_mine", "model": "other"}})
            created = await c.wait_for("session.created")
            assert created["session"]["id"] != "sess_mine"
            assert created["session"]["model"] == "tiny-parrot"
            ids.add(created["session"]["id"])
            await c.send({"type": "session.close"})
            await c.wait_for("session.closed")
    assert len(ids) == 3


async def test_autostart_0_waits_then_session_update_opens_with_its_config(parrot_server):
    async with connect(f"{parrot_server.ws}/v1/realtime?duplex=1&autostart=0") as c:
        await trio.sleep(0.5)  # a slow client: the server must wait for its first message
        await c.send(
            {
                "type": "session.update",
                "event_id": "u1",
                "session": {"voice": "NATM1.pt", "instructions": "Be brief.", "modalities": ["audio"]},
            }
        )
        await c.wait_for("session.updated")
        await barrier(c)
        # Nothing before the first client message: whatever the server had sent while the client
        # waited would come before session.created, and that carries the update's config.
        assert c.types() == ["session.created", "session.updated", "session.heartbeat_ack"]
        created, updated, _ = c.events()
        assert created["session"] == updated["session"]
        assert created["session"]["voice"] == "NATM1.pt"
        assert created["session"]["instructions"] == "Be brief."
        assert created["session"]["modalities"] == ["audio"]  # unknown keys are echoed
        assert created["session"]["capabilities"] == CAPABILITIES


async def test_autostart_0_other_first_message_opens_a_default_session_and_is_processed(parrot_server):
    # That nothing comes before the first client message: the test above (by ordering).
    async with connect(f"{parrot_server.ws}/v1/realtime?autostart=0") as c:
        await c.append(frames(3), event_id="a1")
        await c.wait_until(lambda: c.output_frames() == 3, what="3 output frames")
        types = c.types()
        assert types[:2] == ["session.created", "session.updated"]
        assert c.events()[0]["session"]["voice"] == "NATF2.pt"
        assert "error" not in types
    async with connect(f"{parrot_server.ws}/v1/realtime?autostart=0") as c:
        await c.send({"type": "session.heartbeat", "event_id": "hb"})
        ack = await c.wait_for("session.heartbeat_ack")
        assert ack["client_event_id"] == "hb"
        assert c.types()[:2] == ["session.created", "session.updated"]
    async with connect(f"{parrot_server.ws}/v1/realtime?autostart=0") as c:
        await c.send_raw('{"type": "session.update", "session": ')  # not JSON: opens, then refused
        err = await c.wait_for("error")
        assert error_code(err) == "invalid_json"
        assert c.types()[:2] == ["session.created", "session.updated"]


async def test_autostart_0_invalid_first_session_update_echoes_its_event_id(parrot_server):
    """The opening ``session.update`` is refused (bad voice): the error must echo the client's
    ``event_id`` like every refusal (docs/protocol.md §4), and ``session.created`` still opens the stream."""
    async with connect(f"{parrot_server.ws}/v1/realtime?autostart=0") as c:
        await c.send({"type": "session.update", "event_id": "bad-open", "session": {"voice": "../x.pt"}})
        await c.wait_for("session.updated")
        await c.wait_for("error")
        err = c.errors()[0]
        assert error_code(err) == "invalid_voice"
        assert client_event_id(err) == "bad-open", err
        assert c.types()[:2] == ["session.created", "session.updated"], c.types()
        assert c.events()[0]["session"]["voice"] == "NATF2.pt"  # opened with the defaults
        await c.append(frames(1))
        await c.wait_until(lambda: c.output_frames() == 1)


async def test_sampling_value_the_engine_cannot_hold_is_refused_and_the_session_goes_on(parrot_server):
    """``top_k`` of 2**63 is a valid JSON integer but no int64: it is refused when the update
    is validated, never later, inside the engine (which would end the session with 1011)."""
    async with connect(f"{parrot_server.ws}/v1/realtime?duplex=1") as c:
        await c.wait_for("session.updated")
        await c.send(
            {"type": "session.update", "event_id": "huge", "session": {"temperature": 0.8, "top_k": 2**63}}
        )
        await c.wait_for("error")
        err = c.errors()[0]
        assert error_code(err) == "invalid_duplex_runtime_config", err
        assert client_event_id(err) == "huge" and "top_k must be < 2**31" in err["error"]["message"]
        await c.append(frames(2))
        await c.wait_until(lambda: c.output_frames() >= 2)
        await c.send({"type": "response.cancel"})  # a new epoch: its context takes the config
        await c.append(frames(3, seed=1))
        await c.wait_until(lambda: c.output_frames() >= 5)
        assert c.error_codes() == ["invalid_duplex_runtime_config"] and not c.closed.is_set()


async def test_an_update_refusing_a_long_persona_and_a_bad_voice_gets_one_error_and_goes_on(parrot_server):
    """A persona too long for the context beside a field the core refuses (an unknown voice, a
    negative temperature): one error names them all, nothing of them is applied, and the
    session streams on (the too-long persona never reaches the engine, which would end the
    session with 1011)."""
    async with connect(f"{parrot_server.ws}/v1/realtime?duplex=1") as c:
        await c.wait_for("session.updated")
        session = {"instructions": "a " * 900, "voice": "nope.pt", "temperature": -3, "seed": 7}
        await c.send({"type": "session.update", "event_id": "both", "session": session})
        await c.wait_until(lambda: len(c.of_type("session.updated")) >= 2 and c.errors())
        (err,) = c.errors()
        message = err["error"]["message"]
        assert error_code(err) == "invalid_duplex_runtime_config" and client_event_id(err) == "both", err
        assert "the persona is too long" in message and "voice: " in message and "temperature: " in message
        applied = c.of_type("session.updated")[-1]["session"]
        assert applied["instructions"] != session["instructions"] and applied["voice"] != "nope.pt"
        await c.append(frames(3))
        await c.wait_until(lambda: c.output_frames() >= 3)
        assert len(c.errors()) == 1 and not c.closed.is_set()


async def test_wrong_model_is_refused_with_model_not_found(parrot_server):
    async with connect(f"{parrot_server.ws}/v1/realtime?duplex=1&model=gpt-4o-realtime-preview") as c:
        await c.wait_closed()
        assert c.types() == ["error"]
        err = c.events()[0]["error"]
        assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error"
        assert c.close_code is not None and c.close_code != 1000


# -- lockstep accounting -----------------------------------------------------------------------
async def test_output_never_exceeds_input_and_comes_in_whole_frames(parrot_server):
    violations: list[str] = []
    out_frames = 0

    def check(client: Client, msg) -> None:
        nonlocal out_frames
        if isinstance(msg, dict) and msg["type"] == "response.output_audio.delta":
            audio = base64.b64decode(msg["delta"])
            out_frames += len(audio) // FRAME_PCM16_BYTES
            whole_in = client.samples_sent // FRAME_SAMPLES
            if out_frames > whole_in:
                violations.append(f"{out_frames} frames out after {whole_in} whole frames in")

    audio = pcm16(tone_and_noise(2.0, seed=3))  # 25 frames
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        c.on_message = check
        await c.wait_for("session.updated")
        # 1000 samples per chunk: frames straddle chunks, the tail must be kept.
        await feed(c, audio, 2000, pace=2.0)
        await c.wait_until(lambda: c.output_frames() >= 25, timeout=20, what="25 frames")
        await barrier(c)
        deltas = c.deltas()
        assert not violations, violations
        assert c.output_frames() == 25
        for k, d in enumerate(deltas):
            assert len(base64.b64decode(d["delta"])) == FRAME_PCM16_BYTES
            assert d["sample_rate_hz"] == 24000
            # input_samples_end (spec section 7): no pads here, so the end of input frame k
            meta = {
                "epoch": 0,
                "frame_index": k,
                "audio_duration_ms": 80,
                "input_samples_end": (k + 1) * 1920,
            }
            assert d["metadata"] == meta
        assert len({d["response_id"] for d in deltas}) == 1
        types = c.types()
        first = types.index("response.created")
        assert types[first : first + 5] == [
            "response.created",
            "response.output_item.added",
            "conversation.item.added",
            "response.content_part.added",
            "response.output_audio.delta",
        ]
        assert types.count("input_audio_buffer.speech_started") == 1
        event_ids = [m["event_id"] for m in c.events()]
        assert len(set(event_ids)) == len(event_ids)
        await c.send({"type": "session.close"})
        closed = await c.wait_for("session.closed")
        assert closed["reason"] == "client_close"
        await c.wait_closed()
        assert c.close_code == 1000
        # Nothing but the response's terminal group between the last delta and session.closed.
        assert c.types()[-1] == "session.closed"
        assert c.output_frames() == 25 and not violations  # session.closed is the last event


async def test_heartbeat_playback_ack_and_input_clear(parrot_server):
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        await c.wait_for("session.updated")
        await c.send({"type": "session.heartbeat", "event_id": "h1"})
        assert (await c.wait_for("session.heartbeat_ack"))["client_event_id"] == "h1"
        await c.send({"type": "playback.ack", "event_id": "p1", "played_ms": 160})
        ack = await c.wait_for("playback.acknowledged")
        assert ack["client_event_id"] == "p1" and ack["payload"] == {"played_ms": 160}
        # Half a frame, cleared: it never reaches the model; the next frame is frame 0.
        await c.append(frames(1)[: FRAME_PCM16_BYTES // 2])
        await c.send({"type": "input_audio_buffer.clear", "event_id": "x1"})
        await c.wait_for("input_audio_buffer.cleared")
        await c.append(frames(1, seed=9))
        await c.wait_until(lambda: c.output_frames() == 1)
        await barrier(c)
        assert c.output_frames() == 1
        assert c.deltas()[0]["metadata"]["frame_index"] == 0
        assert c.deltas()[0]["metadata"]["epoch"] == 0  # an input clear changes no epoch
        await c.send({"type": "session.close"})
        await c.wait_for("session.closed")  # always the last event: no frame came after all
        assert c.output_frames() == 1


# -- cancel / output-buffer clear --------------------------------------------------------------
@pytest.mark.parametrize(
    ("command", "reason"),
    [("response.cancel", "client_cancelled"), ("output_audio_buffer.clear", "output_audio_buffer_clear")],
)
async def test_cancel_and_clear_end_the_response_and_start_epoch_1(parrot_server, command, reason):
    # ?duplex=1: a cancel resets the model's context (the stock route's keeps it: below)
    async with connect(f"{parrot_server.ws}/v1/realtime?duplex=1") as c:
        await c.wait_for("session.updated")
        await feed(c, frames(4, seed=1), FRAME_PCM16_BYTES, pace=0)
        await c.wait_until(lambda: c.output_frames() >= 4, what="4 frames")
        before = len(c.messages)
        await c.send({"type": command, "event_id": "x1"})
        done = await c.wait_for("rate_limits.updated", since=before)
        group = c.types(before)
        expected = (
            ["output_audio_buffer.cleared"] if command == "output_audio_buffer.clear" else []
        ) + TERMINAL_GA
        assert group[: len(expected)] == expected, group
        assert done["rate_limits"] == []
        ev0 = c.events(before)
        rid0 = c.of_type("response.created")[0]["response"]["id"]
        for m in ev0[: len(expected) - 1]:
            if "response_id" in m and m["response_id"] is not None:
                assert m["response_id"] == rid0
        resp_done = c.of_type("response.done")[0]["response"]
        assert resp_done["id"] == rid0
        assert resp_done["status"] == "cancelled"
        assert resp_done["status_details"]["reason"] == reason
        # The next input frames start epoch 1: a new response with a new id.
        after = len(c.messages)
        await feed(c, frames(3, seed=2), FRAME_PCM16_BYTES, pace=0)
        created = await c.wait_for("response.created", since=after)
        rid1 = created["response"]["id"]
        assert rid1 != rid0
        await c.wait_until(lambda: len(c.deltas(after)) >= 3, what="3 epoch-1 deltas")
        new = c.deltas(after)
        assert all(d["response_id"] == rid1 and d["metadata"]["epoch"] == 1 for d in new)
        # frame_index counts over the whole session, across epochs.
        assert [d["metadata"]["frame_index"] for d in new] == [4, 5, 6]
        assert all(d["metadata"]["epoch"] == 0 for d in c.deltas()[:4])
        # Nothing of epoch 0 after its terminal group.
        assert all(d["response_id"] == rid1 for d in c.deltas(before))
        items = c.of_type("conversation.item.added")
        assert [i["previous_item_id"] for i in items] == [None, items[0]["item"]["id"]]
        speech = c.of_type("input_audio_buffer.speech_started")  # once per epoch
        assert [s["audio_start_ms"] for s in speech] == [0, 4 * 80]
        session_id = c.session_id
        await c.send({"type": "session.close"})
        await c.wait_closed()
        assert c.close_code == 1000
        # Closing ends the open response: the last events are its terminal group + session.closed.
        tail = c.types()[-9:]
        assert tail[-1] == "session.closed"
        assert c.of_type("response.done")[-1]["response"]["status_details"]["reason"] == "session_closed"
    recs = await read_records(parrot_server, session_id)
    st = steps(recs)
    first_epoch1 = next(s for s in st if s.epoch == 1)
    assert first_epoch1.agent_codes == SINE_TOKENS  # the prefill was replayed
    epoch0 = [s for s in st if s.epoch == 0]
    for prev, cur in itertools.pairwise(epoch0):
        assert cur.agent_codes == prev.user_codes  # the parrot, one frame late


async def test_cancel_with_nothing_active_is_refused(parrot_server):
    async with connect(f"{parrot_server.ws}/v1/realtime?duplex=1") as c:
        await c.wait_for("session.updated")
        await c.send({"type": "response.cancel", "event_id": "c-none"})
        err = await c.wait_for("error")
        assert error_code(err) == "response_cancel_not_active"
        assert client_event_id(err) == "c-none"
        assert err["error"]["type"] == "invalid_request_error"
        # output_audio_buffer.clear with nothing playing: just cleared, no epoch change.
        await c.send({"type": "output_audio_buffer.clear", "event_id": "o1"})
        cleared = await c.wait_for("output_audio_buffer.cleared")
        assert cleared["response_id"] is None
        await c.append(frames(2))
        await c.wait_until(lambda: c.output_frames() == 2)
        assert all(d["metadata"]["epoch"] == 0 for d in c.deltas())
        # A second cancel right after a first one: nothing active any more.
        await c.send({"type": "response.cancel", "event_id": "c1"})
        await c.wait_for("response.done")
        await c.send({"type": "response.cancel", "event_id": "c2"})
        err = await c.wait_for("error", count=2)
        assert error_code(err) == "response_cancel_not_active" and client_event_id(err) == "c2"


@pytest.mark.parametrize("command", ["response.cancel", "output_audio_buffer.clear"])
async def test_on_the_stock_route_a_cancel_ends_the_response_and_keeps_the_context(parrot_server, command):
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        await c.wait_for("session.updated")
        await c.send({"type": "output_audio_buffer.clear", "event_id": "o0"})  # nothing to name yet
        await c.send({"type": "response.cancel", "event_id": "c0"})
        err = await c.wait_for("error")
        assert err["error"]["message"] == "Cancellation failed: no active response found"
        await feed(c, frames(4, seed=1), FRAME_PCM16_BYTES, pace=0)
        await c.wait_until(lambda: c.output_frames() >= 4, what="4 frames")
        await c.send({"type": command, "event_id": "x1"})
        await c.wait_for("response.done")
        await c.send({"type": "response.cancel", "event_id": "x2"})  # LiveKit sends two
        await c.wait_for("error", count=2)
        after = len(c.messages)
        await feed(c, frames(3, seed=2), FRAME_PCM16_BYTES, pace=0)
        await c.wait_until(lambda: c.output_frames() >= 7, what="7 frames")
        created = c.of_type("response.created")
        assert [r["response"]["id"].rsplit("_", 1)[1] for r in created] == ["0", "1"]
        assert all(d["metadata"]["epoch"] == 0 for d in c.deltas())  # one epoch, no reset
        assert [d["metadata"]["frame_index"] for d in c.deltas()] == list(range(7))  # none lost
        assert all(d["response_id"] == created[1]["response"]["id"] for d in c.deltas(after))
        done = c.of_type("response.done")[0]["response"]["status_details"]
        assert done == {"type": "cancelled", "reason": "client_cancelled"}
        cleared = c.of_type("output_audio_buffer.cleared")
        assert [m["response_id"] for m in cleared] == (
            [created[0]["response"]["id"]] if command == "output_audio_buffer.clear" else []
        )
        session_id = c.session_id
    recs = await read_records(parrot_server, session_id)
    st = steps(recs)
    assert {s.epoch for s in st} == {0}
    for prev, cur in itertools.pairwise(st):
        assert cur.agent_codes == prev.user_codes  # the parrot never restarted


# -- voice / persona -----------------------------------------------------------------------------
async def test_voice_and_persona_change_until_the_first_frame_then_only_the_same_value(parrot_server):
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        await c.wait_for("session.updated")
        await c.send({"type": "session.update", "event_id": "v1", "session": {"voice": "NATM1.pt"}})
        upd = await c.wait_for("session.updated", count=2)
        assert upd["session"]["voice"] == "NATM1.pt"
        await c.send({"type": "session.update", "event_id": "p1", "session": {"instructions": "Be terse."}})
        upd = await c.wait_for("session.updated", count=3)
        assert upd["session"]["instructions"] == "Be terse." and upd["session"]["voice"] == "NATM1.pt"
        await c.append(frames(2))
        await c.wait_until(lambda: c.output_frames() >= 1)

        await c.send({"type": "session.update", "event_id": "v2", "session": {"voice": "NATF2.pt"}})
        err = await c.wait_for("error")
        assert error_code(err) == "voice_update_unsupported" and client_event_id(err) == "v2"
        await c.send({"type": "session.update", "event_id": "p2", "session": {"instructions": "Other."}})
        err = await c.wait_for("error", count=2)
        assert error_code(err) == "persona_update_unsupported" and client_event_id(err) == "p2"
        ga = {"type": "realtime", "audio": {"output": {"voice": "NATF2.pt"}}}
        await c.send({"type": "session.update", "event_id": "v3", "session": ga})
        err = await c.wait_for("error", count=3)
        assert error_code(err) == "voice_update_unsupported" and client_event_id(err) == "v3"

        same = {"voice": "NATM1.pt", "instructions": "Be terse."}
        await c.send({"type": "session.update", "event_id": "s1", "session": same})
        upd = await c.wait_for("session.updated", count=4)
        assert upd["session"]["voice"] == "NATM1.pt" and upd["session"]["instructions"] == "Be terse."
        ga_same = {"type": "realtime", "audio": {"output": {"voice": "NATM1.pt"}}}
        await c.send({"type": "session.update", "event_id": "s2", "session": ga_same})
        upd = await c.wait_for("session.updated", count=5)
        assert upd["session"]["voice"] == "NATM1.pt"
        assert len(c.errors()) == 3
        # Still usable.
        n = c.output_frames()
        await c.append(frames(1, seed=5))
        await c.wait_until(lambda: c.output_frames() == n + 1)


async def test_default_values_spelled_out_are_the_same_value_after_the_first_frame(parrot_server):
    """Empty or omitted persona means the default persona, omitted voice means NATF2.pt: after
    the first frame, spelling those out is the same value and is accepted."""
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        await c.append(frames(1))
        await c.wait_until(lambda: c.output_frames() == 1)
        for i, session in enumerate(
            [{"instructions": ""}, {"voice": "NATF2.pt"}, {"instructions": DEFAULT_PERSONA}, {"voice": ""}]
        ):
            await c.send({"type": "session.update", "event_id": f"s{i}", "session": session})
            upd = await c.wait_for("session.updated", count=2 + i)
            assert upd["session"]["voice"] == "NATF2.pt"
            assert upd["session"]["instructions"] == DEFAULT_PERSONA
        assert c.errors() == []


async def test_binary_message_on_the_realtime_dialect_is_refused(parrot_server):
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        await c.wait_for("session.updated")
        await c.send_raw(frames(1))
        err = await c.wait_for("error")
        assert error_code(err) == "bad_event"
        await c.append(frames(1))
        await c.wait_until(lambda: c.output_frames() == 1)


async def test_ga_audio_output_voice_before_the_first_frame(parrot_server):
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        await c.wait_for("session.updated")
        session = {
            "type": "realtime",
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "NATM1.pt"},
            },
        }
        await c.send({"type": "session.update", "event_id": "g1", "session": session})
        upd = await c.wait_for("session.updated", count=2)
        assert upd["session"]["voice"] == "NATM1.pt"
        assert upd["session"]["audio"]["output"]["voice"] == "NATM1.pt"
        assert c.errors() == []


@pytest.mark.parametrize(
    ("session", "code"),
    [
        ({"voice": "../x.pt"}, "invalid_voice"),
        ({"voice": "x.wav"}, "invalid_voice"),
        ({"voice": "/tmp/NATF2.pt"}, "invalid_voice"),
        ({"voice": "NOPE.pt"}, "invalid_voice"),
        ({"audio": {"output": {"voice": "../NATM1.pt"}}}, "invalid_voice"),
        ({"extra_body": {"personaplex_voice_prompt": "NATM1.pt"}}, "invalid_duplex_runtime_config"),
        ({"extra_body": {"personaplex_persona": "x"}}, "invalid_duplex_runtime_config"),
    ],
)
async def test_bad_session_config_is_refused_and_changes_nothing(parrot_server, session, code):
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        await c.wait_for("session.updated")
        await c.send({"type": "session.update", "event_id": "bad", "session": session})
        err = await c.wait_for("error")
        assert error_code(err) == code and client_event_id(err) == "bad"
        assert err["error"]["type"] == "invalid_request_error"
        await c.send({"type": "session.update", "event_id": "ok", "session": {"extra_body": {"note": 1}}})
        upd = await c.wait_for("session.updated", count=2)
        assert upd["session"]["voice"] == "NATF2.pt"
        assert upd["session"]["extra_body"] == {"note": 1}
        await c.append(frames(1))
        await c.wait_until(lambda: c.output_frames() == 1)


# -- GA vs beta names ----------------------------------------------------------------------------
BETA_TERMINAL = [
    "response.audio.done",
    "response.audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.done",
    "rate_limits.updated",
]
GA_ONLY = {
    "response.output_audio.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.delta",
    "response.output_audio_transcript.done",
    "conversation.item.added",
    "conversation.item.done",
}


@pytest.mark.parametrize(
    ("headers", "subprotocols"),
    [([("OpenAI-Beta", "realtime=v1")], None), ([], ["realtime", "openai-beta.realtime-v1"])],
)
async def test_beta_header_gives_beta_names(parrot_server, headers, subprotocols):
    async with connect(f"{parrot_server.ws}/v1/realtime", headers=headers, subprotocols=subprotocols) as c:
        created = await c.wait_for("session.created")
        assert "type" not in created["session"]
        await c.append(frames(3))
        await c.wait_until(lambda: c.output_frames() == 3)
        before = len(c.messages)
        await c.send({"type": "response.cancel"})
        await c.wait_for("rate_limits.updated", since=before)
        types = c.types()
        assert types[before : before + len(BETA_TERMINAL)] == BETA_TERMINAL
        assert "response.audio.delta" in types and "conversation.item.created" in types
        assert not GA_ONLY & set(types), set(types) & GA_ONLY
        assert [d["metadata"]["frame_index"] for d in c.deltas()] == [0, 1, 2]
        done = c.of_type("response.done")[0]["response"]
        assert done["modalities"] == ["audio", "text"]


async def test_ga_names_by_default(parrot_server):
    async with connect(f"{parrot_server.ws}/v1/realtime") as c:
        await c.append(frames(2))
        await c.wait_until(lambda: c.output_frames() == 2)
        types = set(c.types())
        assert {"response.output_audio.delta", "conversation.item.added"} <= types
        assert not {"response.audio.delta", "conversation.item.created"} & types


@pytest.mark.parametrize(
    ("query", "code"),
    [("", "conversation_already_has_active_response"), ("?duplex=1", "response_create_unsupported")],
)
async def test_text_items_truncate_retrieve_and_response_create(parrot_server, query, code):
    async with connect(f"{parrot_server.ws}/v1/realtime{query}") as c:
        await c.wait_for("session.updated")
        item = {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Be brief."}]}
        await c.send({"type": "conversation.item.create", "event_id": "i1", "item": item})
        added = await c.wait_for("conversation.item.added")
        assert added["item"]["role"] == "system" and added["item"]["content"][0]["text"] == "Be brief."
        await c.wait_for("conversation.item.done")
        await c.send({"type": "response.create", "event_id": "r1"})
        err = await c.wait_for("error")
        assert error_code(err) == code and client_event_id(err) == "r1"
        await c.append(frames(2))
        await c.wait_until(lambda: c.output_frames() == 2)
        item_id = c.of_type("response.output_item.added")[0]["item"]["id"]
        await c.send(
            {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 80}
        )
        truncated = await c.wait_for("conversation.item.truncated")
        assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, 80)
        await c.send({"type": "conversation.item.retrieve", "item_id": item_id})
        retrieved = await c.wait_for("conversation.item.retrieved")
        assert retrieved["item"]["id"] == item_id and retrieved["item"]["status"] == "in_progress"
        await c.send({"type": "conversation.item.retrieve", "item_id": "nope", "event_id": "q"})
        await c.wait_error("item_retrieve_invalid_item_id")
        session_id = c.session_id
    recs = await read_records(parrot_server, session_id)
    assert [type(x).__name__ for x in recs if isinstance(x, r.TextItem | r.Truncate | r.RetrieveItem)] == [
        "TextItem",
        "Truncate",
        "RetrieveItem",
        "RetrieveItem",
    ]
    assert replay_logic(log_path(parrot_server, session_id)).identical
