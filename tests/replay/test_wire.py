"""The bytes on the wire: the golden corpus and a synthetic stream of every session event, projected
onto Realtime GA, Realtime beta and native (JSON and binary audio), hash to the recorded digests.

The corpus digests (``replay/expected.json``) cover the dialect-neutral events; these cover what
the projections make of them, so a change of field order, of an omitted or ``null`` field, or of a
GA/beta name fails here. The digests were recorded with the hand-built dicts the projections had
before they built the ``protocol.events`` classes; change them only for an intended wire change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from duplex_actors.protocol import dumps
from duplex_actors.protocol import native as native_dialect
from duplex_actors.protocol import realtime as realtime_dialect
from duplex_actors.protocol.errors import ProtocolError
from duplex_actors.replay.replayer import replay_logic
from duplex_actors.session import events as ev

CORPUS = Path(__file__).resolve().parents[2] / "replay"
SID = "sess_00112233445566778899aabb"
PCM = bytes(range(256)) * 15  # one 80 ms frame
CAPS: dict[str, Any] = {
    "implementation_level": "model_native_duplex",
    "chunk_period_ms": 80,
    "supports_client_commit": False,
    "supports_external_turn_signal": False,
    "supports_barge_in": False,
    "supports_session_resume": False,
    "supports_audio_truncate": False,
    "supports_playback_ack": True,
    "supports_input_append": True,
    "supports_multi_session": True,
    "supports_multi_session_same_replica": True,
    "input_modes": ["append_audio_chunk"],
}
# (name, dialect, options): every way a projection is configured in the server.
VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("ga", "realtime", {}),
    ("ga-chunk3", "realtime", {"output_chunk_frames": 3}),
    ("beta", "realtime", {"beta": True}),
    ("beta-chunk3", "realtime", {"beta": True, "output_chunk_frames": 3}),
    ("native", "native", {}),
    ("native-binary", "native", {"binary_output": True}),
    ("native-nocaps", "native", {"capabilities": None}),
]


def synthetic(sid: str = SID) -> list[ev.SessionEvent]:
    """Every session event, with the edge cases of the wire shapes: a config that names server-owned
    keys and ``type``, ``None`` and set client event ids, a long message, unicode, an unpaired
    surrogate, two responses (``previous_item_id``), a response cut by the close."""
    config = {"voice": "NATF2.pt", "id": "x", "model": "y", "type": "realtime", "temperature": 0.7}
    return [
        ev.SessionCreated(sid, config),
        ev.SessionUpdated(sid, {"voice": "NATM1.pt", "instructions": "héllo \ud800 ✓"}, "ev_u"),
        ev.ResponseStarted("resp_a", "item_a", 0),
        ev.AudioFrame("resp_a", "item_a", 0, 0, PCM, "Hé"),
        ev.AudioFrame("resp_a", "item_a", 0, 1, PCM, ""),
        ev.SpeechStarted(0, 2, "item_in_a"),
        ev.AudioFrame("resp_a", "item_a", 0, 2, PCM[:1920], "llo"),
        ev.ResponseEnded("resp_a", "item_a", 0, "client_cancelled", "Héllo", 3, False),
        ev.InputCleared(None),
        ev.InputCleared("ev_ic"),
        ev.OutputCleared(None),
        ev.OutputCleared("ev_oc"),
        ev.HeartbeatAck(None),
        ev.HeartbeatAck("ev_hb"),
        ev.PlaybackAcknowledged({"played_ms": 160, "nested": {"a": [1, None]}}, "ev_pa"),
        ev.PlaybackAcknowledged({}, None),
        ev.Error("bad_audio", "nope", "ev_e", "audio"),
        ev.Error("resource_exhausted", "x" * 3000, None, "p" * 300),
        ev.Error("internal_error", "boom"),
        ev.ResponseStarted("resp_b", "item_b", 1),
        ev.AudioFrame("resp_b", "item_b", 1, 3, PCM, "a"),
        ev.AudioFrame("resp_c", "item_c", 2, 4, PCM, "b"),  # a new response before the flush
        ev.ResponseEnded("resp_b", "item_b", 1, "output_audio_buffer_clear", "a" * 70_000, 1, True),
        ev.ResponseStarted("resp_d", "item_d", 3),
        ev.AudioFrame("resp_d", "item_d", 3, 5, PCM, ""),
        ev.SessionClosed(sid, "client_close"),
        ev.HeartbeatAck("after_close"),
    ]


def _projection(dialect: str, sid: str, options: dict[str, Any]) -> Any:
    if dialect == "native":
        opts = {"capabilities": CAPS, **options}
        return native_dialect.NativeProjection(sid, **opts)
    return realtime_dialect.RealtimeProjection(sid, "personaplex-7b", CAPS, **options)


def _wire(events: list[ev.SessionEvent], sid: str, dialect: str, options: dict[str, Any]) -> Iterator[bytes]:
    projection = _projection(dialect, sid, options)
    yield dumps(projection.closing_event("server_shutdown")).encode()
    yield dumps(projection.protocol_error(ProtocolError("bad_event", "bad", client_event_id="c"))).encode()
    for event in events:
        for message in projection.project(event):
            yield message if isinstance(message, bytes) else dumps(message).encode()


def _digest(parts: Iterator[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def wire_digests() -> dict[str, str]:
    """``"<stream>/<variant>" -> sha256`` of every message the projections send."""
    streams: dict[str, tuple[str, list[ev.SessionEvent]]] = {"synthetic": (SID, synthetic())}
    for path in sorted(CORPUS.glob("*.dlog")):
        report = replay_logic(path)
        assert report.session_id is not None
        streams[path.stem] = (report.session_id, report.events)
    out = {}
    for stream, (sid, events) in streams.items():
        for name, dialect, options in VARIANTS:
            out[f"{stream}/{name}"] = _digest(_wire(events, sid, dialect, options))
    refusals = [
        dumps(
            realtime_dialect.refusal_error(
                "model_not_found", "m" * 2000, "c1", param="model", event_id="evt_1"
            )
        ),
        dumps(realtime_dialect.refusal_error("config_timeout", "late", event_id="evt_2")),
        dumps(native_dialect.refusal_error("resource_exhausted", "full", "c2", param="p")),
        dumps(native_dialect.refusal_error("config_timeout", "late")),
    ]
    out["refusals"] = _digest(s.encode() for s in refusals)
    return out


EXPECTED: dict[str, str] = {
    "refusals": "a757b75768c0f823c5bf88b18428f9aceb19fe258a50bc0122d41b77ec12f20d",
    "sess_golden-parrot-clears-updates-disconnect/beta": "6125a838a02fdd05d0c10bfc078df749a6b9c2455e4323b00b58d6f60d77c44a",
    "sess_golden-parrot-clears-updates-disconnect/beta-chunk3": "b742bbe14053481c39316ced22cdcc41639636409c863387b2e88f7e42762e77",
    "sess_golden-parrot-clears-updates-disconnect/ga": "9d2ef4a350b4007005477eea3e2109af34d5812c70123b75f97e0afc66da2e98",
    "sess_golden-parrot-clears-updates-disconnect/ga-chunk3": "c65660417a3a42b2e8f593773248df93bd1edc767ebe528f069abf4d066a168a",
    "sess_golden-parrot-clears-updates-disconnect/native": "561d77cd3d00225ba7faffe75919f91575e6eb3a2301b497addba9dec0ab8522",
    "sess_golden-parrot-clears-updates-disconnect/native-binary": "3c8860e1754f715ba39124465e614be71dfc2fa7b7f7277df5f78dd8b75ccd0e",
    "sess_golden-parrot-clears-updates-disconnect/native-nocaps": "6bec578d3d846dab2268f12f0b8f014561073d69ffadc7fa231e8be64cc959cf",
    "sess_golden-tiny-greedy/beta": "5ae69df49436b4e21722bbbf9331ff3de54307c10e6c850c6bffa329f3f4d36e",
    "sess_golden-tiny-greedy/beta-chunk3": "ec89eb4ba20a41207a196c111e9691995accdc875e1eb88b0862c142aa830ef5",
    "sess_golden-tiny-greedy/ga": "e0141d08df9cb8d97c5407690cead1765ba690e5b6323b5fe66429bc2d943f99",
    "sess_golden-tiny-greedy/ga-chunk3": "c87b62fe7b8dbd13110940f50447775693756b6c768ea1557b4f92eb5eb7279b",
    "sess_golden-tiny-greedy/native": "ee0a28da72221757c9da6561d51a06b72e6608ffc99c3ab1a1bb42b8fe0b02f7",
    "sess_golden-tiny-greedy/native-binary": "0b7f64da9f23045dd620bc18ee144ea1f4adc3136c86a40f6b786d3b849eec11",
    "sess_golden-tiny-greedy/native-nocaps": "730c01fabb63b6e8c3fe496145e96fe847d178e0cf3d8a414c87a328a6f5aae4",
    "sess_golden-tiny-moshi-family/beta": "58a762a014bab2be1f3273c54c1adbff68db1259480e3a196631906016bb8d2a",
    "sess_golden-tiny-moshi-family/beta-chunk3": "9388b2142554d7400efb3ee0dfcb0e6976a460b66711fa3f7988564886a0a20a",
    "sess_golden-tiny-moshi-family/ga": "3110586d2a6da2787699afe28477cace187bc02e1cde5c788620228934183b6c",
    "sess_golden-tiny-moshi-family/ga-chunk3": "f1fcaf6c8ceac418fd1444addcbbbf48c5d95b45ede46b001bb1d0180847fe48",
    "sess_golden-tiny-moshi-family/native": "6cd42354c61487a36ece978bfeb61b38515098b77333b6436b1eddd94338e9cd",
    "sess_golden-tiny-moshi-family/native-binary": "dea77fb07f6691001d36a77ecea14d51602f80f7b69683729066b21812720dc5",
    "sess_golden-tiny-moshi-family/native-nocaps": "98d37ceabb47586eae37a008dca48024220868806488980cb01feb47fc852295",
    "sess_golden-tiny-seeded-cancel/beta": "b03d5f4367a2adc84240fa7e3a0d24b8f82083edeeec1f998c821750b678df54",
    "sess_golden-tiny-seeded-cancel/beta-chunk3": "06269c0a73d6193ae60a9b1230d7f17ce0d7f83187b92a112a253918d9e8f484",
    "sess_golden-tiny-seeded-cancel/ga": "eabab009f503a84086a22ff48cba059355824d4806631e7036d1f81721761f2c",
    "sess_golden-tiny-seeded-cancel/ga-chunk3": "46eacec36d27ad0e0b12c6048c97f0257884a3a7b8ba63af19ade6b5f9e90a66",
    "sess_golden-tiny-seeded-cancel/native": "2fe75f345fcf89f667eb543efb86bd43b483e12508c23514753506a9c5989a31",
    "sess_golden-tiny-seeded-cancel/native-binary": "9f8d257ea3fb674f631a7f5fbf0a608a5b764bbb3b1978d03ae85f888d45d36b",
    "sess_golden-tiny-seeded-cancel/native-nocaps": "7243c6c917c087884d49077124929136dc2ca08512e7243deaad7dea58033fdd",
    "synthetic/beta": "4b3da0e849017d85c6260e35a07d84ee297257df253b4be359432430cc7cb27f",
    "synthetic/beta-chunk3": "118e75e74f57522f90213e1b0623013503f38691650e75965d86d9cca8c3a25a",
    "synthetic/ga": "0f48583894e95b490e34ae31ec95fe0646100f9ccfada18374ab1a2fec7f0703",
    "synthetic/ga-chunk3": "6df6ceaced0894bd265c6d84665570cfe4d888f35294fccd44c58ea52d2d2ad6",
    "synthetic/native": "5597bb6bf6ee07eb5c7dbddcce74bf4028b39d7aa04eb2736c626e035104d8f2",
    "synthetic/native-binary": "aa7e01865b613660f73e91ebdcc0c64297ffdf28017616777ba0d79ff1aac889",
    "synthetic/native-nocaps": "6b8683c6ef640e27c2cd044693ebd860059a732b1f6ed7d91e76b296ad67c64c",
}


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_wire_bytes_match_the_recorded_digests(key: str, digests: dict[str, str]) -> None:
    assert digests[key] == EXPECTED[key]


def test_every_stream_and_variant_is_recorded(digests: dict[str, str]) -> None:
    assert sorted(digests) == sorted(EXPECTED)


@pytest.fixture(scope="module")
def digests() -> dict[str, str]:
    return wire_digests()


if __name__ == "__main__":  # print the digests (to record them after an intended change)
    for key, value in sorted(wire_digests().items()):
        print(f'    "{key}": "{value}",')
