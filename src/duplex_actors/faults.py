"""Fault injection for the reliability tests (``RELIABILITY.md``); off unless ``DUPLEX_FAULTS``.

Each fault is armed by a trigger file, so a test decides exactly when it fires::

    DUPLEX_FAULTS="step_raise=/tmp/f1,step_stall=/tmp/f2:200,fsync_error=/tmp/f3,handler_raise=/tmp/f4"

- ``step_raise=PATH``: when PATH exists, the next model step raises (PATH is removed: one tick).
- ``step_stall=PATH:MS``: while PATH exists, every model step first sleeps MS milliseconds.
- ``fsync_error=PATH[:ERRNO]``: while PATH exists, every ``fdatasync`` of a session log fails
  with ERRNO (EIO by default; ENOSPC is a disk that filled mid-stream).
- ``fsync_stall=PATH:MS``: while PATH exists, every ``fdatasync`` first sleeps MS milliseconds.
- ``log_create_error=PATH[:ERRNO]``: while PATH exists, creating a file in the log dir (a session
  log, the writer's probe) fails with ERRNO (a name such as ENOSPC, EACCES; default ENOSPC).
- ``handler_raise=PATH``: when PATH exists, the next client message makes its connection
  handler raise (PATH is removed).
- ``step_silence=PATH``: while PATH exists, every step's output audio is silence (its tokens
  unchanged): the negative control of the real-client audio checks.

Never set this in production; the server logs a warning at start-up when it is set.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from .config import ConfigError
from .model.engine import EngineDescription, EngineFamily, ModelEngine, SessionPrompt, StepOutput

log = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """A failure injected on purpose by ``DUPLEX_FAULTS``."""


def _take(path: Path | None) -> bool:
    """True once per creation of ``path`` (it is removed)."""
    if path is None:
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


@attrs.frozen(slots=True)
class Faults:
    step_raise: Path | None = None
    step_stall: Path | None = None
    stall_ms: float = 0.0
    fsync_error: Path | None = None
    handler_raise: Path | None = None
    fsync_stall: Path | None = None
    fsync_stall_ms: float = 0.0
    log_create_error: Path | None = None
    log_create_errno: int = errno.ENOSPC
    fsync_errno: int = errno.EIO
    step_silence: Path | None = None

    @property
    def active(self) -> bool:
        return any(
            p is not None
            for p in (
                self.step_raise,
                self.step_stall,
                self.fsync_error,
                self.handler_raise,
                self.fsync_stall,
                self.log_create_error,
                self.step_silence,
            )
        )

    @classmethod
    def parse(cls, spec: str) -> Faults:
        fields: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, _, value = item.partition("=")
            if name == "step_stall":
                path, _, ms = value.rpartition(":")
                try:
                    fields["step_stall"], fields["stall_ms"] = Path(path), float(ms)
                except ValueError:
                    raise ConfigError(f"DUPLEX_FAULTS: step_stall wants PATH:MS, got {value!r}") from None
            elif name == "fsync_stall":
                path, _, ms = value.rpartition(":")
                try:
                    fields["fsync_stall"], fields["fsync_stall_ms"] = Path(path), float(ms)
                except ValueError:
                    raise ConfigError(f"DUPLEX_FAULTS: fsync_stall wants PATH:MS, got {value!r}") from None
            elif name in ("log_create_error", "fsync_error") and value:
                path, sep, code = value.rpartition(":")
                if sep and code.isupper():
                    number = getattr(errno, code, None)
                    if not isinstance(number, int):
                        raise ConfigError(f"DUPLEX_FAULTS: {name}: unknown errno {code!r}")
                    fields[name], fields[name.replace("_error", "_errno")] = Path(path), number
                else:
                    fields[name] = Path(value)
            elif name in ("step_raise", "handler_raise", "step_silence") and value:
                fields[name] = Path(value)
            else:
                raise ConfigError(f"DUPLEX_FAULTS: unknown fault {item!r}")
        return cls(**fields)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Faults:
        return cls.parse((os.environ if env is None else env).get("DUPLEX_FAULTS", ""))

    def before_step(self) -> None:
        if self.step_stall is not None and self.step_stall.exists():
            time.sleep(self.stall_ms / 1000)
        if _take(self.step_raise):
            raise InjectedFault("injected model step failure (DUPLEX_FAULTS step_raise)")

    def silence_output(self) -> bool:
        return self.step_silence is not None and self.step_silence.exists()

    def before_message(self) -> None:
        if _take(self.handler_raise):
            raise InjectedFault("injected handler failure (DUPLEX_FAULTS handler_raise)")

    def install_log_faults(self) -> None:
        """Install the armed log faults (process-wide): fdatasync errors and stalls, log file
        creation errors."""
        self.install_fsync_fault()
        self._install_create_fault()

    def install_fsync_fault(self) -> None:
        """Make session-log fdatasync fail (``fsync_error``) or stall (``fsync_stall``) while
        the trigger file exists (process-wide)."""
        trigger, stall, code = self.fsync_error, self.fsync_stall, self.fsync_errno
        if trigger is None and stall is None:
            return
        real = os.fdatasync
        stall_s = self.fsync_stall_ms / 1000

        def fdatasync(fd: int) -> None:
            if stall is not None and stall.exists():
                time.sleep(stall_s)
            if trigger is not None and trigger.exists():
                raise OSError(code, f"{os.strerror(code)} (injected: DUPLEX_FAULTS fsync_error)")
            real(fd)

        os.fdatasync = fdatasync  # type: ignore[assignment]

    def _install_create_fault(self) -> None:
        trigger, code = self.log_create_error, self.log_create_errno
        if trigger is None:
            return
        from .log import writer

        real = writer._create_file

        def create_file(path: Path) -> int:
            if trigger.exists():
                raise OSError(
                    code, f"{os.strerror(code)} (injected: DUPLEX_FAULTS log_create_error)", str(path)
                )
            return real(path)

        writer._create_file = create_file


class FaultyEngine:
    """A :class:`~duplex_actors.model.engine.ModelEngine` whose ``step`` consults the armed
    faults first; every other call goes to the wrapped engine unchanged."""

    def __init__(self, engine: ModelEngine, faults: Faults) -> None:
        self.engine = engine
        self._faults = faults

    @property
    def slots(self) -> int:
        return self.engine.slots

    @property
    def family(self) -> EngineFamily:
        return self.engine.family

    def describe(self) -> EngineDescription:
        return self.engine.describe()

    def prepare(self, prompt: SessionPrompt) -> object:
        return self.engine.prepare(prompt)

    def reset(self, slot: int, prompt: SessionPrompt | None) -> None:
        self.engine.reset(slot, prompt)

    def step(self, frames: Mapping[int, npt.NDArray[np.float32]]) -> Mapping[int, StepOutput]:
        self._faults.before_step()
        outputs = self.engine.step(frames)
        if self._faults.silence_output():
            return {slot: attrs.evolve(out, pcm=np.zeros_like(out.pcm)) for slot, out in outputs.items()}
        return outputs
