"""A resume reaches the process that holds the session, through HAProxy running the shipped
deploy/haproxy/haproxy.cfg (docs/scaling.md §8, "Resuming a dropped session through HAProxy").

Three ``duplex-actors serve`` processes (tiny-parrot, 2 slots each, ``--admission-refusal http``,
``--resume-grace-s 30``) behind a real HAProxy, each added to both backends by the runtime-API
helper. Every upgrade's 101 carries ``X-Duplex-Session-Id``; backend ``duplex`` stores that id ->
server name from the answer to an open, and a resume (``?session_id=`` in the URL) goes to
backend ``duplex_resume``, which sticks to that name. The clients here are bare WebSockets
(wsproto on a socket), so a connection can be dropped without a close frame, as a lost network
does:

1. a resume lands on its owner although leastconn would pick another process (native and
   Realtime), and the answer says so: ``session.resumed`` with the input the session holds;
   only a resume goes the resume way (an empty ``session_id`` opens a session as usual);
2. the owner drains (SIGUSR1, the agent's ``drain``; or ``set server ... state drain`` in both
   backends): the resume still lands there, also when every other server is full and HAProxy
   refuses new sessions itself;
3. a half-open connection still attached at a full owner: the resume takes it over at once
   (in one backend it would wait for a connection above the agent's maxconn, then get a 503);
4. the owner is killed (``kill -9``): the resume gets ``session_not_found`` (close 1000) from
   another process, before HAProxy marks it down (the connect fails and is redispatched) and
   after; the table entry is not rewritten, and the owner's successor answers the same;
5. the runtime-API helper takes a process out of both backends and puts it back.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np
import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from duplex_actors.scaleout.haproxy import RESUME_SUFFIX

from .conftest import BACKEND, HAProxy, Node, make_nodes, metric, start_all, start_haproxy, wait_until

SLOTS = 2
GRACE_S = 30
NATIVE = "/v1/duplex"
REALTIME = "/v1/realtime?duplex=1"
HEADER = "x-duplex-session-id"
RESUME = BACKEND + RESUME_SUFFIX  # duplex_resume: the resumes' backend


# -- a bare WebSocket client -------------------------------------------------------------------------
class Rejected(Exception):
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status, self.headers, self.body = status, headers, body


class WS:
    """One WebSocket on a plain socket: the 101's headers, messages in order, and a drop with
    no close frame (``drop``)."""

    def __init__(self, port: int, target: str, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.conn = WSConnection(ConnectionType.CLIENT)
        self.messages: list[str | bytes] = []
        self.closed: tuple[int, str] | None = None
        self._text: list[str] = []
        self._bytes: list[bytes] = []
        self.sock.sendall(self.conn.send(Request(host="127.0.0.1", target=target)))
        reject: RejectConnection | None = None
        body = b""
        while True:
            events = self._events()
            for i, event in enumerate(events):
                if isinstance(event, AcceptConnection):
                    self.headers = {k.decode().lower(): v.decode() for k, v in event.extra_headers}
                    # What came in the same read as the 101 (session.created, when the client
                    # was slow to read) is the session's first message: keep it.
                    self._handle(events[i + 1 :])
                    return
                if isinstance(event, RejectConnection):
                    reject = event
                    if not event.has_body:
                        raise Rejected(event.status_code, self._hdrs(event), b"")
                if isinstance(event, RejectData):
                    body += event.data
                    if event.body_finished and reject is not None:
                        raise Rejected(reject.status_code, self._hdrs(reject), body)

    @staticmethod
    def _hdrs(event: RejectConnection) -> dict[str, str]:
        return {k.decode().lower(): v.decode() for k, v in event.headers}

    def _events(self) -> list[Any]:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the peer closed the socket")
        self.conn.receive_data(data)
        return list(self.conn.events())

    def send(self, message: dict[str, Any] | bytes) -> None:
        if isinstance(message, bytes):
            self.sock.sendall(self.conn.send(BytesMessage(data=message)))
        else:
            self.sock.sendall(self.conn.send(TextMessage(data=json.dumps(message))))

    def _pump(self) -> None:
        self._handle(self._events())

    def _handle(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, TextMessage):
                self._text.append(event.data)
                if event.message_finished:
                    self.messages.append("".join(self._text))
                    self._text = []
            elif isinstance(event, BytesMessage):
                self._bytes.append(bytes(event.data))
                if event.message_finished:
                    self.messages.append(b"".join(self._bytes))
                    self._bytes = []
            elif isinstance(event, Ping):
                self.sock.sendall(self.conn.send(event.response()))
            elif isinstance(event, CloseConnection):
                self.closed = (event.code, event.reason or "")
                if self.conn.state is ConnectionState.REMOTE_CLOSING:  # theirs first: answer it
                    try:
                        self.sock.sendall(self.conn.send(event.response()))
                    except OSError:
                        pass

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> dict[str, Any]:
        """The first JSON message (after those already seen) that ``predicate`` accepts."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for message in self.messages[seen:]:
                seen += 1
                if isinstance(message, str):
                    event = json.loads(message)
                    if predicate(event):
                        return event
            if self.closed is not None:
                raise AssertionError(f"closed {self.closed} before the message; got {self.types()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no such message within {timeout} s; got {self.types()}")
            self.sock.settimeout(left)
            self._pump()

    def first(self, kind: str, timeout: float = 10.0) -> dict[str, Any]:
        return self.wait_for(lambda e: e.get("type") == kind, timeout)

    def wait_count(self, count: int, timeout: float = 10.0) -> None:
        """Until ``count`` messages have come on this connection."""
        deadline = time.monotonic() + timeout
        while len(self.messages) < count:
            left = deadline - time.monotonic()
            assert left > 0 and self.closed is None, (count, self.types(), self.closed)
            self.sock.settimeout(left)
            self._pump()

    def wait_closed(self, timeout: float = 10.0) -> tuple[int, str]:
        deadline = time.monotonic() + timeout
        while self.closed is None:
            left = deadline - time.monotonic()
            assert left > 0, f"not closed within {timeout} s; got {self.types()}"
            self.sock.settimeout(left)
            try:
                self._pump()
            except ConnectionError:
                break
        assert self.closed is not None, "the socket ended with no close frame"
        return self.closed

    def types(self) -> list[str]:
        return [json.loads(m)["type"] if isinstance(m, str) else "<binary>" for m in self.messages]

    def drop(self) -> None:
        """The connection ends with no close frame (a FIN), as when the network goes."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def close(self) -> None:
        """A clean close (1000): it ends the session."""
        try:
            self.sock.sendall(self.conn.send(CloseConnection(code=1000)))
            self.wait_closed(5)
        except (OSError, AssertionError):
            pass
        self.sock.close()


# -- sessions ----------------------------------------------------------------------------------------
def pcm16(seconds: float) -> bytes:
    t = np.arange(int(seconds * 24_000)) / 24_000
    return ((0.3 * np.sin(2 * np.pi * 440 * t)) * 32767).astype("<i2").tobytes()


@attrs.define
class Session:
    dialect: str  # "native" or "realtime"
    ws: WS
    session_id: str
    token: str
    created_index: int  # where session.created is in ws.messages
    samples_sent: int = 0

    @property
    def received(self) -> int:
        """The client's cursor: messages received after session.created (native: their count;
        Realtime: the highest server_event_seq, the same number)."""
        after = self.ws.messages[self.created_index + 1 :]
        if self.dialect == "native":
            return len(after)
        seqs = [json.loads(m).get("server_event_seq", 0) for m in after if isinstance(m, str)]
        return max(seqs, default=0)

    def talk(self, seconds: float = 0.24) -> None:
        audio = pcm16(seconds)
        if self.dialect == "native":
            self.ws.send(audio)
        else:
            self.ws.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()})
        self.samples_sent += len(audio) // 2
        self.ws.wait_count(len(self.ws.messages) + int(seconds * 1000) // 80)  # a delta a frame, at least


def open_session(port: int, dialect: str) -> Session:
    if dialect == "native":
        ws = WS(port, NATIVE)
        ws.send({"type": "session.create", "resume": True, "session": {"duplex": {"alignment": "off"}}})
        created = ws.first("session.created")
        session_id = created["session_id"]
    else:
        ws = WS(port, REALTIME + "&resume=1")
        created = ws.first("session.created")
        session_id = created["session"]["id"]
    assert created.get("resume_token"), created
    # The id is in the 101 too: this is what HAProxy stores.
    assert ws.headers.get(HEADER) == session_id, ws.headers
    index = next(i for i, m in enumerate(ws.messages) if isinstance(m, str) and '"session.created"' in m)
    return Session(dialect, ws, session_id, created["resume_token"], index)


def resume_ws(port: int, session: Session) -> WS:
    path = NATIVE if session.dialect == "native" else REALTIME
    ws = WS(port, f"{path}{'&' if '?' in path else '?'}session_id={session.session_id}")
    assert ws.headers.get(HEADER) == session.session_id, ws.headers
    ws.send(
        {
            "type": "session.resume",
            "session_id": session.session_id,
            "resume_token": session.token,
            "last_received_server_event_seq": session.received,
        }
    )
    return ws


def resume(port: int, session: Session) -> dict[str, Any]:
    """Resume ``session`` through ``port``: its ``session.resumed`` (the session now runs on
    the new socket), or an AssertionError naming what came instead."""
    ws = resume_ws(port, session)
    answer = ws.wait_for(lambda e: e.get("type") in ("session.resumed", "error"))
    assert answer["type"] == "session.resumed", (answer, ws.wait_closed())
    session.ws = ws
    session.token = answer["resume_token"]
    session.created_index = -1  # the cursor now counts from the resumed connection
    return answer


def refused_resume(port: int, session: Session) -> tuple[dict[str, Any], tuple[int, str]]:
    ws = resume_ws(port, session)
    try:
        answer = ws.first("error")
        return answer, ws.wait_closed()
    finally:
        ws.sock.close()


# -- the cluster -------------------------------------------------------------------------------------
@attrs.define
class Cluster:
    nodes: list[Node]
    haproxy: HAProxy

    @property
    def port(self) -> int:
        return self.haproxy.port

    def node_of(self, session_id: str) -> Node:
        found = [n for n in self.nodes if (n.log_dir / f"{session_id}.dlog").exists()]
        assert len(found) == 1, (session_id, found)
        return found[0]

    def detached(self, node: Node) -> float:
        return metric(node.metrics(), "duplex_sessions_detached")

    def resumes(self, node: Node, result: str) -> float:
        return metric(node.metrics(), "duplex_session_resumes_total", result=result)

    def scur(self) -> dict[str, int]:
        return {n.name: int(self.haproxy.stat()[n.name]["scur"]) for n in self.nodes}

    def table(self) -> dict[str, str]:
        """HAProxy's stick table: session id -> server name (``srvkey name``)."""
        out = self.haproxy.api.command(f"show table {BACKEND}")
        entries: dict[str, str] = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if "key" in fields and "server_key" in fields:
                entries[fields["key"]] = fields["server_key"]
        return entries

    def resume_state(self) -> dict[str, Any]:
        return self.haproxy.api.servers_state(RESUME)

    def resume_scur(self) -> dict[str, int]:
        stat = self.haproxy.api.stat(RESUME)
        return {n.name: int(stat[n.name]["scur"]) for n in self.nodes}

    def wait_detached(self, node: Node, count: int = 1) -> None:
        wait_until(lambda: self.detached(node) == count, 10, f"{count} detached on {node.name}")

    def wait_idle(self) -> None:
        def idle() -> bool:
            return all(
                metric(n.metrics(), "duplex_slots_in_use") == 0 and self.scur()[n.name] == 0
                for n in self.nodes
            )

        wait_until(idle, 15, "every process idle", 0.1)


