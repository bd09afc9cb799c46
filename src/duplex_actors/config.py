"""Server settings: from ``duplex-actors serve`` flags or, for the hypercorn entry, ``DUPLEX_*``."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TypeVar

import attrs

from .model.engine import CONTEXT_POLICIES, DEFAULT_CONTEXT_POLICY
from .model.memory import DTYPES, parse_size

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it and fits on one line."""


ADMISSION_REFUSALS = ("inband", "http")
# The tick policies' names (scheduler/policy.py implements them; it reads them from here, so that
# reading settings never imports the scheduler) and the default.
TICK_POLICIES = ("grid", "deadline", "window")
DEFAULT_TICK_POLICY = "grid"


def parse_flag(env: Mapping[str, str], name: str, fallback: bool) -> bool:
    """``env[name]`` as a boolean (1/true/yes/on, 0/false/no/off), ``fallback`` when unset."""
    value = env.get(name, "").strip().lower()
    if not value:
        return fallback
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={env[name]!r}: expected 1/true/yes/on or 0/false/no/off")


def _parse(env: Mapping[str, str], name: str, kind: Callable[[str], T], what: str) -> T | None:
    """``env[name]`` converted by ``kind``, None when unset or empty; ConfigError naming it."""
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r}: expected {what}") from None


def parse_voice_aliases(items: list[str], name: str) -> tuple[tuple[str, str], ...]:
    """``NAME=FILE.pt`` items (blank ones skipped) as pairs; :class:`ConfigError` naming ``name``."""
    from .model.voices import VoiceAliasError, parse_voice_alias

    try:
        return tuple(parse_voice_alias(item) for item in items if item.strip())
    except VoiceAliasError as exc:
        raise ConfigError(f"{name}: {exc}") from None


