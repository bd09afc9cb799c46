"""The checked-in schemas match the classes, and the validators accept and refuse correctly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from duplex_actors.protocol import encode_client_event, schemas
from duplex_actors.protocol import wire_events as wire
from duplex_actors.protocol.schemas import main, validate_client_event, validate_server_event

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_schemas_are_in_sync() -> None:
    assert schemas.check(ROOT / "schemas") == [], (
        "regenerate with: python -m duplex_actors.protocol.schemas write schemas/"
    )


def test_write_then_check_round_trips_and_check_lists_what_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["write", str(tmp_path)]) == 0
    assert main(["check", str(tmp_path)]) == 0
    generated = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert generated == {
        p.relative_to(ROOT / "schemas").as_posix() for p in (ROOT / "schemas").rglob("*") if p.is_file()
    }
    for path in generated:
        assert (tmp_path / path).read_bytes() == (ROOT / "schemas" / path).read_bytes()
    (tmp_path / "realtime/server/error.json").write_text("{}")
    (tmp_path / "log/stale.json").write_text("{}")
    (tmp_path / "native/client/session.close.json").unlink()
    capsys.readouterr()
    assert main(["check", str(tmp_path)]) == 1
    printed = capsys.readouterr().out
    for path in ("realtime/server/error.json", "log/stale.json", "native/client/session.close.json"):
        assert path in printed
    assert main(["write", str(tmp_path)]) == 0
    assert main(["check", str(tmp_path)]) == 0
    assert not (tmp_path / "log/stale.json").exists()
    assert main(["frobnicate"]) == 2


def test_the_documented_command_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "duplex_actors.protocol.schemas", "check", str(ROOT / "schemas")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_there_is_a_schema_per_wire_event_and_log_record() -> None:
    paths = set(schemas.generate())
    assert "realtime/server/response.output_audio.delta.json" in paths
    assert "realtime/server/response.audio.delta.json" in paths
    assert "realtime/server/conversation.item.created.json" in paths
    assert "native/client/session.create.json" in paths
    assert "realtime/client/session.create.json" not in paths
    assert {f"log/{n}.json" for n in ("header", "append", "step", "end")} <= paths
    step = schemas.schema_objects()["log/step.json"]
    assert step["properties"]["pcm16"]["contentEncoding"] == "base64"
    assert step["properties"]["agent_codes"] == {"type": "array", "items": {"type": "integer"}}
    for schema in schemas.schema_objects().values():
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("dialect", ["realtime", "native"])
def test_client_events_validate_and_unknown_or_malformed_do_not(dialect: str) -> None:
    classes = wire.REALTIME_CLIENT_EVENTS if dialect == "realtime" else wire.NATIVE_CLIENT_EVENTS
    defaults = {
        "session.update": wire.SessionUpdate({"voice": "NATF2.pt"}, "e"),
        "input_audio_buffer.append": wire.InputAudioBufferAppend("AAAA", format="pcm16"),
        "playback.ack": wire.PlaybackAck({"played_ms": 1}),
        "session.event_ack": wire.SessionEventAck(1),
        "session.resume": wire.SessionResume("sess_1", "token", 3),
        "conversation.item.truncate": wire.ConversationItemTruncate("item_x_0", 0, 320),
        "conversation.item.create": wire.ConversationItemCreate({"type": "message", "role": "user"}),
        "conversation.item.retrieve": wire.ConversationItemRetrieve("item_x_0"),
    }
    for cls in classes:
        event = defaults.get(cls.TYPE) or cls()
        validate_client_event(encode_client_event(event), dialect)  # type: ignore[arg-type]
    with pytest.raises(jsonschema.ValidationError):
        validate_client_event({"type": "conversation.item.delete"}, dialect)  # type: ignore[arg-type]
    with pytest.raises(jsonschema.ValidationError):
        validate_client_event({"type": "input_audio_buffer.append", "audio": 3}, dialect)  # type: ignore[arg-type]


def test_server_validation_refuses_drift() -> None:
    good = {"type": "session.closed", "event_id": "evt_1", "session_id": "s", "reason": "timeout"}
    validate_server_event(good, "realtime")
    with pytest.raises(jsonschema.ValidationError):
        validate_server_event({**good, "surprise": 1}, "realtime")
    with pytest.raises(jsonschema.ValidationError):
        validate_server_event({k: v for k, v in good.items() if k != "event_id"}, "realtime")
    with pytest.raises(jsonschema.ValidationError):
        validate_server_event(good, "native")  # native events carry no event_id
    with pytest.raises(jsonschema.ValidationError):
        validate_server_event(["not", "an", "event"], "realtime")
