"""A small client of HAProxy's runtime API (the ``stats socket``): membership without reloads.

A reload would cut every live WebSocket tunnel, so GPU processes join and leave a running
HAProxy through its runtime API. The same commands work with ``socat``; see docs/scaling.md::

    python -m duplex_actors.scaleout.haproxy --socket /run/haproxy/admin.sock \\
        add duplex/gpu0 10.0.0.5:8000 --agent-port 8001 --maxconn 8
    python -m duplex_actors.scaleout.haproxy --socket ... remove duplex/gpu0
    python -m duplex_actors.scaleout.haproxy --socket ... state duplex

Each process is added twice under one name: to ``duplex`` (new sessions: maxconn and drain from
its agent) and to ``duplex_resume`` (resumes, routed by the session id to the process that holds
the session; no maxconn, no agent). deploy/haproxy/haproxy.cfg says why.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time

import attrs

# The server parameters every GPU process gets (dynamic servers take no `default-server`).
SERVER_PARAMS = (
    "check inter 500ms fastinter 250ms downinter 1s fall 2 rise 2"
    " observe layer4 error-limit 1 on-error mark-down"
    " agent-check agent-inter 1s"
)
# The same process in the resume backend: liveness only. No maxconn (a resume takes no new slot,
# and must reach a full or draining process), no agent (its drain and maxconn are not for resumes).
RESUME_SERVER_PARAMS = (
    "check inter 500ms fastinter 250ms downinter 1s fall 2 rise 2"
    " observe layer4 error-limit 1 on-error mark-down"
)
RESUME_SUFFIX = "_resume"


class RuntimeError_(Exception):
    """HAProxy answered a command with an error."""


@attrs.frozen(slots=True)
class ServerState:
    name: str
    address: str
    port: int
    operational: int  # 0 stopped (DOWN), 1 starting, 2 running (UP), 3 stopping
    admin: int  # flags: 0x01 forced, 0x02 inherited, 0x04 configured, 0x20 DNS maintenance; 0x08/0x10 drain
    weight: int

    @property
    def up(self) -> bool:
        return self.operational == 2

    @property
    def down(self) -> bool:
        return self.operational == 0

    @property
    def draining(self) -> bool:
        return bool(self.admin & 0x18)

    @property
    def maintenance(self) -> bool:
        return bool(self.admin & 0x27)


class RuntimeAPI:
    def __init__(self, path: str, timeout: float = 5.0) -> None:
        self.path = path
        self.timeout = timeout

    def command(self, line: str) -> str:
        """Send one command (non-interactive mode) and return the whole answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
        return b"".join(chunks).decode("utf-8", "replace")

    def checked(self, line: str) -> str:
        out = self.command(line)
        lowered = out.lower()
        if any(
            word in lowered for word in ("unknown", "error", "not found", "no such", "invalid", "require")
        ):
            raise RuntimeError_(f"{line!r}: {out.strip()}")
        return out

    # -- membership ------------------------------------------------------------------------------
    def add_server(
        self,
        backend: str,
        name: str,
        address: str,
        *,
        agent_port: int,
        maxconn: int = 1,
        params: str = SERVER_PARAMS,
        resume: bool = True,
    ) -> None:
        """Add a GPU process and start checking it. ``maxconn`` holds until the first agent
        answer (at most ``agent-inter``) brings the process's own figure. With ``resume``, it
        first joins ``<backend>_resume`` under the same name, so that the resumes of its
        sessions can reach it from their first open on."""
        if resume:
            self.checked(f"add server {backend}{RESUME_SUFFIX}/{name} {address} {RESUME_SERVER_PARAMS}")
            self.checked(f"enable health {backend}{RESUME_SUFFIX}/{name}")
            self.checked(f"enable server {backend}{RESUME_SUFFIX}/{name}")
        self.checked(
            f"add server {backend}/{name} {address} maxconn {maxconn} {params} agent-port {agent_port}"
        )
        self.checked(f"enable health {backend}/{name}")
        self.checked(f"enable agent {backend}/{name}")
        self.checked(f"enable server {backend}/{name}")

    def remove_server(self, backend: str, name: str, *, wait_s: float = 0.0, resume: bool = True) -> None:
        """Stop sending it sessions and resumes, wait up to ``wait_s`` for its connections to
        end, delete it (from ``<backend>_resume`` too, with ``resume``). (``del server`` refuses
        while it still has connections: drain it first.)"""
        self.checked(f"disable agent {backend}/{name}")
        targets = [backend] + ([backend + RESUME_SUFFIX] if resume else [])
        for target in targets:
            self.checked(f"set server {target}/{name} state maint")
        deadline = time.monotonic() + wait_s
        for target in targets:
            while True:
                try:
                    self.checked(f"del server {target}/{name}")
                    break
                except RuntimeError_:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.5)

    # -- state -----------------------------------------------------------------------------------
    def servers_state(self, backend: str) -> dict[str, ServerState]:
        """``show servers state`` for one backend, by server name."""
        out = self.command(f"show servers state {backend}")
        lines = [line for line in out.splitlines() if line.strip()]
        header = next((line for line in lines if line.startswith("#")), None)
        if header is None:
            raise RuntimeError_(f"unexpected answer: {out.strip()}")
        columns = header.lstrip("# ").split()
        states: dict[str, ServerState] = {}
        for line in lines:
            parts = line.split()
            if line.startswith("#") or len(parts) < len(columns) // 2:
                continue  # the header, and the format version line before it
            row = dict(zip(columns, parts, strict=False))
            states[row["srv_name"]] = ServerState(
                name=row["srv_name"],
                address=row["srv_addr"],
                port=int(row.get("srv_port", "0") or 0),
                operational=int(row["srv_op_state"]),
                admin=int(row["srv_admin_state"]),
                weight=int(row["srv_uweight"]),
            )
        return states

    def stat(self, backend: str) -> dict[str, dict[str, str]]:
        """``show stat`` rows of one backend (its servers and BACKEND), by ``svname``."""
        out = self.command("show stat")
        lines = out.splitlines()
        columns = lines[0].lstrip("# ").split(",")
        rows: dict[str, dict[str, str]] = {}
        for line in lines[1:]:
            if not line.strip():
                continue
            row = dict(zip(columns, line.split(","), strict=False))
            if row.get("pxname") == backend:
                rows[row["svname"]] = row
        return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m duplex_actors.scaleout.haproxy", description=__doc__)
    parser.add_argument("--socket", required=True, help="HAProxy's admin-level stats socket")
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="add a GPU process: BACKEND/NAME HOST:PORT")
    add.add_argument("server")
    add.add_argument("address")
    add.add_argument("--agent-port", type=int, required=True)
    add.add_argument("--maxconn", type=int, default=1, help="until the agent reports (default 1)")
    add.add_argument(
        "--no-resume", action="store_true", help=f"not into BACKEND{RESUME_SUFFIX} (a config without it)"
    )
    remove = sub.add_parser("remove", help="drain-free removal: BACKEND/NAME")
    remove.add_argument("server")
    remove.add_argument("--wait", type=float, default=0.0, help="seconds to wait for its sessions")
    remove.add_argument("--no-resume", action="store_true", help=f"not from BACKEND{RESUME_SUFFIX}")
    state = sub.add_parser("state", help="show the servers of BACKEND")
    state.add_argument("backend")
    args = parser.parse_args(argv)
    api = RuntimeAPI(args.socket)
    try:
        if args.command == "add":
            backend, _, name = args.server.partition("/")
            api.add_server(
                backend,
                name,
                args.address,
                agent_port=args.agent_port,
                maxconn=args.maxconn,
                resume=not args.no_resume,
            )
        elif args.command == "remove":
            backend, _, name = args.server.partition("/")
            api.remove_server(backend, name, wait_s=args.wait, resume=not args.no_resume)
        else:
            for st in api.servers_state(args.backend).values():
                flags = ("DOWN" if st.down else "UP" if st.up else "?") + (" DRAIN" if st.draining else "")
                flags += " MAINT" if st.maintenance else ""
                print(f"{st.name}\t{st.address}:{st.port}\t{flags}\tweight {st.weight}")
    except (OSError, RuntimeError_) as exc:
        print(f"haproxy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