@attrs.frozen(slots=True)
class ServerConfig:
    model: str = "tiny"
    revision: str | None = None
    family: str | None = None
    max_sessions: int = 8
    device: str = "cpu"
    # auto: bfloat16 on CUDA, float32 on CPU; refused at start-up if it cannot fit (model/memory.py)
    dtype: str = "auto"
    memory_limit: int | None = None  # bytes the model may use at most (None: what the device has)
    torch_threads: int = 1
    # The engine core's address (a Unix socket; abstract when it starts with NUL): set by
    # ``serve`` for its front ends. None: the core of this log dir, started if none answers.
    engine_core: str | None = None
    log_dir: str = "sessions"
    log_max_age_s: float | None = None
    log_max_bytes: int | None = None
    log_probe_interval_s: float = 5.0
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    static_ui: str | None = None  # a built web UI (e.g. PersonaPlex's) served at / instead of the page
    idle_timeout_s: float = 300.0
    input_buffer_bytes: int = 16 * 1024 * 1024
    outbox_events: int = 4096
    max_message_bytes: int = 16 * 1024 * 1024
    # When the scheduler steps (notes/tick-policy.md, docs/operations.md): the grid, sessions
    # aligned to it (an unaligned 80 ms client waits 40 ms on average there).
    tick_policy: str = DEFAULT_TICK_POLICY
    # /api/chat: the stock UIs' sampling query parameters set the session's sampling (else greedy)
    client_sampling: bool = False
    # transport (docs/operations.md): request-body deadline, HTTP keep-alive idle time, and the
    # bound on open TCP connections (None: the descriptor limit less room for logs)
    body_timeout_s: float = 10.0
    keep_alive_timeout_s: float | None = None  # None: hypercorn's own (5 s, or its --keep-alive)
    max_connections: int | None = None
    # per-connection input budget (docs/operations.md; RELIABILITY.md, "What a hostile client can cost you")
    input_budget_s: float = 2.0  # audio ahead of the scheduler before the socket is not read
    max_messages_per_s: float = 200.0
    message_burst: float = 250.0
    max_bytes_per_s: float = 1024.0 * 1024.0
    byte_burst: float = 8.0 * 1024.0 * 1024.0
    rate_limit_after_s: float = 60.0  # held back that long: rate_limited, 1008
    # scale-out (docs/scaling.md)
    agent_port: int | None = None  # HAProxy agent-check responder
    agent_host: str = "127.0.0.1"
    admission_refusal: str = "inband"  # or "http": HTTP 503 + Retry-After at the handshake
    log_upload: str | None = None  # s3://bucket/prefix
    s3_endpoint_url: str | None = None
    # /api/chat's Opus codec processes; None: opus.pool.default_opus_workers() (started lazily)
    opus_workers: int | None = None
    # The total alignment pad of a session (spec section 7); past it the session is unaligned.
    max_align_pad_ms: int = 1000
    # What a session longer than the model's context keeps (docs/operations.md, "Sessions longer
    # than the context"): "ring" (moshi's) or "pin-prompt"; and the cap of a pinned prompt in
    # positions (None: a quarter of the context).
    context_policy: str = DEFAULT_CONTEXT_POLICY
    max_pinned_prompt: int | None = None
    # Voice names besides the bundled ones (model/voices.py): the operator's (name, voice) pairs,
    # over the default table of OpenAI's voice names.
    voice_aliases: tuple[tuple[str, str], ...] = ()
    # /api/chat: how long the handshake waits for a prompt's prefill (None: 30 s, or 4 times the
    # default prompt's prefill at start-up if longer)
    prepare_timeout_s: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.admission_refusal not in ADMISSION_REFUSALS:
            raise ValueError(f"admission_refusal must be one of {ADMISSION_REFUSALS}")
        if self.tick_policy not in TICK_POLICIES:
            raise ValueError(f"tick_policy must be one of {TICK_POLICIES}")
        if self.opus_workers is not None and self.opus_workers < 1:
            raise ConfigError(f"opus workers: {self.opus_workers}: expected at least 1")
        if self.max_align_pad_ms < 0:
            raise ConfigError(f"max align pad: {self.max_align_pad_ms} ms: expected at least 0")
        if self.context_policy not in CONTEXT_POLICIES:
            raise ConfigError(
                f"context policy {self.context_policy!r}: expected one of {', '.join(CONTEXT_POLICIES)}"
            )
        if self.max_pinned_prompt is not None and self.max_pinned_prompt < 0:
            raise ConfigError(f"max pinned prompt: {self.max_pinned_prompt}: expected at least 0 positions")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype {self.dtype!r}: expected one of {', '.join(DTYPES)}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServerConfig:
        """The settings of the hypercorn entry; a bad value raises :class:`ConfigError` naming
        its variable. Unset or empty variables keep their defaults."""
        env = dict(os.environ if env is None else env)
        default = cls()

        def integer(name: str, fallback: int) -> int:
            value = _parse(env, name, int, "an integer")
            return fallback if value is None else value

        def number(name: str, fallback: float) -> float:
            value = _parse(env, name, float, "a number")
            return fallback if value is None else value

        def flag(name: str, fallback: bool) -> bool:
            return parse_flag(env, name, fallback)

        opus_workers = _parse(env, "DUPLEX_OPUS_WORKERS", int, "an integer (processes)")
        if opus_workers is not None and opus_workers < 1:
            raise ConfigError(f"DUPLEX_OPUS_WORKERS={opus_workers}: expected at least 1")
        refusal = env.get("DUPLEX_ADMISSION_REFUSAL") or default.admission_refusal
        if refusal not in ADMISSION_REFUSALS:
            raise ConfigError(
                f"DUPLEX_ADMISSION_REFUSAL={refusal!r}: expected one of {', '.join(ADMISSION_REFUSALS)}"
            )
        tick_policy = env.get("DUPLEX_TICK_POLICY") or default.tick_policy
        if tick_policy not in TICK_POLICIES:
            raise ConfigError(
                f"DUPLEX_TICK_POLICY={tick_policy!r}: expected one of {', '.join(TICK_POLICIES)}"
            )
        context_policy = env.get("DUPLEX_CONTEXT_POLICY") or default.context_policy
        if context_policy not in CONTEXT_POLICIES:
            raise ConfigError(
                f"DUPLEX_CONTEXT_POLICY={context_policy!r}: expected one of {', '.join(CONTEXT_POLICIES)}"
            )
        dtype = env.get("DUPLEX_DTYPE") or default.dtype
        if dtype not in DTYPES:
            raise ConfigError(f"DUPLEX_DTYPE={dtype!r}: expected one of {', '.join(DTYPES)}")
        return cls(
            model=env.get("DUPLEX_MODEL", default.model),
            dtype=dtype,
            memory_limit=_parse(env, "DUPLEX_MEMORY_LIMIT", parse_size, "a size such as 24G or 512M"),
            prepare_timeout_s=_parse(env, "DUPLEX_PREPARE_TIMEOUT", float, "a number of seconds"),
            revision=env.get("DUPLEX_MODEL_REVISION") or None,
            family=env.get("DUPLEX_FAMILY") or None,
            max_sessions=integer("DUPLEX_MAX_SESSIONS", default.max_sessions),
            device=env.get("DUPLEX_DEVICE", default.device),
            torch_threads=integer("DUPLEX_TORCH_THREADS", default.torch_threads),
            engine_core=env.get("DUPLEX_ENGINE_CORE") or None,
            log_dir=env.get("DUPLEX_LOG_DIR", default.log_dir),
            log_max_age_s=_parse(env, "DUPLEX_LOG_MAX_AGE", float, "a number of seconds"),
            log_max_bytes=_parse(env, "DUPLEX_LOG_MAX_BYTES", int, "an integer (bytes)"),
            log_probe_interval_s=number("DUPLEX_LOG_PROBE_INTERVAL", default.log_probe_interval_s),
            api_key=env.get("DUPLEX_API_KEY") or None,
            allowed_origins=tuple(
                o.strip() for o in env.get("DUPLEX_ALLOWED_ORIGINS", "").split(",") if o.strip()
            ),
            idle_timeout_s=number("DUPLEX_IDLE_TIMEOUT", default.idle_timeout_s),
            input_buffer_bytes=integer("DUPLEX_INPUT_BUFFER_BYTES", default.input_buffer_bytes),
            outbox_events=integer("DUPLEX_OUTBOX_EVENTS", default.outbox_events),
            max_message_bytes=integer("DUPLEX_MAX_MESSAGE_BYTES", default.max_message_bytes),
            tick_policy=tick_policy,
            client_sampling=flag("DUPLEX_CLIENT_SAMPLING", default.client_sampling),
            body_timeout_s=number("DUPLEX_BODY_TIMEOUT", default.body_timeout_s),
            keep_alive_timeout_s=_parse(env, "DUPLEX_KEEP_ALIVE_TIMEOUT", float, "a number of seconds"),
            max_connections=_parse(env, "DUPLEX_MAX_CONNECTIONS", int, "an integer"),
            input_budget_s=number("DUPLEX_INPUT_BUDGET", default.input_budget_s),
            max_messages_per_s=number("DUPLEX_MAX_MESSAGES_PER_S", default.max_messages_per_s),
            message_burst=number("DUPLEX_MESSAGE_BURST", default.message_burst),
            max_bytes_per_s=number("DUPLEX_MAX_BYTES_PER_S", default.max_bytes_per_s),
            byte_burst=number("DUPLEX_BYTE_BURST", default.byte_burst),
            rate_limit_after_s=number("DUPLEX_RATE_LIMIT_AFTER", default.rate_limit_after_s),
            agent_port=_parse(env, "DUPLEX_AGENT_PORT", int, "a port number"),
            agent_host=env.get("DUPLEX_AGENT_HOST", default.agent_host),
            admission_refusal=refusal,
            log_upload=env.get("DUPLEX_LOG_UPLOAD") or None,
            s3_endpoint_url=env.get("DUPLEX_S3_ENDPOINT_URL") or None,
            opus_workers=opus_workers,
            max_align_pad_ms=integer("DUPLEX_MAX_ALIGN_PAD_MS", default.max_align_pad_ms),
            context_policy=context_policy,
            max_pinned_prompt=_parse(env, "DUPLEX_MAX_PINNED_PROMPT", int, "an integer (positions)"),
            voice_aliases=parse_voice_aliases(
                env.get("DUPLEX_VOICE_ALIASES", "").split(","), "DUPLEX_VOICE_ALIASES"
            ),
        )
