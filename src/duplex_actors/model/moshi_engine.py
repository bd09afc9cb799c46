"""The batched lockstep engine over moshi 0.2.13 (docs/design.md §2 "Model engine").

Per step, for a ``[B, 1920]`` batch: Mimi streaming encode -> ``LMGen.step`` -> Mimi
streaming decode. Slots without a frame are exec-masked and do not advance; rows the LM has
not generated yet (``-2``) are never decoded. A reset slot is prefilled with its prompt by
pasting a snapshot computed once per (voice, persona) on a batch-1 twin of the LM that shares
its weights (or, with ``prefill="burst"``, by running the prompt inside the batch).
With ``context_policy="pin-prompt"`` a slot's prompt stays in its KV cache for the session's
life, past the model's context (:mod:`.pinned_context`); with ``"ring"`` (the default) it is
overwritten first, as in moshi.

Synchronous and single-threaded: call it from one worker thread. Never imports trio.
"""

from __future__ import annotations

import copy
import itertools
import platform
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs
import numpy as np
import numpy.typing as npt
import torch

from ..audio import FRAME_SAMPLES
from .engine import (
    CONTEXT_POLICIES,
    DEFAULT_CONTEXT_POLICY,
    GREEDY,
    NUM_CODEBOOKS,
    TEXT_EPAD_ID,
    TEXT_PAD_ID,
    EngineDescription,
    SessionPrompt,
    StepOutput,
)
from .errors import InvalidVoice
from .family import ModelFamily, detect_family, wrap_with_system_tags
from .lm_runner import LMRunner, SlotState
from .loading import LoadedCheckpoint
from .personaplex import (
    PrefillPlan,
    VoicePrompt,
    build_prefill_plan,
    load_voice_prompt,
    prefill_positions,
)
from .sampling import install as install_sampler

PrefillMode = Literal["snapshot", "burst"]


@attrs.define(slots=True)
class EngineStatistics:
    steps: int = 0
    step_seconds_total: float = 0.0
    last_step_seconds: float = 0.0
    resets: int = 0
    last_reset_seconds: float = 0.0
    prefill_snapshot_hits: int = 0
    prefill_snapshot_misses: int = 0
    prefill_compute_seconds_total: float = 0.0


def configure_torch_threads(threads: int) -> None:
    """On CPU, one torch thread per engine: on 2 shared cores more threads get much slower."""
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # can only be set once per process, before any parallel work
        pass


