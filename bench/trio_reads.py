"""What trio's scheduling of one socket read costs: N sockets each read by its own task (as
hypercorn reads each connection) against one task that reads every ready socket through a
private epoll. CPU time of the event loop's thread per message; the writer is a thread of the
same process, as bursty as aligned clients (one small message to every socket, every
``--period-ms``: 10 by default; 80, a frame's period, leaves every socket's task and buffers a
frame old at each message, as in a served front end).

    .venv/bin/python bench/trio_reads.py [--sockets 64] [--rounds 400] [--period-ms 10]
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import threading
import time

import trio


def measure(mode: str, sockets: int, rounds: int, period_s: float = 0.01) -> float:
    pairs = [socket.socketpair() for _ in range(sockets)]
    for a, b in pairs:
        a.setblocking(False)
        b.setblocking(False)
    count = 0

    async def per_socket(sock: socket.socket) -> None:
        nonlocal count
        fd = sock.fileno()
        while True:
            await trio.lowlevel.wait_readable(sock)
            os.read(fd, 65536)
            count += 1

    async def one_reader() -> None:
        nonlocal count
        poller = select.epoll()
        for a, _ in pairs:
            poller.register(a.fileno(), select.EPOLLIN)
        while True:
            await trio.lowlevel.wait_readable(poller.fileno())
            for fd, _ in poller.poll(0):
                os.read(fd, 65536)
                count += 1

    def writer() -> None:
        for _ in range(rounds):
            for _, b in pairs:
                b.send(b"x" * 200)
            time.sleep(period_s)

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            if mode == "task-per-socket":
                for a, _ in pairs:
                    nursery.start_soon(per_socket, a)
            else:
                nursery.start_soon(one_reader)
            t0 = time.thread_time()
            thread = threading.Thread(target=writer)
            thread.start()
            await trio.to_thread.run_sync(thread.join)
            await trio.sleep(0.05)
            spent = time.thread_time() - t0
            nursery.cancel_scope.cancel()
        return 1e6 * spent / count

    try:
        return trio.run(main)
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--period-ms", type=float, default=10.0, help="between two bursts")
    args = parser.parse_args()
    for mode in ("task-per-socket", "one-reader"):
        spent = measure(mode, args.sockets, args.rounds, args.period_ms / 1000)
        print(f"{mode:16} {spent:6.2f} µs per message (loop thread CPU)")


if __name__ == "__main__":
    main()
