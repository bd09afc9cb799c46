"""The session inbox: commands wait for room, results never wait, every put is a checkpoint."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from duplex_actors.session.inbox import Inbox


async def test_put_command_is_a_checkpoint_even_with_room() -> None:
    inbox: Inbox[str] = Inbox(max_commands=4)
    with trio.testing.assert_checkpoints():
        await inbox.put_command("a")
    assert await inbox.get() == "a"


async def test_a_cancelled_put_command_queues_nothing() -> None:
    inbox: Inbox[str] = Inbox(max_commands=4)
    with trio.CancelScope() as scope:
        scope.cancel()
        await inbox.put_command("a")
    assert scope.cancelled_caught and len(inbox) == 0


async def test_commands_wait_for_room_and_results_never_wait() -> None:
    inbox: Inbox[str] = Inbox(max_commands=1)
    await inbox.put_command("c1")
    inbox.put_result_nowait("r1")  # past the command bound: results are not bounded by it
    async with trio.open_nursery() as nursery:
        nursery.start_soon(inbox.put_command, "c2")
        await trio.testing.wait_all_tasks_blocked()
        assert len(inbox) == 2  # c2 waits for c1 to be taken
        assert await inbox.get() == "c1"
        await trio.testing.wait_all_tasks_blocked()
        assert [await inbox.get(), await inbox.get()] == ["r1", "c2"]


async def test_put_command_after_close_raises() -> None:
    inbox: Inbox[str] = Inbox()
    inbox.close()
    with pytest.raises(trio.ClosedResourceError):
        await inbox.put_command("a")
