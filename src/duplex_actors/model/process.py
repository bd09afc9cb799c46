"""An engine in a child process, behind the :class:`~duplex_actors.model.engine.ModelEngine` interface.

The server runs its engine in the engine core process (``engine_core.py``) and uses only this
module's prompt-length helpers; :class:`EngineProcess` serves tools and tests that want an
engine off their own GIL.

:class:`EngineProcess` is a :class:`~duplex_actors.model.engine.ModelEngine` whose real engine
(``open_engine(...)``, the arguments the server gives it in-thread) runs in a ``spawn``-ed child.
Two pipes, each strictly one request then its reply:

- the *step* pipe carries ``step``, ``reset`` and ``close`` (the scheduler calls them from its
  one engine thread, never two at once); the child's main thread serves it;
- the *prepare* pipe carries ``prepare`` (the scheduler's prepare thread), served by a second
  thread in the child, so a cold persona's prefill never holds up the steps, as in-thread.

A call raises in the parent the exception the engine raised in the child (same type, message
and ``code``; the child's traceback is its ``__cause__``). If the child dies, every pending and
later call raises :class:`EngineProcessDied` with its exit code, which is logged once.

``slots``, ``family`` and ``describe()`` are answered in the parent with no round trip: the
child sends them once it has built the engine. Before that it sends its start-up phases
(:class:`~duplex_actors.model.startup.PhaseReport`) as they go, for ``on_phase``. The family's prompt-length check needs the
tokenizer: the parent loads it (SentencePiece, no torch), with each voice's prompt length.

The child never outlives the server: :meth:`EngineProcess.close` ends it; pipe EOF (the parent
died) ends it too, and so does a change of its parent pid (checked twice a second, for a parent
that dies while the child is still loading). It ignores SIGINT/SIGTERM/SIGUSR1/SIGUSR2, which a
terminal or a service manager may send to the whole process group: the server drains first,
then closes it.

Sans-io and torch-free in the parent: torch is imported only in the child.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import numpy.typing as npt

from .engine import EngineDescription, SessionPrompt, StepOutput
from .errors import InvalidVoice, ModelError
from .family import ModelFamily, wrap_with_system_tags
from .startup import PhaseReport, PhaseSink, Startup, import_engine

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    import sentencepiece

log = logging.getLogger("duplex_actors.engine_process")

CLOSE_TIMEOUT_S = 5.0
PARENT_CHECK_S = 0.5
_IGNORED_SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2")


class EngineProcessDied(ModelError):
    """The engine's child process is gone (it exited, was killed, or was closed)."""


