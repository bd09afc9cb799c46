"""Will the model fit: the memory a checkpoint needs in a dtype, against the memory available."""

from __future__ import annotations

import pytest
import torch
from moshi.modules.transformer import _MHAState

from duplex_actors.model import memory
from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.factory import resolve_checkpoint
from duplex_actors.model.memory import (
    GIB,
    InsufficientMemory,
    available_memory,
    choose_dtype,
    gib,
    memory_need,
    parse_size,
)

from .helpers import engine


def test_sizes_parse_in_powers_of_1024():
    assert parse_size("24G") == 24 * GIB
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1.5g") == 3 * GIB // 2
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError, match="expected a size"):
        parse_size("lots")


def test_the_need_is_what_the_engine_holds(tiny_dir):
    """Weights and KV caches as counted from the headers equal what a built engine holds."""
    files = checkpoint_from_dir(tiny_dir)
    eng = engine(tiny_dir, 2)
    held = sum(v.numel() * v.element_size() for v in eng.checkpoint.lm.state_dict().values())
    caches = sum(
        state.kv_cache.cache.nbytes
        for runner in (eng._runner, eng._twin)
        for state in runner.lm.get_streaming_state().values()
        if isinstance(state, _MHAState) and state.kv_cache is not None
    )
    need = memory_need(files, torch.float32, 2)
    assert (need.weights, need.kv_caches) == (held, caches)
    assert need.mimi == files.mimi.stat().st_size
    half = memory_need(files, torch.bfloat16, 2)
    assert half.weights * 2 == need.weights and half.kv_caches * 2 == need.kv_caches
    # The tiny LM is stored in float32: loading it in bfloat16 reads the float32 tensors first.
    assert half.loading == need.weights


def test_a_dtype_that_does_not_fit_is_refused_with_the_figures(tiny_dir):
    files = resolve_checkpoint("tiny")
    cpu = torch.device("cpu")
    assert choose_dtype("auto", cpu, files, 2) == torch.float32
    f32, bf16 = memory_need(files, torch.float32, 2), memory_need(files, torch.bfloat16, 2)
    between = (f32.total + bf16.total) // 2
    with pytest.raises(InsufficientMemory) as info:
        choose_dtype("auto", cpu, files, 2, limit=between)
    message = str(info.value)
    assert message.startswith("tiny in float32 does not fit: it needs ")
    assert f"it needs {gib(f32.total)} (LM {gib(f32.weights)}, KV caches " in message
    assert f"{gib(between)} is the memory limit (--memory-limit / DUPLEX_MEMORY_LIMIT)" in message
    assert f"--dtype bfloat16 needs {gib(bf16.total)} (fits)" in message
    assert choose_dtype("bfloat16", cpu, files, 2, limit=between) == torch.bfloat16
    with pytest.raises(InsufficientMemory, match=r"tiny in bfloat16 does not fit") as info:
        choose_dtype("bfloat16", cpu, files, 2, limit=1 << 20)
    assert "--dtype" not in str(info.value)


def test_the_limit_lowers_what_the_machine_has(monkeypatch: pytest.MonkeyPatch):
    found = available_memory(torch.device("cpu"))
    assert 0 < found.bytes < 1 << 50 and "available" in found.source
    # The machine's figure moves as other processes allocate: the limits below are compared
    # with the one just read.
    monkeypatch.setattr(memory, "_host_available", lambda: found)
    assert available_memory(torch.device("cpu"), limit=found.bytes * 2) == found
    assert available_memory(torch.device("cpu"), limit=5).bytes == 5
