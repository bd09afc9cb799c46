"""The session core's conversation: cancels that keep the context, truncate, text items,
retrieve, voice aliases and updates taken field by field (records in, events and effects out)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from duplex_actors.audio import FRAME_SAMPLES, encode_f32
from duplex_actors.log import records as r
from duplex_actors.model.family import DEFAULT_PERSONA, detect_family
from duplex_actors.model.voices import AliasedVoices, voice_alias_table
from duplex_actors.session import events as ev
from duplex_actors.session.core import Emit, ResetSlot, SessionCore, cancel_resets

SID = "sess_0123456789abcdef01234567"
VOICES = ["NATF0.pt", "NATF2.pt", "NATM1.pt"]
HEADER = r.Header(r.FORMAT_VERSION, SID, "tiny", "", "float32", {}, {}, "realtime", {}, "0", 0.0)


def new_core(
    config: dict | None = None, *, aliases: bool = True, header: r.Header | None = HEADER
) -> SessionCore:
    family = detect_family(VOICES)
    policy = AliasedVoices(family, voice_alias_table(VOICES)) if aliases else family
    core = SessionCore(SID, policy)
    if header is not None:
        core.apply(header)
    core.apply(r.Open(config or {}))
    return core


def events(effects) -> list:
    return [e.event for e in effects if isinstance(e, Emit)]


def frame(core: SessionCore) -> list:
    return core.apply(r.Append(encode_f32(np.full(FRAME_SAMPLES, 0.1, np.float32)), "pcm_f32le"))


def step(core: SessionCore, epoch: int, index: int, text: str = "") -> list:
    pcm = np.zeros(FRAME_SAMPLES, "<i2").tobytes()
    return core.apply(r.Step(epoch, index, True, 5, text, (1,) * 8, (2,) * 8, pcm))


# -- cancel: the response, or the context too ------------------------------------------------------
@pytest.mark.parametrize("record", [r.Cancel("c", reset=False), r.ClearOutput("c", reset=False)])
def test_a_cancel_that_keeps_the_context_ends_the_response_only(record):
    core = new_core()
    frame(core)
    frame(core)
    step(core, 0, 0, "Hel")
    effects = core.apply(record)
    (ended,) = [e for e in events(effects) if isinstance(e, ev.ResponseEnded)]
    assert ended.response_id.endswith("_0") and ended.transcript == "Hel"
    assert ended.audio_cleared is isinstance(record, r.ClearOutput)
    assert not [e for e in effects if isinstance(e, ResetSlot)]  # the context is kept
    assert core.epoch == 0
    # The frame stepped meanwhile (of the same epoch) opens the next response: nothing lost.
    started, audio = events(step(core, 0, 1, "lo"))
    assert isinstance(started, ev.ResponseStarted) and started.response_id.endswith("_1")
    assert started.item_id.endswith("_1") and started.epoch == 0
    assert isinstance(audio, ev.AudioFrame) and audio.frame_index == 1
    # A second cancel: no response is active.
    core.apply(r.Cancel("c1", reset=False))
    (err,) = events(core.apply(r.Cancel("c2", reset=False)))
    assert isinstance(err, ev.Error) and err.code == "response_cancel_not_active"


def test_a_reset_cancel_starts_an_epoch_and_ids_still_count_responses():
    core = new_core()
    frame(core)
    step(core, 0, 0)
    effects = core.apply(r.Cancel("c"))  # reset defaults to True (older logs)
    assert [e.epoch for e in effects if isinstance(e, ResetSlot)] == [1]
    frame(core)
    (started, _) = events(step(core, 1, 1))
    assert started.response_id.endswith("_1") and started.epoch == 1  # n = the epoch, as before


def test_the_cancel_mode_is_the_sessions_option_else_the_routes():
    assert cancel_resets({}, True) is True and cancel_resets({}, False) is False
    assert cancel_resets({"duplex": {"cancel": "reset"}}, False) is True
    assert cancel_resets({"duplex": {"cancel": "response"}}, True) is False
    core = new_core()
    (err,) = events(core.apply(r.Update({"duplex": {"cancel": "sometimes"}}, "u")))
    assert err.code == "invalid_value" and "duplex.cancel" in err.message


# -- truncate, text items, retrieve ------------------------------------------------------------------
def test_truncate_is_acknowledged_and_changes_nothing_else():
    core = new_core()
    frame(core)
    step(core, 0, 0)
    effects = core.apply(r.Truncate("item_x_0", 0, 40, "t"))
    assert events(effects) == [ev.ItemTruncated("item_x_0", 0, 40, "t")]
    assert len(effects) == 1 and core.epoch == 0


def test_a_system_text_before_the_first_frame_joins_the_persona():
    core = new_core({"instructions": "You sell bicycles."})
    effects = core.apply(r.TextItem("system", "Speak French.", None, "t"))
    (added,) = events(effects)
    assert added == ev.TextItemAdded(f"item_text_{SID[5:]}_0", "system", "Speak French.", True, "t")
    (reset,) = [e for e in effects if isinstance(e, ResetSlot)]
    assert reset.prompt.persona == "You sell bicycles.\nSpeak French."
    # The echo keeps the client's instructions; a later update keeps the folded text.
    (updated,) = events(core.apply(r.Update({"instructions": "You sell tea."})))
    assert updated.config["instructions"] == "You sell tea."
    assert core.prompt.persona == "You sell tea.\nSpeak French."
    # Retrieved as it was added.
    (item,) = events(core.apply(r.RetrieveItem(added.item_id, "r")))
    assert item == ev.ItemRetrieved(added.item_id, "system", "Speak French.", False, True, "r")


def test_text_items_after_the_first_frame_and_user_items_are_kept_not_read():
    core = new_core()
    user = core.apply(r.TextItem("user", "Say hello!", "msg_1"))
    assert events(user) == [ev.TextItemAdded("msg_1", "user", "Say hello!", False)]
    assert not [e for e in user if isinstance(e, ResetSlot)]
    frame(core)
    late = core.apply(r.TextItem("developer", "Be terse.", None))
    assert [e.prompted for e in events(late)] == [False]
    assert not [e for e in late if isinstance(e, ResetSlot)] and core.prompt.persona == DEFAULT_PERSONA


def test_retrieve_gives_the_response_so_far_then_as_it_ended_and_refuses_unknown_items():
    core = new_core()
    frame(core)
    step(core, 0, 0, " Hi")
    item_id = f"item_{SID[5:]}_0"
    (live,) = events(core.apply(r.RetrieveItem(item_id)))
    assert (live.role, live.text, live.audio, live.done) == ("assistant", " Hi", True, False)
    core.apply(r.Cancel(None, reset=False))
    (done,) = events(core.apply(r.RetrieveItem(item_id)))
    assert done.done and done.text == " Hi"
    (err,) = events(core.apply(r.RetrieveItem("item_nope", "r")))
    assert err.code == "item_retrieve_invalid_item_id" and err.client_event_id == "r"


# -- voice aliases and updates taken field by field ----------------------------------------------------
def test_an_openai_voice_name_resolves_and_is_echoed_as_asked():
    core = new_core({"voice": "ash"})
    assert core.prompt.voice == "NATM1.pt"
    assert core.config["voice"] == "ash" and core.config["voice_prompt"] == "NATM1.pt"
    (updated,) = events(core.apply(r.Update({"voice": "NATF0.pt"})))
    assert updated.config["voice"] == "NATF0.pt" and "voice_prompt" not in updated.config
    frame(core)  # locked: the same voice prompt under another name is the same voice
    (same,) = events(core.apply(r.Update({"voice": "coral"})))
    assert isinstance(same, ev.SessionUpdated) and same.config["voice_prompt"] == "NATF0.pt"


def test_a_refused_field_does_not_drop_the_rest_of_the_update():
    core = new_core()
    update = {
        "type": "realtime",
        "instructions": "You sell bicycles.",
        "voice": "nope",
        "audio": {"output": {"voice": "nope", "format": {"type": "audio/pcm"}}},
        "temperature": 9,
    }
    updated, *errors = events(core.apply(r.Update(update, "u")))
    assert isinstance(updated, ev.SessionUpdated)
    assert updated.config["instructions"] == "You sell bicycles." and updated.config["voice"] == "NATF2.pt"
    assert updated.config["audio"] == {"output": {"format": {"type": "audio/pcm"}}}  # its voice refused too
    assert "temperature" not in updated.config
    # One error for the update, under the first refused field's code, naming each refused field.
    (err,) = errors
    assert err.code == "invalid_voice" and err.client_event_id == "u"
    assert err.message.startswith("voice: ") and "; temperature: " in err.message
    assert err.message.endswith("(the update's other fields were applied)")


def test_a_log_before_format_6_replays_one_error_per_refused_field():
    header = attrs.evolve(HEADER, format_version=5)
    core = new_core(header=header)
    updated, *errors = events(core.apply(r.Update({"voice": "nope", "temperature": 9, "seed": 3}, "u")))
    assert isinstance(updated, ev.SessionUpdated) and updated.config["seed"] == 3
    assert [(e.code, e.message.split(":")[0]) for e in errors] == [
        ("invalid_voice", "voice"),
        ("invalid_duplex_runtime_config", "temperature"),
    ]
    assert all("other fields were applied" in e.message and e.client_event_id == "u" for e in errors)


def test_an_update_of_one_refused_field_is_refused_whole_as_before():
    core = new_core()
    record = r.Update({"voice": "NOPE.pt"}, "u")
    assert core.refusal_for_update(record) is not None  # logged as a small rejected record
    (err,) = events(core.apply(record))
    assert err.code == "invalid_voice" and err.message.startswith("unknown voice")


def test_after_the_first_frame_a_new_persona_is_refused_and_the_rest_applied():
    core = new_core()
    frame(core)
    updated, err = events(core.apply(r.Update({"instructions": "Other.", "seed": 3}, "u")))
    assert updated.config["seed"] == 3 and updated.config["instructions"] == DEFAULT_PERSONA
    assert err.code == "persona_update_unsupported"


def test_an_opening_config_with_a_refused_field_opens_with_the_rest_from_format_5_on():
    config = {"voice": "nope", "instructions": "You sell bicycles."}
    new = new_core(config)
    assert new.config["instructions"] == "You sell bicycles." and new.config["voice"] == "NATF2.pt"
    old_header = r.Header(4, SID, "tiny", "", "float32", {}, {}, "realtime", {}, "0", 0.0)
    old = new_core(config, header=old_header)  # a log of format 4 opened with the defaults
    assert old.config["instructions"] == DEFAULT_PERSONA


def test_without_aliases_an_openai_voice_name_is_an_invalid_voice():
    core = new_core(aliases=False)
    (err,) = events(core.apply(r.Update({"voice": "ash"})))
    assert err.code == "invalid_voice"


def test_an_update_is_split_with_a_few_checks_however_many_keys_it_holds():
    calls = []

    class Counting:
        def __init__(self, family):
            self.family = family

        def session_prompt(self, **kw):
            calls.append(1)
            return self.family.session_prompt(**kw)

        def check_context(self, prompt):
            self.family.check_context(prompt)

    core = SessionCore(SID, Counting(detect_family(VOICES)))
    core.apply(HEADER)
    core.apply(r.Open({}))
    calls.clear()
    update = {f"k{i}": i for i in range(8_000)} | {"voice": "nope", "seed": 3}
    updated, err = events(core.apply(r.Update(update, "u")))
    assert updated.config["k7999"] == 7_999 and updated.config["seed"] == 3 and err.code == "invalid_voice"
    assert len(calls) <= 8  # the whole, then voice and seed alone, then the taken fields: not 8 000
