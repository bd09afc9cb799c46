"""KV-cache writes through index_put_ (model/kv_write.py) are moshi's scatter_ writes, bit for bit."""

from __future__ import annotations

import pytest
import torch
from moshi.modules.transformer import RingKVCache, _MHAState

from duplex_actors.model import kv_write
from duplex_actors.model.factory import open_engine

from .helpers import first_divergence, session_audio


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_complete_is_moshis_complete(dtype):
    """Every output (keys, values, positions) and the cache after each call, over a ring that
    wraps several times, rows masked at random, one and several positions per call."""
    gen = torch.Generator().manual_seed(3)
    ours = RingKVCache(3, 2, 4, 7, device=torch.device("cpu"), dtype=dtype)
    theirs = RingKVCache(3, 2, 4, 7, device=torch.device("cpu"), dtype=dtype)
    for step in range(40):
        if step == 20:
            reset = torch.tensor([False, True, False])
            ours.reset(reset)
            theirs.reset(reset)
        t = 1 if step % 5 else 3
        k = torch.randn(3, 2, t, 4, generator=gen).to(dtype)
        v = torch.randn(3, 2, t, 4, generator=gen).to(dtype)
        mask = torch.rand(3, generator=gen) < 0.7
        got = kv_write.complete(ours, k, v, mask)
        expected = theirs.complete(k, v, mask)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b), step
        assert torch.equal(ours.cache, theirs.cache) and torch.equal(ours.end_offset, theirs.end_offset)


def test_an_engine_in_bfloat16_gives_what_moshis_writes_give():
    # Plain Moshi: no prompt to prefill (slow in bfloat16 on CPU), the same writes.
    engine = open_engine("tiny", slots=2, dtype="bfloat16", family="moshi")
    caches = [
        state.kv_cache
        for state in engine._runner.lm.get_streaming_state().values()
        if isinstance(state, _MHAState) and state.kv_cache is not None
    ]
    assert caches and all("complete" in vars(cache) for cache in caches)  # installed on CPU
    a, b = session_audio(3, 8), session_audio(4, 8)

    def run() -> list:
        for slot in (0, 1):
            engine.reset(slot, engine.family.session_prompt())
        # slot 1 is exec-masked every other step: rows at different offsets
        return [engine.step({0: a[i], 1: b[i]} if i % 2 else {0: a[i]}) for i in range(8)]

    ours = run()
    for cache in caches:
        del cache.complete  # moshi's own method again
    moshis = run()
    for slot in (0, 1):
        got = [step[slot] for step in ours if slot in step]
        expected = [step[slot] for step in moshis if slot in step]
        assert first_divergence(expected, got, pcm_atol=0.0) is None