class MoshiEngine:
    """A :class:`~duplex_actors.model.engine.ModelEngine` over the real moshi models."""

    def __init__(
        self,
        checkpoint: LoadedCheckpoint,
        *,
        slots: int,
        family: str | None = None,
        prefill: PrefillMode = "snapshot",
        snapshot_cache_size: int = 32,
        torch_threads: int | None = 1,
        context_policy: str = DEFAULT_CONTEXT_POLICY,
        pin_max: int | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        if prefill not in ("snapshot", "burst"):
            raise ValueError(f"prefill must be 'snapshot' or 'burst', got {prefill!r}")
        if context_policy not in CONTEXT_POLICIES:
            raise ValueError(f"context_policy must be one of {CONTEXT_POLICIES}, got {context_policy!r}")
        if checkpoint.device.type == "cpu" and torch_threads is not None:
            configure_torch_threads(torch_threads)
        install_sampler()
        self.checkpoint = checkpoint
        self.family: ModelFamily = detect_family(list(checkpoint.files.voices), family)
        self.device = checkpoint.device
        self._slots = slots
        self._prefill_mode = prefill
        self._snapshot_cache_size = snapshot_cache_size
        lm = checkpoint.lm
        self.context_policy = context_policy
        self.context = int(lm.context or 0)
        # The cap of a pinned prompt (default a quarter of the context; a prompt of P positions
        # leaves the session C - P of recent memory); None: moshi's ring, which ignores pin_max.
        self.pin_max: int | None = None
        if context_policy == "pin-prompt":
            if not self.context:
                raise ValueError("context_policy 'pin-prompt' needs an LM with a finite context")
            self.pin_max = self.context // 4 if pin_max is None else pin_max
            if not 0 <= self.pin_max < self.context:
                raise ValueError(f"pin_max must be in 0..{self.context - 1}, got {self.pin_max}")
        self._twin: LMRunner | None = None
        if self.family.capabilities.prefill and prefill == "snapshot":
            # A second LMModel that shares every parameter and buffer (no extra weights), so
            # a prompt can be computed at B=1 without touching the batch's state.
            memo = {id(t): t for t in itertools.chain(lm.parameters(), lm.buffers())}
            self._twin = LMRunner(copy.deepcopy(lm, memo), 1, cuda_graphs=False, pin_width=self.pin_max)
        self._runner = LMRunner(lm, slots, pin_width=self.pin_max)
        self._mimi = checkpoint.mimi
        self._mimi.streaming_forever(slots)
        self._tokenizer = checkpoint.tokenizer
        self._voices: dict[str, VoicePrompt] = {}
        if self.family.capabilities.voice_prompts:
            # Load every bundled voice now: a malformed one is a checkpoint error at start-up,
            # not a failure in the middle of serving.
            for name in checkpoint.files.voices:
                self.voice(name)
        if self.family.capabilities.prefill and lm.context:
            self.family = attrs.evolve(
                self.family,
                context_positions=int(lm.context),
                prompt_positions=self._prompt_positions,
                prompt_budget=self.pin_max,
                pinned_prompt=self.pin_max is not None,
            )
            if self.pin_max is not None and self.family.default_voice is not None:
                # Sessions that set no persona get the default one: it must be pinnable.
                default = self._prompt_positions(self.family.session_prompt())
                if default > self.pin_max:
                    raise ValueError(
                        f"context_policy 'pin-prompt': the default prompt ({self.family.default_voice}, "
                        f"the default persona) takes {default} positions, more than the pinned "
                        f"prompt's cap of {self.pin_max}; raise the cap (pin_max, serve "
                        f"--max-pinned-prompt), to at most {self.context - 1}"
                    )
        self._snapshots: OrderedDict[tuple[str, str], SlotState] = OrderedDict()
        self._plans: dict[tuple[str, str], PrefillPlan] = {}
        self._prepare_lock = threading.Lock()
        self._hidden_text = {TEXT_PAD_ID, TEXT_EPAD_ID}
        self.stats = EngineStatistics()
        self._description: EngineDescription | None = None

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def model_id(self) -> str:
        return self.checkpoint.files.model_id

    def describe(self, progress: Callable[[int, int], None] | None = None) -> EngineDescription:
        """What a session log's header records; the first call hashes the LM weights unless
        their digest is cached (call it off the event loop; ``progress`` gets bytes hashed and
        total), later ones reuse the result (nothing in it changes)."""
        if self._description is not None:
            return self._description
        checkpoint = self.checkpoint
        engine: dict[str, Any] = {
            "slots": self.slots,
            "family": self.family.name,
            "voices": list(self.family.voices),
            "prefill": self._prefill_mode,
            "device": str(checkpoint.device),
            "machine": platform.machine(),
            # A log without these was served with moshi's ring (and replays so).
            "context_policy": self.context_policy,
            "context": self.context,
        }
        if self.pin_max is not None:
            # Each epoch's pin is its prompt's positions (at most pin_max), which a replay
            # computes again from the logged prompt.
            assert self._runner.pins is not None
            engine.update(pin="prompt", pin_max=self.pin_max, attention=self._runner.pins.kernel)
        self._description = EngineDescription(
            model_id=self.model_id,
            checkpoint_sha256=checkpoint.files.lm_sha256(progress),
            dtype=str(checkpoint.dtype).removeprefix("torch."),
            engine=engine,
        )
        return self._description

    # -- prompts -----------------------------------------------------------------------------
    def voice(self, name: str) -> VoicePrompt:
        if name not in self._voices:
            if name not in self.checkpoint.files.voices:
                raise InvalidVoice(f"unknown voice {name!r}")
            path = self.checkpoint.files.voices[name]
            lm = self.checkpoint.lm
            self._voices[name] = load_voice_prompt(path, dim=lm.dim, text_card=lm.text_card, card=lm.card)
        return self._voices[name]

    def _prompt_positions(self, prompt: SessionPrompt) -> int:
        voice = prompt.voice or self.family.default_voice
        if voice is None:
            return 0
        tokens = self._tokenizer.encode(wrap_with_system_tags(prompt.persona))
        return prefill_positions(self.voice(voice), len(tokens))

    def prefill_plan(self, prompt: SessionPrompt) -> PrefillPlan | None:
        if not self.family.capabilities.prefill:
            return None
        voice = prompt.voice or self.family.default_voice
        if voice is None:
            raise InvalidVoice("this checkpoint bundles no voice prompts")
        key = (voice, prompt.persona)
        if key not in self._plans:
            tokens = self._tokenizer.encode(wrap_with_system_tags(prompt.persona))
            plan = build_prefill_plan(self.voice(voice), list(tokens))
            self.family.check_prompt_positions(len(plan))
            self._plans[key] = plan
        return self._plans[key]

    @property
    def can_prepare(self) -> bool:
        """Whether :meth:`prepare` computes anything (a family with prompts, snapshot mode)."""
        return self._twin is not None

    def prepare(
        self, prompt: SessionPrompt, progress: Callable[[int, int], None] | None = None
    ) -> SlotState | None:
        """Compute (or fetch) the prefill snapshot of ``prompt``'s (voice, persona);
        ``progress`` gets positions done and total as it is computed.

        Uses only the batch-1 twin, so it may run in another thread while ``step`` runs.
        """
        plan = self.prefill_plan(prompt)
        if plan is None or self._twin is None:
            return None
        key = (prompt.voice or self.family.default_voice or "", prompt.persona)
        snap = self._snapshots.get(key)  # a hit never waits for a computation in progress
        if snap is not None:
            self.stats.prefill_snapshot_hits += 1
            return snap
        with self._prepare_lock:
            snap = self._snapshots.get(key)
            if snap is not None:
                self.stats.prefill_snapshot_hits += 1
                return snap
            started = time.perf_counter()
            self._twin.reset(0, prompt.sampling)
            self._twin.run_prefill(0, plan, prompt.sampling, progress=progress, pin=self._pin_of(plan))
            snap = self._twin.snapshot(0, len(plan))
            self.stats.prefill_compute_seconds_total += time.perf_counter() - started
            self.stats.prefill_snapshot_misses += 1
            self._snapshots[key] = snap
            while len(self._snapshots) > self._snapshot_cache_size:
                self._snapshots.popitem(last=False)
            return snap

    def _pin_of(self, plan: PrefillPlan) -> int:
        """The positions a slot keeps past the context: its whole prompt, when pinning."""
        return len(plan) if self.pin_max is not None else 0

    # -- the engine interface ------------------------------------------------------------------
    def reset(self, slot: int, prompt: SessionPrompt | None) -> None:
        """Fresh context for ``slot``: reset LM and Mimi rows, then prefill ``prompt``.

        ``None`` resets without a prompt (a slot being freed).
        """
        self._check_slot(slot)
        started = time.perf_counter()
        plan = self.prefill_plan(prompt) if prompt is not None else None  # validates first
        snap = self.prepare(prompt) if prompt is not None and self._prefill_mode == "snapshot" else None
        mask = torch.zeros(self._slots, dtype=torch.bool, device=self.device)
        mask[slot] = True
        sampling = prompt.sampling if prompt is not None else GREEDY
        self._runner.reset(slot, sampling)
        self._mimi.reset_streaming(reset_mask=mask)
        if snap is not None:
            self._runner.paste(slot, snap)
        elif plan is not None:
            self._runner.run_prefill(slot, plan, sampling, pin=self._pin_of(plan))
        self.stats.resets += 1
        self.stats.last_reset_seconds = time.perf_counter() - started

    @torch.no_grad()
    def step(self, frames: Mapping[int, npt.NDArray[np.float32]]) -> dict[int, StepOutput]:
        started = time.perf_counter()
        batch = self._slots
        exec_mask = torch.zeros(batch, dtype=torch.bool)
        pcm = torch.zeros(batch, 1, FRAME_SAMPLES, dtype=torch.float32)
        for slot, frame in frames.items():
            self._check_slot(slot)
            if frame.shape != (FRAME_SAMPLES,):
                raise ValueError(f"slot {slot}: frame must be [{FRAME_SAMPLES}], got {frame.shape}")
            pcm[slot, 0] = torch.from_numpy(np.asarray(frame, dtype=np.float32))
            exec_mask[slot] = True
        if not frames:
            return {}
        exec_mask = exec_mask.to(self.device)
        self._mimi.set_exec_mask(exec_mask)
        user_codes = self._mimi.encode(pcm.to(self.device))  # [B, 8, 1]
        out = self._runner.step(user_codes, exec_mask)  # [B, 9, 1]
        agent = out[:, 1:, :]
        ready = exec_mask & (agent[:, :, 0] >= 0).all(dim=1)
        ready_cpu = ready.cpu()
        pcm_out = None
        if bool(ready_cpu.any()):
            self._mimi.set_exec_mask(ready)
            pcm_out = self._mimi.decode(agent.clamp(min=0))[:, 0].float().cpu().numpy()
        tokens = out[:, :, 0].cpu().tolist()
        codes_in = user_codes[:, :, 0].cpu().tolist()
        results: dict[int, StepOutput] = {}
        for slot in frames:
            is_ready = bool(ready_cpu[slot])
            text = int(tokens[slot][0])
            results[slot] = StepOutput(
                ready=is_ready,
                text_token=text,
                text_piece=self.text_piece(text) if is_ready else "",
                agent_codes=tuple(int(c) for c in tokens[slot][1 : 1 + NUM_CODEBOOKS]),
                user_codes=tuple(int(c) for c in codes_in[slot]),
                pcm=(
                    pcm_out[slot].copy()
                    if is_ready and pcm_out is not None
                    else np.zeros(FRAME_SAMPLES, dtype=np.float32)
                ),
            )
        elapsed = time.perf_counter() - started
        self.stats.steps += 1
        self.stats.step_seconds_total += elapsed
        self.stats.last_step_seconds = elapsed
        return results

    def text_piece(self, token: int) -> str:
        """The text a token shows to users: '' for padding and control ids, '▁' -> ' '."""
        tok = self._tokenizer
        if token in self._hidden_text or token < 0 or token >= tok.vocab_size():
            return ""
        if tok.is_control(token) or tok.is_unknown(token):
            return ""
        return str(tok.id_to_piece(token)).replace("\u2581", " ")

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self._slots:
            raise IndexError(f"slot {slot} out of range 0..{self._slots - 1}")
