"""receiver_waits_idle against trio's own statistics, in every state the direct paths meet."""

from __future__ import annotations

import trio
import trio.testing

from duplex_actors.web import channel_state
from duplex_actors.web.channel_state import receiver_waits_idle


def by_statistics(channel: trio.MemoryReceiveChannel[int]) -> bool:
    stats = channel.statistics()
    return bool(stats.tasks_waiting_receive) and not stats.current_buffer_used


async def test_it_answers_as_statistics_do() -> None:
    assert channel_state._READS_STATE  # the installed trio's layout is the one it reads
    send, receive = trio.open_memory_channel[int](4)
    seen: list[tuple[bool, bool]] = []

    def both() -> None:
        seen.append((receiver_waits_idle(receive), by_statistics(receive)))

    both()  # nobody waits, nothing queued
    send.send_nowait(1)
    both()  # queued, nobody waits
    receive.receive_nowait()
    async with trio.open_nursery() as nursery:
        got: list[int] = []

        async def reader() -> None:
            got.append(await receive.receive())

        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        both()  # a reader waits, nothing queued: the only True
        send.send_nowait(2)  # handed to the waiting reader, which has not run yet
        both()
    both()
    assert got == [2]
    assert seen == [(False, False), (False, False), (True, True), (False, False), (False, False)]


def test_without_the_state_it_asks_statistics(monkeypatch) -> None:
    monkeypatch.setattr(channel_state, "_READS_STATE", False)
    send, receive = trio.open_memory_channel[int](1)
    assert receiver_waits_idle(receive) is False
    send.send_nowait(1)
    assert receiver_waits_idle(receive) is False
