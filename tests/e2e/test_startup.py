"""Start-up as an operator meets it, on real processes: a PersonaPlex-layout checkpoint served in
bfloat16 (its phases in /ready, its dtype in the log header); a model that cannot be served ends
the process at once with one line (serve and the hypercorn entry); a hub that cannot be reached
keeps the process loading, the retry visible in /ready, until it can."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from duplex_actors.model.synthetic import make_personaplex_layout
from tests.model.test_loading import _hf_cache_layout
from tests.model.test_personaplex_layout import SMALL_LM

from .conftest import EXE, ServerProcess, free_port, http_get, start_server
from .helpers import FRAME_PCM16_BYTES, connect, feed, pcm16, tone_and_noise

PHASES = ["import", "resolve", "load", "engine", "digest", "prefill", "warmup"]


def _get(server_base: str, path: str) -> tuple[int, dict]:
    try:
        status, body = http_get(server_base + path)
    except OSError:
        return 0, {}
    return status, json.loads(body)


async def test_serve_on_the_personaplex_layout_in_bfloat16(tmp_path, tiny_dir):
    layout = make_personaplex_layout(tmp_path / "personaplex-7b-v1", lm_config=SMALL_LM)
    server = await trio.to_thread.run_sync(
        lambda: start_server(tmp_path, "--dtype", "bfloat16", "--max-sessions", "1", model=str(layout))
    )
    try:
        status, ready = await trio.to_thread.run_sync(_get, server.base, "/ready")
        assert status == 200 and ready["family"] == "personaplex"
        assert set(ready["phases_done_s"]) == set(PHASES)
        async with connect(f"{server.ws}/v1/realtime?duplex=1") as client:
            await client.wait_for("session.created")
            await feed(client, pcm16(tone_and_noise(0.32)), FRAME_PCM16_BYTES, pace=0)
            await client.wait_until(lambda: client.output_frames() >= 4, what="4 frames back")
    finally:
        assert server.stop() == 0, server.output
    for line in ("start-up: digest done in", "start-up: prefill done in", "start-up: warmup done in"):
        assert line in server.output
    logs = sorted(server.log_dir.glob("*.dlog"))
    headers = [rec for path in logs for _, rec in read_log(path).records if isinstance(rec, r.Header)]
    assert {h.dtype for h in headers} == {"bfloat16"}
    assert {h.model_id for h in headers} == {str(layout.resolve())}
    assert all(len(h.engine["voices"]) == 18 for h in headers)


def _run_to_exit(cmd: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def test_serve_refuses_the_7b_in_float32_on_a_24_gib_machine_at_once(tmp_path, tiny_dir):
    """The 7B layout, its LM file sparse (a real header, no data: nothing is loaded before the
    check), on a machine with 24 GiB for the model: float32 is refused with the figures and the
    way out, at once, instead of the kernel killing the process half-way through the load."""
    layout = make_personaplex_layout(tmp_path / "personaplex-7b-v1", weights=False)
    cmd = [EXE, "serve", "--model", str(layout), "--dtype", "float32", "--max-sessions", "1"]
    cmd += ["--memory-limit", "24G", "--port", str(free_port()), "--log-dir", str(tmp_path / "logs")]
    code, out, took = _run_to_exit(cmd, {})
    assert code == 2, out
    assert "Traceback" not in out
    last = out.strip().splitlines()[-1]
    assert last.startswith(
        f"duplex-actors: cannot serve {layout}: the load phase failed: {layout} in float32 does not fit: "
        "it needs 34.5 GiB (LM 28.6 GiB, KV caches 5.9 GiB, Mimi "
    ), last
    # 24 GiB, or less where the machine has less available (either is named); bfloat16 fits in
    # 24 GiB (whether it fits here is the machine's)
    assert re.search(
        r"\), (24\.0 GiB is the memory limit \(--memory-limit|[0-9.]+ GiB is available on this)", last
    )
    assert "; --dtype bfloat16 needs 17.3 GiB (" in last, last
    assert took < 30


def test_the_hypercorn_entry_ends_with_one_line_when_the_model_cannot_be_served(tmp_path):
    """With ``--workers 0``: hypercorn 0.18 exits 0 after its worker process exits non-zero (its
    final join overwrites the worker's status), so only the in-process worker keeps the status."""
    exe = str(Path(sys.executable).with_name("hypercorn"))
    cmd = [exe, "-k", "trio", "--workers", "0", "--bind", f"127.0.0.1:{free_port()}", "duplex_actors.app:app"]
    env = {"DUPLEX_MODEL": str(tmp_path / "no-such-checkpoint"), "DUPLEX_LOG_DIR": str(tmp_path / "logs")}
    code, out, _ = _run_to_exit(cmd, env)
    assert code == 2, out
    assert "Traceback" not in out
    assert out.strip().splitlines()[-1] == (
        f"duplex-actors: cannot serve {tmp_path}/no-such-checkpoint: the resolve phase failed: "
        f"{tmp_path}/no-such-checkpoint: not a built-in model (tiny, tiny-parrot), an existing directory, "
        "or a Hugging Face repo id (owner/name)"
    )


def test_an_unreachable_hub_keeps_the_server_loading_until_it_heals(tmp_path, tiny_dir):
    hub = tmp_path / "hub"
    hub.mkdir()
    port = free_port()
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    env.pop("HF_HUB_OFFLINE", None)
    proc = subprocess.Popen(
        [
            EXE,
            "serve",
            "--model",
            "local-org/tiny-personaplex",
            "--port",
            str(port),
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    server = ServerProcess(proc, port, tmp_path / "logs")
    try:
        deadline = time.monotonic() + 60
        retrying: dict = {}
        while time.monotonic() < deadline and proc.poll() is None:
            status, body = _get(server.base, "/ready")
            if status == 503 and (body.get("phase") or {}).get("state") == "retrying":
                retrying = body
                break
            time.sleep(0.2)
        assert retrying, server.stop() or server.output
        phase = retrying["phase"]
        assert phase["name"] == "resolve" and retrying["loading"] is True
        assert phase["detail"].startswith(
            "attempt 1 failed: local-org/tiny-personaplex: the Hugging Face hub cannot be reached and "
            "the repo is not in the local cache; next attempt in "
        )
        assert _get(server.base, "/health") == (200, {"status": "loading", "phase": "resolve"})
        _hf_cache_layout(tiny_dir, hub, "local-org/tiny-personaplex")  # the download, done by hand
        deadline = time.monotonic() + 60
        status = 0
        while time.monotonic() < deadline and proc.poll() is None and status != 200:
            status, body = _get(server.base, "/ready")
            time.sleep(0.2)
        assert status == 200, server.stop() or server.output
        assert _get(server.base, "/health") == (200, {"status": "healthy"})
    finally:
        assert server.stop(signal.SIGTERM) == 0, server.output
    assert "start-up: resolve: attempt 1 failed" in server.output
