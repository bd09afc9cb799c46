"""A per-slot, counter-based sampler that replaces moshi's ``sample_token``.

moshi's stock sampler draws Exp(1) noise of shape ``[B, k]`` from the global RNG, so a
session's draws depend on the batch size and its slot index. Here the noise for token ``j``
is a pure function of ``(seed, frame, stream, j)`` of the slot, so a session samples the same
tokens alone or in any slot of any batch (up to near-ties in the logits, which differ across
batch sizes by ~1e-6).

``moshi.models.lm`` imported ``sample_token`` into its own namespace; :func:`install` swaps
that name for a dispatcher that uses the sampler active on the calling thread (set by the
engine around its ``LMGen.step``) and falls back to moshi's own sampler otherwise.
Stream index: 0 for the text token, 1 + k for depformer codebook k, counted per step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .engine import SamplingConfig

_MASK32 = 0xFFFFFFFF
_active = threading.local()
_installed: Callable[..., torch.Tensor] | None = None


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 tensors holding values in [0, 2**32)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def exponential_noise(seed: torch.Tensor, frame: torch.Tensor, stream: int, vocab: int) -> torch.Tensor:
    """Exp(1) noise ``[B, vocab]`` from ``(seed[b], frame[b], stream, token)``; float32."""
    device = seed.device
    key = _fmix32((seed & _MASK32) ^ 0x9E3779B9)
    key = _fmix32(key ^ (frame & _MASK32))
    key = _fmix32(key ^ ((stream * 0x27D4EB2F) & _MASK32))
    tokens = torch.arange(vocab, device=device, dtype=torch.long)
    h = _fmix32(key[:, None] ^ ((tokens[None, :] * 0x165667B1) & _MASK32))
    # 24 high bits -> uniform in (0, 1), exactly representable in float32.
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / 16_777_216.0)
    return -torch.log(u)


class SlotSampler:
    """Per-slot decoding state of one batched ``LMGen``: seeds, frame counters, temperatures.

    All state lives in ``[B]`` tensors updated in place (CUDA graphs keep references).
    """

    def __init__(self, batch_size: int, device: torch.device | str) -> None:
        self.batch_size = batch_size
        self.seed = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.frame = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.temp = torch.zeros(batch_size, dtype=torch.float32, device=device)
        self.temp_text = torch.zeros(batch_size, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.top_k_text = torch.zeros(batch_size, dtype=torch.long, device=device)
        self._stream = 0

    def configure(self, slot: int, config: SamplingConfig) -> None:
        self.seed[slot] = config.seed & _MASK32
        self.temp[slot] = config.temperature
        self.temp_text[slot] = config.temperature_text
        self.top_k[slot] = config.top_k
        self.top_k_text[slot] = config.top_k_text
        self.frame[slot] = 0

    def advance(self, exec_mask: torch.Tensor) -> None:
        """Count one step for the slots that executed it."""
        self.frame.add_(exec_mask.to(self.frame.dtype))

    @contextmanager
    def active(self) -> Iterator[None]:
        """Make this sampler the one moshi's ``sample_token`` dispatches to, for one step."""
        previous = getattr(_active, "sampler", None)
        _active.sampler = self
        self._stream = 0
        try:
            yield
        finally:
            _active.sampler = previous

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """``[B, ..., V]`` logits -> ``[B, ...]`` tokens, one stream per call."""
        stream = self._stream
        self._stream += 1
        if stream == 0:
            temp, top_k = self.temp_text, self.top_k_text
        else:
            temp, top_k = self.temp, self.top_k
        shape = logits.shape
        x = logits.float().reshape(shape[0], -1, shape[-1])  # [B, R, V]
        greedy_tokens = x.argmax(dim=-1)
        # On CUDA this runs inside moshi's CUDA graph of the depformer: no host sync, no
        # data-dependent branch (both paths are computed, rows pick with where). On CPU an
        # all-greedy batch takes the short cut.
        if not x.is_cuda and bool((temp <= 0).all()):
            return greedy_tokens.reshape(shape[:-1])
        vocab = shape[-1]
        t = torch.where(temp > 0, temp, torch.ones_like(temp))[:, None, None]
        probs = torch.softmax(x / t, dim=-1)
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
        sorted_probs = probs.sort(dim=-1, descending=True).values
        kth = sorted_probs.gather(-1, (k - 1)[:, None, None].expand(-1, x.shape[1], 1))
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        noise = exponential_noise(self.seed, self.frame, stream, vocab)[:, None, :]
        sampled = (probs / noise).argmax(dim=-1)
        tokens = torch.where((temp > 0)[:, None], sampled, greedy_tokens)
        return tokens.reshape(shape[:-1])


def _dispatching_sample_token(
    logits: torch.Tensor,
    use_sampling: bool = False,
    temp: float = 1.0,
    top_k: int = 0,
    top_p: float = 0.0,
) -> torch.Tensor:
    sampler: SlotSampler | None = getattr(_active, "sampler", None)
    if sampler is None:
        assert _installed is not None
        return _installed(logits, use_sampling, temp, top_k, top_p)
    return sampler.sample(logits)


def install() -> None:
    """Route ``moshi.models.lm.sample_token`` through the active per-slot sampler (idempotent)."""
    global _installed
    import moshi.models.lm as lm_module

    current: Any = getattr(lm_module, "sample_token")  # noqa: B009
    if current is _dispatching_sample_token:
        return
    _installed = current
    setattr(lm_module, "sample_token", _dispatching_sample_token)  # noqa: B010