def all_ready(cl: Cluster) -> bool:
    state, stat, resume_state = cl.haproxy.state(), cl.haproxy.stat(), cl.resume_state()
    return all(
        n.name in resume_state and resume_state[n.name].up and not resume_state[n.name].maintenance
        for n in cl.nodes
    ) and all(
        n.name in state
        and state[n.name].up
        and not state[n.name].draining
        and stat[n.name]["slim"] == str(SLOTS)
        and stat[n.name]["status"] == "UP"
        for n in cl.nodes
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, haproxy_bin, parrot_dir) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("resume")
    args = [
        "--max-sessions",
        str(SLOTS),
        "--admission-refusal",
        "http",
        "--resume-grace-s",
        str(GRACE_S),
        "--drain-timeout",
        "5",
    ]
    nodes = make_nodes(root, 3, args, {})
    haproxy: HAProxy | None = None
    try:
        start_all(nodes)
        haproxy = start_haproxy(haproxy_bin, root / "haproxy")
        cl = Cluster(nodes, haproxy)
        for node in nodes:
            haproxy.api.add_server(BACKEND, node.name, f"127.0.0.1:{node.port}", agent_port=node.agent_port)
        wait_until(lambda: all_ready(cl), 15, "all three servers UP with maxconn from the agent")
        yield cl
    finally:
        if haproxy is not None:
            haproxy.stop()
        for node in nodes:
            node.stop()


