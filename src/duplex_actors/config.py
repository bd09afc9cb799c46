"""Server settings: from ``duplex-actors serve`` flags or, for the hypercorn entry, ``DUPLEX_*``."""

from __future__ import annotations

import os

import attrs


def _opt_float(value: str | None) -> float | None:
    return float(value) if value else None


def _opt_int(value: str | None) -> int | None:
    return int(value) if value else None


ADMISSION_REFUSALS = ("inband", "http")


@attrs.frozen(slots=True)
class ServerConfig:
    model: str = "tiny"
    revision: str | None = None
    family: str | None = None
    max_sessions: int = 8
    device: str = "cpu"
    torch_threads: int = 1
    log_dir: str = "sessions"
    log_max_age_s: float | None = None
    log_max_bytes: int | None = None
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    idle_timeout_s: float = 300.0
    input_buffer_bytes: int = 16 * 1024 * 1024
    outbox_events: int = 4096
    max_message_bytes: int = 16 * 1024 * 1024
    # scale-out (docs/scaling.md)
    agent_port: int | None = None  # HAProxy agent-check responder
    agent_host: str = "127.0.0.1"
    admission_refusal: str = "inband"  # or "http": HTTP 503 + Retry-After at the handshake
    log_upload: str | None = None  # s3://bucket/prefix
    s3_endpoint_url: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.admission_refusal not in ADMISSION_REFUSALS:
            raise ValueError(f"admission_refusal must be one of {ADMISSION_REFUSALS}")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ServerConfig:
        env = dict(os.environ if env is None else env)
        return cls(
            model=env.get("DUPLEX_MODEL", "tiny"),
            revision=env.get("DUPLEX_MODEL_REVISION") or None,
            family=env.get("DUPLEX_FAMILY") or None,
            max_sessions=int(env.get("DUPLEX_MAX_SESSIONS", "8")),
            device=env.get("DUPLEX_DEVICE", "cpu"),
            torch_threads=int(env.get("DUPLEX_TORCH_THREADS", "1")),
            log_dir=env.get("DUPLEX_LOG_DIR", "sessions"),
            log_max_age_s=_opt_float(env.get("DUPLEX_LOG_MAX_AGE")),
            log_max_bytes=_opt_int(env.get("DUPLEX_LOG_MAX_BYTES")),
            api_key=env.get("DUPLEX_API_KEY") or None,
            allowed_origins=tuple(
                o.strip() for o in env.get("DUPLEX_ALLOWED_ORIGINS", "").split(",") if o.strip()
            ),
            idle_timeout_s=float(env.get("DUPLEX_IDLE_TIMEOUT", "300")),
            input_buffer_bytes=int(env.get("DUPLEX_INPUT_BUFFER_BYTES", str(16 * 1024 * 1024))),
            outbox_events=int(env.get("DUPLEX_OUTBOX_EVENTS", "4096")),
            max_message_bytes=int(env.get("DUPLEX_MAX_MESSAGE_BYTES", str(16 * 1024 * 1024))),
            agent_port=_opt_int(env.get("DUPLEX_AGENT_PORT")),
            agent_host=env.get("DUPLEX_AGENT_HOST", "127.0.0.1"),
            admission_refusal=env.get("DUPLEX_ADMISSION_REFUSAL", "inband"),
            log_upload=env.get("DUPLEX_LOG_UPLOAD") or None,
            s3_endpoint_url=env.get("DUPLEX_S3_ENDPOINT_URL") or None,
        )
