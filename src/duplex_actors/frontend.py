"""One front end: hypercorn's trio worker serving the app on a listening socket it was given.

``duplex-actors serve`` starts K of them (``supervisor.py``), each with its own listening
socket on the same port (``SO_REUSEPORT``: the kernel spreads connections over them) and the
engine core's address. ``python -m duplex_actors.frontend`` is that process; what it serves is
in ``DUPLEX_FRONTEND`` (a :class:`FrontEndSpec`, pickled, base64). Signals come from the
supervisor: SIGTERM drains (every session ``session.closing`` + 1012, logs finished, exit 0),
SIGUSR1 stops taking new sessions, SIGUSR2 takes them again.

``DUPLEX_FRONTEND_PROFILE=PATH`` (a tool for measuring the per-frame path, as
``bench/append_path.py --profile-server`` uses it): each front end runs under cProfile and writes
its statistics to ``PATH.I`` (I: its index) when it exits.
"""

from __future__ import annotations

import base64
import cProfile
import logging
import os
import pickle
import signal
import sys
from typing import NoReturn

import attrs
import trio

from .config import ServerConfig
from .heap import freeze_heap
from .procname import set_process_name

SPEC_ENV = "DUPLEX_FRONTEND"
PROFILE_ENV = "DUPLEX_FRONTEND_PROFILE"
log = logging.getLogger("duplex_actors.frontend")
PARENT_CHECK_S = 0.5
PARENT_GONE_GRACE_S = 5.0  # beyond the drain: time for the link to report the core's loss


@attrs.frozen(slots=True)
class FrontEndSpec:
    config: ServerConfig
    index: int
    listen_fd: int
    drain_timeout_s: float
    switch_interval_ms: float
    url: str
    count: int = 1  # front ends of this server


def encode_spec(spec: FrontEndSpec) -> str:
    return base64.b64encode(pickle.dumps(spec)).decode("ascii")


async def serve_frontend(spec: FrontEndSpec) -> None:
    """Serve until SIGTERM (drained) or SIGINT."""
    from hypercorn.trio import serve

    from .app import create_app
    from .web.hardening import HardenedConfig

    config = spec.config
    hyper = HardenedConfig()
    hyper.bind = [f"fd://{spec.listen_fd}"]
    hyper.accesslog = None
    hyper.websocket_max_message_size = config.max_message_bytes
    if config.keep_alive_timeout_s is not None:
        hyper.keep_alive_timeout = config.keep_alive_timeout_s
    # Our drain has already closed every session and finished its log; hypercorn's own grace
    # only has to let handlers return (a send blocked on a stuck client never would).
    hyper.graceful_timeout = 1.0
    app = create_app(config)
    holder = app.holder
    holder.frontend = (spec.index, spec.count)
    # The model cannot be served: serve says so in one line and exits; this front end just ends.
    holder.on_fatal = lambda line: _exit(2)
    stop = trio.Event()
    name = f"front end {spec.index}"

    async def on_signals() -> None:
        # The receiver stays open while draining, so a second SIGTERM cannot kill us midway.
        with trio.open_signal_receiver(
            signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2
        ) as signals:
            draining = False
            async for signum in signals:
                if signum == signal.SIGUSR1:
                    holder.pause()
                    continue
                if signum == signal.SIGUSR2:
                    holder.resume()
                    continue
                if not draining:
                    draining = True
                    nursery.start_soon(drain)

    async def drain() -> None:
        started = trio.current_time()
        await holder.drain(spec.drain_timeout_s)
        log.info("%s: drained in %.2f s", name, trio.current_time() - started)
        stop.set()
        # Every session is closed and its log finished. A socket whose client stopped reading
        # can keep hypercorn's shielded send (and so the exit) waiting until TCP gives up
        # (TCP_USER_TIMEOUT, 15 s): do not let it hold the process past the grace.
        await trio.sleep(hyper.graceful_timeout)
        print(f"duplex-actors: {name}: drained; a stuck connection remains, exiting anyway", flush=True)
        sys.stdout.flush()
        _exit(0)

    async def on_core_lost() -> None:
        # The engine core runs in the supervisor's process: it is gone too, and nothing
        # will restart this front end. Its sessions have ended (1011): finish the connections.
        await holder.core_lost.wait()
        print(f"duplex-actors: {name}: the engine core is gone, exiting", flush=True)
        await holder.drain(spec.drain_timeout_s)
        sys.stdout.flush()
        _exit(1)

    async def watch_parent() -> None:
        # serve is the engine core: without it nothing is served, and nothing restarts us.
        parent = os.getppid()
        while os.getppid() == parent:
            await trio.sleep(PARENT_CHECK_S)
        # The core died with its process, so its link reports the loss and on_core_lost ends
        # the connections with their 1011 before exiting; exiting first would cut them (1006).
        # This exit is for a link that never reports it.
        await trio.sleep(spec.drain_timeout_s + PARENT_GONE_GRACE_S)
        _exit(1)

    async def freeze_serving_heap() -> None:
        await holder.serving.wait()
        frozen = freeze_heap()  # heap.py: full collections no longer scan the app and its server
        log.info("%s: serving heap frozen (%d objects)", name, frozen)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(freeze_serving_heap)
        nursery.start_soon(on_signals)
        nursery.start_soon(on_core_lost)
        nursery.start_soon(watch_parent)
        await serve(app, hyper, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
        nursery.cancel_scope.cancel()


_profile: tuple[cProfile.Profile, str] | None = None  # DUPLEX_FRONTEND_PROFILE's, once enabled


def _dump_profile() -> None:
    global _profile
    if _profile is not None:
        profiler, path = _profile
        _profile = None
        profiler.disable()
        profiler.dump_stats(path)


def _exit(code: int) -> NoReturn:
    _dump_profile()
    os._exit(code)


def main() -> None:
    global _profile
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec: FrontEndSpec = pickle.loads(base64.b64decode(os.environ[SPEC_ENV]))
    set_process_name(f"duplex-fe-{spec.index}")
    # The front end's loop takes the GIL back after each sleep of the codec or log threads.
    sys.setswitchinterval(spec.switch_interval_ms / 1000)
    profile_path = os.environ.get(PROFILE_ENV)
    if profile_path:
        _profile = (cProfile.Profile(), f"{profile_path}.{spec.index}")
        _profile[0].enable()
    try:
        trio.run(serve_frontend, spec)
    finally:
        _dump_profile()


if __name__ == "__main__":
    main()
