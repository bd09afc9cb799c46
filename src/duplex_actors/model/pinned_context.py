"""A per-slot pinned prefix in moshi's ring KV cache: the prompt stays, the rest is a ring.

moshi's temporal transformer keeps keys and values of the last C positions (``RingKVCache``,
C = the LM's ``context``): position p is written at column p mod C, so once a slot passes C
positions its oldest ones, the voice prompt and the persona, are overwritten first. Here each
row b of the batch has a pin P_b (0: moshi's ring as it is). Its first P_b columns hold
positions 0..P_b-1 for the slot's life and the other R_b = C - P_b columns are a ring, in the
same cache tensor. With t the row's position (its ``offset``)::

    write column    w(p)  = p if p < P_b else P_b + (p - P_b) mod R_b
    ring columns    query rotated to t            (keys at t-R_b+1 .. t: distances 0 .. R_b-1)
    pinned columns  query rotated to min(t, C-1)  (key j at distance min(t, C-1) - j)

Keys are stored rotated to their absolute position, as moshi stores them, and never rotated
again: a RoPE score depends only on the difference of the two rotations. Past the wrap the
pinned keys are seen at distances C-P_b .. C-1, right before the oldest ring entry, so a query
sees one window of C consecutive distances ending at itself, as in moshi's ring, and no
distance the model was not trained on. Before position C, w(p) = p and both rotations agree:
a slot is exactly moshi's ring until it first wraps, so the pin may be set at any time before.

The attention is computed in two parts merged by their log-sum-exp: the ring part by the same
scaled-dot-product kernel moshi calls on CPU (with the pinned columns of wrapped rows masked
out), the pinned part explicitly over the first columns. A row with no pinned column in use (pin
0, or not yet wrapped) gets the ring part's output bit for bit, which on CPU is moshi's.

Installed per LM instance (:func:`install`), on the self-attention of every layer of
``lm.transformer``; nothing is patched globally. Off CPU every tensor keeps its shape, pins are
edited in place and no step reads the device from the host, so CUDA graphs can capture it as
they capture moshi's ring (not yet tried on a GPU).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import torch

from . import kv_write

if TYPE_CHECKING:
    from moshi.models.lm import LMModel
    from moshi.modules.transformer import StreamingMultiheadAttention

# The attention kernels a pinned LM runs, as the session log's header names them. On CPU the
# ring part is moshi's own kernel (the CPU flash attention that public SDPA dispatches to), so
# unwrapped rows match moshi's ring bit for bit; elsewhere it is computed explicitly (moshi's
# SDPA on CUDA picks among several kernels, which agree only to rounding).
KERNEL_CPU: Final = "sdpa-cpu+lse"
KERNEL_EXPLICIT: Final = "explicit"


def attention_kernel(device: torch.device) -> str:
    return KERNEL_CPU if device.type == "cpu" else KERNEL_EXPLICIT


class PinnedPrefix:
    """The pins of a batch (``pin[B]``, positions) and the width of the pinned part.

    ``width`` bounds every pin. Off CPU (``static``) the explicit part of the attention reads
    that many columns whatever the pins are, so the compute graph keeps its shape when a pin
    changes (CUDA graphs); on CPU it reads only up to the largest pin, and is skipped while no
    pinned row has wrapped (a host read, free there).
    """

    def __init__(
        self,
        batch_size: int,
        context: int,
        width: int,
        device: torch.device,
        kernel: str | None = None,
        static: bool | None = None,
    ) -> None:
        if not 0 <= width < context:
            raise ValueError(f"the pinned width must be in 0..{context - 1}, got {width}")
        self.context = context
        self.width = width
        self.pin = torch.zeros(batch_size, dtype=torch.long, device=device)
        self._host = [0] * batch_size  # the same pins, host-side
        self.static = device.type != "cpu" if static is None else static
        self.kernel = kernel or attention_kernel(device)
        if self.kernel not in (KERNEL_CPU, KERNEL_EXPLICIT) or (
            self.kernel == KERNEL_CPU and device.type != "cpu"
        ):
            raise ValueError(f"attention kernel {self.kernel!r} is not available on {device}")

    def set(self, row: int, positions: int) -> None:
        if not 0 <= positions <= self.width:
            raise ValueError(f"a pin must be in 0..{self.width}, got {positions}")
        self.pin[row] = positions
        self._host[row] = positions

    def get(self, row: int) -> int:
        return self._host[row]

    @property
    def widest(self) -> int:
        """The columns the pinned part of the attention reads."""
        return self.width if self.static else max(self._host)


def install(lm: LMModel, pins: PinnedPrefix) -> None:
    """Make every temporal self-attention layer of ``lm`` keep ``pins``' prefixes (per instance)."""
    for layer in lm.transformer.layers:
        pin_attention(layer.self_attn, pins)


