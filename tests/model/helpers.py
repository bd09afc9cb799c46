"""Helpers for engine tests: sessions as (prompt, frames) and runs compared frame by frame."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt

from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.engine import SessionPrompt, StepOutput
from duplex_actors.model.loading import load_checkpoint
from duplex_actors.model.moshi_engine import MoshiEngine, PrefillMode

Frames = list[npt.NDArray[np.float32]]


def engine(
    path: Path,
    slots: int,
    *,
    family: str | None = None,
    prefill: PrefillMode = "snapshot",
    context_policy: str = "ring",
    pin_max: int | None = None,
):
    return MoshiEngine(
        load_checkpoint(checkpoint_from_dir(path)),
        slots=slots,
        family=family,
        prefill=prefill,
        context_policy=context_policy,
        pin_max=pin_max,
    )


def with_context(source: Path, target: Path, context: int) -> Path:
    """A copy of the checkpoint at ``source`` whose LM sees ``context`` positions (its
    ``lm_config.json``; the weights do not depend on it)."""
    shutil.copytree(source, target)
    config = json.loads((target / "lm_config.json").read_text())
    config["context"] = context
    (target / "lm_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return target


def session_audio(seed: int, frames: int) -> Frames:
    """Speech-like test audio: a tone with vibrato and noise, different per seed."""
    rs = np.random.RandomState(seed)
    t = np.arange(frames * FRAME_SAMPLES) / 24_000
    pitch = rs.uniform(90, 400)
    audio = rs.uniform(0.1, 0.5) * np.sin(2 * np.pi * pitch * t + 3 * np.sin(2 * np.pi * 3 * t))
    audio += rs.uniform(0.01, 0.2) * rs.randn(len(t))
    audio = audio.astype(np.float32)
    return [audio[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES] for i in range(frames)]


@attrs.frozen
class Session:
    prompt: SessionPrompt
    frames: Frames = attrs.field(eq=False)


def run_alone(eng: MoshiEngine, session: Session, slot: int = 0) -> list[StepOutput]:
    eng.reset(slot, session.prompt)
    return [eng.step({slot: f})[slot] for f in session.frames]


def first_divergence(
    expected: Sequence[StepOutput], got: Sequence[StepOutput], pcm_atol: float = 1e-5
) -> str | None:
    """None when tokens and codes are identical and PCM is within ``pcm_atol``; else where."""
    if len(expected) != len(got):
        return f"length {len(expected)} != {len(got)}"
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        if (a.ready, a.text_token, a.agent_codes, a.user_codes) != (
            b.ready,
            b.text_token,
            b.agent_codes,
            b.user_codes,
        ):
            return (
                f"frame {i}: expected text {a.text_token} codes {a.agent_codes} user {a.user_codes}, "
                f"got text {b.text_token} codes {b.agent_codes} user {b.user_codes}"
            )
        err = float(np.abs(a.pcm - b.pcm).max())
        if err > pcm_atol:
            return f"frame {i}: PCM differs by {err:.3g} > {pcm_atol}"
    return None
