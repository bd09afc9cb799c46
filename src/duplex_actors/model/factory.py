"""From a ``--model`` spec to a ready engine: built-in tiny models, local directories, HF repos.

:func:`open_engine` runs the start-up phases of :mod:`.startup` (resolve, load, engine, digest,
and with ``prepare_default`` the default prompt's prefill), each reported to ``on_phase``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .checkpoint import CheckpointFiles, checkpoint_from_dir, find_checkpoint
from .engine import DEFAULT_CONTEXT_POLICY
from .errors import CheckpointError, CheckpointUnavailable
from .family import detect_family
from .loading import load_checkpoint
from .memory import choose_dtype
from .moshi_engine import MoshiEngine, PrefillMode
from .standin import StandInEngine, is_standin
from .startup import Phase, PhaseSink, Startup
from .tiny import ensure_builtin

BUILTIN_MODELS = ("tiny", "tiny-parrot")
# Waits between attempts to fetch a checkpoint that is unavailable for now (the last repeats).
RETRY_DELAYS_S = (2.0, 5.0, 10.0, 30.0, 60.0)


def resolve_checkpoint(spec: str, revision: str | None = None) -> CheckpointFiles:
    """``tiny`` / ``tiny-parrot`` (built on first use), a local directory, or an HF repo id."""
    if spec in BUILTIN_MODELS:
        return checkpoint_from_dir(ensure_builtin(spec), model_id=spec)
    found = find_checkpoint(spec, revision)
    if found is None:
        raise CheckpointError(
            f"{spec}: not a built-in model ({', '.join(BUILTIN_MODELS)}), an existing directory, "
            "or a Hugging Face repo id (owner/name)"
        )
    return found


def resolve_retrying(spec: str, revision: str | None, phase: Phase) -> CheckpointFiles:
    """:func:`resolve_checkpoint`, tried again after :data:`RETRY_DELAYS_S` for as long as it
    fails with :class:`CheckpointUnavailable` (each failure is reported by ``phase``)."""
    attempt = 0
    while True:
        try:
            return resolve_checkpoint(spec, revision)
        except CheckpointUnavailable as exc:
            delay = RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)]
            attempt += 1
            phase.retrying(str(exc), delay, attempt)
            time.sleep(delay)


def dtype_name(dtype: torch.dtype | str | None) -> str:
    """``auto`` for None, else the dtype's name (``bfloat16``)."""
    if dtype is None:
        return "auto"
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def open_engine(
    model: str = "tiny",
    *,
    slots: int = 8,
    device: str = "cpu",
    dtype: torch.dtype | str | None = "auto",
    family: str | None = None,
    revision: str | None = None,
    prefill: PrefillMode = "snapshot",
    torch_threads: int | None = 1,
    memory_limit: int | None = None,
    context_policy: str = DEFAULT_CONTEXT_POLICY,
    pin_max: int | None = None,
    retry_unavailable: bool = False,
    prepare_default: bool = False,
    on_phase: PhaseSink | None = None,
) -> MoshiEngine:
    """Resolve, check the memory, load and build the engine of ``model``.

    ``dtype``: a torch dtype or its name, or ``auto`` (:func:`.memory.choose_dtype`; a dtype
    that does not fit in the memory available, at most ``memory_limit`` bytes, raises
    :class:`~.memory.InsufficientMemory`). ``retry_unavailable``: keep trying a checkpoint that
    cannot be fetched now. ``context_policy``, ``pin_max``: what a session longer than the
    context keeps (:class:`~.moshi_engine.MoshiEngine`). ``prepare_default``: prefill the
    family's default prompt now, so the first session with it starts at once."""
    startup = Startup(on_phase)
    with startup.phase("resolve") as phase:
        files = (
            resolve_retrying(model, revision, phase)
            if retry_unavailable
            else resolve_checkpoint(model, revision)
        )
    with startup.phase("load"):
        where = torch.device(device)
        twin = prefill == "snapshot" and detect_family(list(files.voices), family).capabilities.prefill
        chosen = choose_dtype(dtype_name(dtype), where, files, slots, limit=memory_limit, twin=twin)
        loaded = load_checkpoint(files, device=where, dtype=chosen)
    with startup.phase("engine"):
        engine = MoshiEngine(
            loaded,
            slots=slots,
            family=family,
            prefill=prefill,
            torch_threads=torch_threads,
            context_policy=context_policy,
            pin_max=pin_max,
        )
    with startup.phase("digest", total=files.lm.stat().st_size, unit="bytes") as phase:
        engine.describe(progress=phase.progress)
    if prepare_default and engine.can_prepare:
        prompt = engine.family.session_prompt()
        with startup.phase("prefill", unit="positions") as phase:
            engine.prepare(prompt, progress=phase.progress)
    return engine


def open_served_engine(model: str = "tiny", **kwargs: Any) -> MoshiEngine | StandInEngine:
    """What ``serve --model`` runs: :func:`open_engine`, or for benchmarks only the weightless
    stand-in ``standin:STEP_MS`` (``model/standin.py``)."""
    if is_standin(model):
        return StandInEngine(model, slots=kwargs.get("slots", 8))
    return open_engine(model, **kwargs)
