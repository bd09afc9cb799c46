"""The server's settings, each declared once: its type, default, kind, variable, flag and help.

``duplex-actors serve`` reads them from its flags over the ``DUPLEX_*`` variables over the
defaults; the hypercorn entry and the engine core it starts, from the variables over the
defaults (``settings.py`` says how). The table of docs/operations.md is generated from here:
``python -m duplex_actors.config --update docs/operations.md`` rewrites it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import attrs

from .model.engine import CONTEXT_POLICIES, DEFAULT_CONTEXT_POLICY
from .model.memory import DTYPES, parse_size
from .model.voices import parse_voice_alias
from .settings import (
    BOOLEAN,
    ConfigError,
    Kind,
    as_env,
    choice,
    integer,
    load,
    markdown_table,
    number,
    setting,
    text,
)

__all__ = [
    "ADMISSION_REFUSALS",
    "DEFAULT_TICK_POLICY",
    "TICK_POLICIES",
    "ConfigError",
    "ServeOptions",
    "ServerConfig",
    "parse_voice_aliases",
]

ADMISSION_REFUSALS = ("inband", "http")
# The tick policies' names (scheduler/policy.py implements them; it reads them from here, so that
# reading settings never imports the scheduler) and the default.
TICK_POLICIES = ("grid", "deadline", "window")
DEFAULT_TICK_POLICY = "grid"
FAMILIES = ("personaplex", "moshi")

SIZE: Kind[int] = Kind(
    "a size such as 24G, 512M or a number of bytes",
    parse_size,
    accepts=lambda v: isinstance(v, int) and v >= 0,
)
VOICE_ALIAS: Kind[tuple[str, str]] = Kind(
    "NAME=FILE.pt",
    parse_voice_alias,
    accepts=lambda v: isinstance(v, tuple) and len(v) == 2,
    render=lambda v: f"{v[0]}={v[1]}",
    explains=True,
)


def _ui_dir(path: str) -> str:
    if not (Path(path) / "index.html").is_file():
        raise ValueError("no index.html there")
    return path


UI_DIR: Kind[str] = Kind("a directory with an index.html", _ui_dir, explains=True)


def parse_voice_aliases(items: list[str], name: str) -> tuple[tuple[str, str], ...]:
    """``NAME=FILE.pt`` items (blank ones skipped) as pairs; :class:`ConfigError` naming ``name``."""
    pairs = []
    for item in items:
        if item.strip():
            try:
                pairs.append(parse_voice_alias(item))
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
    return tuple(pairs)


MAX_RESUME_GRACE_S = 300.0
RESUME_GRACE: Kind[float] = Kind(
    f"a number of seconds in 0..{MAX_RESUME_GRACE_S:g}",
    float,
    accepts=lambda v: isinstance(v, (int, float)) and 0 <= v <= MAX_RESUME_GRACE_S,
    render=repr,
)

MAX_LOG_COMMIT_LINGER_S = 1.0
DEFAULT_LOG_COMMIT_LINGER_S = 0.2  # log/writer.py's COMMIT_LINGER_S (a sibling layer: not imported)
LOG_COMMIT_LINGER: Kind[float] = Kind(
    f"a number of seconds in 0..{MAX_LOG_COMMIT_LINGER_S:g}",
    float,
    accepts=lambda v: isinstance(v, (int, float)) and 0 <= v <= MAX_LOG_COMMIT_LINGER_S,
    render=repr,
)

BUDGET = "per-connection input budget (docs/operations.md)"
SCALE_OUT = "scale-out (docs/scaling.md)"


@attrs.frozen(slots=True)
class ServerConfig:
    """What a server (the engine core and every front end) is configured with."""

    model: str = setting(
        "tiny",
        text("a model"),
        env="DUPLEX_MODEL",
        flag="--model",
        help="tiny, tiny-parrot, a checkpoint directory, or a Hugging Face repo id (section 3); "
        "standin:STEP_MS is a benchmark tool, not a model: no weights, each step waits STEP_MS "
        "with the GIL released and returns silence",
    )
    revision: str | None = setting(
        None,
        text("a revision"),
        env="DUPLEX_MODEL_REVISION",
        flag="--revision",
        help="the Hugging Face revision of --model",
        default_text="none: the repo's default branch",
    )
    family: str | None = setting(
        None,
        choice(FAMILIES),
        env="DUPLEX_FAMILY",
        flag="--family",
        help="the model family: personaplex or moshi",
        default_text="detected from the checkpoint",
    )
    max_sessions: int = setting(
        8,
        integer(),
        env="DUPLEX_MAX_SESSIONS",
        flag="--max-sessions",
        help="engine slots = concurrent sessions; fixed for the life of the process",
    )
    device: str = setting(
        "cpu", text("a device"), env="DUPLEX_DEVICE", flag="--device", help="cpu or cuda[:N]"
    )
    dtype: str = setting(
        "auto",
        choice(DTYPES),
        env="DUPLEX_DTYPE",
        flag="--dtype",
        help="the model's dtype: auto (bfloat16 on CUDA, float32 on CPU), bfloat16, float16 or "
        "float32; one that cannot fit in memory is refused at start-up, with the figures",
        details="Checked against the memory available before anything is loaded (section 3, "
        '"Memory"). Recorded in every log header; `duplex-replay --model` replays in it',
    )
    memory_limit: int | None = setting(
        None,
        SIZE,
        env="DUPLEX_MEMORY_LIMIT",
        flag="--memory-limit",
        metavar="SIZE",
        help="the memory the model may use at most, e.g. 24G, 512M or bytes (powers of 1024); "
        "checked at start-up before anything is loaded",
        details="For a machine or GPU shared with other processes: the start-up check takes the "
        "smaller of this and what is available",
        default_text="what the device has free",
    )
    torch_threads: int = setting(
        1, integer(), env="DUPLEX_TORCH_THREADS", flag="--torch-threads", help="torch threads on CPU"
    )
    # The engine core's address (a Unix socket; abstract when it starts with NUL): set by
    # ``serve`` for its front ends. None: the core of this log dir, started if none answers.
    engine_core: str | None = setting(
        None,
        text("a Unix socket address"),
        env="DUPLEX_ENGINE_CORE",
        flag=None,
        help="the engine core's Unix socket (abstract when it starts with NUL); `serve` sets it "
        "for its front ends. Unset, a front end links to the core of its log dir and starts one "
        "if none answers",
        default_text="the core of the log dir",
    )
    log_dir: str = setting(
        "sessions",
        text("a directory"),
        env="DUPLEX_LOG_DIR",
        flag="--log-dir",
        help="session logs (section 6), relative to the working directory",
    )
    log_max_age_s: float | None = setting(
        None,
        number(unit="seconds"),
        env="DUPLEX_LOG_MAX_AGE",
        flag="--log-max-age",
        metavar="SECONDS",
        help="delete finished logs older than this (by mtime)",
        default_text="none",
    )
    log_max_bytes: int | None = setting(
        None,
        integer(unit="bytes"),
        env="DUPLEX_LOG_MAX_BYTES",
        flag="--log-max-bytes",
        metavar="BYTES",
        help="delete the oldest finished logs while the log dir is over this size",
        default_text="none",
    )
    log_probe_interval_s: float = setting(
        5.0,
        number(unit="seconds"),
        env="DUPLEX_LOG_PROBE_INTERVAL",
        flag="--log-probe-interval",
        metavar="SECONDS",
        help="while the log dir fails (a log could not be created, written or fsynced), probe it "
        "this often; admissions resume once a probe works (section 6)",
    )
    log_commit_linger_s: float = setting(
        DEFAULT_LOG_COMMIT_LINGER_S,
        LOG_COMMIT_LINGER,
        env="DUPLEX_LOG_COMMIT_LINGER",
        flag="--log-commit-linger",
        metavar="SECONDS",
        help="how long the session logs' records that nobody waits for (audio, step results) gather "
        "before their commit (write and fdatasync); an acknowledged record is committed at once",
        details="Each commit costs one fdatasync per log in it, CPU of the front end's (section 6, "
        '"Durability"); a crash loses at most the records of this long that nobody waited for',
    )
    api_key: str | None = setting(
        None,
        text("a key"),
        env="DUPLEX_API_KEY",
        flag="--api-key",
        help="require this key on the WebSocket routes, as a Bearer token or a subprotocol (section 9)",
        default_text="none",
    )
    allowed_origins: tuple[str, ...] = setting(
        (),
        text("an origin"),
        env="DUPLEX_ALLOWED_ORIGINS",
        flag="--allowed-origin",
        metavar="ORIGIN",
        many=True,
        help="browser Origin values allowed on the WebSocket routes",
        default_text="none: any",
    )
    static_ui: str | None = setting(
        None,
        UI_DIR,
        env="DUPLEX_STATIC_UI",
        flag="--static-ui",
        metavar="DIR",
        help="serve a built web UI from DIR instead of the built-in page: DIR/index.html at /, "
        "every other file under DIR at its relative path, e.g. the PersonaPlex client's dist/, "
        "which then talks to /api/chat on this origin",
        details="The files are listed at start-up; no path is joined from a request; no CSP of "
        "ours ([api.md](api.md#running-the-personaplex-web-ui-and-moshiclient))",
        default_text="none: the built-in page at /",
    )
    idle_timeout_s: float = setting(
        300.0,
        number(unit="seconds"),
        env="DUPLEX_IDLE_TIMEOUT",
        flag="--idle-timeout",
        metavar="SECONDS",
        help="close a session after this many seconds without a client message (timeout, 1000)",
        details="At the deadline what already waits in the socket gets 0.25 s to arrive, so a "
        "paused process does not close live sessions",
    )
    resume_grace_s: float = setting(
        30.0,
        RESUME_GRACE,
        env="DUPLEX_RESUME_GRACE_S",
        flag="--resume-grace-s",
        metavar="SECONDS",
        help="how long a resumable session whose connection dropped keeps its slot, context and "
        "output journal for the client to come back; 0 turns resume off",
        details="Sessions opt in ([protocol.md §10](protocol.md#10-resuming-a-dropped-connection)); "
        'a detached session keeps its slot (section 10, "Resumable sessions")',
    )
    resume_journal_bytes: int = setting(
        2 * 1024 * 1024,
        integer(at_least=65536, unit="bytes"),
        env="DUPLEX_RESUME_JOURNAL_BYTES",
        flag="--resume-journal-bytes",
        help="per resumable session, the sent messages kept for a resume (oldest evicted first; "
        "a client whose cursor was evicted gets session.resync_required)",
    )
    resume_max_backlog_s: float = setting(
        2.0,
        number(at_least=0, unit="seconds"),
        env="DUPLEX_RESUME_MAX_BACKLOG_S",
        flag="--resume-max-backlog-s",
        metavar="SECONDS",
        help="after a resume, this much of the client's re-sent input is never drained by the tick policy",
    )
    input_buffer_bytes: int = setting(
        16 * 1024 * 1024,
        integer(unit="bytes"),
        env="DUPLEX_INPUT_BUFFER_BYTES",
        flag="--input-buffer-bytes",
        help="per-session input received but not yet stepped, counted as float32 bytes (4 per "
        "sample, whatever the wire format), at least 960000 (10 s); beyond it: input_backpressure",
    )
    input_budget_s: float = setting(
        2.0,
        number(unit="seconds"),
        env="DUPLEX_INPUT_BUDGET",
        flag="--input-budget",
        metavar="SECONDS",
        group=BUDGET,
        help="seconds of audio a session may have waiting for the model (received, not yet "
        "stepped); beyond, its socket is not read until the model catches up",
        details="TCP then pushes back on the client",
    )
    max_messages_per_s: float = setting(
        200.0,
        number(),
        env="DUPLEX_MAX_MESSAGES_PER_S",
        flag="--max-messages-per-s",
        group=BUDGET,
        help="client messages per second per connection; beyond, the socket is not read until "
        "the budget refills",
        details="Real clients: a browser's 10 ms chunks are 100/s, vLLM-Omni's `DuplexClient` "
        "acknowledgements 25/s; each message costs the event loop ~0.1-0.5 ms "
        "(`bench/append_path.py`)",
    )
    message_burst: float = setting(
        250.0,
        number(),
        env="DUPLEX_MESSAGE_BURST",
        flag="--message-burst",
        group=BUDGET,
        help="client messages a connection may send at once beyond --max-messages-per-s",
        details="The burst is what a storm gets at once (a 30 s upload in 10 ms chunks is held "
        "back ~14 s, never closed)",
    )
    max_bytes_per_s: float = setting(
        1024.0 * 1024.0,
        number(),
        env="DUPLEX_MAX_BYTES_PER_S",
        flag="--max-bytes-per-s",
        group=BUDGET,
        help="client message bytes per second per connection; beyond, the socket is not read "
        "until the budget refills",
        details="The largest real-time input, `pcm_f32le` at 48 kHz in base64, is 256 000 bytes/s",
    )
    byte_burst: float = setting(
        8.0 * 1024.0 * 1024.0,
        number(),
        env="DUPLEX_BYTE_BURST",
        flag="--byte-burst",
        group=BUDGET,
        help="client message bytes a connection may send at once beyond --max-bytes-per-s",
        details="It holds a 30 s upload of `pcm_f32le` at 48 kHz; one message larger than the "
        "burst is still taken, once the bucket is full, and paid for after",
    )
    rate_limit_after_s: float = setting(
        60.0,
        number(unit="seconds"),
        env="DUPLEX_RATE_LIMIT_AFTER",
        flag="--rate-limit-after",
        metavar="SECONDS",
        group=BUDGET,
        help="close a client held back by any of the input budgets this long without a break "
        "(error rate_limited, session.closed {reason: rate_limited}, close 1008)",
    )
    outbox_events: int = setting(
        4096,
        integer(),
        env="DUPLEX_OUTBOX_EVENTS",
        flag="--outbox-events",
        help="events a session may have waiting for its client before it is closed (slow_consumer)",
    )
    max_message_bytes: int = setting(
        16 * 1024 * 1024,
        integer(unit="bytes"),
        env="DUPLEX_MAX_MESSAGE_BYTES",
        flag="--max-message-bytes",
        help="WebSocket message limit; over it: close 1009",
        details="Under hypercorn the variable bounds only the JSON parser; hypercorn's own limit "
        "is its `websocket_max_message_size` (section 1)",
    )
    # When the scheduler steps (docs/operations.md, section 10): the grid, sessions aligned to it
    # (an unaligned 80 ms client waits 40 ms on average there).
    tick_policy: str = setting(
        DEFAULT_TICK_POLICY,
        choice(TICK_POLICIES),
        env="DUPLEX_TICK_POLICY",
        flag="--tick-policy",
        help="when the scheduler steps: 'grid' (one step per 80 ms tick on a fixed grid, "
        "sessions aligned to it), 'window' (step when every session has a frame, else 20 ms "
        "after the first), 'deadline' (the window stretched to 80 ms minus the p90 step)",
        details='Section 10, "Tick policies"',
    )
    context_policy: str = setting(
        DEFAULT_CONTEXT_POLICY,
        choice(CONTEXT_POLICIES),
        env="DUPLEX_CONTEXT_POLICY",
        flag="--context-policy",
        help="what a session longer than the model's context keeps: 'ring' (moshi's: the oldest "
        "positions go first, the voice prompt and persona among them), 'pin-prompt' (the prompt "
        "stays for the session's life, the rest is a ring)",
        details='PersonaPlex\'s context is 240 s. Section 10, "Sessions longer than the context"',
    )
    max_pinned_prompt: int | None = setting(
        None,
        integer(at_least=0, unit="positions"),
        env="DUPLEX_MAX_PINNED_PROMPT",
        flag="--max-pinned-prompt",
        metavar="POSITIONS",
        help="with --context-policy pin-prompt (ignored under ring), the most positions a "
        "session's prompt (voice, silences, persona) may take; a longer one is refused at open or "
        "update: invalid_duplex_runtime_config",
        details="As a prompt over 3/4 of the context is under `ring`. The default prompt (default "
        "voice and persona) must fit, or the server does not start",
        default_text="a quarter of the context (750 on PersonaPlex)",
    )
    # The total alignment pad of a session (docs/protocol.md §7); past it the session is unaligned.
    max_align_pad_ms: int = setting(
        1000,
        integer(at_least=0, unit="milliseconds"),
        env="DUPLEX_MAX_ALIGN_PAD_MS",
        flag="--max-align-pad-ms",
        metavar="MS",
        help="silence the server may insert into one session's input, in total, to align it to "
        "the tick (docs/protocol.md §7); past it the session is served unaligned",
        details='Section 10, "Alignment". 0 disables padding (hints are then never applied either)',
    )
    # Voice names besides the bundled ones (model/voices.py): the operator's (name, voice) pairs,
    # over the default table of OpenAI's voice names.
    voice_aliases: tuple[tuple[str, str], ...] = setting(
        (),
        VOICE_ALIAS,
        env="DUPLEX_VOICE_ALIASES",
        flag="--voice-alias",
        metavar="NAME=FILE.pt",
        many=True,
        help="a voice name sessions may ask for, mapped to a bundled voice prompt; it replaces "
        "the default of the same name or adds one",
        details="So that voice-agent frameworks work with their default voices ([api.md](api.md), "
        '"Using it from a voice-agent framework"). `FILE.pt` must be bundled (else `/health` '
        "reports the error at start-up). A session echoes the name it asked for and names the "
        "voice prompt it got under `voice_prompt`; the table is recorded in every log's header, "
        "so a replay resolves the same names. A checkpoint without voice prompts (plain Moshi) "
        "takes every alias as its own voice",
        default_text="OpenAI's voice names: alloy, sage, marin -> NATF2.pt; coral, shimmer -> "
        "NATF0.pt; ash, ballad, echo, verse, cedar -> NATM1.pt (those whose voice the checkpoint "
        "bundles)",
    )
    client_sampling: bool = setting(
        False,
        BOOLEAN,
        env="DUPLEX_CLIENT_SAMPLING",
        flag="--client-sampling",
        help="/api/chat: the stock UIs' text_temperature, text_topk, audio_temperature, "
        "audio_topk and audio_seed/text_seed set the session's sampling; off: they are ignored "
        "and sessions are greedy",
        details='[api.md](api.md), "Coming from PersonaPlex or Moshi"',
    )
    prepare_timeout_s: float | None = setting(
        None,
        number(unit="seconds"),
        env="DUPLEX_PREPARE_TIMEOUT",
        flag="--prepare-timeout",
        metavar="SECONDS",
        help="/api/chat: how long a connection waits for its prompt's prefill before its "
        "handshake; past it: 0x05 naming the limit, close 1011",
        details="A long persona on a slow machine prefills longer than the default prompt: raise it there",
        default_text="30, or 4 x the default prompt's prefill at start-up if longer",
    )
    opus_workers: int | None = setting(
        None,
        integer(at_least=1, unit="processes"),
        env="DUPLEX_OPUS_WORKERS",
        flag="--opus-workers",
        metavar="N",
        help="Opus codec processes for /api/chat sessions (python -m duplex_actors.opus.worker), "
        "started with the first such session",
        details="Each session's codec lives in one of them (the least loaded). A worker that dies "
        "ends only its sessions (1011) and is replaced. One worker holds about 80 ms / (its CPU "
        'per session-frame) sessions: see BENCHMARKS.md "Opus codec"',
        default_text="half the CPUs the process may use, 1 to 4",
    )
    body_timeout_s: float = setting(
        10.0,
        number(unit="seconds"),
        env="DUPLEX_BODY_TIMEOUT",
        flag="--body-timeout",
        metavar="SECONDS",
        help="close a connection whose HTTP request body has not fully arrived this long after "
        'its head (duplex_connections_dropped_total{reason="body_timeout"})',
    )
    keep_alive_timeout_s: float | None = setting(
        None,
        number(unit="seconds"),
        env="DUPLEX_KEEP_ALIVE_TIMEOUT",
        flag="--keep-alive-timeout",
        metavar="SECONDS",
        help="close a connection with no request, or an incomplete request head, for this long "
        "(slowloris heads)",
        default_text="hypercorn's: 5 (under hypercorn, its --keep-alive)",
    )
    max_connections: int | None = setting(
        None,
        integer(),
        env="DUPLEX_MAX_CONNECTIONS",
        flag="--max-connections",
        metavar="N",
        help="open TCP connections (HTTP and WebSocket, duplex_tcp_connections_open); a new one "
        'beyond is closed at once (duplex_connections_dropped_total{reason="max_connections"})',
        details="So `accept` never fails with EMFILE and session logs always get a descriptor. At "
        "start the soft `RLIMIT_NOFILE` is raised to the hard limit (as Go does); bound the "
        "process with the hard limit (`ulimit -Hn`, systemd `LimitNOFILE=`)",
        default_text="the descriptor limit - 64 - 2 x --max-sessions (at least 16)",
    )
    agent_port: int | None = setting(
        None,
        integer(unit="a port number"),
        env="DUPLEX_AGENT_PORT",
        flag="--agent-port",
        metavar="PORT",
        group=SCALE_OUT,
        help="answer HAProxy agent checks on this port: 'up ready maxconn:N', 'drain', 'down #reason'",
        details="[scaling.md](scaling.md)",
        default_text="none",
    )
    agent_host: str = setting(
        "127.0.0.1",
        text("an address"),
        env="DUPLEX_AGENT_HOST",
        flag="--agent-host",
        group=SCALE_OUT,
        help="the agent-check responder's address",
        default_text="serve's --host; 127.0.0.1 under hypercorn",
    )
    admission_refusal: str = setting(
        "inband",
        choice(ADMISSION_REFUSALS),
        env="DUPLEX_ADMISSION_REFUSAL",
        flag="--admission-refusal",
        group=SCALE_OUT,
        help="when every slot is taken: 'inband' accepts the WebSocket, sends error "
        "resource_exhausted and closes 1013; 'http' refuses the upgrade itself with HTTP 503 + "
        "Retry-After, so a proxy can retry another server",
    )
    log_upload: str | None = setting(
        None,
        text("an s3://BUCKET/PREFIX URL"),
        env="DUPLEX_LOG_UPLOAD",
        flag="--log-upload",
        metavar="s3://BUCKET/PREFIX",
        group=SCALE_OUT,
        help="upload each finished session log to S3 (If-None-Match: *), delete it locally once stored",
        default_text="none",
    )
    s3_endpoint_url: str | None = setting(
        None,
        text("a URL"),
        env="DUPLEX_S3_ENDPOINT_URL",
        flag="--s3-endpoint-url",
        metavar="URL",
        group=SCALE_OUT,
        help="an S3-compatible endpoint (SeaweedFS, MinIO, ...); credentials from the AWS_* variables",
        default_text="AWS's, or AWS_ENDPOINT_URL_S3",
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServerConfig:
        """The settings of the hypercorn entry: the variables over the defaults; a bad value
        raises :class:`ConfigError` naming its variable."""
        return load(cls, os.environ if env is None else env)

    def as_env(self) -> dict[str, str]:
        """Every setting as its ``DUPLEX_*`` variable (:meth:`from_env` reads them back)."""
        return as_env(self)


@attrs.frozen(slots=True)
class ServeOptions:
    """What ``duplex-actors serve`` alone is configured with (hypercorn has its own flags)."""

    host: str = setting(
        "127.0.0.1",
        text("an address"),
        env="DUPLEX_HOST",
        flag="--host",
        help="the address to listen on; 0.0.0.0 listens beyond loopback (hypercorn: -b HOST:PORT)",
    )
    port: int = setting(
        8000, integer(unit="a port number"), env="DUPLEX_PORT", flag="--port", help="the port"
    )
    frontends: int | None = setting(
        None,
        integer(at_least=1),
        env="DUPLEX_FRONTENDS",
        flag="--frontends",
        metavar="K",
        help="front-end processes (connections, dialects, sessions, logs) beside the engine core "
        '(section 10, "Processes"); hypercorn: its -w',
        default_text="min(4, cores - 1), at least 1",
    )
    drain_timeout_s: float = setting(
        10.0,
        number(unit="seconds"),
        env="DUPLEX_DRAIN_TIMEOUT",
        flag="--drain-timeout",
        metavar="SECONDS",
        help="seconds the drain on SIGTERM waits for sessions to close (section 8)",
    )
    switch_interval_ms: float = setting(
        0.5,
        number(unit="milliseconds"),
        env="DUPLEX_SWITCH_INTERVAL_MS",
        flag="--switch-interval-ms",
        group=BUDGET,
        help="the interpreter's thread switch interval (sys.setswitchinterval): how long the "
        "model's thread may wait for the GIL while the event loop is busy",
        details="Python's default 5 ms let a message storm stretch 20 ms steps to seconds",
    )


SETTINGS_CLASSES = (ServerConfig, ServeOptions)
# The table's rows: the server's settings (both entries read their variables), then serve's own.
TABLE_ROWS = ((ServerConfig, ""), (ServeOptions, " (`serve` only)"))
TABLE_START = (
    "<!-- settings table: generated by python -m duplex_actors.config --update docs/operations.md -->"
)
TABLE_END = "<!-- end of the settings table -->"


def with_table(document: str) -> str:
    """``document`` (docs/operations.md) with its settings table regenerated."""
    head, start, rest = document.partition(TABLE_START)
    _, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise ValueError(f"no {TABLE_START!r} ... {TABLE_END!r} in the document")
    return f"{head}{TABLE_START}\n{markdown_table(TABLE_ROWS)}{TABLE_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m duplex_actors.config", description="the settings table of docs/operations.md"
    )
    parser.add_argument("--markdown", action="store_true", help="print the table")
    parser.add_argument("--update", metavar="FILE", help="rewrite the table in FILE (docs/operations.md)")
    args = parser.parse_args(argv)
    if args.update:
        path = Path(args.update)
        path.write_text(with_table(path.read_text()))
    else:
        sys.stdout.write(markdown_table(TABLE_ROWS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
