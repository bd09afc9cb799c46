"""``duplex-actors``: serve the model, or build a tiny test checkpoint."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .config import DEFAULT_TICK_POLICY, TICK_POLICIES
from .model.engine import CONTEXT_POLICIES, DEFAULT_CONTEXT_POLICY
from .model.memory import DTYPES, parse_size


def _serve(args: argparse.Namespace) -> int:
    if args.log_upload:
        from .scaleout.s3 import BadS3Url, parse_s3_url

        try:
            parse_s3_url(args.log_upload)
        except BadS3Url as exc:
            print(f"duplex-actors: --log-upload: {exc}", file=sys.stderr)
            return 2
    if args.static_ui and not (Path(args.static_ui) / "index.html").is_file():
        print(f"duplex-actors: --static-ui {args.static_ui}: no index.html there", file=sys.stderr)
        return 2
    tick_policy = args.tick_policy or os.environ.get("DUPLEX_TICK_POLICY") or DEFAULT_TICK_POLICY
    if tick_policy not in TICK_POLICIES:
        print(
            f"duplex-actors: DUPLEX_TICK_POLICY={tick_policy!r}: expected one of {', '.join(TICK_POLICIES)}",
            file=sys.stderr,
        )
        return 2
    context_policy = args.context_policy or os.environ.get("DUPLEX_CONTEXT_POLICY") or DEFAULT_CONTEXT_POLICY
    if context_policy not in CONTEXT_POLICIES:
        print(
            f"duplex-actors: DUPLEX_CONTEXT_POLICY={context_policy!r}: expected one of "
            f"{', '.join(CONTEXT_POLICIES)}",
            file=sys.stderr,
        )
        return 2
    from .config import ServerConfig, _parse, parse_voice_aliases
    from .supervisor import default_frontends, serve

    frontends = (
        args.frontends or _parse(os.environ, "DUPLEX_FRONTENDS", int, "an integer") or default_frontends()
    )
    if frontends < 1:
        print(f"duplex-actors: --frontends {frontends}: expected at least 1", file=sys.stderr)
        return 2

    config = ServerConfig(
        model=args.model,
        revision=args.revision,
        family=args.family,
        max_sessions=args.max_sessions,
        device=args.device,
        dtype=args.dtype,
        memory_limit=(
            args.memory_limit
            if args.memory_limit is not None
            else _parse(os.environ, "DUPLEX_MEMORY_LIMIT", parse_size, "a size such as 24G or 512M")
        ),
        prepare_timeout_s=args.prepare_timeout,
        torch_threads=args.torch_threads,
        log_dir=args.log_dir,
        log_max_age_s=args.log_max_age,
        log_max_bytes=args.log_max_bytes,
        log_probe_interval_s=args.log_probe_interval,
        api_key=args.api_key or os.environ.get("DUPLEX_API_KEY") or None,
        allowed_origins=tuple(args.allowed_origin),
        static_ui=args.static_ui,
        idle_timeout_s=args.idle_timeout,
        input_buffer_bytes=args.input_buffer_bytes,
        outbox_events=args.outbox_events,
        max_message_bytes=args.max_message_bytes,
        tick_policy=tick_policy,
        client_sampling=args.client_sampling,
        body_timeout_s=args.body_timeout,
        keep_alive_timeout_s=args.keep_alive_timeout,
        max_connections=args.max_connections,
        input_budget_s=args.input_budget,
        max_messages_per_s=args.max_messages_per_s,
        message_burst=args.message_burst,
        max_bytes_per_s=args.max_bytes_per_s,
        byte_burst=args.byte_burst,
        rate_limit_after_s=args.rate_limit_after,
        agent_port=args.agent_port,
        agent_host=args.agent_host or args.host,
        admission_refusal=args.admission_refusal,
        log_upload=args.log_upload,
        s3_endpoint_url=args.s3_endpoint_url,
        opus_workers=(
            args.opus_workers
            if args.opus_workers is not None
            else _parse(os.environ, "DUPLEX_OPUS_WORKERS", int, "an integer (processes)")
        ),
        voice_aliases=parse_voice_aliases(
            args.voice_alias or os.environ.get("DUPLEX_VOICE_ALIASES", "").split(","),
            "--voice-alias" if args.voice_alias else "DUPLEX_VOICE_ALIASES",
        ),
        max_align_pad_ms=next(
            v
            for v in (
                args.max_align_pad_ms,
                _parse(os.environ, "DUPLEX_MAX_ALIGN_PAD_MS", int, "an integer (milliseconds)"),
                1000,
            )
            if v is not None
        ),
        context_policy=context_policy,
        max_pinned_prompt=(
            args.max_pinned_prompt
            if args.max_pinned_prompt is not None
            else _parse(os.environ, "DUPLEX_MAX_PINNED_PROMPT", int, "an integer (positions)")
        ),
    )
    return serve(
        config,
        host=args.host,
        port=args.port,
        frontends=frontends,
        drain_timeout_s=args.drain_timeout,
        switch_interval_ms=args.switch_interval_ms,
    )


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _make_tiny(args: argparse.Namespace) -> int:
    from .model.tiny import make_tiny_model

    out = make_tiny_model(Path(args.dir), seed=args.seed, parrot=args.parrot)
    kind = "parrot" if args.parrot else "tiny"
    print(f"wrote {kind} checkpoint (seed {args.seed}) to {out}")
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        print(f"  {path.relative_to(out)}  {path.stat().st_size} bytes")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duplex-actors", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the model over HTTP/WebSocket")
    serve.add_argument(
        "--model",
        default="tiny",
        help=(
            "tiny, tiny-parrot, a checkpoint directory, or a Hugging Face repo id (default: tiny); "
            "standin:STEP_MS is a benchmark tool, not a model: no weights, each step waits STEP_MS "
            "with the GIL released and returns silence"
        ),
    )
    serve.add_argument("--revision", default=None, help="Hugging Face revision")
    serve.add_argument("--family", choices=["personaplex", "moshi"], default=None)
    serve.add_argument("--max-sessions", type=int, default=8, help="engine slots (default 8)")
    serve.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    serve.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="the model's dtype: auto (default: bfloat16 on CUDA, float32 on CPU), bfloat16, float16 "
        "or float32; one that cannot fit in memory is refused at start-up, with the figures",
    )
    serve.add_argument(
        "--memory-limit",
        type=_size,
        default=None,
        metavar="SIZE",
        help="memory the model may use at most, e.g. 20G (default: what the device has free; "
        "env DUPLEX_MEMORY_LIMIT); checked at start-up before anything is loaded",
    )
    serve.add_argument("--torch-threads", type=int, default=1, help="torch threads on CPU (default 1)")
    serve.add_argument(
        "--frontends",
        type=int,
        default=None,
        metavar="K",
        help="front-end processes (connections, dialects, sessions, logs) beside the engine core "
        "(default min(4, cores - 1), at least 1; env DUPLEX_FRONTENDS)",
    )
    serve.add_argument("--log-dir", default="sessions", help="session logs (default ./sessions)")
    serve.add_argument(
        "--log-max-age",
        type=float,
        default=None,
        metavar="SECONDS",
        help="delete finished logs older than this",
    )
    serve.add_argument(
        "--log-max-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="keep the log directory under this size",
    )
    serve.add_argument(
        "--log-probe-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="after a log write fails, re-probe the log dir this often; admit again once it works (default 5)",
    )
    serve.add_argument(
        "--api-key", default=None, help="require this key (Bearer or subprotocol); or DUPLEX_API_KEY"
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow browser Origin (repeatable)",
    )
    serve.add_argument(
        "--static-ui",
        default=None,
        metavar="DIR",
        help="serve a built web UI from DIR at / (its index.html) and its files by their paths, "
        "e.g. the PersonaPlex client's dist/, which then talks to /api/chat on this origin",
    )
    serve.add_argument(
        "--idle-timeout", type=float, default=300.0, help="close a session after this many silent seconds"
    )
    serve.add_argument(
        "--max-message-bytes", type=int, default=16 * 1024 * 1024, help="WebSocket message limit (1009)"
    )
    serve.add_argument(
        "--input-buffer-bytes",
        type=int,
        default=16 * 1024 * 1024,
        help="per-session input not yet stepped, as float32 bytes (>= 10 s); beyond: input_backpressure",
    )
    budget = serve.add_argument_group("per-connection input budget (docs/operations.md)")
    budget.add_argument(
        "--input-budget",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="audio a session may have waiting for the model before its socket is not read",
    )
    budget.add_argument("--max-messages-per-s", type=float, default=200.0, help="client messages per second")
    budget.add_argument("--message-burst", type=float, default=250.0, help="messages beyond the rate")
    budget.add_argument(
        "--max-bytes-per-s", type=float, default=1024.0 * 1024.0, help="client message bytes per second"
    )
    budget.add_argument(
        "--byte-burst", type=float, default=8.0 * 1024.0 * 1024.0, help="bytes beyond the rate"
    )
    budget.add_argument(
        "--switch-interval-ms",
        type=float,
        default=0.5,
        help="the interpreter's thread switch interval (sys.setswitchinterval): how long the "
        "model's thread may wait for the GIL while the event loop is busy",
    )
    budget.add_argument(
        "--rate-limit-after",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="close a client held back by its budget this long (rate_limited, 1008)",
    )
    serve.add_argument(
        "--outbox-events", type=int, default=4096, help="events a client may fall behind before slow_consumer"
    )
    serve.add_argument(
        "--drain-timeout", type=float, default=10.0, help="seconds to close sessions on SIGTERM"
    )
    serve.add_argument(
        "--tick-policy",
        choices=TICK_POLICIES,
        default=None,
        help="when the scheduler steps (docs/operations.md): 'grid' (default: one step per 80 ms "
        "tick on a fixed grid, sessions aligned to it), 'window' (step when every session has a "
        "frame, else 20 ms after the first), 'deadline' (the window stretched to 80 ms minus the "
        "p90 step); env DUPLEX_TICK_POLICY",
    )
    serve.add_argument(
        "--max-align-pad-ms",
        type=int,
        default=None,
        metavar="MS",
        help="silence the server may insert into one session's input to align it to the tick, "
        "in total (spec section 7; default 1000; env DUPLEX_MAX_ALIGN_PAD_MS); past it the "
        "session is served unaligned",
    )
    serve.add_argument(
        "--context-policy",
        choices=CONTEXT_POLICIES,
        default=None,
        help="what a session longer than the model's context keeps (docs/operations.md): 'ring' "
        "(default: moshi's, the oldest positions go first, the voice prompt and persona among "
        "them), 'pin-prompt' (the prompt stays for the session's life, the rest is a ring); env "
        "DUPLEX_CONTEXT_POLICY",
    )
    serve.add_argument(
        "--max-pinned-prompt",
        type=int,
        default=None,
        metavar="POSITIONS",
        help="with --context-policy pin-prompt, the most positions a prompt may take (longer "
        "personas are refused: invalid_duplex_runtime_config); default a quarter of the context; "
        "env DUPLEX_MAX_PINNED_PROMPT",
    )
    serve.add_argument(
        "--voice-alias",
        action="append",
        default=[],
        metavar="NAME=FILE.pt",
        help="a voice name sessions may ask for, mapped to a bundled voice (repeatable; replaces "
        "the default of the same name; defaults: OpenAI's voice names; env DUPLEX_VOICE_ALIASES, "
        "comma-separated)",
    )
    serve.add_argument(
        "--client-sampling",
        action="store_true",
        help="/api/chat: let the query's text/audio temperature, topk and seed set the session's "
        "sampling (default: ignored, greedy)",
    )
    serve.add_argument(
        "--opus-workers",
        type=int,
        default=None,
        metavar="N",
        help="Opus codec processes for /api/chat sessions, started on the first one "
        "(default: DUPLEX_OPUS_WORKERS, else half the CPUs, 1 to 4)",
    )
    serve.add_argument(
        "--prepare-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="/api/chat: how long a handshake waits for its prompt's prefill (default: 30 s, or 4 "
        "times the default prompt's prefill measured at start-up if longer)",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="close a connection whose HTTP request body has not fully arrived this long after its head",
    )
    serve.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="close a connection with no request (or an incomplete head) for this long (default 5)",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help="open TCP connections; beyond, a new one is closed at once (default: the descriptor "
        "limit, raised to its hard limit, less room for session logs)",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    scale = serve.add_argument_group("scale-out (docs/scaling.md)")
    scale.add_argument(
        "--agent-port",
        type=int,
        default=None,
        metavar="PORT",
        help="answer HAProxy agent checks here: 'up ready maxconn:N', 'drain', 'down #reason'",
    )
    scale.add_argument("--agent-host", default=None, help="the agent's address (default: --host)")
    scale.add_argument(
        "--admission-refusal",
        choices=["inband", "http"],
        default="inband",
        help="when every slot is taken: 'inband' (default) accepts the WebSocket, sends error "
        "resource_exhausted and closes 1013; 'http' refuses the upgrade itself with HTTP 503 + "
        "Retry-After, so a proxy can retry another server",
    )
    scale.add_argument(
        "--log-upload",
        default=None,
        metavar="s3://BUCKET/PREFIX",
        help="upload each finished session log to S3 (If-None-Match: *), delete it locally once stored",
    )
    scale.add_argument(
        "--s3-endpoint-url",
        default=None,
        metavar="URL",
        help="an S3-compatible endpoint (SeaweedFS, MinIO, ...); credentials from the AWS_* variables",
    )
    serve.set_defaults(func=_serve)

    tiny = sub.add_parser("make-tiny-model", help="write a tiny checkpoint (deterministic)")
    tiny.add_argument("dir", help="output directory (created; must be empty)")
    tiny.add_argument("--parrot", action="store_true", help="an LM that echoes the user's codes")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_make_tiny)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .config import ConfigError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (FileExistsError, ConfigError) as exc:
        print(f"duplex-actors: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
