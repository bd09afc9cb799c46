"""web/ws_frames.py against wsproto: the messages it takes from the start of a read, then
wsproto on the rest, are what wsproto delivers for the whole read."""

from __future__ import annotations

import os
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto import ConnectionType, frame_protocol
from wsproto.connection import Connection
from wsproto.events import BytesMessage, CloseConnection, Event, Message, Ping, Pong, TextMessage
from wsproto.utilities import RemoteProtocolError

from duplex_actors.web.hardening import WSPROTO_UNMASK
from duplex_actors.web.ws_frames import leading_messages, server_frame, unmask, unmask_in_python

MAX_PAYLOAD = 70_000


def frame(
    opcode: int,
    payload: bytes,
    *,
    fin: bool = True,
    masked: bool = True,
    rsv: int = 0,
    wide_length: bool = False,
    key: bytes = b"\x01\x02\x03\x04",
) -> bytes:
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    mask_bit = 0x80 if masked else 0
    if n < 126 and not wide_length:
        head += bytes([mask_bit | n])
    elif n < 65536:
        head += bytes([mask_bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", n)
    return head + (key + bytes(b ^ key[i % 4] for i, b in enumerate(payload)) if masked else payload)


def wsproto_events(data: bytes) -> list[tuple[object, ...]]:
    """What a wsproto server connection makes of ``data`` (its error, if any, last), with
    wsproto's own unmasking (the app installs ours in the process: hardening.install_unmask)."""
    installed = frame_protocol.XorMaskerSimple.process
    frame_protocol.XorMaskerSimple.process = WSPROTO_UNMASK  # type: ignore[method-assign]
    try:
        connection = Connection(ConnectionType.SERVER)
        connection.receive_data(data)
        out: list[tuple[object, ...]] = []
        try:
            for event in connection.events():
                out.append(describe(event))
        except RemoteProtocolError as exc:
            out.append(("error", str(exc)))
        return out
    finally:
        frame_protocol.XorMaskerSimple.process = installed  # type: ignore[method-assign]


def describe(event: Event) -> tuple[object, ...]:
    if isinstance(event, Message):
        return (type(event).__name__, event.data, event.frame_finished, event.message_finished)
    if isinstance(event, Ping | Pong):
        return (type(event).__name__, event.payload)
    if isinstance(event, CloseConnection):
        return ("close", event.code, event.reason)
    return (type(event).__name__,)


def as_events(messages: list[str | bytes]) -> list[tuple[object, ...]]:
    return [
        ("TextMessage", m, True, True) if isinstance(m, str) else ("BytesMessage", m, True, True)
        for m in messages
    ]


def check(data: bytes) -> tuple[list[str | bytes], int]:
    messages, used = leading_messages(data, MAX_PAYLOAD)
    assert 0 <= used <= len(data)
    assert wsproto_events(data) == as_events(messages) + wsproto_events(data[used:])
    return messages, used


def test_an_audio_append_and_a_binary_frame_in_one_read() -> None:
    append = b'{"type":"input_audio_buffer.append","audio":"' + b"A" * 5120 + b'"}'
    pcm = os.urandom(3840)
    data = frame(0x1, append) + frame(0x2, pcm, key=b"\xff\x00\xaa\x55")
    messages, used = check(data)
    assert messages == [append.decode(), pcm]
    assert used == len(data)


def test_it_stops_where_wsproto_must_take_over() -> None:
    text = frame(0x1, b"hello")
    cases = {
        "a ping": frame(0x9, b"p"),
        "a fragment": frame(0x1, b"par", fin=False) + frame(0x0, b"t"),
        "a partial frame": frame(0x2, b"x" * 300)[:-1],
        "an unmasked frame": frame(0x2, b"x", masked=False),
        "an rsv bit": frame(0x2, b"x", rsv=4),
        "a non-minimal length": frame(0x2, b"x" * 10, wide_length=True),
        "invalid utf-8": frame(0x1, b"\xff\xfe"),
        "too long": frame(0x2, b"x" * (MAX_PAYLOAD + 1)),
        "a close": frame(0x8, struct.pack("!H", 1000)),
    }
    for name, rest in cases.items():
        messages, used = check(text + rest)
        assert (messages, used) == (["hello"], len(text)), name


_payloads = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([125, 126, 127, 65535, 65536]).map(lambda n: os.urandom(n)),
)


@st.composite
def _frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["text", "binary", "ping", "pong", "close", "fragment", "odd"]))
    payload = draw(_payloads)
    key = draw(st.binary(min_size=4, max_size=4))
    if kind == "text":
        text = draw(st.text(max_size=100)).encode() if draw(st.booleans()) else payload
        return frame(0x1, text, key=key)
    if kind == "binary":
        return frame(0x2, payload, key=key)
    if kind in ("ping", "pong"):
        return frame(0x9 if kind == "ping" else 0xA, payload[:125], key=key)
    if kind == "close":
        return frame(0x8, struct.pack("!H", 1000) + b"bye", key=key)
    if kind == "fragment":
        return frame(0x2, payload[:50], fin=False, key=key) + frame(0x0, payload[50:], key=key)
    return frame(
        draw(st.sampled_from([0x1, 0x2, 0x3])),
        payload[:300],
        masked=draw(st.booleans()),
        rsv=draw(st.integers(0, 7)),
        wide_length=draw(st.booleans()),
        key=key,
    )


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(_frames(), max_size=6), cut=st.integers(min_value=0))
def test_leading_messages_then_wsproto_is_wsproto(frames: list[bytes], cut: int) -> None:
    data = b"".join(frames)
    check(data[: cut % (len(data) + 1)])
    check(data)


@settings(max_examples=200, deadline=None)
@given(
    message=st.one_of(
        st.text(max_size=300),
        st.binary(max_size=300),
        st.sampled_from([125, 126, 65535, 65536]).map(lambda n: os.urandom(n)),
        st.sampled_from([125, 126, 65535, 65536]).map(lambda n: "é" * (n // 2)),
    )
)
def test_server_frame_is_wsproto_s(message: str | bytes) -> None:
    event = TextMessage(data=message) if isinstance(message, str) else BytesMessage(data=message)
    assert server_frame(message) == Connection(ConnectionType.SERVER).send(event)


@settings(max_examples=300)
@given(payload=st.binary(max_size=9000), key=st.binary(min_size=4, max_size=4))
def test_unmask_is_the_xor_of_the_repeated_key_with_or_without_the_c_mask(payload: bytes, key: bytes) -> None:
    expected = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    assert unmask(payload, key) == expected
    assert unmask_in_python(payload, key) == expected


def test_the_c_mask_is_the_one_used() -> None:
    """websockets is a dependency for its C mask: a build without it would cost every frame."""
    from duplex_actors.web import ws_frames

    assert ws_frames._c_apply_mask is not None
