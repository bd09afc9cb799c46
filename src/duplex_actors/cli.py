"""``duplex-actors``: serve the model, or build a tiny test checkpoint."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .config import SETTINGS_CLASSES, ServeOptions, ServerConfig
from .settings import ConfigError, add_flags, load


def _serve(args: argparse.Namespace) -> int:
    options = load(ServeOptions, os.environ, args)
    # serve's agent-check responder listens where the server does unless told otherwise
    config = load(ServerConfig, os.environ, args, defaults={"agent_host": options.host})
    if config.log_upload:
        from .scaleout.s3 import BadS3Url, parse_s3_url

        try:
            parse_s3_url(config.log_upload)
        except BadS3Url as exc:
            source = "--log-upload" if args.log_upload else "DUPLEX_LOG_UPLOAD"
            raise ConfigError(f"{source}: {exc}") from None
    from .supervisor import default_frontends, serve

    return serve(
        config,
        host=options.host,
        port=options.port,
        frontends=options.frontends or default_frontends(),
        drain_timeout_s=options.drain_timeout_s,
        switch_interval_ms=options.switch_interval_ms,
    )


def _make_tiny(args: argparse.Namespace) -> int:
    from .model.tiny import make_tiny_model

    out = make_tiny_model(Path(args.dir), seed=args.seed, parrot=args.parrot)
    kind = "parrot" if args.parrot else "tiny"
    print(f"wrote {kind} checkpoint (seed {args.seed}) to {out}")
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        print(f"  {path.relative_to(out)}  {path.stat().st_size} bytes")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duplex-actors", description=__doc__, exit_on_error=False)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve",
        help="serve the model over HTTP/WebSocket",
        description="Each setting: its flag, else its DUPLEX_* variable, else its default. "
        "The sections named are those of docs/operations.md, whose section 2 lists every setting.",
        exit_on_error=False,
    )
    add_flags(serve, SETTINGS_CLASSES)
    serve.set_defaults(func=_serve)

    tiny = sub.add_parser("make-tiny-model", help="write a tiny checkpoint (deterministic)")
    tiny.add_argument("dir", help="output directory (created; must be empty)")
    tiny.add_argument("--parrot", action="store_true", help="an LM that echoes the user's codes")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_make_tiny)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command's exit status; 2, with one line, for a setting that cannot be used."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except argparse.ArgumentError as exc:  # a flag's value (the message names the flag)
        print(f"duplex-actors: {exc.message}", file=sys.stderr)
        return 2
    except (FileExistsError, ConfigError) as exc:
        print(f"duplex-actors: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
