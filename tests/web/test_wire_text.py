"""What the connection writes for an outbound event is ``json.dumps`` to the byte, whether or not
its base64 audio is spliced in (web/wire_text.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from duplex_actors.web.wire_text import wire_message

values = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=40))
audio = st.one_of(
    st.binary(min_size=150, max_size=4000).map(lambda b: base64.b64encode(b).decode("ascii")),
    st.text(min_size=250, max_size=600),  # a transcript's delta is text, not base64
    st.text(alphabet='AB+/=\\"\x01é', min_size=256, max_size=400),
)


@given(
    fields=st.dictionaries(st.text(min_size=1, max_size=12), values, max_size=6),
    field=st.sampled_from(["delta", "audio"]),
    data=audio,
)
def test_an_event_is_its_json_to_the_byte(fields: dict[str, Any], field: str, data: str) -> None:
    message = {"type": "response.output_audio.delta", **fields, field: data, "metadata": {"text": data[:9]}}
    assert wire_message(message) == json.dumps(message, separators=(",", ":"))


def test_bytes_go_as_they_are() -> None:
    assert wire_message(b"\x00\x01") == b"\x00\x01"
