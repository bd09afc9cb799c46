"""One batched ``LMGen`` with per-slot token forcing, embedding overrides and sampling.

Forcing is how prompts are injected (as in Kyutai's batched TTS server): ``LMGen`` calls
``on_text_hook``/``on_audio_hook`` with the sampled tokens, and the hooks overwrite the rows
whose forcing mask is set, in place. A PersonaPlex ``.pt`` voice replaces whole summed input
embeddings, which needs a replacement ``forward_text`` installed before streaming starts.
Every buffer is ``[B, ...]`` and updated in place (CUDA graphs keep references to them).
With ``pin_width``, every row may keep its first positions (its prompt) past the context
(:mod:`.pinned_context`); the pin is set by ``run_prefill`` and ``paste`` and cleared by ``reset``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import torch

from . import kv_write
from .engine import GREEDY, NUM_CODEBOOKS, SamplingConfig
from .personaplex import PrefillPlan
from .pinned_context import PinnedPrefix, install
from .sampling import SlotSampler

if TYPE_CHECKING:
    from moshi.models.lm import LMModel


@attrs.frozen(slots=True, eq=False)
class SlotState:
    """One slot's LM streaming state (a prefill snapshot): what ``paste`` copies back.

    ``pin``: the positions kept past the context (0: none); the cache tensors do not say it.
    """

    steps: int
    tensors: tuple[torch.Tensor, ...]
    pin: int = 0


class LMRunner:
    def __init__(
        self, lm: LMModel, batch_size: int, *, cuda_graphs: bool = True, pin_width: int | None = None
    ) -> None:
        from moshi.models.lm import LMGen

        self.lm = lm
        self.batch_size = batch_size
        device, dim = lm.device, lm.dim
        # None: moshi's ring as it is. Else the widest pin a row may have (fixed: graph shapes).
        self.pins: PinnedPrefix | None = None
        if pin_width is not None:
            self.pins = PinnedPrefix(batch_size, int(lm.context or 0), pin_width, device)
            install(lm, self.pins)
        self.force_text_mask = torch.zeros(batch_size, dtype=torch.bool, device=device)
        self.force_text = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.force_audio_mask = torch.zeros(batch_size, NUM_CODEBOOKS, dtype=torch.bool, device=device)
        self.force_audio = torch.zeros(batch_size, NUM_CODEBOOKS, dtype=torch.long, device=device)
        self.emb_mask = torch.zeros(batch_size, dtype=torch.bool, device=device)
        self.emb_override = torch.zeros(batch_size, 1, dim, dtype=lm.dtype, device=device)
        self.sampler = SlotSampler(batch_size, device)
        # Set to a [B, text_card] float32 tensor before the first step to receive every step's
        # text logits (bench/long_sessions_eval.py scores forced answers with them); copied in
        # place, so CUDA graphs capture the copy.
        self.text_logits: torch.Tensor | None = None
        # An instance attribute shadows LMModel.forward_text; LMGen graphs whatever it finds.
        lm.forward_text = self._forward_text  # type: ignore[method-assign]
        self.lm_gen = LMGen(
            lm,
            use_sampling=False,
            on_text_hook=self._on_text,
            on_audio_hook=self._on_audio,
            support_out_of_sync=True,
        )
        self.lm_gen.streaming_forever(batch_size)
        # On CPU in bfloat16 and float16, KV-cache writes through index_put_: moshi's scatter_
        # costs a whole cache per write there (kv_write.py); the same values land either way.
        kv_write.install(lm)
        if not cuda_graphs:
            state: Any = self.lm_gen._streaming_state
            state.graphed_main.disable = True
            if state.graphed_depth is not None:
                state.graphed_depth.disable = True

    # -- hooks -------------------------------------------------------------------------------
    def _on_text(self, tokens: torch.Tensor) -> None:
        tokens.copy_(torch.where(self.force_text_mask, self.force_text, tokens))

    def _on_audio(self, tokens: torch.Tensor) -> None:
        tokens.copy_(torch.where(self.force_audio_mask, self.force_audio, tokens))

    def _forward_text(
        self,
        sequence: torch.Tensor,
        sum_condition: torch.Tensor | None = None,
        cross_attention_src: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """moshi 0.2.13's ``LMModel.forward_text``, op for op, plus the per-row override."""
        lm = self.lm
        input_: Any = None
        for cb_index in range(lm.num_audio_codebooks):
            audio_emb = lm.emb[cb_index](sequence[:, cb_index + lm.audio_offset])
            input_ = audio_emb if input_ is None else input_ + audio_emb
        text_emb = lm.text_emb(sequence[:, 0])
        input_ = text_emb if input_ is None else input_ + text_emb
        input_ = torch.where(self.emb_mask[:, None, None], self.emb_override, input_)
        if sum_condition is not None:
            input_ = input_ + sum_condition.to(input_)
        if cross_attention_src is not None:
            cross_attention_src = cross_attention_src.to(input_)
        transformer_out = lm.transformer(input_, cross_attention_src=cross_attention_src)
        if lm.out_norm:
            transformer_out = lm.out_norm(transformer_out)
        text_logits = lm.text_linear(transformer_out)
        if self.text_logits is not None:
            self.text_logits.copy_(text_logits[:, 0])
        return transformer_out, text_logits[:, None]

    # -- stepping ----------------------------------------------------------------------------
    @torch.no_grad()
    def step(
        self, user_tokens: torch.Tensor, exec_mask: torch.Tensor, agent_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One ``LMGen.step``: ``[B, 8, 1]`` user codes -> ``[B, 9, 1]`` (text + agent codes).

        ``agent_tokens`` (``[B, 8, 1]``) replaces the depformer for the whole batch: for prompt
        positions whose agent codes are all forced anyway, it saves the 8 depformer passes.
        """
        self.lm_gen.set_exec_mask(exec_mask)
        with self.sampler.active():
            out = self.lm_gen.step(user_tokens, depformer_replace_tokens=agent_tokens)
        assert out is not None  # support_out_of_sync=True always returns a frame
        self.sampler.advance(exec_mask)
        return out

    def reset(self, slot: int, sampling: SamplingConfig) -> None:
        mask = self._one_hot(slot)
        self.lm_gen.reset_streaming(reset_mask=mask)
        if self.pins is not None:
            self.pins.set(slot, 0)
        self.clear_forcing(slot)
        self.sampler.configure(slot, sampling)

    def clear_forcing(self, slot: int) -> None:
        self.force_text_mask[slot] = False
        self.force_audio_mask[slot] = False
        self.emb_mask[slot] = False

    @torch.no_grad()
    def run_prefill(
        self,
        slot: int,
        plan: PrefillPlan,
        sampling: SamplingConfig,
        progress: Callable[[int, int], None] | None = None,
        *,
        pin: int = 0,
    ) -> None:
        """Run every forced call of ``plan`` in ``slot`` (the other slots do not advance);
        ``progress(calls done, calls)`` after each; then pin its first ``pin`` positions.

        The prompt's last call leaves text and agent codebook 0 to the model; it is decoded
        greedily so that a prompt's state is one deterministic snapshot for every session.
        """
        device = self.lm.device
        exec_mask = self._one_hot(slot)
        tokens = torch.zeros(self.batch_size, NUM_CODEBOOKS, 1, dtype=torch.long, device=device)
        agent = torch.zeros(self.batch_size, NUM_CODEBOOKS, 1, dtype=torch.long, device=device)
        self.sampler.configure(slot, GREEDY)
        for done, call in enumerate(plan.calls, 1):
            tokens[slot, :, 0] = torch.tensor(call.user, device=device)
            self.force_text_mask[slot] = call.text is not None
            self.force_text[slot] = call.text if call.text is not None else 0
            self.force_audio_mask[slot] = torch.tensor(call.agent_mask, device=device)
            self.force_audio[slot] = torch.tensor(call.agent, device=device)
            if call.embedding is not None:
                self.emb_mask[slot] = True
                self.emb_override[slot, 0] = call.embedding.to(self.emb_override)
            else:
                self.emb_mask[slot] = False
            if all(call.agent_mask):
                # Every agent code is forced: the depformer's choice would be overwritten. (Other
                # rows are exec-masked here, so replacing their depformer output changes nothing.)
                agent[slot, :, 0] = torch.tensor(call.agent, device=device)
                self.step(tokens, exec_mask, agent)
            else:
                self.step(tokens, exec_mask)
            if progress is not None:
                progress(done, len(plan.calls))
        self.clear_forcing(slot)
        self.sampler.configure(slot, sampling)
        self.sampler.frame[slot] = len(plan)
        self.set_pin(slot, pin)

    def set_pin(self, slot: int, positions: int) -> None:
        """Keep ``slot``'s first ``positions`` positions past the context (before it first wraps)."""
        if self.pins is not None:
            self.pins.set(slot, positions)
        elif positions:
            raise ValueError("this runner keeps no pinned prefix (moshi's ring)")

    # -- snapshots ---------------------------------------------------------------------------
    def _slot_tensors(self) -> list[tuple[torch.Tensor, int, bool]]:
        """(tensor, batch dim, is a KV ring) for every per-slot piece of LM streaming state.

        Looked up anew on each call: ``LMGen._step`` rebinds ``offsets`` to a new tensor.
        """
        from moshi.modules.transformer import _MHAState, _TransformerState

        gen_state = self.lm_gen._streaming_state
        assert gen_state is not None
        found: list[tuple[torch.Tensor, int, bool]] = [
            (gen_state.cache, 0, False),
            (gen_state.offsets, 0, False),
        ]
        for state in self.lm.get_streaming_state().values():
            if isinstance(state, _MHAState) and state.kv_cache is not None:
                if not state.kv_cache.respect_exec_mask:
                    raise RuntimeError("a temporal attention layer ignores exec masks")
                found.append((state.kv_cache.cache, 1, True))
                found.append((state.kv_cache.end_offset, 0, False))
                found.append((state.offset, 0, False))
            elif isinstance(state, _TransformerState):
                found.append((state.offsets, 0, False))
        return found

    def snapshot(self, slot: int, steps: int) -> SlotState:
        """Copy ``slot``'s state after ``steps`` steps from a reset; KV rings only up to ``steps``."""
        parts = []
        for tensor, dim, ring in self._slot_tensors():
            row = tensor.select(dim, slot)
            if ring:
                row = row[:, :, : min(steps, row.shape[2])]
            parts.append(row.clone())
        pin = self.pins.get(slot) if self.pins is not None else 0
        return SlotState(steps=steps, tensors=tuple(parts), pin=pin)

    def paste(self, slot: int, state: SlotState) -> None:
        """Write a snapshot into ``slot`` (which must have been reset)."""
        for (tensor, dim, ring), part in zip(self._slot_tensors(), state.tensors, strict=True):
            row = tensor.select(dim, slot)
            if ring:
                row = row[:, :, : part.shape[2]]
            row.copy_(part)
        self.sampler.frame[slot] = state.steps
        self.set_pin(slot, state.pin)

    def _one_hot(self, slot: int) -> torch.Tensor:
        mask = torch.zeros(self.batch_size, dtype=torch.bool, device=self.lm.device)
        mask[slot] = True
        return mask
