"""``duplex-actors serve``: the engine core in this process, K front ends beside it.

This process holds the log dir's lock, truncates the torn tails a crash left, runs the engine
core (``engine_core.py``: the model, the slot table, admission, the tick policy, the batching)
and starts K front-end processes (``frontend.py``), each with its own listening socket on the
one port (``SO_REUSEPORT``; this process keeps a copy of each, so connections that arrive while
a front end restarts wait in its backlog). It watches them:

- a front end that exits on its own (a crash, a kill) is started again after a short backoff;
  the core has reset and freed the slots its sessions held, and only its sessions ended;
- SIGTERM/SIGINT drains: every front end gets SIGTERM (its sessions ``session.closing`` +
  1012, logs finished), then the core stops, exit 0;
- SIGUSR1/SIGUSR2 are passed to every front end (stop / resume taking new sessions).

If the engine core fails (its scheduler raises), every front end reports it (``/ready`` and
``/health`` 503, sessions end 1011); if this process dies, the front ends see the core's link
close, end their sessions and exit.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time

import attrs
import trio

from .config import ServerConfig
from .core.link import engine_core_address
from .engine_core import (
    CoreSettings,
    CoreStart,
    CoreStartFailed,
    core_settings,
    prepare_log_dir,
    run_engine_core,
    start_failures,
)
from .frontend import SPEC_ENV, FrontEndSpec, encode_spec
from .procname import set_process_name

log = logging.getLogger("duplex_actors.supervisor")

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
# A front end that ran this long before it died starts again with the shortest backoff.
STABLE_RUN_S = 30.0
LISTEN_BACKLOG = 1024
# The exit status when the model cannot be served (as a bad setting's).
FATAL_EXIT_CODE = 2


def default_frontends(cores: int | None = None) -> int:
    """min(4, cores - 1), at least 1: one core is the engine core's (and the engine's threads)."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(4, cores - 1))


def listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` TCP sockets listening on ``host:port`` together (``SO_REUSEPORT``)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind(address)
            sock.listen(LISTEN_BACKLOG)
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Supervisor:
    def __init__(
        self,
        config: ServerConfig,
        *,
        host: str,
        port: int,
        frontends: int,
        drain_timeout_s: float,
        switch_interval_ms: float,
        recovered_logs: int = 0,
    ) -> None:
        self.config = config
        self.recovered_logs = recovered_logs
        self.host = host
        self.port = port
        self.frontends = frontends
        self.drain_timeout_s = drain_timeout_s
        self.switch_interval_ms = switch_interval_ms
        self.processes: dict[int, trio.Process] = {}
        self.stopping = False
        self.address = engine_core_address(config.log_dir) + f"-{os.getpid()}"

    async def run(self, sockets: list[socket.socket]) -> None:
        """Serve until drained; ``CoreStartFailed`` when the model cannot be served."""
        settings: CoreSettings = attrs.evolve(core_settings(self.config), recovered_logs=self.recovered_logs)
        async with trio.open_nursery() as nursery:
            # The front ends start while the core loads: their /ready shows its phases.
            start = await nursery.start(run_engine_core, settings, self.address)
            for index, sock in enumerate(sockets):
                nursery.start_soon(self._keep_running, index, sock)
            print(
                f"duplex-actors: starting {self.config.model} on http://{self.host}:{self.port}: "
                "/ready shows the start-up",
                flush=True,
            )
            nursery.start_soon(self._announce, start)
            await self._signals()
            nursery.cancel_scope.cancel()

    async def _announce(self, start: CoreStart) -> None:
        await start.settled.wait()
        if start.core is not None:
            print(
                f"duplex-actors: serving {self.config.model} on http://{self.host}:{self.port} "
                f"({self.frontends} front end{'s' if self.frontends != 1 else ''}, engine core pid {os.getpid()})",
                flush=True,
            )

    async def _keep_running(self, index: int, sock: socket.socket) -> None:
        config = self.config
        if index > 0 and config.agent_port is not None:
            # One agent responder per server: it answers for all of them (the core's slots).
            config = attrs.evolve(config, agent_port=None)
        config = _with_core(config, self.address)
        spec = FrontEndSpec(
            config=config,
            index=index,
            listen_fd=sock.fileno(),
            drain_timeout_s=self.drain_timeout_s,
            switch_interval_ms=self.switch_interval_ms,
            url=f"http://{self.host}:{self.port}",
            count=self.frontends,
        )
        failures = 0
        while not self.stopping:
            started = time.monotonic()
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "duplex_actors.frontend"],
                pass_fds=(sock.fileno(),),
                env={**os.environ, SPEC_ENV: encode_spec(spec)},
            )
            self.processes[index] = process
            try:
                code = await process.wait()
            finally:
                if self.processes.get(index) is process:
                    del self.processes[index]
            if self.stopping or code == FATAL_EXIT_CODE:
                return  # draining, or the model cannot be served (the core says why)
            failures = 0 if time.monotonic() - started > STABLE_RUN_S else failures + 1
            backoff = (
                RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S)) - 1]
                if failures
                else RESTART_BACKOFF_S[0]
            )
            log.error(
                "front end %d (pid %d) exited with code %s: starting it again in %.1f s",
                index,
                process.pid,
                code,
                backoff,
            )
            await trio.sleep(backoff)

    async def _signals(self) -> None:
        with trio.open_signal_receiver(
            signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2
        ) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum in (signal.SIGUSR1, signal.SIGUSR2):
                    state = (
                        "taking no new sessions" if signum == signal.SIGUSR1 else "taking new sessions again"
                    )
                    print(f"duplex-actors: {name}: {state}", flush=True)
                    self._forward(signum)
                    continue
                if self.stopping:
                    print(f"duplex-actors: {name}: already draining", flush=True)
                    continue
                self.stopping = True
                print(f"duplex-actors: {name}: draining", flush=True)
                await self._drain()
                # Every front end has drained and exited (their sessions closed, their logs
                # finished): the core holds nothing that outlives it. Its interpreter's teardown
                # (torch's included) would only delay the exit.
                print("duplex-actors: drained", flush=True)
                os._exit(0)

    def _forward(self, signum: int) -> None:
        for process in list(self.processes.values()):
            try:
                process.send_signal(signum)
            except ProcessLookupError:
                pass

    async def _drain(self) -> None:
        self._forward(signal.SIGTERM)
        # A front end drains within drain_timeout_s, then hypercorn's grace and its own guard.
        with trio.move_on_after(self.drain_timeout_s + 5.0) as timer:
            for process in list(self.processes.values()):
                await process.wait()
        if timer.cancelled_caught:
            for process in list(self.processes.values()):
                log.warning("front end pid %d did not exit after the drain: killing it", process.pid)
                process.kill()


def _with_core(config: ServerConfig, address: str) -> ServerConfig:
    return attrs.evolve(config, engine_core=address)


def serve(
    config: ServerConfig,
    *,
    host: str,
    port: int,
    frontends: int,
    drain_timeout_s: float,
    switch_interval_ms: float,
) -> int:
    """Run a whole server; the exit status (2: the log dir or the port cannot be had)."""
    from .log.lock import LogDirLocked

    try:
        recovered = prepare_log_dir(config.log_dir)  # the lock is held until this process exits
    except LogDirLocked as exc:
        print(f"duplex-actors: {exc}", file=sys.stderr)
        return 2
    try:
        sockets = listening_sockets(host, port, frontends)
    except OSError as exc:
        print(f"duplex-actors: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 2
    # The engine thread needs the GIL back after every torch call; a busy loop in this process
    # (the core's links) must not hold it for the default 5 ms.
    sys.setswitchinterval(switch_interval_ms / 1000)
    set_process_name("duplex-engine")  # the engine core runs here (bench/ceiling.py tells it so)
    supervisor = Supervisor(
        config,
        recovered_logs=recovered,
        host=host,
        port=port,
        frontends=frontends,
        drain_timeout_s=drain_timeout_s,
        switch_interval_ms=switch_interval_ms,
    )
    failed: list[str] = []
    try:
        trio.run(supervisor.run, sockets)
    except* CoreStartFailed as group:
        failed.extend(exc.line for exc in start_failures(group))
    if failed:
        print(f"duplex-actors: {failed[0]}", file=sys.stderr, flush=True)
        return FATAL_EXIT_CODE
    return 0
