"""Three ``duplex-actors serve`` processes (tiny-parrot, 2 slots each, ``--admission-refusal http``,
``--agent-port``, ``--log-upload``) behind a real HAProxy running deploy/haproxy/haproxy.cfg, with
their session logs shipped to a real S3 store (SeaweedFS). Membership goes through HAProxy's
runtime API. The tests run in order on one cluster and each leaves it idle:

1. leastconn spreads sessions; capacity is the sum of the slots; one more gets HAProxy's JSON 503;
2. a full process's 503 on the upgrade is retried on another one, unseen by the client (and a
   slot is reserved at the handshake: two racing upgrades for one slot, one wins);
3. a connect failure is redispatched too (a dead server added through the runtime API);
4. SIGUSR1 drains one process: its live session goes on to its end, new sessions go elsewhere;
   SIGUSR2 takes it back;
5. ``kill -9`` of one process: HAProxy marks it down within 2 s, the others' sessions go on,
   new sessions go elsewhere; restarted on the same log dir, its torn log is recovered,
   uploaded and replays;
6. every finished session's log is in the bucket exactly once and replays identically from it.

Figures (latencies, times to mark down) go to ``$DUPLEX_SCALEOUT_FIGURES`` (JSON) when set.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import secrets
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import trio

from duplex_actors.client import HandshakeRejected, open_duplex_client
from duplex_actors.client.connection import DuplexClient
from duplex_actors.log.segment import read_records

from .conftest import (
    BACKEND,
    REPLAY,
    HAProxy,
    Node,
    S3Store,
    free_port,
    make_nodes,
    metric,
    start_all,
    start_haproxy,
    wait_until,
)

SLOTS = 2
PATH = "/v1/realtime?duplex=1"


@attrs.define
class Cluster:
    nodes: list[Node]
    haproxy: HAProxy
    s3: S3Store
    prefix: str
    figures: dict[str, Any] = attrs.field(factory=dict)
    session_ids: set[str] = attrs.field(factory=set)

    @property
    def url(self) -> str:
        return self.haproxy.ws + PATH

    def node_of(self, session_id: str) -> Node | None:
        found = [n for n in self.nodes if (n.log_dir / f"{session_id}.dlog").exists()]
        return found[0] if len(found) == 1 else None

    def refused(self, node: Node, code: str = "resource_exhausted") -> float:
        return metric(node.metrics(), "duplex_refusals_total", code=code)

    def wait_servers(self, predicate: Any, what: str, timeout: float = 10) -> float:
        return wait_until(lambda: predicate(self.haproxy.state(), self.haproxy.stat()), timeout, what, 0.02)


def all_ready(state: dict[str, Any], stat: dict[str, dict[str, str]]) -> bool:
    return all(
        name in state and state[name].up and not state[name].draining and stat[name]["slim"] == str(SLOTS)
        for name in ("gpu0", "gpu1", "gpu2")
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, haproxy_bin, s3, parrot_dir) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    prefix = f"run-{secrets.token_hex(4)}/logs"
    args = [
        "--max-sessions",
        str(SLOTS),
        "--admission-refusal",
        "http",
        "--log-upload",
        f"s3://{s3.bucket}/{prefix}",
        "--s3-endpoint-url",
        s3.endpoint,
        "--drain-timeout",
        "5",
    ]
    nodes = make_nodes(root, 3, args, s3.env)
    haproxy: HAProxy | None = None
    try:
        t0 = time.monotonic()
        start_all(nodes)
        haproxy = start_haproxy(haproxy_bin, root / "haproxy")
        cl = Cluster(nodes, haproxy, s3, prefix)
        cl.figures["processes_ready_s"] = round(time.monotonic() - t0, 1)
        t1 = time.monotonic()
        for node in nodes:  # membership through the runtime API, no reload
            haproxy.api.add_server(BACKEND, node.name, f"127.0.0.1:{node.port}", agent_port=node.agent_port)
        cl.wait_servers(all_ready, "all three servers UP with maxconn from the agent")
        cl.figures["added_to_up_with_agent_maxconn_s"] = round(time.monotonic() - t1, 2)
        yield cl
        out = os.environ.get("DUPLEX_SCALEOUT_FIGURES")
        if out:
            Path(out).write_text(json.dumps(cl.figures, indent=2, sort_keys=True) + "\n")
        print("\nscale-out figures:", json.dumps(cl.figures, sort_keys=True))
    finally:
        if haproxy is not None:
            haproxy.stop()
        for node in nodes:
            node.stop()


# -- sessions ------------------------------------------------------------------------------------
def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 24_000)) / 24_000
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@attrs.define(eq=False)
class Live:
    client: DuplexClient
    session_id: str
    open_s: float
    release: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)
    error: BaseException | None = None

    @property
    def frames(self) -> int:
        return self.client.frames_received


async def _session(url: str, talk: bool, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    live: Live | None = None
    t0 = trio.current_time()
    try:
        async with open_duplex_client(url, connect_timeout=10, open_timeout=15, close_timeout=5) as client:
            assert client.session_id is not None
            live = Live(client, client.session_id, trio.current_time() - t0)
            task_status.started(live)
            async with trio.open_nursery() as inner:
                if talk:
                    inner.start_soon(client.stream, tone(60.0))
                await live.release.wait()
                inner.cancel_scope.cancel()
    except Exception as exc:
        if live is None:
            raise
        live.error = exc
    finally:
        if live is not None:
            live.done.set()


async def open_live(
    nursery: trio.Nursery, cl: Cluster, url: str | None = None, *, talk: bool = False
) -> Live:
    live: Live = await nursery.start(_session, url or cl.url, talk)
    cl.session_ids.add(live.session_id)
    return live


async def close_all(lives: list[Live], timeout: float = 15) -> None:
    for live in lives:
        live.release.set()
    with trio.fail_after(timeout):
        for live in lives:
            await live.done.wait()


async def frames_advance(live: Live, by: int = 5, timeout: float = 5) -> None:
    start = live.frames
    with trio.fail_after(timeout):
        while live.frames < start + by:
            await trio.sleep(0.02)


def raw_upgrade(port: int, path: str = PATH) -> tuple[int, dict[str, str], bytes, http.client.HTTPConnection]:
    """A bare WebSocket upgrade request; returns (status, headers, body-or-b"", the connection)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(
        "GET",
        path,
        headers={
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
            "Sec-WebSocket-Version": "13",
        },
    )
    resp = conn.getresponse()
    headers = {k.lower(): v for k, v in resp.getheaders()}
    body = b"" if resp.status == 101 else resp.read()
    return resp.status, headers, body, conn


