"""The stand-in engine (``--model standin:STEP_MS``): a benchmark tool, never a model.

Its step takes ``STEP_MS`` of wall time with the GIL released (``time.sleep``), as a GPU step
does (the host launches the batch and waits), and returns silence with no text; ``reset`` and
``prepare`` are instant; it has no weights. It measures what serving costs the host when the
model costs it nothing (bench/ceiling.py), as vLLM's dummy weights do. Sessions see the
PersonaPlex family with the tiny checkpoint's voice names, so every client config that works
against ``tiny`` opens here too.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from ..audio import FRAME_SAMPLES
from .engine import NUM_CODEBOOKS, TEXT_PAD_ID, EngineDescription, SessionPrompt, StepOutput
from .errors import CheckpointError
from .family import PersonaPlexFamily

PREFIX = "standin:"
VOICES = ("NATF0.pt", "NATF1.pt", "NATF2.pt", "NATF3.pt", "NATM0.pt", "NATM1.pt", "NATM2.pt", "NATM3.pt")
MAX_STEP_MS = 10_000.0


def is_standin(model: str) -> bool:
    return model.startswith(PREFIX)


def parse_standin(model: str) -> float:
    """``standin:STEP_MS`` -> the step's milliseconds (``CheckpointError`` naming the form)."""
    text = model.removeprefix(PREFIX)
    try:
        step_ms = float(text)
    except ValueError:
        step_ms = -1.0
    if not 0 <= step_ms <= MAX_STEP_MS:
        raise CheckpointError(
            f"{model}: the stand-in engine is standin:STEP_MS with 0 <= STEP_MS <= {MAX_STEP_MS:g} "
            "(e.g. standin:25)"
        )
    return step_ms


class StandInEngine:
    """A :class:`~duplex_actors.model.engine.ModelEngine` whose step only waits ``step_ms``."""

    def __init__(self, model: str, *, slots: int = 8) -> None:
        self.model_id = model
        self.step_s = parse_standin(model) / 1000
        self._slots = slots
        self._family = PersonaPlexFamily(voices=VOICES)
        self._silence = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        self._codes = (0,) * NUM_CODEBOOKS
        self._output = StepOutput(
            ready=True,
            text_token=TEXT_PAD_ID,
            text_piece="",
            agent_codes=self._codes,
            user_codes=self._codes,
            pcm=self._silence,
        )

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def family(self) -> PersonaPlexFamily:
        return self._family

    def describe(self) -> EngineDescription:
        return EngineDescription(
            model_id=self.model_id,
            dtype="none",
            engine={
                "slots": self._slots,
                "family": self._family.name,
                "voices": list(VOICES),
                "standin_step_ms": self.step_s * 1000,
                "machine": platform.machine(),
            },
        )

    def prepare(self, prompt: SessionPrompt) -> object:
        return None

    def reset(self, slot: int, prompt: SessionPrompt | None) -> None:
        if not 0 <= slot < self._slots:
            raise IndexError(f"slot {slot} of {self._slots}")

    def step(self, frames: Mapping[int, npt.NDArray[np.float32]]) -> Mapping[int, StepOutput]:
        if self.step_s > 0:
            time.sleep(self.step_s)
        return dict.fromkeys(frames, self._output)
