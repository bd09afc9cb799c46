"""Writing moshi's KV caches on CPU with ``index_put_`` instead of ``scatter_``.

moshi 0.2.13's ``RingKVCache.complete`` writes each step's keys and values into the ring with
``scatter_`` along the time axis (every row at its own offset). On CPU, ``scatter_`` on a
bfloat16 tensor costs time in proportion to the whole cache, not to what it writes: at the 7B's
shape (32 heads x 3000 positions x 128, per layer) 90 ms per layer and step at B=1 on this
project's CPU machine, against 0.08 ms with ``index_put_`` (float32: 0.1 ms either way;
BENCHMARKS.md, "KV-cache writes in bfloat16 on CPU").

:func:`complete` is ``RingKVCache.complete`` of moshi 0.2.13, op for op, with only the write
done by ``index_put_`` on a ``[B, positions, heads, dim]`` view of the same storage: the same
elements receive the same values, a copy bit for bit (tests/model/test_kv_write.py compares
every output and the cache itself against moshi's own). :func:`install` puts it on the
bfloat16 and float16 caches of an LM whose streaming has started, on CPU only (float32 keeps
moshi's, as fast there; CUDA keeps moshi's, graphed).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from moshi.modules.transformer import KVCacheResult, RingKVCache


def complete(self: RingKVCache, k: torch.Tensor, v: torch.Tensor, exec_mask: torch.Tensor) -> KVCacheResult:
    from moshi.modules.transformer import KVCacheResult

    assert k.shape[:-1] == v.shape[:-1], (k.shape, v.shape)
    B, _, T, _ = k.shape
    assert T > 0
    indexes = torch.arange(T, device=self.end_offset.device, dtype=self.end_offset.dtype)
    indexes = indexes + self.end_offset.view(-1, 1)
    indexes = indexes % self.capacity
    # moshi: cache[i].scatter_(2, indexes.view(B, 1, T, 1).expand(-1, H, T, D), k or v)
    rows = torch.arange(B, device=indexes.device).view(B, 1).expand(B, T)
    self.cache[0].transpose(1, 2).index_put_((rows, indexes), k.transpose(1, 2))
    self.cache[1].transpose(1, 2).index_put_((rows, indexes), v.transpose(1, 2))

    keys = self.cache[0]
    values = self.cache[1]

    indexes = torch.arange(self.capacity, device=self.end_offset.device, dtype=torch.long)
    last_offset = self.end_offset.view(-1, 1) + T - 1
    end_index = last_offset % self.capacity
    delta = indexes - end_index
    positions = torch.where(
        delta <= 0,
        last_offset + delta,
        last_offset + delta - self.capacity,
    )
    self.end_offset[:] = torch.where(exec_mask, self.end_offset + T, self.end_offset)
    invalid = indexes >= self.end_offset.view(-1, 1)
    positions = torch.where(invalid, torch.full_like(positions, -1), positions)
    return KVCacheResult(keys, values, positions)


# The dtypes whose scatter_ is slow on CPU; in float32 scatter_ is as fast as index_put_ (a
# little faster at small shapes) and moshi's own write is kept.
HALF_DTYPES = (torch.bfloat16, torch.float16)


def install(lm: torch.nn.Module) -> int:
    """Write the KV caches of ``lm``'s streaming state through :func:`complete` (CPU caches in
    bfloat16 or float16 that respect exec masks, the ones ``scatter_`` into); returns how many."""
    from moshi.modules.transformer import RingKVCache, _MHAState

    count = 0
    for state in lm.get_streaming_state().values():  # type: ignore[operator]
        cache = getattr(state, "kv_cache", None) if isinstance(state, _MHAState) else None
        if (
            isinstance(cache, RingKVCache)
            and cache.respect_exec_mask
            and cache.cache.device.type == "cpu"
            and cache.cache.dtype in HALF_DTYPES
        ):
            cache.complete = types.MethodType(complete, cache)  # type: ignore[method-assign]
            count += 1
    return count