def pin_attention(attn: Any, pins: PinnedPrefix) -> None:
    """Replace ``attn``'s forward, on this instance only, by the pinned-prefix attention."""
    from moshi.modules.transformer import StreamingMultiheadAttention

    if not isinstance(attn, StreamingMultiheadAttention):
        raise TypeError(f"not moshi's streaming attention: {type(attn).__name__}")
    if attn.cross_attention or not attn.causal or attn.rope is None or attn.weights_per_step:
        raise ValueError("a pinned prefix needs causal RoPE self-attention with one set of weights")
    if attn.context != pins.context:
        raise ValueError(f"attention context {attn.context} != the pins' context {pins.context}")
    # An instance attribute shadows the class's forward; nn.Module.__call__ looks it up.
    attn.forward = _pinned_forward(attn, pins)  # type: ignore[method-assign,assignment]


def _pinned_forward(
    attn: StreamingMultiheadAttention, pins: PinnedPrefix
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    from einops import rearrange
    from moshi.modules.transformer import StreamingMultiheadAttention, expand_repeated_kv

    stock = StreamingMultiheadAttention.forward.__get__(attn)
    heads = attn.num_heads
    kv_heads = heads // attn.kv_repeat
    rope = attn.rope
    assert rope is not None

    def forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        state: Any = attn._streaming_state
        if state is None:  # not streaming: the whole sequence at once, nothing to pin
            whole: torch.Tensor = stock(query, key, value)
            return whole
        if query.shape[1] != 1:
            raise ValueError("a pinned prefix steps one position per call")
        projected = attn.in_projs[0](query)
        if attn.kv_repeat == 1:
            q, k, v = rearrange(projected, "b t (p h d) -> p b h t d", p=3, h=heads)
        else:
            q = rearrange(projected[:, :, : attn.embed_dim], "b t (h d) -> b h t d", h=heads)
            k, v = rearrange(
                projected[:, :, attn.embed_dim :], "b t (p kh d) -> p b kh t d", p=2, kh=kv_heads
            )
        offset = state.offset
        q_ring, k = rope(q, k, offset, time_before_heads=False)
        cache = state.kv_cache
        keys, values = _write(cache, pins.pin, k, v)
        if attn.kv_repeat > 1:
            keys = expand_repeated_kv(keys, attn.kv_repeat)
            values = expand_repeated_kv(values, attn.kv_repeat)
        x = attend(q, q_ring, keys, values, offset, pins, rope)
        _advance(cache, state)
        x = rearrange(x, "b h t d -> b t (h d)")
        out: torch.Tensor = attn.out_projs[0](x)
        return out

    return forward


def write_index(position: torch.Tensor, pin: torch.Tensor, context: int) -> torch.Tensor:
    """The column position ``position`` is written at, per row: w(p) above."""
    ring = context - pin
    return torch.where(position < pin, position, pin + (position - pin) % ring)


def _write(
    cache: Any, pin: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """moshi's ``RingKVCache.complete`` write, at w(end_offset): an exec-masked row writes too,
    where its next real step writes before attending (as in moshi), and does not advance. On CPU
    in bfloat16 and float16 through ``index_put_``, as kv_write.py writes moshi's ring there
    (``scatter_`` costs a whole cache per write); the same values land either way."""
    B, H, _, D = k.shape
    column = write_index(cache.end_offset, pin, cache.capacity)
    if cache.cache.device.type == "cpu" and cache.cache.dtype in kv_write.HALF_DTYPES:
        rows = torch.arange(B, device=column.device).view(B, 1)
        cache.cache[0].transpose(1, 2).index_put_((rows, column.view(B, 1)), k.transpose(1, 2))
        cache.cache[1].transpose(1, 2).index_put_((rows, column.view(B, 1)), v.transpose(1, 2))
    else:
        index = column.view(B, 1, 1, 1).expand(B, H, 1, D)
        cache.cache[0].scatter_(2, index, k)
        cache.cache[1].scatter_(2, index, v)
    return cache.cache[0], cache.cache[1]


def _advance(cache: Any, state: Any) -> None:
    exec_mask = state.exec_mask
    cache.end_offset[:] = torch.where(exec_mask, cache.end_offset + 1, cache.end_offset)
    state.offset[:] = torch.where(exec_mask, state.offset + 1, state.offset)
    state.offset_cpu += 1


def pinned_query_position(offset: torch.Tensor, context: int) -> torch.Tensor:
    """The position a query is rotated to against the pinned columns: min(t, C-1)."""
    return torch.clamp(offset, max=context - 1)


def attend(
    q: torch.Tensor,
    q_ring: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    offset: torch.Tensor,
    pins: PinnedPrefix,
    rope: Any,
) -> torch.Tensor:
    """One query per row (``q`` before RoPE, ``q_ring`` rotated to the row's position ``offset``)
    against the cache ``keys``/``values`` ``[B, H, C, D]`` holding pinned columns and a ring."""
    B, _, C, D = keys.shape
    columns = torch.arange(C, device=keys.device)
    pin = pins.pin
    wrapped = (pin > 0) & (offset >= C)  # rows whose pinned columns need the second rotation
    written = columns.view(1, C) <= offset.view(B, 1)
    pinned_apart = wrapped.view(B, 1) & (columns.view(1, C) < pin.view(B, 1))
    ring_mask = written & ~pinned_apart  # [B, C]
    out_ring, lse_ring = _masked_attention_lse(q_ring, keys, values, ring_mask, pins.kernel)
    width = pins.widest
    if width == 0 or (not pins.static and not bool(wrapped.any())):
        return out_ring  # what the merge below gives when no row has a pinned column in use
    q_pin, _ = rope(q, q, pinned_query_position(offset, C), time_before_heads=False)
    # Products in the cache's dtype (no float copy of the cache is made), softmax in float32.
    scores = torch.matmul(q_pin, keys[:, :, :width].transpose(-1, -2)).float() / math.sqrt(D)
    pin_mask = pinned_apart[:, :width].view(B, 1, 1, width)
    scores = scores.masked_fill(~pin_mask, -math.inf)
    lse_pin = torch.logsumexp(scores, dim=-1)  # [B, H, 1]: -inf where no pinned column is used
    weights = torch.exp(scores - torch.where(torch.isfinite(lse_pin), lse_pin, 0.0).unsqueeze(-1))
    out_pin = torch.matmul(weights.to(values.dtype), values[:, :, :width]).float()
    top = torch.maximum(lse_ring, lse_pin)
    w_ring = torch.exp(lse_ring - top).unsqueeze(-1)
    w_pin = torch.exp(lse_pin - top).unsqueeze(-1)
    merged = (out_ring.float() * w_ring + out_pin * w_pin) / (w_ring + w_pin)
    return merged.to(out_ring.dtype)


def _masked_attention_lse(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, kernel: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q [B, H, 1, D]`` over the columns ``mask [B, C]`` allows, and the log of
    its softmax denominator ``[B, H, 1]`` (float32)."""
    B, _, C, D = keys.shape
    bias = torch.zeros(B, 1, 1, C, dtype=q.dtype, device=q.device)
    bias = bias.masked_fill(~mask.view(B, 1, 1, C), -math.inf)
    if kernel == KERNEL_CPU:
        # The kernel F.scaled_dot_product_attention runs for moshi on CPU (a boolean mask
        # becomes this additive one), which also returns the log-sum-exp.
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, keys, values, 0.0, False, attn_mask=bias
        )[:2]
        return out, lse.float()
    scores = torch.matmul(q, keys.transpose(-1, -2)).float() / math.sqrt(D) + bias.float()
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1).to(values.dtype), values)
    return out, lse