def assert_json_503(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 503, (status, body)
    assert headers.get("retry-after") == "1", headers
    assert headers.get("content-type", "").startswith("application/json"), headers
    assert json.loads(body)["error"]["code"] == "resource_exhausted", body


def wait_idle(cl: Cluster, timeout: float = 15) -> None:
    def idle() -> bool:
        stat = cl.haproxy.stat()
        return all(
            n.proc is not None
            and n.proc.poll() is None
            and metric(n.metrics(), "duplex_slots_in_use") == 0
            and stat[n.name]["scur"] == "0"
            for n in cl.nodes
        )

    wait_until(idle, timeout, "every process idle")


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


# -- 1 -------------------------------------------------------------------------------------------
async def test_leastconn_spreads_capacity_is_the_sum_and_one_more_gets_json_503(cluster):
    cl = cluster
    refused_before = [cl.refused(n) for n in cl.nodes]
    lives: list[Live] = []
    async with trio.open_nursery() as nursery:
        for i in range(3 * SLOTS):
            lives.append(await open_live(nursery, cl))
            if i == 2:  # one each before any gets a second
                assert sorted(cl.node_of(x.session_id).name for x in lives) == ["gpu0", "gpu1", "gpu2"]
        where = [cl.node_of(x.session_id) for x in lives]
        assert all(w is not None for w in where)
        assert sorted(w.name for w in where) == ["gpu0", "gpu0", "gpu1", "gpu1", "gpu2", "gpu2"]
        # The seventh: HAProxy itself answers (no process is asked), in JSON, with Retry-After.
        status, headers, body, conn = await trio.to_thread.run_sync(raw_upgrade, cl.haproxy.port)
        conn.close()
        assert_json_503(status, headers, body)
        with pytest.raises(HandshakeRejected) as refused:
            await open_live(nursery, cl)
        assert refused.value.status == 503 and refused.value.code == "resource_exhausted"
        assert [cl.refused(n) for n in cl.nodes] == refused_before
        # The sessions work.
        await lives[0].client.send_audio(tone(0.24))
        with trio.fail_after(5):
            await lives[0].client.wait_frames(3)
        await close_all(lives)
    assert all(x.error is None for x in lives), [x.error for x in lives]
    cl.figures["open_via_haproxy_median_ms"] = median_ms([x.open_s for x in lives])
    wait_idle(cl)


# -- 2 -------------------------------------------------------------------------------------------
async def test_a_full_process_503_is_redispatched_unseen_and_slots_are_reserved_at_the_handshake(cluster):
    cl = cluster
    full = cl.nodes[0]
    lives: list[Live] = []
    async with trio.open_nursery() as nursery:
        # One slot taken directly, then two upgrades race for the last one: exactly one wins.
        direct = [await open_live(nursery, cl, full.ws + PATH)]
        results = []

        async def race() -> None:
            results.append(await trio.to_thread.run_sync(raw_upgrade, full.port))

        async with trio.open_nursery() as racers:
            racers.start_soon(race)
            racers.start_soon(race)
        statuses = sorted(res[0] for res in results)
        assert statuses == [101, 503], statuses
        loser = next(res for res in results if res[0] == 503)
        assert_json_503(loser[0], loser[1], loser[2])
        known = {f"{direct[0].session_id}.dlog"}
        wait_until(lambda: len(full.logs() - known) == 1, 5, "the winner's session")
        cl.session_ids.add(next(iter(full.logs() - known)).removesuffix(".dlog"))
        for res in results:
            res[3].close()  # the winner's socket drops: its slot comes back
        wait_until(lambda: metric(full.metrics(), "duplex_slots_in_use") == 1, 10, "the raced slot freed")
        direct.append(await open_live(nursery, cl, full.ws + PATH))
        assert all(cl.node_of(x.session_id) is full for x in direct)

        # HAProxy sees no connection on gpu0, so leastconn keeps trying it: every such attempt
        # is refused with 503 at the upgrade and retried on another process.
        stat_before = cl.haproxy.stat()
        redispatched: list[float] = []
        straight: list[float] = []
        for _ in range(2 * SLOTS):
            before = cl.refused(full)
            live = await open_live(nursery, cl)
            lives.append(live)
            assert cl.node_of(live.session_id) in (cl.nodes[1], cl.nodes[2])
            (redispatched if cl.refused(full) > before else straight).append(live.open_s)
        stat_after = cl.haproxy.stat()
        assert redispatched, "leastconn never tried the full process"
        assert int(stat_after[full.name]["wredis"]) > int(stat_before[full.name]["wredis"])
        await close_all(lives + direct)
    assert all(x.error is None for x in lives + direct)
    cl.figures["redispatch_on_503"] = {
        "opens_redispatched": len(redispatched),
        "open_redispatched_median_ms": median_ms(redispatched),
        "open_straight_median_ms": median_ms(straight) if straight else None,
    }
    wait_idle(cl)


# -- 3 -------------------------------------------------------------------------------------------
async def test_a_connect_failure_is_redispatched(cluster):
    """A server that refuses connections (added through the runtime API with no checks, so
    HAProxy believes it is up): leastconn picks it first, the connect fails, HAProxy redispatches."""
    cl = cluster
    api = cl.haproxy.api
    lives: list[Live] = []
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            lives.append(await open_live(nursery, cl))
        api.checked(f"add server {BACKEND}/ghost 127.0.0.1:{free_port()} maxconn {SLOTS}")
        api.checked(f"enable server {BACKEND}/ghost")
        try:
            live = await open_live(nursery, cl)
            lives.append(live)
            stat = cl.haproxy.stat()
            # picked once, the connect refused, the request redispatched (econ counts final errors only)
            assert stat["ghost"]["lbtot"] == "1" and stat["ghost"]["wredis"] == "1", stat["ghost"]
        finally:
            api.checked(f"set server {BACKEND}/ghost state maint")
            api.checked(f"del server {BACKEND}/ghost")
        assert "ghost" not in cl.haproxy.state()
        await close_all(lives)
    assert all(x.error is None for x in lives)
    cl.figures["redispatch_on_connect_failure_open_ms"] = round(live.open_s * 1000, 1)
    wait_idle(cl)


# -- 4 -------------------------------------------------------------------------------------------
async def test_sigusr1_drains_one_process_its_live_session_goes_on_and_new_ones_go_elsewhere(cluster):
    cl = cluster
    drained = cl.nodes[2]
    lives: list[Live] = []
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            lives.append(await open_live(nursery, cl, talk=True))
        (on_drained,) = [x for x in lives if cl.node_of(x.session_id) is drained]
        await frames_advance(on_drained)

        drained.send_signal(signal.SIGUSR1)
        took = cl.wait_servers(
            lambda state, stat: state[drained.name].draining or "DRAIN" in stat[drained.name]["status"],
            "HAProxy sees the drain",
        )
        assert drained.agent().strip() == "drain"
        status, body = drained.ready_body()
        assert status == 503 and body["draining"] is True
        status, headers, raw, conn = await trio.to_thread.run_sync(raw_upgrade, drained.port)
        conn.close()
        assert status == 503 and headers.get("retry-after") == "1"
        assert json.loads(raw)["error"]["code"] == "draining"

        # New sessions go to the others (one free slot each) ...
        for _ in range(2):
            live = await open_live(nursery, cl)
            lives.append(live)
            assert cl.node_of(live.session_id) in (cl.nodes[0], cl.nodes[1])
        # ... while the drained process's session goes on, and ends as the client decides.
        await frames_advance(on_drained, by=10)
        frames_after_drain = on_drained.frames
        on_drained.release.set()
        with trio.fail_after(10):
            await on_drained.done.wait()
        assert on_drained.error is None
        assert on_drained.client.closed_event is not None
        assert on_drained.client.closed_event.reason == "client_close"
        assert on_drained.client.close_code == 1000

        drained.send_signal(signal.SIGUSR2)
        back = cl.wait_servers(all_ready, "HAProxy takes the process back")
        live = await open_live(nursery, cl)  # it has the fewest connections now
        lives.append(live)
        assert cl.node_of(live.session_id) is drained
        await close_all(lives)
    assert all(x.error is None for x in lives)
    cl.figures["drain_sigusr1"] = {
        "signal_to_haproxy_drain_s": round(took, 2),
        "live_session_frames_after_drain_signal": frames_after_drain,
        "sigusr2_to_haproxy_ready_s": round(back, 2),
    }
    wait_idle(cl)


# -- 5 -------------------------------------------------------------------------------------------
async def test_kill_9_marks_down_fast_others_go_on_and_the_killed_logs_recover_and_replay(cluster):
    cl = cluster
    victim = cl.nodes[1]
    lives: list[Live] = []
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            lives.append(await open_live(nursery, cl, talk=True))
        (dead,) = [x for x in lives if cl.node_of(x.session_id) is victim]
        others = [x for x in lives if x is not dead]
        for live in lives:
            await frames_advance(live)
        log_path = victim.log_dir / f"{dead.session_id}.dlog"

        assert victim.proc is not None
        os.killpg(victim.proc.pid, signal.SIGKILL)  # the engine core and its front ends: a crash
        t0 = time.monotonic()
        took = await trio.to_thread.run_sync(
            lambda: cl.wait_servers(lambda state, stat: state[victim.name].down, "HAProxy marks it down", 5)
        )
        down_after = time.monotonic() - t0
        assert down_after < 2.0, down_after
        victim.proc.wait(5)
        with trio.fail_after(10):
            await dead.done.wait()
        assert dead.error is not None  # its client saw the connection drop
        dropped = f"{type(dead.error).__name__}: {dead.error}"

        # The other processes' sessions go on, untouched.
        for live in others:
            await frames_advance(live, by=10)
            assert live.error is None and not live.client.is_closed
        # New sessions go elsewhere.
        for _ in range(2):
            live = await open_live(nursery, cl)
            lives.append(live)
            assert cl.node_of(live.session_id) in (cl.nodes[0], cl.nodes[2])

        # A torn tail, as a crash mid-append leaves: half a frame header after the last record.
        intact = log_path.stat().st_size
        valid = read_records(log_path.read_bytes()).valid_length  # kill -9 may have torn it already
        with open(log_path, "ab") as f:
            f.write(b"\x40\x00\x00\x00\x99\x99")
        # Restarted on the same log dir: the tail is truncated at start-up, the log uploaded.
        t1 = time.monotonic()
        victim.start()
        up_while_loading = []

        def ready_and_never_up_before() -> bool:
            up = cl.haproxy.state()[victim.name].up  # first: the agent says "up" only once ready
            ready = victim.ready()
            if up and not ready:
                up_while_loading.append(time.monotonic() - t1)
            return ready

        await trio.to_thread.run_sync(lambda: wait_until(ready_and_never_up_before, 60, "restarted", 0.1))
        assert up_while_loading == [], "HAProxy sent traffic to a process still loading its model"
        restart_ready = time.monotonic() - t1
        back = await trio.to_thread.run_sync(lambda: cl.wait_servers(all_ready, "back in HAProxy"))
        assert "torn tail truncated" in victim.output()
        await trio.to_thread.run_sync(
            lambda: wait_until(lambda: not log_path.exists(), 20, "the recovered log uploaded and deleted")
        )
        key = f"{cl.prefix}/{dead.session_id}.dlog"
        head = cl.s3.client().head_object(Bucket=cl.s3.bucket, Key=key)
        assert head["ContentLength"] == valid
        replay = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                [REPLAY, f"s3://{cl.s3.bucket}/{key}", "--s3-endpoint-url", cl.s3.endpoint],
                capture_output=True,
                text=True,
                env={**os.environ, **cl.s3.env},
                timeout=60,
            )
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert "consistent" in replay.stdout and "torn tail" not in replay.stdout, replay.stdout

        await close_all(lives)
    assert all(x.error is None for x in lives if x is not dead)
    cl.figures["kill_9"] = {
        "kill_to_marked_down_s": round(down_after, 2),
        "poll_measured_s": round(took, 2),
        "restart_to_ready_s": round(restart_ready, 1),
        "ready_to_haproxy_up_s": round(back, 2),
        "torn_bytes_truncated": 6 + intact - valid,
        "killed_session_client_saw": dropped,
    }
    wait_idle(cl)


