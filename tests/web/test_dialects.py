"""Dialect parsing that needs no server: what each dialect refuses at its edge."""

from __future__ import annotations

import json

import pytest

from duplex_actors.protocol.errors import ProtocolError
from duplex_actors.web.dialects import NativeDialect, RealtimeDialect


def native() -> NativeDialect:
    return NativeDialect(capabilities={})


@pytest.mark.parametrize("fmt", ["g711_ulaw", "audio/pcma"])
def test_native_refuses_g711_output_at_create_and_update(fmt: str) -> None:
    create = {"type": "session.create", "event_id": "c1", "session": {"output_audio_format": fmt}}
    with pytest.raises(ProtocolError) as exc:
        native().first_message(json.dumps(create))
    assert exc.value.code == "unsupported_audio_format" and "/v1/realtime" in exc.value.message
    assert exc.value.client_event_id == "c1"
    update = {"type": "session.update", "session": {"output_audio_format": fmt}}
    with pytest.raises(ProtocolError) as exc:
        native().parse(json.dumps(update), {})
    assert exc.value.code == "unsupported_audio_format"


def test_native_takes_pcm16_output_and_realtime_takes_g711() -> None:
    create = {"type": "session.create", "session": {"output_audio_format": "pcm16"}}
    assert native().first_message(json.dumps(create)).config["output_audio_format"] == "pcm16"
    update = {"type": "session.update", "session": {"output_audio_format": "g711_ulaw"}}
    opening = RealtimeDialect(capabilities={}, model="tiny", beta=False).first_message(json.dumps(update))
    assert opening.config["output_audio_format"] == "g711_ulaw"


def test_native_binary_audio_takes_the_format_of_the_config_it_is_parsed_with() -> None:
    from duplex_actors.web.dialects import AppendCommand

    dialect = native()
    pcm = {"input_audio_format": "pcm16", "sample_rate_hz": 16000}
    ulaw = {"input_audio_format": "g711_ulaw"}
    seen = []
    for config in (pcm, pcm, ulaw, ulaw, pcm, {}):
        command = dialect.parse(b"\x00\x01", config)
        assert type(command) is AppendCommand
        seen.append((command.format, command.sample_rate_hz))
    assert seen == [("pcm16", 16000)] * 2 + [("g711_ulaw", 8000)] * 2 + [("pcm16", 16000), ("pcm16", 24000)]
    # an unsupported config is refused at every message, not only the first
    for _ in range(2):
        with pytest.raises(ProtocolError) as exc:
            dialect.parse(b"\x00\x01", {"input_audio_format": "mp3"})
        assert exc.value.code == "unsupported_audio_format"
