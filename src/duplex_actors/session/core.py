"""The session core: a pure state machine over session log records (sans-io, no trio).

``SessionCore.apply(record) -> list[Effect]`` is the only way its state changes, and its only
input is the log, so the log alone determines every event a session ever emitted (docs/design.md §2).
Like h11's ``Connection`` it is an object that mutates itself rather than returning a new
state; it never performs I/O, reads a clock or draws random numbers.

It owns: the session config and its validation (voice/persona changeable until the first
frame is submitted to the model, then only the same value); fixed-frame input buffering (any
chunk size in, every whole 1920-sample frame drained, partial tail kept, buffered input
bounded); epochs (a cancel or output-buffer clear whose record says ``reset`` ends the response
and starts a fresh, prefilled context; frames already drained but not yet stepped are carried
into the new epoch; one without it ends the response only, and the model keeps its context; input
clear drops the partial frame only); the response lifecycle (a response opens at the first
output frame after the previous one ended); the conversation's text items (system ones before
the first frame join the persona), truncations and retrievals; and the ordered stream of
dialect-neutral events.

Its life is explicit, h11-style: a :class:`State` and a table (:data:`ACCEPTS`) of the records
each state takes. Nothing is ignored silently: a client's mistake is an ``error`` event with
its wire code and the session goes on; a record the state does not take is refused with an
``error`` too: ``session_closed`` once the session is closed, ``internal_error`` otherwise (the
log contradicts a session's life: a bug of the shell that wrote it), which also puts the core
in :attr:`State.ERROR`, where it refuses everything until the shell closes the session.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import attrs
import numpy as np
import numpy.typing as npt

from .. import error_codes
from ..audio import FORMATS, FRAME_SAMPLES, SAMPLE_RATE, AudioError, InputStream
from ..error_codes import CodedError, code_of
from ..log import records as r
from . import events as ev
from .events import alignment_mode

SPEECH_RMS = 0.02  # ~ -34 dBFS: input_audio_buffer.speech_started, once per epoch
SAMPLING_KEYS = ("temperature", "temperature_text", "top_k", "top_k_text", "seed")
# The session config fields the prompt is made of (``SessionCore._validated`` reads these only).
VALIDATED_KEYS: Final = frozenset({"voice", "instructions", "extra_body", "duplex", *SAMPLING_KEYS})


def _width(fmt: str) -> int:
    return FORMATS.get(fmt, 1)


class PromptPolicy(Protocol):
    """The model family's validation (``duplex_actors.model.family.ModelFamily``)."""

    def session_prompt(
        self,
        *,
        voice: str | None = None,
        persona: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Any: ...

    def check_context(self, prompt: Any) -> None:
        """Raise if ``prompt`` cannot fit the model's context (a no-op without a budget)."""
        ...


@attrs.frozen(slots=True)
class SessionLimits:
    """``max_buffered_samples``: input received but not yet stepped (partial tail plus frames
    waiting for the scheduler); default 16 MiB of float32, never less than 10 s.
    ``max_config_bytes``: the merged session config as compact JSON, which ``session.updated``
    echoes whole; an update that would pass it is refused (``invalid_value``)."""

    max_buffered_samples: int = 16 * 1024 * 1024 // 4
    max_config_bytes: int = 256 * 1024
    # The shell's soft budget, not a refusal: while more input than this is buffered (and
    # queued for the core), the connection stops reading the client's socket (docs/design.md, decision 11).
    input_budget_samples: int = 2 * SAMPLE_RATE
    # The total of a session's alignment pads (24 kHz samples; ``--max-align-pad-ms``): a pad
    # that would pass it is refused (``invalid_value``) and inserts nothing.
    max_pad_samples: int = SAMPLE_RATE

    def __attrs_post_init__(self) -> None:
        if self.max_buffered_samples < 10 * SAMPLE_RATE:
            raise ValueError("max_buffered_samples must hold at least 10 s of audio")
        if self.max_pad_samples < 0:
            raise ValueError("max_pad_samples must not be negative")
        if not 0 < self.input_budget_samples <= self.max_buffered_samples:
            raise ValueError("input_budget_samples must be positive and within max_buffered_samples")


class ConfigRefused(CodedError, ValueError):
    """A session config the core itself refuses (before the model family sees it)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def input_samples(record: r.Append) -> int:
    """The append's length in 24 kHz samples, before resampling (one byte of G.711 at 8 kHz is
    3 of them): what the input bounds count."""
    rate = record.sample_rate_hz
    if rate == SAMPLE_RATE:  # every frame's case: the same floor, without the products
        return len(record.audio) // _width(record.format)
    return len(record.audio) * SAMPLE_RATE // (max(rate, 1) * _width(record.format))


ALIGNMENT_MODES: Final = ("server", "client", "off")  # session config duplex.alignment
# Session config duplex.cancel: what response.cancel and output_audio_buffer.clear do to an active
# response besides ending it ("reset": the model's context too, a new epoch). The connection
# reads it (its route's default when absent) and writes it on the cancel or clear record.
CANCEL_MODES: Final = ("response", "reset")
# conversation.item.create: the roles of a text message folded into the persona.
PROMPT_ROLES: Final = frozenset({"system", "developer"})
# The session config key that names the voice prompt an alias (``voice: "ash"``) resolved to.
VOICE_PROMPT_KEY: Final = "voice_prompt"
# Items a session remembers for conversation.item.retrieve (the latest; older ones are unknown).
MAX_ITEMS_KEPT: Final = 64
# Logs of this format version on open with what is valid in a refused opening config.
PARTIAL_OPEN_FORMAT: Final = 5
# From this log format on, the fields one update or opening config has refused get one error.
ONE_ERROR_FORMAT: Final = 6
PAD_REASONS: Final = frozenset({"start", "clear", "drift", "margin", "client"})
HINT_REASONS: Final = frozenset({"start", "clear", "drift", "margin"})
# Output frames state ``input_samples_end`` from this log format version on.
POSITIONS_FORMAT: Final = 4


def _check_duplex(config: Mapping[str, Any]) -> None:
    if "duplex" not in config:
        return
    duplex = config["duplex"]
    if not isinstance(duplex, Mapping):
        raise ConfigRefused(error_codes.INVALID_VALUE, "duplex must be an object")
    mode = duplex.get("alignment", "server")
    if mode not in ALIGNMENT_MODES:
        raise ConfigRefused(
            error_codes.INVALID_VALUE,
            f"duplex.alignment must be one of {', '.join(ALIGNMENT_MODES)}, not {mode!r}",
        )
    cancel = duplex.get("cancel", "response")
    if cancel not in CANCEL_MODES:
        raise ConfigRefused(
            error_codes.INVALID_VALUE,
            f"duplex.cancel must be one of {', '.join(CANCEL_MODES)}, not {cancel!r}",
        )


def cancel_resets(config: Mapping[str, Any], default: bool) -> bool:
    """Whether a cancel or output clear in a session with ``config`` also resets the model's
    context: its ``duplex.cancel``, else ``default`` (the route's)."""
    duplex = config.get("duplex")
    mode = duplex.get("cancel") if isinstance(duplex, Mapping) else None
    return default if mode not in CANCEL_MODES else mode == "reset"


# Room for the effective voice and persona, which the family may spell longer than the client.
CONFIG_SLACK_BYTES = 16 * 1024


def _json_size(config: Mapping[str, Any]) -> int:
    return len(json.dumps(config, separators=(",", ":"), default=str))


def _entry_size(key: str, value: Any) -> int:
    """Length of ``"key":value`` in a config's compact JSON (as ``_json_size`` writes it)."""
    return len(json.dumps(key)) + 1 + len(json.dumps(value, separators=(",", ":"), default=str))


def _entry_sizes(config: Mapping[str, Any]) -> dict[str, int] | None:
    """Each entry's share of ``_json_size(config)``; None when a key is not a string (JSON
    would convert it, and the sum would not be exact)."""
    out: dict[str, int] = {}
    for key, value in config.items():
        if type(key) is not str:
            return None
        out[key] = _entry_size(key, value)
    return out


def _size_of(entries: Mapping[str, int]) -> int:
    """``_json_size`` of the config whose entry sizes are ``entries``: braces and commas added,
    so a merged config is measured without serialising it whole (a 200 KB update refused by
    the bound costs one serialisation of the update, not of the merged config)."""
    return 2 + sum(entries.values()) + max(0, len(entries) - 1)


@attrs.frozen(slots=True)
class _Refusal:
    code: str
    message: str


_VOICE_LOCKED: Final = "the voice cannot change after the first audio frame reached the model"
_PERSONA_LOCKED: Final = "the persona cannot change after the first audio frame reached the model"


def _locked_refusal(locked: bool, prompt: Any, current: Any) -> _Refusal | None:
    """The refusal of ``prompt`` once voice and persona are locked (else None)."""
    if locked and prompt.voice != current.voice:
        return _Refusal(error_codes.VOICE_UPDATE_UNSUPPORTED, _VOICE_LOCKED)
    if locked and prompt.persona != current.persona:
        return _Refusal(error_codes.PERSONA_UPDATE_UNSUPPORTED, _PERSONA_LOCKED)
    return None


@attrs.frozen(slots=True)
class _Outcome:
    """An update the core takes: its prompt, the effective config (and its entries' sizes), and
    the fields it refused (the rest was applied)."""

    prompt: Any
    effective: dict[str, Any]
    entries: dict[str, int] | None
    refused: tuple[_Refusal, ...] = ()


# -- effects -----------------------------------------------------------------------------------
@attrs.frozen(slots=True)
class Emit:
    event: ev.SessionEvent


@attrs.frozen(slots=True, eq=False)
class SubmitFrame:
    frame_index: int
    samples: npt.NDArray[np.float32]
    # The frame holds alignment pad samples the server asked for (a server pad, or a client's
    # answering a hint): it completes early by design, and with the frame before it may make
    # two frames for one tick (the scheduler owes that double a catch-up).
    padded: bool = False


@attrs.frozen(slots=True)
class ResetSlot:
    """Give the slot a fresh context for ``epoch``, prefilled for ``prompt``."""

    epoch: int
    prompt: Any


@attrs.frozen(slots=True)
class ReleaseSlot:
    pass


Effect = Emit | SubmitFrame | ResetSlot | ReleaseSlot


# -- states --------------------------------------------------------------------------------------
class State(enum.Enum):
    IDLE = "idle"  # nothing applied yet, or only the log's header
    OPEN = "open"  # session.created sent; no response in this epoch yet
    RESPONDING = "responding"  # the epoch's first output frame opened a response
    CLOSED = "closed"  # session.closed sent: the last event of a session
    ERROR = "error"  # the records contradicted the session's life; only a close ends it


# What a live session takes from its client (the shell turns each wire command into one).
_COMMANDS: Final = frozenset(
    {
        r.Update,
        r.Append,
        r.ClearInput,
        r.ClearOutput,
        r.Cancel,
        r.Heartbeat,
        r.PlaybackAck,
        r.Rejected,
        r.Truncate,
        r.TextItem,
        r.RetrieveItem,
    }
)
# What the shell itself writes into a live session: step results, alignment, drains, the close.
_SHELL: Final = frozenset({r.Step, r.Close, r.Pad, r.AlignHint, r.Drain, r.Detach, r.Resume})
# The records each state takes. Anything else is refused: in CLOSED with ``session_closed``,
# in ERROR with ``internal_error``, elsewhere with ``internal_error`` and a move to ERROR. A
# taken record can still be refused by its own checks (bad audio, a locked voice, ...).
ACCEPTS: Final[Mapping[State, frozenset[type[Any]]]] = {
    State.IDLE: frozenset({r.Header, r.Open, r.Close}),
    State.OPEN: _COMMANDS | _SHELL,
    State.RESPONDING: _COMMANDS | _SHELL,
    State.ERROR: frozenset({r.Close}),
    State.CLOSED: frozenset({r.End}),
}
# SessionCore.apply takes these two first in the states of a live session.
assert {r.Step, r.Append} <= ACCEPTS[State.OPEN] & ACCEPTS[State.RESPONDING]


class SessionCore:
    def __init__(self, session_id: str, policy: PromptPolicy, limits: SessionLimits | None = None) -> None:
        self.session_id = session_id
        self.policy = policy
        self.limits = limits or SessionLimits()
        self.state = State.IDLE
        self.config: dict[str, Any] = {}
        self._config_bytes = 2  # of self.config as compact JSON ("{}")
        self._config_entries: dict[str, int] | None = {}  # its entries' sizes (_entry_sizes)
        # The last update outcome computed, for the same record in the same state (the shell
        # asks refusal_for_update, then applies the record): computed once, not twice.
        self._outcome_memo: tuple[Any, ...] | None = None
        self.prompt: Any = None
        self.epoch = 0
        self.frames_in = 0  # whole input frames drained (= next frame index)
        self.frames_stepped = 0  # step results received, any epoch
        self.frames_out = 0  # output frames emitted
        self._header_seen = False
        self.format_version: int | None = None  # of the log, from its header
        # Where the partial frame's samples came from: (24 kHz samples, client position at their start,
        # at their end), oldest first; a pad's start and end are the same position.
        self._tail_marks: list[tuple[int, int, int]] = []
        self.client_samples = 0  # the client's own stream so far (samples at its rates)
        self.pad_samples = 0  # alignment pads inserted (24 kHz samples)
        self._frame_ends: dict[int, int] = {}  # frame index -> input_samples_end, until stepped
        # The partial input frame: ``_fill`` samples of ``_frame`` (a preallocated frame buffer,
        # so a tiny append copies its samples in rather than re-concatenating the tail).
        self._frame: npt.NDArray[np.float32] = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        self._fill = 0
        self._fill_padded = False  # the partial frame holds pad samples the server asked for
        self._hint_owed = False  # a hint went out that no client pad has answered yet
        # Input at the client's format and rate -> 24 kHz; its state is rebuilt on replay by the
        # same appends in the same order.
        self._input = InputStream()
        self._response: tuple[str, str] | None = None  # (response_id, item_id) of this epoch
        # Responses started: a response's ids count them. One per epoch while every cancel
        # resets, so the ids of those sessions are their epochs.
        self._responses = 0
        self._text_items = 0  # text items added (their server-made ids count them)
        self._system_texts: list[str] = []  # system/developer texts folded into the persona
        # item id -> (role, text, audio) of the latest items, for conversation.item.retrieve
        self._items: dict[str, tuple[str, str, bool]] = {}
        self._response_frames = 0
        self._transcript: list[str] = []
        self._transcript_chars = 0
        self._speech_started = False
        self._events = hashlib.sha256()
        self._audio = hashlib.sha256()
        self.events_emitted = 0
        # A resumable session's connection (docs/protocol.md §10): which attachment holds it, and
        # whether one does. Neither changes what the session emits.
        self.attachment = 1
        self.attached = True

    # -- derived state ------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def frames_pending(self) -> int:
        """Frames submitted to the scheduler whose step result has not come back."""
        return self.frames_in - self.frames_stepped

    @property
    def buffered_samples(self) -> int:
        return self._fill + self.frames_pending * FRAME_SAMPLES

    @property
    def tail_samples(self) -> int:
        """The partial input frame (24 kHz samples not yet a whole frame)."""
        return self._fill

    @property
    def alignment(self) -> str:
        """The session's ``duplex.alignment``: server (default), client or off."""
        return alignment_mode(self.config)

    @property
    def locked(self) -> bool:
        """Voice and persona are fixed once the first frame has gone to the model."""
        return self.frames_in > 0

    def digests(self) -> r.End:
        return r.End(
            events_sha256=self._events.hexdigest(),
            audio_sha256=self._audio.hexdigest(),
            events=self.events_emitted,
            frames_out=self.frames_out,
        )

    def _id(self, kind: str, epoch: int) -> str:
        return f"{kind}_{self.session_id.removeprefix('sess_')}_{epoch}"

    # -- the state machine ---------------------------------------------------------------------
    def apply(self, record: r.Record) -> list[Effect]:
        out: list[Effect] = []
        # Every frame brings these two, ahead of the lookup in ACCEPTS (its State key hashes in
        # Python) and the match (it tries its cases one by one): both live states accept both,
        # and the exact type is checked, so no subclass takes this way.
        state = self.state
        if state is State.RESPONDING or state is State.OPEN:
            if type(record) is r.Step:
                self._step(record, out)
                return out
            if type(record) is r.Append:
                self._append(record, out)
                return out
        if type(record) not in ACCEPTS[state]:
            self._refuse(record, out)
            return out
        match record:
            case r.Header():
                if record.session_id != self.session_id:
                    raise ValueError(f"log of {record.session_id}, core of {self.session_id}")
                if self._header_seen:
                    self._fail(out, "a second header record")
                self._header_seen = True
                self.format_version = record.format_version
            case r.Open():
                self._open(record, out)
            case r.Update():
                self._update(record, out)
            case r.ClearInput():
                self._fill = 0
                self._fill_padded = False
                self._tail_marks = []
                self._input.reset()
                self._emit(out, ev.InputCleared(record.client_event_id))
            case r.ClearOutput():
                if self._response is None:
                    self._emit(out, ev.OutputCleared(record.client_event_id))
                elif record.reset:
                    self._new_epoch(out, "output_audio_buffer_clear", audio_cleared=True)
                else:
                    self._end_response(out, "output_audio_buffer_clear", audio_cleared=True)
            case r.Cancel():
                if self._response is None:
                    self._error(
                        out,
                        error_codes.RESPONSE_CANCEL_NOT_ACTIVE,
                        "no response is active",
                        record.client_event_id,
                    )
                elif record.reset:
                    self._new_epoch(out, "client_cancelled", audio_cleared=False)
                else:
                    self._end_response(out, "client_cancelled", audio_cleared=False)
            case r.Truncate():
                self._emit(
                    out,
                    ev.ItemTruncated(
                        record.item_id, record.content_index, record.audio_end_ms, record.client_event_id
                    ),
                )
            case r.TextItem():
                self._text_item(record, out)
            case r.RetrieveItem():
                self._retrieve(record, out)
            case r.Heartbeat():
                self._emit(out, ev.HeartbeatAck(record.client_event_id))
            case r.PlaybackAck():
                self._emit(out, ev.PlaybackAcknowledged(dict(record.payload), record.client_event_id))
            case r.Pad():
                self._pad(record, out)
            case r.AlignHint():
                if record.pad_ms not in range(1, 80) or record.reason not in HINT_REASONS:
                    self._error(
                        out,
                        error_codes.INVALID_VALUE,
                        f"alignment hint {record.pad_ms} ms ({record.reason}) refused",
                        None,
                    )
                else:
                    self._hint_owed = True
                    self._emit(out, ev.AlignmentHint(record.pad_ms, record.reason))
            case r.Drain():
                self._drain(record, out)
            case r.Rejected():
                self._error(out, record.code, record.message, record.client_event_id)
            case r.Close():
                self._end_response(out, "session_closed", audio_cleared=False)
                out.append(ReleaseSlot())  # session.closed goes out once the slot is reset
                self._emit(out, ev.SessionClosed(self.session_id, record.reason))
                self.state = State.CLOSED
            case r.Detach():
                self.attached = False
            case r.Resume():
                self.attached = True
                self.attachment = record.attachment
            case r.End():
                pass  # the log's trailer: digests, checked by the replayer
        return out

    def _refuse(self, record: r.Record, out: list[Effect]) -> None:
        """A record the current state does not take (see ACCEPTS)."""
        kind = r.KIND_NAMES[type(record)]
        client_event_id = getattr(record, "client_event_id", None)
        if self.state is State.CLOSED:
            self._error(
                out, error_codes.SESSION_CLOSED, f"the session is closed: {kind} refused", client_event_id
            )
        elif self.state is State.ERROR:
            self._error(
                out,
                error_codes.INTERNAL_ERROR,
                f"the session failed earlier: {kind} refused",
                client_event_id,
            )
        else:
            self._fail(out, f"a {kind} record while the session is {self.state.value}", client_event_id)

    def _fail(self, out: list[Effect], what: str, client_event_id: str | None = None) -> None:
        """The records contradict the session's life: say so and refuse everything but a close."""
        self.state = State.ERROR
        self._error(out, error_codes.INTERNAL_ERROR, f"session log out of order: {what}", client_event_id)

    def _emit(self, out: list[Effect], event: ev.SessionEvent) -> None:
        self._events.update(ev.canonical_bytes(event))
        self.events_emitted += 1
        out.append(Emit(event))

    def _error(self, out: list[Effect], code: str, message: str, client_event_id: str | None) -> None:
        self._emit(out, ev.Error(code=code, message=message, client_event_id=client_event_id))

    def validated(self, config: Mapping[str, Any]) -> Any:
        """The prompt the family makes of ``config``; raises what the core would refuse it with."""
        return self._validated(config)

    def folded_prompt(self, text: str) -> Any:
        """The prompt a system or developer ``text`` added now would give (folded into the
        persona), or None when it would not be folded (after the first frame) or the core
        refuses it: the shell checks it against the model's context before logging it."""
        if self.locked:
            return None
        try:
            return self._validated(self.config, [*self._system_texts, text])
        except Exception:
            return None

    def _validated(self, config: Mapping[str, Any], texts: list[str] | None = None) -> Any:
        """The prompt of ``config``, with the session's folded system texts (or ``texts``)
        after its instructions."""
        _check_duplex(config)
        sampling = {k: config[k] for k in SAMPLING_KEYS if k in config}
        extra = config.get("extra_body")
        if extra is not None and not isinstance(extra, Mapping):
            raise ConfigRefused(error_codes.INVALID_DUPLEX_RUNTIME_CONFIG, "extra_body must be an object")
        texts = self._system_texts if texts is None else texts
        persona = config.get("instructions")
        if texts and (persona is None or isinstance(persona, str)):
            persona = "\n".join([p for p in [(persona or "").strip()] if p] + texts)
        return self.policy.session_prompt(
            voice=config.get("voice"),
            persona=persona,
            sampling=sampling,
            extra=extra,
        )

    def _effective(self, config: Mapping[str, Any], prompt: Any) -> dict[str, Any]:
        """The config echoed: ``voice`` and ``instructions`` as the model uses them, but a voice
        alias as the client named it (with the voice prompt it resolved to under
        ``VOICE_PROMPT_KEY``) and the instructions without the folded system texts."""
        effective = dict(config)
        asked = config.get("voice")
        if isinstance(asked, str) and asked and asked != prompt.voice:
            effective[VOICE_PROMPT_KEY] = prompt.voice
        else:
            effective["voice"] = prompt.voice
            effective.pop(VOICE_PROMPT_KEY, None)
        persona = prompt.persona
        if self._system_texts:
            persona = self._validated(config, []).persona
        effective["instructions"] = persona
        return effective

    def _split(
        self, base: Mapping[str, Any], changes: Mapping[str, Any], prompt: Any
    ) -> tuple[dict[str, Any], list[_Refusal]]:
        """``changes`` field by field onto ``base``: each field that keeps the config valid is
        taken, each that does not is refused with the reason (a voice refused takes
        ``audio.output.voice`` with it). ``prompt``: the current one (None before the session
        opens), whose voice and persona are fixed once locked."""
        # Only the fields the prompt reads can be refused: they are checked one by one (a few
        # checks, however many other keys the update holds), on those fields alone.
        checked = {k: base[k] for k in VALIDATED_KEYS if k in base}
        refused_keys: set[str] = set()
        refused: list[_Refusal] = []
        for key, value in changes.items():
            if key not in VALIDATED_KEYS:
                continue
            try:
                candidate = self._validated({**checked, key: value})
            except Exception as exc:
                refused.append(_Refusal(code_of(exc, error_codes.INVALID_VALUE), f"{key}: {exc}"))
                refused_keys.add(key)
                continue
            if prompt is not None and self.locked:
                if candidate.voice != prompt.voice:
                    refused.append(_Refusal(error_codes.VOICE_UPDATE_UNSUPPORTED, f"{key}: {_VOICE_LOCKED}"))
                    refused_keys.add(key)
                    continue
                if candidate.persona != prompt.persona:
                    refused.append(
                        _Refusal(error_codes.PERSONA_UPDATE_UNSUPPORTED, f"{key}: {_PERSONA_LOCKED}")
                    )
                    refused_keys.add(key)
                    continue
            checked[key] = value
        taken = {k: v for k, v in changes.items() if k not in refused_keys}
        audio = taken.get("audio")
        if "voice" in changes and "voice" not in taken and isinstance(audio, Mapping):
            output = audio.get("output")
            if isinstance(output, Mapping) and "voice" in output:
                rest = {k: v for k, v in output.items() if k != "voice"}
                if rest or len(audio) > 1:
                    taken["audio"] = {**audio, "output": rest}
                else:  # the audio object held the refused voice only
                    del taken["audio"]
        return taken, refused

    def _open(self, record: r.Open, out: list[Effect]) -> None:
        self.state = State.OPEN
        refused: list[_Refusal] = []
        config = record.config
        try:
            prompt = self._validated(config)
        except Exception as exc:  # a bad opening config: open with what is valid, then say why
            config, refused = {}, [_Refusal(code_of(exc, error_codes.INVALID_VALUE), str(exc))]
            if self.format_version is not None and self.format_version >= PARTIAL_OPEN_FORMAT:
                taken, split = self._split({}, record.config, None)
                if split:
                    config, refused = taken, split
            # (logs before PARTIAL_OPEN_FORMAT opened with the defaults, and replay so)
            try:
                prompt = self._validated(config)
            except Exception:
                config = {}
                prompt = self._validated(config)
        self.prompt = prompt
        self.config = self._effective(config, prompt)
        self._config_entries = _entry_sizes(self.config)
        self._config_bytes = (
            _size_of(self._config_entries) if self._config_entries is not None else _json_size(self.config)
        )
        self._emit(out, ev.SessionCreated(self.session_id, dict(self.config)))
        self._emit(out, ev.SessionUpdated(self.session_id, dict(self.config)))
        self._refuse_fields(out, refused, "", record.client_event_id)
        out.append(ResetSlot(self.epoch, prompt))

    def _refuse_fields(
        self, out: list[Effect], refused: Sequence[_Refusal], suffix: str, client_event_id: str | None
    ) -> None:
        """The error for the fields a config refused: one naming them all, under the first one's
        code (logs before ``ONE_ERROR_FORMAT``: one per field, as they were recorded)."""
        if not refused:
            return
        if self.format_version is not None and self.format_version < ONE_ERROR_FORMAT:
            for refusal in refused:
                self._error(out, refusal.code, f"{refusal.message}{suffix}", client_event_id)
            return
        message = "; ".join(refusal.message for refusal in refused)
        self._error(out, refused[0].code, f"{message}{suffix}", client_event_id)

    def split_update(
        self, changes: Mapping[str, Any], base: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The fields of ``changes`` the core would take onto ``base`` (its config by default)
        and the ``(code, message)`` of each field it would refuse; read-only."""
        base = self.config if base is None else base
        try:
            prompt = self._validated({**base, **changes})
            if _locked_refusal(self.locked, prompt, self.prompt) is None:
                return dict(changes), []
        except Exception:
            pass  # taken field by field below
        taken, refused = self._split(base, changes, self.prompt)
        return taken, [(f.code, f.message) for f in refused]

    def _update_outcome(self, record: r.Update) -> _Outcome | _Refusal:
        """The outcome of an update the core takes (whole or in part), else the refusal of all
        of it. Pure: ``refusal_for_update`` and ``_update`` share it (and its memo: the same
        record in the same state has the same outcome)."""
        key = (record, self.config, self.locked)
        memo = self._outcome_memo
        if memo is not None and all(a is b for a, b in zip(memo[:3], key, strict=True)):
            outcome: _Outcome | _Refusal = memo[3]
            return outcome
        outcome = self._compute_update_outcome(record)
        self._outcome_memo = (*key, outcome)
        return outcome

    def _compute_update_outcome(self, record: r.Update) -> _Outcome | _Refusal:
        changes: Mapping[str, Any] = record.config
        refused: list[_Refusal] = []
        merged = {**self.config, **changes}
        try:
            prompt = self._validated(merged)
            whole = _locked_refusal(self.locked, prompt, self.prompt)
        except Exception as exc:
            whole = _Refusal(code_of(exc, error_codes.INVALID_VALUE), str(exc))
        if whole is not None:
            # A refused field never drops the rest: the update is taken field by field.
            taken, refused = self._split(self.config, changes, self.prompt)
            if not refused or (len(refused) == 1 and not taken):
                return whole
            if not taken:
                return _Refusal(refused[0].code, "; ".join(f.message for f in refused))
            changes = taken
            merged = {**self.config, **changes}
            prompt = self._validated(merged)
        effective = self._effective(merged, prompt)
        update_entries = _entry_sizes(changes)
        entries: dict[str, int] | None = None
        if update_entries is not None and self._config_entries is not None:
            entries = {**self._config_entries, **update_entries}
            for name in ("voice", "instructions", VOICE_PROMPT_KEY):
                if name in effective:
                    entries[name] = _entry_size(name, effective[name])
                else:
                    entries.pop(name, None)
        # The merged config is at most the current one plus the update (plus the effective
        # voice and persona): only near the bound is it worth measuring whole.
        bound = self.limits.max_config_bytes
        update_bytes = _size_of(update_entries) if update_entries is not None else _json_size(changes)
        if self._config_bytes + update_bytes + CONFIG_SLACK_BYTES <= bound:
            return _Outcome(prompt, effective, entries, tuple(refused))
        size = _size_of(entries) if entries is not None else _json_size(effective)
        if size > bound:
            return _Refusal(
                error_codes.INVALID_VALUE,
                f"the merged session config would be {size} bytes of JSON, over {self.limits.max_config_bytes}",
            )
        return _Outcome(prompt, effective, entries, tuple(refused))

    def refusal_for_update(self, record: r.Update) -> r.Rejected | None:
        """The small ``rejected`` record to log instead of an update the core would refuse
        whole (else None): a read-only query, as ``refusal_for`` is for appends, so a client
        sending refused updates of any size costs the log a few bytes each; applying the record
        it returns emits exactly the error applying ``record`` would."""
        if self.state not in (State.OPEN, State.RESPONDING):
            return None
        outcome = self._update_outcome(record)
        if isinstance(outcome, _Refusal):
            return r.Rejected("session.update", outcome.code, outcome.message, record.client_event_id)
        return None

    def _update(self, record: r.Update, out: list[Effect]) -> None:
        outcome = self._update_outcome(record)
        if isinstance(outcome, _Refusal):
            self._error(out, outcome.code, outcome.message, record.client_event_id)
            return
        changed = outcome.prompt != self.prompt
        self.prompt = outcome.prompt
        self.config = outcome.effective
        self._config_entries = outcome.entries
        self._config_bytes = (
            _size_of(outcome.entries) if outcome.entries is not None else _json_size(outcome.effective)
        )
        self._emit(out, ev.SessionUpdated(self.session_id, dict(self.config), record.client_event_id))
        self._refuse_fields(
            out, outcome.refused, " (the update's other fields were applied)", record.client_event_id
        )
        if changed and not self.locked:
            out.append(ResetSlot(self.epoch, outcome.prompt))
        # After the lock only sampling can change: it applies from the next epoch's reset.

    def _text_item(self, record: r.TextItem, out: list[Effect]) -> None:
        """A text message: a system or developer one before the first frame is folded into
        the persona (the context restarts with it); any other is kept, not read by the model."""
        prompted = record.role in PROMPT_ROLES and not self.locked
        prompt = self.prompt
        if prompted:
            texts = [*self._system_texts, record.text]
            try:
                prompt = self._validated(self.config, texts)
            except Exception as exc:
                self._error(
                    out,
                    code_of(exc, error_codes.INVALID_VALUE),
                    f"the {record.role} text cannot join the persona: {exc}",
                    record.client_event_id,
                )
                return
            self._system_texts = texts
        item_id = record.item_id or self._id("item_text", self._text_items)
        self._text_items += 1
        self._emit(out, ev.TextItemAdded(item_id, record.role, record.text, prompted, record.client_event_id))
        self._keep_item(item_id, record.role, record.text, audio=False)
        if prompted and prompt != self.prompt:
            self.prompt = prompt
            out.append(ResetSlot(self.epoch, prompt))

    def refusal_for(self, record: r.Append) -> r.Rejected | None:
        """The ``rejected`` record to log instead of ``record`` when applying it would refuse it
        with ``input_backpressure``, else None. A read-only query (a pure function of the
        state): the shell asks it before logging, so refused audio never reaches the log, and
        applying the record it returns emits exactly the error applying ``record`` would."""
        state = self.state
        if not record.audio or (state is not State.OPEN and state is not State.RESPONDING):
            return None
        if self.buffered_samples + input_samples(record) <= self.limits.max_buffered_samples:
            return None
        return r.Rejected(
            "input_audio_buffer.append",
            error_codes.INPUT_BACKPRESSURE,
            f"more than {self.limits.max_buffered_samples} samples buffered and not yet "
            "stepped; send audio in real time",
            record.client_event_id,
            audio_bytes=len(record.audio),
        )

    def _append(self, record: r.Append, out: list[Effect]) -> None:
        if len(record.audio) == 0:
            self._error(
                out,
                error_codes.BAD_EVENT,
                "input_audio_buffer.append carries no audio",
                record.client_event_id,
            )
            return
        refusal = self.refusal_for(record)
        if refusal is not None:
            self._error(out, refusal.code, refusal.message, record.client_event_id)
            return
        try:
            samples = self._input.feed(record.audio, record.format, record.sample_rate_hz)
        except AudioError as exc:
            self._error(out, exc.code, str(exc), record.client_event_id)
            return
        start = self.client_samples
        self.client_samples += len(record.audio) // _width(record.format)
        self._feed(samples, start, self.client_samples, out)

    def _pad(self, record: r.Pad, out: list[Effect]) -> None:
        """Zeros after the partial tail (docs/protocol.md §7), within the session's pad bound."""
        if record.samples <= 0 or record.reason not in PAD_REASONS:
            self._error(
                out,
                error_codes.INVALID_VALUE,
                f"pad of {record.samples} samples ({record.reason}) refused",
                None,
            )
            return
        if self.pad_samples + record.samples > self.limits.max_pad_samples:
            self._error(
                out,
                error_codes.INVALID_VALUE,
                f"a pad of {record.samples} samples would take the session's alignment pads past "
                f"{self.limits.max_pad_samples} samples: not inserted, the session goes on unaligned",
                None,
            )
            return
        self.pad_samples += record.samples
        position = self.client_samples
        # A client's pad counts as the server's only when it answers a hint: a client may pad
        # its own appends (bounded), but not earn the catch-up a re-alignment's double is owed.
        asked = record.reason != "client" or self._hint_owed
        if record.reason == "client":
            self._hint_owed = False
        self._feed(np.zeros(record.samples, dtype=np.float32), position, position, out, pad=asked)

    def _feed(
        self, samples: npt.NDArray[np.float32], start: int, end: int, out: list[Effect], *, pad: bool = False
    ) -> None:
        """24 kHz samples (client positions ``start``..``end``; ``pad``: alignment zeros; the
        caller's own array, which nothing else holds) into the partial frame; each frame they
        complete is submitted: the array itself when it is exactly one frame and nothing is
        partial, else a copy (the partial frame's buffer is reused)."""
        n = len(samples)
        if n:
            self._tail_marks.append((n, start, end))
        positions = self.format_version is not None and self.format_version >= POSITIONS_FORMAT
        at = 0
        frame = self._frame
        while at < n:
            fill = self._fill
            k = min(FRAME_SAMPLES - fill, n - at)
            self._fill_padded = self._fill_padded or pad
            if fill + k < FRAME_SAMPLES:
                frame[fill : fill + k] = samples[at : at + k]
                self._fill = fill + k
                return
            if fill:
                frame[fill:] = samples[at : at + k]
                whole = frame.copy()
            else:
                whole = samples if k == n else samples[at : at + k].copy()
            at += k
            self._fill = 0
            if positions:
                self._frame_ends[self.frames_in] = self._position_at(FRAME_SAMPLES)
            self._consume_marks(FRAME_SAMPLES)
            self._submit(whole, out)

    def _submit(self, frame: npt.NDArray[np.float32], out: list[Effect]) -> None:
        index = self.frames_in
        self.frames_in += 1
        if not self._speech_started and float(np.sqrt(np.mean(frame * frame))) > SPEECH_RMS:
            self._speech_started = True
            self._emit(out, ev.SpeechStarted(self.epoch, index, self._id("item_in", self.epoch)))
        out.append(SubmitFrame(index, frame, padded=self._fill_padded))
        self._fill_padded = False

    def _position_at(self, offset: int) -> int:
        """The client position at ``offset`` samples into the buffered input (tail first); in a
        pad, the position at its start; inside resampled audio, interpolated."""
        at = 0
        for n, start, end in self._tail_marks:
            if offset <= at + n:
                return start + (offset - at) * (end - start) // n
            at += n
        return self.client_samples

    def _consume_marks(self, samples: int) -> None:
        marks = self._tail_marks
        i = 0
        while i < len(marks) and samples >= marks[i][0]:
            samples -= marks[i][0]
            i += 1
        del marks[:i]
        if samples and marks:
            n, start, end = marks[0]
            marks[0] = (n - samples, start + samples * (end - start) // n, end)

    def _drain(self, record: r.Drain, out: list[Effect]) -> None:
        """A frame the scheduler dropped before stepping it: done without output."""
        if self.frames_pending == 0 or not 0 <= record.frame_index < self.frames_in:
            self._fail(out, f"a drain of frame {record.frame_index}, which is not waiting for a step")
            return
        self.frames_stepped += 1
        self._frame_ends.pop(record.frame_index, None)

    def _step(self, record: r.Step, out: list[Effect]) -> None:
        if self.frames_pending == 0 or record.epoch > self.epoch:
            self._fail(
                out, f"a step result for frame {record.frame_index} (epoch {record.epoch}) never submitted"
            )
            return
        self.frames_stepped += 1
        samples_end = self._frame_ends.pop(record.frame_index, None)
        if record.epoch < self.epoch:
            # Not input but a result of an epoch that has ended (the frame being stepped at a
            # cancel or clear): nothing of that epoch follows its terminal events. The shell
            # counts it as dropped (stale_epoch).
            return
        if self._response is None:
            self.state = State.RESPONDING
            self._response = (self._id("resp", self._responses), self._id("item", self._responses))
            self._responses += 1
            self._response_frames = 0
            self._transcript = []
            self._transcript_chars = 0
            self._emit(out, ev.ResponseStarted(*self._response, self.epoch))
        response_id, item_id = self._response
        self.frames_out += 1
        self._response_frames += 1
        self._audio.update(record.pcm16)
        room = ev.MAX_TRANSCRIPT_CHARS - self._transcript_chars
        if record.text_piece and room > 0:
            # The response's transcript is bounded; every piece still goes out in its frame.
            piece = record.text_piece[:room]
            self._transcript.append(piece)
            self._transcript_chars += len(piece)
        self._emit(
            out,
            ev.AudioFrame(
                response_id,
                item_id,
                self.epoch,
                record.frame_index,
                record.pcm16,
                record.text_piece,
                samples_end,
            ),
        )

    def _keep_item(self, item_id: str, role: str, text: str, *, audio: bool) -> None:
        self._items.pop(item_id, None)
        self._items[item_id] = (role, text, audio)
        while len(self._items) > MAX_ITEMS_KEPT:
            del self._items[next(iter(self._items))]

    def _retrieve(self, record: r.RetrieveItem, out: list[Effect]) -> None:
        found: tuple[str, str, bool] | None
        if self._response is not None and record.item_id == self._response[1]:
            found, done = ("assistant", "".join(self._transcript), True), False
        else:
            found, done = self._items.get(record.item_id), True
        if found is None:
            self._error(
                out,
                error_codes.ITEM_RETRIEVE_INVALID_ITEM_ID,
                f"no item {record.item_id!r} in this conversation (the server keeps its latest "
                f"{MAX_ITEMS_KEPT})",
                record.client_event_id,
            )
            return
        role, text, audio = found
        self._emit(out, ev.ItemRetrieved(record.item_id, role, text, audio, done, record.client_event_id))

    def _end_response(self, out: list[Effect], reason: str, *, audio_cleared: bool) -> None:
        if self._response is None:
            return
        response_id, item_id = self._response
        self._keep_item(item_id, "assistant", "".join(self._transcript), audio=True)
        self._emit(
            out,
            ev.ResponseEnded(
                response_id,
                item_id,
                self.epoch,
                reason,
                "".join(self._transcript),
                self._response_frames,
                audio_cleared,
            ),
        )
        self._response = None
        if self.state is State.RESPONDING:
            self.state = State.OPEN

    def _new_epoch(self, out: list[Effect], reason: str, *, audio_cleared: bool) -> None:
        self._end_response(out, reason, audio_cleared=audio_cleared)
        self.epoch += 1
        self._speech_started = False
        out.append(ResetSlot(self.epoch, self.prompt))