# -- 1 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dialect", ["native", "realtime"])
def test_a_resume_lands_on_the_owner_although_leastconn_would_pick_another(cluster, dialect):
    cl = cluster
    sessions = [open_session(cl.port, dialect) for _ in range(4)]
    by_node: dict[str, list[Session]] = {}
    for s in sessions:
        by_node.setdefault(cl.node_of(s.session_id).name, []).append(s)
    owner_name = next(name for name, group in by_node.items() if len(group) == 2)
    owner = next(n for n in cl.nodes if n.name == owner_name)
    dropped, kept = by_node[owner_name]
    table = cl.table()
    assert all(table.get(s.session_id) == cl.node_of(s.session_id).name for s in sessions), table

    dropped.talk(0.24)
    kept.talk(0.08)
    for s in sessions:  # the others end: the owner is left with the most connections
        if s is not dropped and s is not kept:
            s.ws.close()
    dropped.ws.drop()
    cl.wait_detached(owner)
    wait_until(lambda: sum(cl.scur().values()) == 1, 5, "HAProxy sees only the kept connection")
    scur = cl.scur()
    assert scur[owner.name] == 1 and min(scur.values()) == 0, scur  # leastconn would go elsewhere

    before = cl.resumes(owner, "resumed")
    answer = resume(cl.port, dropped)
    assert answer["session_id"] == dropped.session_id
    assert answer["input_samples_received"] == dropped.samples_sent
    assert cl.resumes(owner, "resumed") == before + 1
    assert cl.detached(owner) == 0
    # The session goes on on its new connection.
    dropped.talk(0.16)
    dropped.ws.close()
    kept.ws.close()
    cl.wait_idle()


