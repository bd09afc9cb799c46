"""``duplex-actors``: serve the model, or build a tiny test checkpoint."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from .config import DEFAULT_TICK_POLICY, TICK_POLICIES
from .model.engine import CONTEXT_POLICIES


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
    from .log.lock import LogDirLocked, lock_log_dir

    try:
        # Held (open) until the process exits: the kernel then releases it.
        args.log_dir_lock = lock_log_dir(args.log_dir)
    except LogDirLocked as exc:
        print(f"duplex-actors: {exc}", file=sys.stderr)
        return 2
    tick_policy = args.tick_policy or os.environ.get("DUPLEX_TICK_POLICY") or DEFAULT_TICK_POLICY
    if tick_policy not in TICK_POLICIES:
        print(
            f"duplex-actors: DUPLEX_TICK_POLICY={tick_policy!r}: expected one of {', '.join(TICK_POLICIES)}",
            file=sys.stderr,
        )
        return 2
    context_policy = args.context_policy or os.environ.get("DUPLEX_CONTEXT_POLICY") or CONTEXT_POLICIES[0]
    if context_policy not in CONTEXT_POLICIES:
        print(
            f"duplex-actors: DUPLEX_CONTEXT_POLICY={context_policy!r}: expected one of "
            f"{', '.join(CONTEXT_POLICIES)}",
            file=sys.stderr,
        )
        return 2
    import trio
    from hypercorn.trio import serve

    # The engine thread needs the GIL back after every torch call; with the default 5 ms
    # switch interval a busy event loop (a message storm) made each step wait for it hundreds
    # of times (steps of ~2 s instead of 20 ms). 0.5 ms bounds that wait (issue 13 item 2).
    sys.setswitchinterval(args.switch_interval_ms / 1000)

    from .app import create_app
    from .config import ServerConfig, _parse, parse_flag
    from .web.hardening import HardenedConfig

    config = ServerConfig(
        model=args.model,
        revision=args.revision,
        family=args.family,
        max_sessions=args.max_sessions,
        device=args.device,
        torch_threads=args.torch_threads,
        engine_process=args.engine_process or parse_flag(os.environ, "DUPLEX_ENGINE_PROCESS", False),
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
    hyper = HardenedConfig()
    hyper.bind = [f"{args.host}:{args.port}"]
    hyper.accesslog = None
    hyper.websocket_max_message_size = args.max_message_bytes
    hyper.keep_alive_timeout = args.keep_alive_timeout
    # Our drain has already closed every session and finished its log; hypercorn's own grace
    # only has to let handlers return (a send blocked on a stuck client never would).
    hyper.graceful_timeout = 1.0

    async def main() -> None:
        app = create_app(config)
        holder = app.holder
        stop = trio.Event()

        async def on_signals() -> None:
            # The receiver stays open while draining, so a second SIGTERM cannot kill us midway.
            # SIGUSR1: stop taking new sessions, keep the live ones (HAProxy's agent sees "drain");
            # SIGUSR2: take new sessions again.
            with trio.open_signal_receiver(
                signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2
            ) as signals:
                draining = False
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if signum == signal.SIGUSR1:
                        holder.pause()
                        print(f"duplex-actors: {name}: taking no new sessions", flush=True)
                        continue
                    if signum == signal.SIGUSR2:
                        resumed = holder.resume()
                        state = "taking new sessions again" if resumed else "draining, not resumed"
                        print(f"duplex-actors: {name}: {state}", flush=True)
                        continue
                    if draining:
                        print(f"duplex-actors: {name}: already draining", flush=True)
                        continue
                    draining = True
                    print(f"duplex-actors: {name}: draining", flush=True)
                    nursery.start_soon(drain)

        async def drain() -> None:
            await holder.drain(args.drain_timeout)
            stop.set()
            # Every session is closed and its log finished. A socket whose client stopped
            # reading can keep hypercorn's shielded send (and so the exit) waiting until TCP
            # gives up (TCP_USER_TIMEOUT, 15 s): do not let it hold the process past the grace.
            await trio.sleep(hyper.graceful_timeout + 1.0)
            print("duplex-actors: drained; a stuck connection remains, exiting anyway", flush=True)
            sys.stdout.flush()
            os._exit(0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(on_signals)
            print(f"duplex-actors: serving {config.model} on http://{args.host}:{args.port}", flush=True)
            await serve(app, hyper, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
            nursery.cancel_scope.cancel()

    trio.run(main)
    return 0


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
        help="tiny, tiny-parrot, a checkpoint directory, or a Hugging Face repo id (default: tiny)",
    )
    serve.add_argument("--revision", default=None, help="Hugging Face revision")
    serve.add_argument("--family", choices=["personaplex", "moshi"], default=None)
    serve.add_argument("--max-sessions", type=int, default=8, help="engine slots (default 8)")
    serve.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    serve.add_argument("--torch-threads", type=int, default=1, help="torch threads on CPU (default 1)")
    serve.add_argument(
        "--engine-process",
        action="store_true",
        help="run the model engine in a child process, so the event loop never takes its GIL "
        "(docs/operations.md; costs a second process and its start-up; env DUPLEX_ENGINE_PROCESS=1)",
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
