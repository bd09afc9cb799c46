"""The bytes on the wire: the golden corpus and a synthetic stream of every session event, projected
onto Realtime GA, Realtime beta and native (JSON and binary audio), hash to the recorded digests.

The corpus digests (``replay/expected.json``) cover the dialect-neutral events; these cover what
the projections make of them, so a change of field order, of an omitted or ``null`` field, or of a
GA/beta name fails here. The digests were recorded with the hand-built dicts the projections had
before they built the ``protocol.wire_events`` classes; change them only for an intended wire change.
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
    ("ga-duplex", "realtime", {"duplex": True}),
    ("beta-duplex", "realtime", {"beta": True, "duplex": True}),
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


def synthetic_aligned(sid: str = SID) -> list[ev.SessionEvent]:
    """A session that opted in to alignment (log format 4): hints, positions on every frame, and
    a hint after it turned alignment off (not sent)."""
    config = {"voice": "NATF2.pt", "duplex": {"alignment": "client"}}
    return [
        ev.SessionCreated(sid, config),
        ev.SessionUpdated(sid, config, "ev_u"),
        ev.AlignmentHint(37, "start"),
        ev.ResponseStarted("resp_a", "item_a", 0),
        ev.AudioFrame("resp_a", "item_a", 0, 0, PCM, "Hé", 1032),
        ev.AudioFrame("resp_a", "item_a", 0, 1, PCM, "", 2952),
        ev.AlignmentHint(5, "drift"),
        ev.AudioFrame("resp_a", "item_a", 0, 2, PCM, "llo", 4752),
        ev.AudioFrame("resp_a", "item_a", 0, 3, PCM, "", 4752),  # ended inside a pad
        ev.ResponseEnded("resp_a", "item_a", 0, "client_cancelled", "Héllo", 4, False),
        ev.AlignmentHint(12, "clear"),
        ev.SessionUpdated(sid, {**config, "duplex": {"alignment": "off"}}, "ev_off"),
        ev.AlignmentHint(20, "margin"),
        ev.SessionClosed(sid, "client_close"),
    ]


def synthetic_conversation(sid: str = SID) -> list[ev.SessionEvent]:
    """A conversation (log format 5): text items of every role, a voice alias, a truncation, the
    items retrieved, responses that follow each other in one epoch, a clear with nothing open."""
    config = {"voice": "ash", "voice_prompt": "NATM1.pt", "instructions": "Be brief."}
    return [
        ev.SessionCreated(sid, config),
        ev.OutputCleared("ev_oc0"),
        ev.TextItemAdded("item_text_a_0", "system", "Speak French.", True, "ev_t0"),
        ev.TextItemAdded("msg_1", "user", "Say hello! ✓", False),
        ev.TextItemAdded("msg_2", "developer", "Be terse.", False, "ev_t2"),
        ev.TextItemAdded("msg_3", "assistant", "Hi.", False),
        ev.ResponseStarted("resp_a", "item_a", 0),
        ev.AudioFrame("resp_a", "item_a", 0, 0, PCM, "Hé", 1920),
        ev.ItemTruncated("item_a", 0, 40, "ev_tr"),
        ev.ItemRetrieved("item_a", "assistant", "Hé", True, False, "ev_r0"),
        ev.ResponseEnded("resp_a", "item_a", 0, "client_cancelled", "Hé", 1, False),
        ev.Error("response_cancel_not_active", "no response is active", "ev_c2"),
        ev.OutputCleared("ev_oc1"),
        ev.ItemRetrieved("item_a", "assistant", "Hé", True, True),
        ev.ItemRetrieved("msg_2", "developer", "Be terse.", False, True, "ev_r1"),
        ev.ResponseStarted("resp_b", "item_b", 0),
        ev.AudioFrame("resp_b", "item_b", 0, 1, PCM, "", 3840),
        ev.ResponseEnded("resp_b", "item_b", 0, "output_audio_buffer_clear", "", 1, True),
        ev.ResponseStarted("resp_c", "item_c", 0),
        ev.SessionClosed(sid, "timeout"),
    ]


def _projection(dialect: str, sid: str, options: dict[str, Any]) -> Any:
    if dialect == "native":
        opts = {"capabilities": CAPS, **options}
        return native_dialect.NativeProjection(sid, **opts)
    return realtime_dialect.RealtimeProjection(sid, "personaplex-7b", CAPS, **options)


def _wire(events: list[ev.SessionEvent], sid: str, dialect: str, options: dict[str, Any]) -> Iterator[bytes]:
    projection = _projection(dialect, sid, options)
    closing = projection.closing_event("server_shutdown")
    if closing is not None:
        yield dumps(closing).encode()
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
    streams: dict[str, tuple[str, list[ev.SessionEvent]]] = {
        "synthetic": (SID, synthetic()),
        "synthetic-aligned": (SID, synthetic_aligned()),
        "synthetic-conversation": (SID, synthetic_conversation()),
    }
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


# Recorded against b363dc7 (a rewrite of the projections kept every byte); the Realtime variants were
# re-recorded once on purpose when audio deltas started to state their `format`, and the
# stock variants (ga, beta) once more when the stock route began to send only what OpenAI's types
# validate (protocol/realtime.py): no session.closing, OpenAI's response.done reasons, ...
EXPECTED: dict[str, str] = {
    "refusals": "a757b75768c0f823c5bf88b18428f9aceb19fe258a50bc0122d41b77ec12f20d",
    "sess_golden-parrot-clears-updates-disconnect/beta": "601845e99a82a488e963780f48de2c6de43704a6b970c6c876030de1c2d1d79e",
    "sess_golden-parrot-clears-updates-disconnect/beta-chunk3": "06cfcafced84a3d1ff09e5f0e4523b03b7d06d7e916d76c68f869d596e1b1fc3",
    "sess_golden-parrot-clears-updates-disconnect/ga": "e6be2ad441c85c37c1cb6106e028ce2394a0ef92b049927ac4cb41002ddc47a1",
    "sess_golden-parrot-clears-updates-disconnect/ga-chunk3": "69b38f00a2f6ac542f7e1d5fbab5490421bcd97a249468670455b025472e2924",
    "sess_golden-parrot-clears-updates-disconnect/native": "561d77cd3d00225ba7faffe75919f91575e6eb3a2301b497addba9dec0ab8522",
    "sess_golden-parrot-clears-updates-disconnect/native-binary": "3c8860e1754f715ba39124465e614be71dfc2fa7b7f7277df5f78dd8b75ccd0e",
    "sess_golden-parrot-clears-updates-disconnect/native-nocaps": "6bec578d3d846dab2268f12f0b8f014561073d69ffadc7fa231e8be64cc959cf",
    "sess_golden-tiny-greedy/beta": "893ef646f62d0fb5144b31a5a1e474c1ce3399e19bac179208fde9d93b7ae029",
    "sess_golden-tiny-greedy/beta-chunk3": "e7c40dff3013ffea70ce25e73fa14833c0faa5134976ed4427a5b1012caa44c5",
    "sess_golden-tiny-greedy/ga": "0acdc96fba2d0bd37da2f889cf935a6ac2090a4457c806566fd9391a97784e6e",
    "sess_golden-tiny-greedy/ga-chunk3": "7837dbf0548ae1b3db93a72df57bb5477cf68da2e348aad2a54cf50df808e6e1",
    "sess_golden-tiny-greedy/native": "ee0a28da72221757c9da6561d51a06b72e6608ffc99c3ab1a1bb42b8fe0b02f7",
    "sess_golden-tiny-greedy/native-binary": "0b7f64da9f23045dd620bc18ee144ea1f4adc3136c86a40f6b786d3b849eec11",
    "sess_golden-tiny-greedy/native-nocaps": "730c01fabb63b6e8c3fe496145e96fe847d178e0cf3d8a414c87a328a6f5aae4",
    "sess_golden-tiny-moshi-family/beta": "6c65402a9b42f6790eb97289075540df5cda42a489db481eaa4a818e2f90b87c",
    "sess_golden-tiny-moshi-family/beta-chunk3": "acfa09fd30f34a18947acb7a1507256b58f5c16c2d719ff6d3fe6122d13fe3be",
    "sess_golden-tiny-moshi-family/ga": "bfe1881a781d1c1a60216dcff234823fcd91548db4edd7d333bfe6b96ad8f3bd",
    "sess_golden-tiny-moshi-family/ga-chunk3": "af4b96adbd84ab614807893fc73acc0760dbdfaef8d5e24dfa7918bd5401feb0",
    "sess_golden-tiny-moshi-family/native": "6cd42354c61487a36ece978bfeb61b38515098b77333b6436b1eddd94338e9cd",
    "sess_golden-tiny-moshi-family/native-binary": "dea77fb07f6691001d36a77ecea14d51602f80f7b69683729066b21812720dc5",
    "sess_golden-tiny-moshi-family/native-nocaps": "98d37ceabb47586eae37a008dca48024220868806488980cb01feb47fc852295",
    "sess_golden-tiny-seeded-cancel/beta": "ceb17da6daebf87361691e5c0c8c2ddfa6ce384efc1cc0a873ed990eabf83412",
    "sess_golden-tiny-seeded-cancel/beta-chunk3": "a01417fb0c767e7955df754a2139fb98b93a4dda0c2c3f25e11ecb8db2523dda",
    "sess_golden-tiny-seeded-cancel/ga": "d225111760f07b5f28624bd6d735a58aada9753274d40204f1e36eb0cc91f159",
    "sess_golden-tiny-seeded-cancel/ga-chunk3": "18b759ab59c28ac58972f3bed90c37093cff86e52cda00bc310dc7c9853b127e",
    "sess_golden-tiny-seeded-cancel/native": "2fe75f345fcf89f667eb543efb86bd43b483e12508c23514753506a9c5989a31",
    "sess_golden-tiny-seeded-cancel/native-binary": "9f8d257ea3fb674f631a7f5fbf0a608a5b764bbb3b1978d03ae85f888d45d36b",
    "sess_golden-tiny-seeded-cancel/native-nocaps": "7243c6c917c087884d49077124929136dc2ca08512e7243deaad7dea58033fdd",
    "synthetic/beta": "0ea38ea03a0156bed7bca49c2612e435a3c4f9d6122a26b17e0c79cff7b95f1a",
    "synthetic/beta-chunk3": "a5b5053eedd857b2327dbe537ddbfa84f65bc691d0b3e662ff071799dc75d1ff",
    "synthetic/ga": "a6135ea29e1187f5dd8a84dd23940a1fb22f4be0044a31e3f4f8a9de4384839b",
    "synthetic/ga-chunk3": "e8910dd789a61297b98e47f6da0446334c47ba32d98024e6b1cb763c72e70960",
    "synthetic/native": "5597bb6bf6ee07eb5c7dbddcce74bf4028b39d7aa04eb2736c626e035104d8f2",
    "synthetic/native-binary": "aa7e01865b613660f73e91ebdcc0c64297ffdf28017616777ba0d79ff1aac889",
    "synthetic/native-nocaps": "6b8683c6ef640e27c2cd044693ebd860059a732b1f6ed7d91e76b296ad67c64c",
    # Alignment (log format 4, docs/design.md §2 "The tick grid and alignment"): new streams only; every pin above is unchanged.
    "sess_golden-tiny-grid-client-hint/beta": "5d6f46832646424ed9a2ee999ffa0902d56c9db5cbc7ee177c34d10054cfcb18",
    "sess_golden-tiny-grid-client-hint/beta-chunk3": "006c93ba5b0c91c23c8b2faba123c3981f49fcec50dafb36bc222748d66658f1",
    "sess_golden-tiny-grid-client-hint/ga": "640be7a9569371bfb66dfd5ee35383df74e96bed849fcd69437dc6d6edbf8194",
    "sess_golden-tiny-grid-client-hint/ga-chunk3": "55c7f06f98f77ef5008180df380eb4d5f4c6555bfa8a49f5b152a662178b87fe",
    "sess_golden-tiny-grid-client-hint/native": "e279cf984e725b66c1be4ef30ae8280d99bf4a1c0cf74c3d312884adf7711ff3",
    "sess_golden-tiny-grid-client-hint/native-binary": "094f15428023f9675dadd7b121762db2140179cf4086c98af5e9165007c4262b",
    "sess_golden-tiny-grid-client-hint/native-nocaps": "080728b023e53437ce01a16321b443b81b7d70eb20609502765ab4abb1c33718",
    "sess_golden-tiny-grid-server-pad/beta": "7845a41315b7922cf8294235d3fd8f9f5f5f70b902c4832f078f7df8c76bba71",
    "sess_golden-tiny-grid-server-pad/beta-chunk3": "f39ebb3def205102ff444a7b51c73f888c1c35c526da41dc80dc933284bb050d",
    "sess_golden-tiny-grid-server-pad/ga": "b00d6e7995f5e8499ea873742bceb54b29d3c54ed3f31fba2756df443230ddaf",
    "sess_golden-tiny-grid-server-pad/ga-chunk3": "ad774cbfa458c4a9578126191cf8182eed336ee18ff6336385cfeb3085d9af9a",
    "sess_golden-tiny-grid-server-pad/native": "b21cb172aa83c154857ccd2b99c23a0c0309d96dc35d0dbcb01adce7214732e0",
    "sess_golden-tiny-grid-server-pad/native-binary": "6104d95b6761fe04aa7ac5d72623fe43589360517c630bef8fb03eca94c487af",
    "sess_golden-tiny-grid-server-pad/native-nocaps": "4cb3049ab67214f1011d6f048c109aa3f8670da0bcb19bfba647ec3c71be2eef",
    "synthetic-aligned/beta": "d3b5ac25112a91e680544cbd3a076ad856c8ead79d80bbc45d1953f3944a1c11",
    "synthetic-aligned/beta-chunk3": "8fb57b42e83015be9aca79a2c68e99d73419f2025e2feee5d06d8be136943894",
    "synthetic-aligned/ga": "3538fa40c309b69a1b3e74489a3f76cbf18216794237fc47d92ff357d6762a5f",
    "synthetic-aligned/ga-chunk3": "c3eeaa65215d90605ac454dbfc65aaeca4017f6e7a15a00fcd886836c712effa",
    "synthetic-aligned/native": "938878f2cb60bfcfbb12d4b23c367eadf356a6ad9d1c3716d4b9a3b3f81ab662",
    "synthetic-aligned/native-binary": "8cb515eb2e8de5a0a8e1955b29ee5763344c74200c370908109e79a3f6f0dc25",
    "synthetic-aligned/native-nocaps": "e29fe18872dcda227da9f56a39cb9c9510dc0af2d9e7e00d609bb55c69294f10",
    # The conversation stream (log format 5), recorded when it was added.
    "synthetic-conversation/beta": "b9ebc961c51103b3fb4a7c22c85bddf0ee7030733317d47fa4a5d49d7c0c0983",
    "synthetic-conversation/beta-chunk3": "a06fc87af83dc1de9d6a5758bc10d69e8087742f909d6f70409de2d5479db390",
    "synthetic-conversation/beta-duplex": "dc062b44e0e6d0c709eafdce0cdb0a654ceb5f64c6ef360fd9d52785fe2236ce",
    "synthetic-conversation/ga": "0d2657cc0d24a4edd2a9a10aa6792e65b11f97369755497b178b8cb822df884d",
    "synthetic-conversation/ga-chunk3": "7525a126bd12e170e9a47e09005246144dd0ce3e730bfb2b7c64baec67a0c91d",
    "synthetic-conversation/ga-duplex": "a8613a28c3a570483d3e989438b059ccfeb771496fb5a279aa5ef5ddeb801985",
    "synthetic-conversation/native": "0c5fb7e0ecbe43105b7009ec659832dc1b70cf7153e708dee6a348fadcc3a9e1",
    "synthetic-conversation/native-binary": "483a6ec4b39b30ff710455a754420cfefa32fb83d91fe2f092e8e383b629c77f",
    "synthetic-conversation/native-nocaps": "fc12a0396ece151796b95d54b34edbfbf708ba09dfa9b4df7cb477dae86788b5",
    # The ?duplex=1 variants, recorded at cb22f77, before the stock route sent only OpenAI's events
    # (that change was to the stock route only: these bytes must not move).
    "sess_golden-parrot-clears-updates-disconnect/beta-duplex": "3c771a8727cb8babbf9404b5e4b44502bfae7b2fb2f1bf10d721edae00b07c84",
    "sess_golden-parrot-clears-updates-disconnect/ga-duplex": "9ae0e7299dad635687529e78cb58f5bcdb11adc0c17a6509211b9a08804b6f10",
    "sess_golden-tiny-greedy/beta-duplex": "6873c5c842b9667b75ce73aa70ce9e33726bc1f01ddad889b4678416e4ece1a8",
    "sess_golden-tiny-greedy/ga-duplex": "2f4495a983098d3cf29b225c5cb92d229a16efaf1835aebf4f1d57f734b2d1b7",
    "sess_golden-tiny-grid-client-hint/beta-duplex": "f355866c2cc7bf36a81a4402717b9069c0115aef723a8d9a904953a45da340e3",
    "sess_golden-tiny-grid-client-hint/ga-duplex": "def7c8dc867a184a90df338c3ce2280d75ae7b415f5cb2772778bc65eb34a2ef",
    "sess_golden-tiny-grid-server-pad/beta-duplex": "d65afaccdb78c825aa5bac9e43be461f9dda6eaea78af259ddd3faaaf89dfdc8",
    "sess_golden-tiny-grid-server-pad/ga-duplex": "56f0735f41b9a739b56b3589fa98b03425fb02a403c7645e1b9937e8ef71c9e5",
    "sess_golden-tiny-moshi-family/beta-duplex": "d5b8fc6f8677b16b22b186906bd39606bf2a5551c28f00e51c1655cf81011ab6",
    "sess_golden-tiny-moshi-family/ga-duplex": "49219a101e02e2fdff253ee60235a6dc08e68c6c6b062fa156f5de6ddba41781",
    "sess_golden-tiny-seeded-cancel/beta-duplex": "3e18fdcaf2385cf640118eb2abbfbb638378e8ffa0743e8021de7c32b04c2788",
    "sess_golden-tiny-seeded-cancel/ga-duplex": "3aee5df168cd3f7f7829b6a0de7e1019ebb2e6ea4fc919a3c859845f8df3397a",
    "synthetic-aligned/beta-duplex": "ecf32e3473c8af66aaf6c6babad91bfe4bc982507cffb8450acb7a43efca997c",
    "synthetic-aligned/ga-duplex": "7d1aef955a1f72faa5f6acef66695a6e2a6d46ac729badadb4912863428ab610",
    "synthetic/beta-duplex": "84c3c3692c91a0cac6b8ffc5321a0b7bf0b4d7bdbd9807e6b49516439401c4e1",
    "synthetic/ga-duplex": "5319936d25588451029b189dc5446f924d81a85d313147c26994774802d070db",
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
