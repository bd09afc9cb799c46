"""client/lean_wire.py: the lean client's WebSocket framing against wsproto (a real
implementation, the one the server's hypercorn uses), and its cheap reading of the server's
own projected replies."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from wsproto import ConnectionType, WSConnection
from wsproto.connection import Connection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)

from duplex_actors.client.frames import client_frame
from duplex_actors.client.lean_wire import (
    NO_END,
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_TEXT,
    FrameReader,
    Messages,
    WebSocketViolation,
    accept_value,
    binary_frame_position,
    close_frame,
    close_payload,
    delta_position,
    handshake_key,
    handshake_request,
    masked_frame,
    parse_handshake,
    text_audio_delta,
    tone_pcm16,
)
from duplex_actors.protocol.converter import dumps
from duplex_actors.protocol.native import NativeProjection, binary_frame
from duplex_actors.protocol.realtime import RealtimeProjection
from duplex_actors.session import events as ev

SID = "sess_00112233445566778899aabb"
PCM = bytes(3840)


def server_reads(data: bytes) -> list[object]:
    """What a wsproto server makes of client bytes (after the upgrade)."""
    conn = Connection(ConnectionType.SERVER)
    conn.receive_data(data)
    return list(conn.events())


def server_frames(*events: object) -> bytes:
    conn = Connection(ConnectionType.SERVER)
    return b"".join(conn.send(e) for e in events)  # type: ignore[arg-type]


# -- client frames -----------------------------------------------------------------------------
@given(payload=st.binary(max_size=70_000))
def test_a_masked_frame_is_what_a_real_server_reads(payload: bytes) -> None:
    (binary,) = server_reads(masked_frame(OP_BINARY, payload))
    assert isinstance(binary, BytesMessage) and bytes(binary.data) == payload and binary.message_finished
    text = "é" * (len(payload) % 300)
    (message,) = server_reads(masked_frame(OP_TEXT, text.encode()))
    assert isinstance(message, TextMessage) and message.data == text


def test_each_message_is_masked_with_its_own_key() -> None:
    data = bytes(range(256)) * 3
    assert masked_frame(OP_BINARY, data) != masked_frame(OP_BINARY, data)


def test_the_close_frame_carries_code_and_reason() -> None:
    (close,) = server_reads(close_frame(1000, "bye"))
    assert isinstance(close, CloseConnection) and (close.code, close.reason) == (1000, "bye")
    assert close_payload(b"\x03\xe8ok") == (1000, "ok")
    assert close_payload(b"") == (None, "")


# -- server frames -----------------------------------------------------------------------------
@given(
    messages=st.lists(st.one_of(st.binary(max_size=70_000), st.text(max_size=300)), max_size=6),
    cuts=st.lists(st.integers(0, 200_000), max_size=8),
)
def test_the_reader_gives_back_every_message_whatever_the_recv_boundaries(
    messages: list[bytes | str], cuts: list[int]
) -> None:
    wire = server_frames(*(Message(data=m) for m in messages))  # type: ignore[type-var]
    reader = FrameReader()
    got: list[tuple[int, bytes]] = []
    at = 0
    for cut in [*sorted(c % (len(wire) + 1) for c in cuts), len(wire)]:
        got += reader.feed(wire[at:cut]) if cut > at else []
        at = max(at, cut)
    want = [(OP_TEXT, m.encode()) if isinstance(m, str) else (OP_BINARY, m) for m in messages]
    assert got == want
    assert reader.buffered == 0


def test_fragments_are_joined_and_control_frames_pass_between_them() -> None:
    wire = server_frames(
        Message(data=b"ab", message_finished=False),
        Ping(b"p"),
        Message(data=b"cd", message_finished=False),
        Message(data=b"ef", message_finished=True),
        CloseConnection(1011, "engine"),
    )
    got = FrameReader().feed(wire)
    assert got[0] == (OP_PING, b"p")
    assert got[1] == (OP_BINARY, b"abcdef")
    assert got[2][0] == OP_CLOSE and close_payload(got[2][1]) == (1011, "engine")


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        (client_frame(OP_TEXT, b"x"), "masked"),  # a client's frame, sent back
        (bytes((0xC1, 1)) + b"x", "RSV"),  # RSV1 (permessage-deflate) was never negotiated
        (bytes((0x80, 1)) + b"x", "continuation"),
        (bytes((0x01, 1)) + b"x" + bytes((0x82, 1)) + b"y", "inside a fragmented"),
    ],
)
def test_a_broken_server_stream_is_refused(wire: bytes, problem: str) -> None:
    with pytest.raises(WebSocketViolation, match=problem):
        FrameReader().feed(wire)


# -- the upgrade -------------------------------------------------------------------------------
def test_the_upgrade_against_a_real_handshake() -> None:
    key = handshake_key()
    server = WSConnection(ConnectionType.SERVER)
    server.receive_data(handshake_request("127.0.0.1:8000", "/v1/realtime?duplex=1&autostart=0", key, "sk"))
    (request,) = list(server.events())
    assert isinstance(request, Request) and request.target == "/v1/realtime?duplex=1&autostart=0"
    assert (b"authorization", b"Bearer sk") in [(k.lower(), v) for k, v in request.extra_headers]
    answer = server.send(AcceptConnection()) + server.send(Message(data="first"))
    assert parse_handshake(answer[:10], key) is None  # the head is not whole yet
    status, problem, rest = parse_handshake(answer, key) or (0, "", b"")
    assert (status, problem) == (101, "")
    assert FrameReader().feed(rest) == [(OP_TEXT, b"first")]
    assert accept_value(key) != accept_value(handshake_key())


def test_a_refused_or_forged_upgrade_says_why() -> None:
    key = handshake_key()
    server = WSConnection(ConnectionType.SERVER)
    server.receive_data(handshake_request("h", "/v1/duplex", key))
    list(server.events())
    refused = server.send(RejectConnection(status_code=401, headers=[(b"content-length", b"0")]))
    assert parse_handshake(refused, key)[:2] == (401, "HTTP 401: ")  # type: ignore[index]
    forged = b"HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: nope\r\n\r\n"
    assert parse_handshake(forged, key)[1] == "wrong Sec-WebSocket-Accept"  # type: ignore[index]
    assert parse_handshake(b"garbage\r\n\r\n", key)[0] == 0  # type: ignore[index]


# -- replies: the server's own projections ------------------------------------------------------
def realtime_wire(frame: ev.AudioFrame, *, beta: bool = False, duplex: bool = True) -> list[bytes]:
    projection = RealtimeProjection(SID, "m", {}, beta=beta, duplex=duplex)
    events: list[ev.SessionEvent] = [ev.SessionCreated(SID, {}), ev.ResponseStarted("r", "i", 0), frame]
    return [dumps(m).encode() for e in events for m in projection.project(e)]


@pytest.mark.parametrize("beta", [False, True])
@pytest.mark.parametrize("duplex", [False, True])
@pytest.mark.parametrize("end", [None, 0, 1440, 4_000_000_000])
def test_a_realtime_delta_is_read_by_its_bytes(beta: bool, duplex: bool, end: int | None) -> None:
    frame = ev.AudioFrame("r", "i", 0, 123456, PCM, 'say "frame_index":9', end)
    messages = realtime_wire(frame, beta=beta, duplex=duplex)
    found = [p for m in messages if (p := text_audio_delta(m)) is not None]
    assert found == [(123456, NO_END if end is None else end)]
    for m in messages:  # the parsed path agrees on every message
        assert delta_position(json.loads(m)) == text_audio_delta(m)


def test_a_native_json_delta_and_binary_frame_are_read() -> None:
    native = NativeProjection(SID)
    native.project(ev.SessionCreated(SID, {"duplex": {"alignment": "client"}}))
    (delta,) = native.project(ev.AudioFrame("r", "i", 0, 7, PCM, "hi", 1920))
    assert isinstance(delta, dict)
    assert text_audio_delta(dumps(delta).encode()) == (7, 1920)
    binary = NativeProjection(SID, binary_output=True)
    binary.project(ev.SessionCreated(SID, {"duplex": {"alignment": "client"}}))
    out = binary.project(ev.AudioFrame("r", "i", 0, 8, PCM, "", 3840))
    assert isinstance(out[0], bytes) and binary_frame_position(out[0]) == (8, 3840)
    assert binary_frame_position(binary_frame(9, PCM)) == (9, NO_END)  # a stock client's header


def test_other_messages_are_not_deltas() -> None:
    transcript = b'{"type":"response.output_audio_transcript.delta","event_id":"e","delta":"audio.delta\\""}'
    assert text_audio_delta(transcript) is None
    assert text_audio_delta(b'{"type":"input_audio_buffer.alignment","pad_ms":4}') is None
    assert delta_position({"type": "response.output_audio.delta", "metadata": {}}) is None


# -- what the sessions send ---------------------------------------------------------------------
def test_every_chunk_is_the_same_tone_and_a_pad_message_states_its_pad() -> None:
    assert tone_pcm16(480) == tone_pcm16(1920)[:960] == tone_pcm16(1920)[960:1920]
    samples = np.frombuffer(tone_pcm16(1920), "<i2") / 32767
    assert 0.06 < float(np.sqrt((samples**2).mean())) < 0.08  # -20 dBFS peak: loud enough for the VAD
    realtime = Messages(20, binary=False, opening='{"type":"session.update","session":{}}')
    (append,) = server_reads(realtime.chunk)
    assert isinstance(append, TextMessage)
    event = json.loads(append.data)
    assert event["type"] == "input_audio_buffer.append"
    assert base64.b64decode(event["audio"]) == tone_pcm16(480)
    frame, samples_left = realtime.padded(37)
    assert samples_left == 1920 - 37 * 24 and realtime.padded(37)[0] is frame  # encoded once
    (padded,) = server_reads(frame)
    assert isinstance(padded, TextMessage)
    assert json.loads(padded.data)["pad_ms"] == 37
    assert len(base64.b64decode(json.loads(padded.data)["audio"])) == 2 * samples_left
    native = Messages(80, binary=True, opening="{}")
    (audio,) = server_reads(native.chunk)
    assert isinstance(audio, BytesMessage) and bytes(audio.data) == tone_pcm16(1920)
    (opening,) = server_reads(native.opening)
    assert isinstance(opening, TextMessage) and opening.data == "{}"
    with pytest.raises(ValueError):
        Messages(0, binary=True, opening="{}")