class RemoteTraceback(Exception):
    """The child's traceback of an exception raised there (the parent's ``__cause__``)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f"\n--- in the engine process ---\n{self.tb}"


@attrs.frozen(slots=True, eq=False)
class PromptPositions:
    """The positions a prompt's prefill takes (the engine's ``_prompt_positions``), in the parent.

    ``base``: per voice, the prefill positions with an empty persona; the persona's tokens add
    one position each (``personaplex.prefill_positions``).
    """

    base: Mapping[str, int]
    default_voice: str | None
    tokenizer: sentencepiece.SentencePieceProcessor

    def __call__(self, prompt: SessionPrompt) -> int:
        voice = prompt.voice or self.default_voice
        if voice is None:
            return 0
        if voice not in self.base:
            raise InvalidVoice(f"unknown voice {voice!r}")
        return self.base[voice] + len(self.tokenizer.encode(wrap_with_system_tags(prompt.persona)))


@attrs.frozen(slots=True)
class _Hello:
    """What the child sends once its engine is built."""

    pid: int
    slots: int
    description: EngineDescription
    family: ModelFamily  # without prompt_positions (a bound method of the child's engine)
    prompt_base: Mapping[str, int] | None  # None: the family has no prompt-length check
    tokenizer: str | None
    build_s: float


class EngineProcess:
    """A :class:`~duplex_actors.model.engine.ModelEngine` served by a child process.

    ``open_kwargs`` are :func:`~duplex_actors.model.factory.open_engine`'s arguments. The
    constructor blocks until the child has built the engine (or raises what building raised).
    ``factory`` replaces ``open_engine`` (a module-level function, so that it pickles; tests).
    """

    def __init__(
        self,
        model: str = "tiny",
        *,
        factory: Callable[..., Any] | None = None,
        on_phase: PhaseSink | None = None,
        **open_kwargs: Any,
    ) -> None:
        started = time.perf_counter()
        ctx = multiprocessing.get_context("spawn")
        step_parent, step_child = ctx.Pipe(duplex=True)
        prep_parent, prep_child = ctx.Pipe(duplex=True)
        self._step_conn: Connection = step_parent
        self._prep_conn: Connection = prep_parent
        self._step_lock = threading.Lock()
        self._prep_lock = threading.Lock()
        self._closing = False
        self._died: EngineProcessDied | None = None
        self._reap_lock = threading.Lock()  # one waitpid at a time (two would race for the status)
        self._exitcode: int | None = None
        self._process = ctx.Process(
            target=_child_main,
            args=(step_child, prep_child, os.getpid(), factory, model, open_kwargs, on_phase is not None),
            name="duplex-engine",
            daemon=True,  # multiprocessing's exit handler ends it with a normally exiting parent
        )
        self._process.start()
        _register(self)
        # Only the child holds its ends now: its death is EOF on ours.
        step_child.close()
        prep_child.close()
        assert self._process.pid is not None
        self.pid: int = self._process.pid
        try:
            hello = self._receive(self._step_conn, "start")
            while isinstance(hello, PhaseReport):  # the child's start-up phases, as they go
                if on_phase is not None:
                    on_phase(hello)
                hello = self._receive(self._step_conn, "start")
        except BaseException:
            self._closing = True
            self._kill()
            raise
        assert isinstance(hello, _Hello)
        self._slots = hello.slots
        self._description = hello.description
        family = hello.family
        if hello.prompt_base is not None and hello.tokenizer is not None:
            import sentencepiece

            tokenizer = sentencepiece.SentencePieceProcessor()
            tokenizer.Load(hello.tokenizer)
            positions = PromptPositions(hello.prompt_base, family.default_voice, tokenizer)
            family = attrs.evolve(family, prompt_positions=positions)
        self._family = family
        self.start_s = time.perf_counter() - started
        self.build_s = hello.build_s
        watcher = threading.Thread(target=self._watch, name="duplex-engine-watch", daemon=True)
        watcher.start()
        log.info(
            "engine process %d ready in %.1f s (engine built in %.1f s)",
            self.pid,
            self.start_s,
            hello.build_s,
        )

    # -- the engine interface ------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return self._slots

    @property
    def family(self) -> ModelFamily:
        return self._family

    def describe(self) -> EngineDescription:
        return self._description

    def prepare(self, prompt: SessionPrompt) -> object:
        with self._prep_lock:
            self._call(self._prep_conn, ("prepare", prompt), "prepare")
        return None  # the snapshot stays in the child's cache

    def reset(self, slot: int, prompt: SessionPrompt | None) -> None:
        with self._step_lock:
            self._call(self._step_conn, ("reset", slot, prompt), "reset")

    def step(self, frames: Mapping[int, npt.NDArray[np.float32]]) -> Mapping[int, StepOutput]:
        with self._step_lock:
            outputs: Mapping[int, StepOutput] = self._call(self._step_conn, ("step", dict(frames)), "step")
        return outputs

    # -- life ------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._died is None and self._exitcode is None

    @property
    def exitcode(self) -> int | None:
        return self._exitcode

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """End the child: a clean ``close`` request, else (stuck, or a call in flight past
        ``timeout_s``) SIGKILL. Idempotent; later calls raise :class:`EngineProcessDied`."""
        if self._closing:
            return
        self._closing = True
        if self._died is None and self._step_lock.acquire(timeout=timeout_s):
            try:
                self._step_conn.send(("close",))
                if self._step_conn.poll(timeout_s):
                    self._step_conn.recv()
            except (OSError, EOFError):
                pass
            finally:
                self._step_lock.release()
        if self._reap(timeout_s) is None:
            log.warning("engine process %d did not exit in %.1f s: killing it", self.pid, timeout_s)
            self._kill()
        self._died = EngineProcessDied("the engine process is closed")
        for conn in (self._step_conn, self._prep_conn):
            conn.close()
        log.info("engine process %d closed (exit code %s)", self.pid, self._exitcode)

    def _reap(self, timeout_s: float | None) -> int | None:
        """The child's exit code once it has exited (within ``timeout_s``), else None."""
        with self._reap_lock:
            if self._exitcode is None:
                self._process.join(timeout_s)
                self._exitcode = self._process.exitcode
            return self._exitcode

    def _kill(self) -> None:
        self._process.kill()
        self._reap(None)

    def _watch(self) -> None:
        """Log the child's death as soon as it happens, even between calls."""
        multiprocessing.connection.wait([self._process.sentinel])
        code = self._reap(None)
        if not self._closing:
            log.error("engine process %d exited unexpectedly with code %s", self.pid, code)

    def _dead(self) -> EngineProcessDied:
        if self._died is None:
            code = self._reap(CLOSE_TIMEOUT_S)
            how = (
                f"was killed by signal {-code}"
                if code is not None and code < 0
                else f"exited with code {code}"
            )
            self._died = EngineProcessDied(f"the engine process (pid {self.pid}) {how}")
        return self._died

    def _call(self, conn: Connection, request: tuple[Any, ...], what: str) -> Any:
        if self._died is not None:
            raise self._died
        try:
            conn.send(request)
        except OSError:
            raise self._dead() from None
        return self._receive(conn, what)

    def _receive(self, conn: Connection, what: str) -> Any:
        try:
            reply = conn.recv()
        except (EOFError, OSError):
            if self._died is not None:  # closed while this call waited
                raise self._died from None
            raise self._dead() from None
        status, value, *rest = reply
        if status == "ok":
            return value
        assert isinstance(value, BaseException)
        value.__cause__ = RemoteTraceback(rest[0] if rest else "")
        raise value


