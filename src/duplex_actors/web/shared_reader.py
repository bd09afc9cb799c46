"""One task reads every streaming WebSocket's socket (a trio shell around a private epoll).

A front end's clients send a frame every 80 ms, all within a few milliseconds of each other
(the pre-tick burst). Read the way hypercorn reads, each message wakes its connection's task:
trio registers the socket for one readiness (an ``epoll_ctl`` per read), schedules the task,
and resumes its stack of coroutines, all of it a frame old and out of the caches by then. Here
a connection that streams parks its task once, its socket stays registered in one epoll, and
the reader reads every ready socket in turn and hands the bytes to the connection's
``on_data``, which delivers what it can at once (web/hardening.py: the leading data frames,
offered to the app without a task hop).

The connection's task wakes only for what ``on_data`` leaves to it: a read that holds more
than whole data frames the app took at once, the peer's EOF, a read error, or an exception
``on_data`` raised (raised in that task, as if it had read). Its socket leaves the epoll then,
and whenever the task is cancelled, so a socket is never read by two tasks.
"""

from __future__ import annotations

import contextvars
import os
import select
from collections.abc import Callable
from typing import Any, Final

import attrs
import outcome
import trio

READ_BYTES: Final = 65536
READ_FAILED: Final = object()  # the value a parked task gets for a read that raised OSError


@attrs.define(slots=True)
class _Parked:
    task: trio.lowlevel.Task
    context: contextvars.Context
    on_data: Callable[[bytes], Any]


class SharedReader:
    """The reader of one trio run (:func:`shared_reader`)."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._parked: dict[int, _Parked] = {}
        self._running = False

    @property
    def parked(self) -> int:
        """Connections whose socket this reader reads now."""
        return len(self._parked)

    async def wait(self, fd: int, on_data: Callable[[bytes], Any]) -> Any:
        """Park until a read of ``fd`` is left to the caller: returns what ``on_data`` returned
        that was not None (it is called with each read's bytes, ``b""`` at the peer's EOF), or
        :data:`READ_FAILED`; raises what ``on_data`` raised. Cancellable: the socket leaves
        the epoll at once."""
        if not self._running:
            self._running = True
            trio.lowlevel.spawn_system_task(self._run, name="duplex_actors.web.shared_reader")
        task = trio.lowlevel.current_task()
        await trio.lowlevel.checkpoint_if_cancelled()
        # A task still parked on this number had its socket closed without :meth:`release`
        # (the kernel dropped it from the epoll): it is woken, not left parked for good.
        self.release(fd)
        self._parked[fd] = _Parked(task, task.context, on_data)
        try:
            self._epoll.register(fd, select.EPOLLIN)
        except OSError:
            del self._parked[fd]
            return READ_FAILED

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._forget(fd)
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    def release(self, fd: int) -> None:
        """``fd`` is about to be closed: its parked task, if any, gets :data:`READ_FAILED` (a
        closed descriptor leaves the epoll without a word, and nothing would wake it)."""
        self._hand_back(fd, outcome.Value(READ_FAILED))

    def _forget(self, fd: int) -> _Parked | None:
        parked = self._parked.pop(fd, None)
        if parked is not None:
            try:
                self._epoll.unregister(fd)
            except OSError:  # closed already: the kernel dropped it
                pass
        return parked

    def _hand_back(self, fd: int, result: outcome.Outcome[Any]) -> None:
        parked = self._forget(fd)
        if parked is not None:
            trio.lowlevel.reschedule(parked.task, result)

    async def _run(self) -> None:
        epoll = self._epoll
        parked_by_fd = self._parked
        try:
            while True:
                await trio.lowlevel.wait_readable(epoll.fileno())
                for fd, _ in epoll.poll(0):
                    # A task cancelled meanwhile (in an earlier connection's on_data) is gone.
                    parked = parked_by_fd.get(fd)
                    if parked is None:
                        continue
                    try:
                        data = os.read(fd, READ_BYTES)
                    except BlockingIOError:
                        continue
                    except OSError:
                        self._hand_back(fd, outcome.Value(READ_FAILED))
                        continue
                    try:
                        left = parked.context.run(parked.on_data, data)
                    except Exception as exc:
                        self._hand_back(fd, outcome.Error(exc))
                        continue
                    if left is not None:
                        self._hand_back(fd, outcome.Value(left))
        finally:
            for fd in list(parked_by_fd):
                self._hand_back(fd, outcome.Error(trio.ClosedResourceError("the front end is stopping")))
            epoll.close()


_READER: Final = trio.lowlevel.RunVar["SharedReader"]("duplex_actors_shared_reader")


def release_if_parked(fd: int) -> None:
    """:meth:`SharedReader.release` in this trio run, when it has a reader."""
    try:
        reader = _READER.get()
    except LookupError:
        return
    reader.release(fd)


def shared_reader() -> SharedReader:
    """This trio run's reader (made on first use)."""
    try:
        return _READER.get()
    except LookupError:
        reader = SharedReader()
        _READER.set(reader)
        return reader