def test_only_a_resume_goes_the_resume_way(cluster):
    """An empty ``session_id`` opens a session (the server's rule), so it goes to ``duplex``,
    with its maxconn, and its session is stored; a resume goes to ``duplex_resume``."""
    cl = cluster
    opened = int(cl.haproxy.api.stat(RESUME)["BACKEND"]["stot"])
    ws = WS(cl.port, NATIVE + "?session_id=")
    try:
        ws.send({"type": "session.create", "resume": True, "session": {"duplex": {"alignment": "off"}}})
        created = ws.first("session.created")
        assert ws.headers[HEADER] == created["session_id"]
        assert cl.table()[created["session_id"]] == cl.node_of(created["session_id"]).name
        assert int(cl.haproxy.api.stat(RESUME)["BACKEND"]["stot"]) == opened
    finally:
        ws.close()
    session = open_session(cl.port, "realtime")
    session.ws.drop()
    cl.wait_detached(cl.node_of(session.session_id))
    resume(cl.port, session)
    assert int(cl.haproxy.api.stat(RESUME)["BACKEND"]["stot"]) == opened + 1
    session.ws.close()
    cl.wait_idle()


# -- 2 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["sigusr1", "runtime-api"])
def test_a_resume_reaches_a_draining_owner_even_when_the_rest_is_full(cluster, how):
    cl = cluster
    api = cl.haproxy.api
    session = open_session(cl.port, "native")
    owner = cl.node_of(session.session_id)
    session.talk(0.24)
    session.ws.drop()
    cl.wait_detached(owner)

    if how == "sigusr1":
        owner.send_signal(signal.SIGUSR1)  # paused: the agent says "drain"
    else:
        api.checked(f"disable agent {BACKEND}/{owner.name}")  # its "ready" would undo the drain
        # Both backends: a drained server still takes what sticks to it.
        api.checked(f"set server {BACKEND}/{owner.name} state drain")
        api.checked(f"set server {RESUME}/{owner.name} state drain")
        assert cl.resume_state()[owner.name].draining
    wait_until(lambda: "DRAIN" in cl.haproxy.stat()[owner.name]["status"], 10, "HAProxy shows DRAIN")
    others = [n for n in cl.nodes if n is not owner]
    fillers = [open_session(cl.port, "native") for _ in range(SLOTS * len(others))]
    try:
        assert {cl.node_of(s.session_id).name for s in fillers} == {n.name for n in others}
        # The backend is full for new sessions: HAProxy answers them itself ...
        with pytest.raises(Rejected) as full:
            WS(cl.port, NATIVE)
        assert full.value.status == 503
        assert json.loads(full.value.body)["error"]["code"] == "resource_exhausted"
        # ... but the resume is not a new session: it reaches the draining owner.
        answer = resume(cl.port, session)
        assert answer["input_samples_received"] == session.samples_sent
        assert cl.node_of(session.session_id) is owner
        session.talk(0.16)
    finally:
        session.ws.close()
        for s in fillers:
            s.ws.close()
        if how == "sigusr1":
            owner.send_signal(signal.SIGUSR2)
        else:
            api.checked(f"set server {RESUME}/{owner.name} state ready")
            api.checked(f"set server {BACKEND}/{owner.name} state ready")
            api.checked(f"enable agent {BACKEND}/{owner.name}")
    wait_until(lambda: all_ready(cl), 10, "the owner back to ready")
    cl.wait_idle()