# Closed before multiprocessing's own exit handler (atexit runs the later registration first),
# which would SIGTERM the child (ignored) and then wait for it forever.
_live: weakref.WeakSet[EngineProcess] = weakref.WeakSet()
_atexit_registered = False


def _register(process: EngineProcess) -> None:
    global _atexit_registered
    _live.add(process)
    if not _atexit_registered:
        atexit.register(_close_live)
        _atexit_registered = True


def _close_live() -> None:
    for process in list(_live):
        process.close()


# -- the child ------------------------------------------------------------------------------------
def _child_main(
    step_conn: Connection,
    prep_conn: Connection,
    parent_pid: int,
    factory: Callable[..., Any] | None,
    model: str,
    open_kwargs: dict[str, Any],
    report_phases: bool = False,
) -> None:
    for name in _IGNORED_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="parent-watch", daemon=True).start()
    started = time.perf_counter()
    try:
        if report_phases:
            sink = lambda report: step_conn.send(("ok", report))  # noqa: E731
            import_engine(Startup(sink))
            open_kwargs = {**open_kwargs, "on_phase": sink}
        from .factory import open_served_engine

        engine = (factory or open_served_engine)(model, **open_kwargs)
        hello = _hello(engine, time.perf_counter() - started)
    except BaseException as exc:
        _reply_error(step_conn, exc)
        return
    try:
        step_conn.send(("ok", hello))
    except OSError:
        return
    threading.Thread(target=_serve_prepares, args=(engine, prep_conn), name="prepare", daemon=True).start()
    while True:
        try:
            request = step_conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        kind = request[0]
        try:
            if kind == "step":
                value: Any = engine.step(request[1])
            elif kind == "reset":
                engine.reset(request[1], request[2])
                value = None
            elif kind == "close":
                step_conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown engine request {kind!r}")
        except Exception as exc:
            if not _reply_error(step_conn, exc):
                return
            continue
        try:
            step_conn.send(("ok", value))
        except OSError:
            return


def _serve_prepares(engine: Any, conn: Connection) -> None:
    while True:
        try:
            _, prompt = conn.recv()
        except (EOFError, OSError):
            return
        try:
            engine.prepare(prompt)  # the snapshot stays in the child's cache; the caller uses none
        except Exception as exc:
            if not _reply_error(conn, exc):
                return
            continue
        try:
            conn.send(("ok", None))
        except OSError:
            return


def _reply_error(conn: Connection, exc: BaseException) -> bool:
    """Send ``exc`` (or, if it does not pickle, a ModelError with its type and message)."""
    tb = "".join(traceback.format_exception(exc))
    try:
        pickle.loads(pickle.dumps(exc))
        sent: BaseException = exc
    except Exception:
        sent = ModelError(f"{type(exc).__name__}: {exc}")
    sent.__traceback__ = None
    sent.__cause__ = sent.__context__ = None
    try:
        conn.send(("error", sent, tb))
    except OSError:
        return False
    return True


def prompt_length_table(engine: Any) -> tuple[dict[str, int] | None, str | None]:
    """What another process needs to check prompt lengths without the engine: per voice the
    prefill positions of an empty persona, and the tokenizer's file (None, None: no check)."""
    from .moshi_engine import MoshiEngine
    from .personaplex import prefill_positions

    family: ModelFamily = engine.family
    if family.prompt_positions is None or not isinstance(engine, MoshiEngine):
        return None, None
    base = {name: prefill_positions(engine.voice(name), 0) for name in family.voices}
    return base, str(engine.checkpoint.files.tokenizer)


def _hello(engine: Any, build_s: float) -> _Hello:
    family: ModelFamily = engine.family
    base, tokenizer = prompt_length_table(engine)
    return _Hello(
        pid=os.getpid(),
        slots=engine.slots,
        description=engine.describe(),
        family=attrs.evolve(family, prompt_positions=None),
        prompt_base=base,
        tokenizer=tokenizer,
        build_s=build_s,
    )


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)
