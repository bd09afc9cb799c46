"""The front end's one reader of streaming sockets (web/shared_reader.py), on real socketpairs."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
import trio
import trio.testing

from duplex_actors.web.shared_reader import READ_FAILED, release_if_parked, shared_reader


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    return a, b


async def test_reads_go_to_on_data_and_only_what_it_leaves_wakes_the_task():
    """Every read of a parked socket goes to its ``on_data`` in the reader's task; the parked
    task wakes only with what ``on_data`` returns that is not None, and its socket then leaves
    the epoll (a later write is not read until the task parks again)."""
    reader = shared_reader()
    pairs = [_pair() for _ in range(3)]
    seen: dict[int, list[bytes]] = {i: [] for i in range(3)}
    woke: dict[int, Any] = {}
    tasks: dict[int, trio.lowlevel.Task] = {}

    def on_data(i: int, data: bytes) -> Any:
        tasks.setdefault(-i - 1, trio.lowlevel.current_task())
        seen[i].append(data)
        return ("left", data) if data.startswith(b"!") else None

    async def park(i: int) -> None:
        tasks[i] = trio.lowlevel.current_task()
        woke[i] = await reader.wait(pairs[i][0].fileno(), lambda data: on_data(i, data))

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(park, i)
        await trio.testing.wait_all_tasks_blocked()
        assert reader.parked == 3
        for _ in range(2):
            for i in range(3):
                pairs[i][1].send(b"frame %d" % i)
            await trio.testing.wait_all_tasks_blocked()
        assert woke == {}
        assert seen == {i: [b"frame %d" % i] * 2 for i in range(3)}
        assert tasks[-1] is tasks[-2] is tasks[-3]  # one task read them all
        assert all(tasks[-1] is not tasks[i] for i in range(3))
        pairs[1][1].send(b"!ping")
        await trio.testing.wait_all_tasks_blocked()
        assert woke == {1: ("left", b"!ping")}
        assert reader.parked == 2
        pairs[1][1].send(b"not read: nobody parks it")
        await trio.testing.wait_all_tasks_blocked()
        assert seen[1] == [b"frame 1", b"frame 1", b"!ping"]
        assert pairs[1][0].recv(100) == b"not read: nobody parks it"
        nursery.cancel_scope.cancel()
    assert reader.parked == 0
    for a, b in pairs:
        a.close()
        b.close()


async def test_the_peers_eof_and_an_error_in_on_data_reach_the_task():
    reader = shared_reader()
    a, b = _pair()
    c, d = _pair()

    def eof_or_none(data: bytes) -> Any:
        return "eof" if data == b"" else None

    def broken(data: bytes) -> Any:
        raise ValueError("a bad message")

    b.close()
    assert await reader.wait(a.fileno(), eof_or_none) == "eof"
    d.send(b"x")
    with pytest.raises(ValueError, match="a bad message"):
        await reader.wait(c.fileno(), broken)
    assert reader.parked == 0
    for s in (a, c, d):
        s.close()


async def test_a_cancelled_wait_leaves_the_epoll_and_a_released_socket_wakes_its_task():
    reader = shared_reader()
    a, b = _pair()
    calls: list[bytes] = []
    with trio.move_on_after(0.05):
        await reader.wait(a.fileno(), lambda data: calls.append(data))
    assert reader.parked == 0
    b.send(b"after the cancel")
    await trio.sleep(0.05)
    assert calls == []  # its socket left the epoll with the cancel

    result: list[Any] = []

    async def park() -> None:
        result.append(await reader.wait(a.fileno(), lambda data: calls.append(data)))

    a.recv(100)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(park)
            await trio.testing.wait_all_tasks_blocked()
            assert reader.parked == 1
            release_if_parked(a.fileno())  # as before the socket is closed
    assert result == [READ_FAILED]
    assert reader.parked == 0
    a.close()
    b.close()


async def test_a_number_parked_again_wakes_the_task_whose_socket_was_closed_under_it():
    """A socket closed without a release leaves the epoll without a word; when its number
    comes back for another connection, the task still parked on it is woken, never left."""
    reader = shared_reader()
    a, b = _pair()
    fd = a.fileno()
    result: list[Any] = []

    async def park() -> None:
        result.append(await reader.wait(fd, lambda data: "old"))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(park)
            await trio.testing.wait_all_tasks_blocked()
            c, d = _pair()  # made while fd is taken: another number
            a.close()
            b.close()
            os.dup2(c.fileno(), fd)  # the number comes back, as for the next connection accepted
            d.send(b"new")
            assert await reader.wait(fd, lambda data: ("new", data)) == ("new", b"new")
    assert result == [READ_FAILED]
    os.close(fd)
    c.close()
    d.close()