# -- 6 -------------------------------------------------------------------------------------------
def test_every_finished_log_is_in_the_bucket_exactly_once_and_replays_identically(cluster):
    cl = cluster

    def uploaded() -> bool:
        return all(metric(n.metrics(), "duplex_log_uploads_pending") == 0 and not n.logs() for n in cl.nodes)

    wait_until(uploaded, 30, "every log uploaded and deleted locally")
    keys = cl.s3.keys(cl.prefix + "/")
    names = [k.rsplit("/", 1)[-1] for k in keys]
    assert len(names) == len(set(names))
    by_id = {name.removesuffix(".dlog"): key for name, key in zip(names, keys, strict=True)}
    assert cl.session_ids <= set(by_id), cl.session_ids - set(by_id)
    # Nothing else: the warm-up at start-up is the engine core's, with no session and no log.
    extra = sorted(set(by_id) - cl.session_ids)
    assert extra == [], extra
    failures = sum(metric(n.metrics(), "duplex_log_upload_failures_total") for n in cl.nodes)

    t0 = time.monotonic()
    replay = subprocess.run(
        [REPLAY, f"s3://{cl.s3.bucket}/{cl.prefix}/", "--s3-endpoint-url", cl.s3.endpoint],
        capture_output=True,
        text=True,
        env={**os.environ, **cl.s3.env},
        timeout=120,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    last = replay.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{len(keys)} logs, {len(keys)} reproduced, 0 not"), last
    rows = [line for line in replay.stdout.splitlines() if line.startswith("sess_")]
    consistent = [line for line in rows if "consistent" in line]
    assert len(consistent) == 1  # the session of the killed process has no end record
    assert sum("identical" in line for line in rows) == len(keys) - 1
    cl.figures["bucket"] = {
        "objects": len(keys),
        "client_sessions": len(cl.session_ids),
        "warmup_logs": len(extra),
        "upload_failures": failures,
        "replay_all_from_s3_s": round(time.monotonic() - t0, 2),
    }
