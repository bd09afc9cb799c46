"""The server's start-up as an operator meets it (the holder in process): a model that cannot be
served ends start-up with one line naming the phase; readiness and health while loading; the
/api/chat prepare timeout derived from the prefill measured at start-up."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio

from duplex_actors.app import PREFILL_TIMEOUT_FACTOR, ModelHolder, create_quart_app
from duplex_actors.config import ConfigError, ServerConfig
from duplex_actors.model.layout import LM_NAME, MIMI_NAME
from duplex_actors.model.startup import DONE, RUNNING, PhaseReport


def _broken(tiny_dir: Path, tmp_path: Path, how: str) -> str:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, ckpt)
    if how == "missing":
        (ckpt / MIMI_NAME).unlink()
    else:
        (ckpt / LM_NAME).write_bytes(b"not safetensors")
    return str(ckpt)


@pytest.mark.parametrize(
    "model, phase, says",
    [
        (
            "standin-25",
            "resolve",
            "standin-25: not a built-in model (tiny, tiny-parrot), an existing directory",
        ),
        ("/no/such/checkpoint", "resolve", "/no/such/checkpoint: not a built-in model"),
        ("missing", "resolve", "tokenizer-e351c8d8-checkpoint125.safetensors: missing; expected the Mimi"),
        ("malformed", "load", "model.safetensors: expected a safetensors LM checkpoint"),
        (
            "local-org/absent",
            "resolve",
            "local-org/absent: not in the local Hugging Face cache, and HF_HUB_OFFLINE=1",
        ),
    ],
)
async def test_a_model_that_cannot_be_served_ends_start_up_at_once(
    model, phase, says, tiny_dir, tmp_path, monkeypatch
):
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    # The engine core that loads it is a process of its own: it reads these from its environment.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if model in ("missing", "malformed"):
        model = _broken(tiny_dir, tmp_path, model)
    holder = ModelHolder(ServerConfig(model=model, log_dir=str(tmp_path / "logs")))
    lines: list[str] = []
    holder.on_fatal = lines.append
    with trio.fail_after(60):
        await holder._serve()
    (line,) = lines
    assert line.startswith(f"cannot serve {model}: the {phase} phase failed: "), line
    assert says in line and "\n" not in line
    assert holder.error is not None and holder.error.startswith(f"{phase}: ")
    assert holder.server is None and holder.loaded_at is None


async def test_not_enough_memory_for_the_dtype_is_a_failed_load(tmp_path):
    holder = ModelHolder(
        ServerConfig(model="tiny", dtype="float32", memory_limit=1 << 20, log_dir=str(tmp_path))
    )
    lines: list[str] = []
    holder.on_fatal = lines.append
    with trio.fail_after(60):
        await holder._serve()
    (line,) = lines
    assert line.startswith(
        "cannot serve tiny: the load phase failed: tiny in float32 does not fit: it needs "
    )
    assert "1.0 MiB is the memory limit (--memory-limit / DUPLEX_MEMORY_LIMIT)" in line
    assert "--dtype bfloat16 needs " in line


def test_a_bad_dtype_or_size_setting_is_named():
    with pytest.raises(
        ConfigError, match="DUPLEX_DTYPE='fp8': expected one of auto, bfloat16, float16, float32"
    ):
        ServerConfig.from_env({"DUPLEX_DTYPE": "fp8"})
    with pytest.raises(ConfigError, match="DUPLEX_MEMORY_LIMIT='lots': expected a size"):
        ServerConfig.from_env({"DUPLEX_MEMORY_LIMIT": "lots"})
    config = ServerConfig.from_env(
        {"DUPLEX_DTYPE": "bfloat16", "DUPLEX_MEMORY_LIMIT": "20G", "DUPLEX_PREPARE_TIMEOUT": "90"}
    )
    assert (config.dtype, config.memory_limit, config.prepare_timeout_s) == ("bfloat16", 20 << 30, 90.0)


def _report(name: str, state: str, elapsed: float, **extra: object) -> PhaseReport:
    return PhaseReport(name, state, elapsed, reported_at=1e9, **extra)  # type: ignore[arg-type]


def test_the_prepare_timeout_follows_the_prefill_measured_at_start_up():
    holder = ModelHolder(ServerConfig())
    assert holder.prepare_timeout() == (30.0, "the default; --prepare-timeout sets it")
    holder.startup.record(_report("prefill", DONE, 2.0))  # a fast machine: the default stays
    assert holder.prepare_timeout()[0] == 30.0
    holder.startup.record(_report("prefill", DONE, 265.0))  # the 7B on a CPU
    limit, source = holder.prepare_timeout()
    assert limit == PREFILL_TIMEOUT_FACTOR * 265.0
    assert source == "4 times the default prompt's 265.0 s prefill at start-up; --prepare-timeout sets it"
    fixed = ModelHolder(ServerConfig(prepare_timeout_s=45.0))
    fixed.startup.record(_report("prefill", DONE, 265.0))
    assert fixed.prepare_timeout() == (45.0, "--prepare-timeout / DUPLEX_PREPARE_TIMEOUT")


async def test_ready_and_health_while_loading():
    app = create_quart_app(ServerConfig())  # not started: the model is not loading for real here
    holder: ModelHolder = app.extensions["duplex_model"]
    holder.startup.record(_report("load", DONE, 4.6))
    holder.startup.record(_report("prefill", RUNNING, 10.0, done=20, total=100, unit="positions", eta_s=40.0))
    client = app.test_client()
    ready = await client.get("/ready")
    body = await ready.get_json()
    assert ready.status_code == 503 and body["ready"] is False and body["loading"] is True
    assert body["phases_done_s"] == {"load": 4.6}
    phase = body["phase"]
    assert (phase["name"], phase["state"], phase["progress"], phase["unit"]) == (
        "prefill",
        RUNNING,
        0.2,
        "positions",
    )
    health = await client.get("/health")
    assert health.status_code == 200 and await health.get_json() == {"status": "loading", "phase": "prefill"}
    holder.error = "load: CheckpointError: bad"
    health = await client.get("/health")
    assert health.status_code == 503 and (await health.get_json())["status"] == "unhealthy"


async def test_a_setting_that_cannot_work_ends_start_up_before_the_model_loads(tmp_path):
    holder = ModelHolder(ServerConfig(model="tiny", input_buffer_bytes=1000, log_dir=str(tmp_path)))
    lines: list[str] = []
    holder.on_fatal = lines.append
    with trio.fail_after(60):
        await holder._serve()
    assert lines == [
        "cannot serve tiny: the server start-up phase failed: max_buffered_samples must hold at least 10 s of audio"
    ]
    assert holder.startup.phases == {}  # nothing was loaded