# -- 3 -----------------------------------------------------------------------------------------------
def test_a_half_open_session_on_a_full_owner_is_taken_over(cluster):
    """The old connection is still open (the server and HAProxy have not noticed that the
    client's network went): the owner is at its maxconn in HAProxy's eyes, and the resume
    needs one more connection to it for the moment of the takeover."""
    cl = cluster
    sessions = [open_session(cl.port, "native") for _ in range(len(cl.nodes) + 1)]
    owner_name = next(
        name
        for name in (n.name for n in cl.nodes)
        if sum(cl.node_of(s.session_id).name == name for s in sessions) == 2
    )
    owner = next(n for n in cl.nodes if n.name == owner_name)
    stale, _other = [s for s in sessions if cl.node_of(s.session_id) is owner]
    stale.talk(0.24)
    assert cl.scur()[owner.name] == SLOTS
    takeovers = metric(owner.metrics(), "duplex_session_takeovers_total")
    old = stale.ws
    t0 = time.monotonic()
    answer = resume(cl.port, stale)
    took = time.monotonic() - t0
    assert took < 1.0, took  # no wait in a queue (timeout queue is 2 s)
    assert answer["input_samples_received"] == stale.samples_sent
    assert metric(owner.metrics(), "duplex_session_takeovers_total") == takeovers + 1
    old.first("session.replaced")  # the old connection is told, if anyone still reads it
    old.sock.close()
    stale.talk(0.16)
    for s in sessions:
        s.ws.close()
    cl.wait_idle()


# -- 4 -----------------------------------------------------------------------------------------------
def test_the_owner_killed_the_resume_gets_session_not_found_from_another_process(cluster):
    cl = cluster
    session = open_session(cl.port, "native")
    owner = cl.node_of(session.session_id)
    session.talk(0.24)
    session.ws.drop()
    cl.wait_detached(owner)
    assert cl.table()[session.session_id] == owner.name

    assert owner.proc is not None
    os.killpg(owner.proc.pid, signal.SIGKILL)
    owner.proc.wait(5)
    others = [n for n in cl.nodes if n is not owner]
    before = sum(cl.resumes(n, "session_not_found") for n in others)
    # At once, before HAProxy has marked it down: the connect fails, HAProxy redispatches.
    assert not cl.resume_state()[owner.name].down
    redispatched = int(cl.haproxy.api.stat(RESUME)[owner.name]["wredis"])
    answer, closed = refused_resume(cl.port, session)
    assert answer["code"] == "session_not_found", answer
    assert closed[0] == 1000, closed
    assert int(cl.haproxy.api.stat(RESUME)[owner.name]["wredis"]) == redispatched + 1
    # Marked down: the entry is ignored, leastconn picks another process.
    wait_until(lambda: cl.resume_state()[owner.name].down, 5, "HAProxy marks the owner down")
    answer, closed = refused_resume(cl.port, session)
    assert answer["code"] == "session_not_found" and closed[0] == 1000, (answer, closed)
    assert sum(cl.resumes(n, "session_not_found") for n in others) == before + 2
    assert cl.table()[session.session_id] == owner.name  # a resume never rewrites the entry

    # Restarted on the same address: the entry leads there again, and the new process (which
    # never held the session) answers the same.
    owner.start()
    wait_until(owner.ready, 60, "restarted", 0.2)
    wait_until(lambda: all_ready(cl), 15, "back in HAProxy")
    answer, closed = refused_resume(cl.port, session)
    assert answer["code"] == "session_not_found" and closed[0] == 1000, (answer, closed)
    assert cl.resumes(owner, "session_not_found") == 1
    cl.wait_idle()


# -- 5 -----------------------------------------------------------------------------------------------
def test_the_helper_removes_a_process_from_both_backends_and_adds_it_back(cluster):
    cl = cluster
    api = cl.haproxy.api
    node = cl.nodes[0]
    api.remove_server(BACKEND, node.name, wait_s=5)
    assert node.name not in cl.haproxy.state() and node.name not in cl.resume_state()
    api.add_server(BACKEND, node.name, f"127.0.0.1:{node.port}", agent_port=node.agent_port)
    wait_until(lambda: all_ready(cl), 15, "back in both backends")
    session = open_session(cl.port, "native")
    owner = cl.node_of(session.session_id)
    session.ws.drop()
    cl.wait_detached(owner)
    resume(cl.port, session)
    session.ws.close()
    cl.wait_idle()
