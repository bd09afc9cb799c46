"""``duplex-replay PATH``: replay session logs and say whether they reproduce.

PATH is a session log, a directory of them, or ``s3://bucket/key.dlog`` / ``s3://bucket/prefix``
(every ``.dlog`` object under the prefix, downloaded to memory; credentials from the AWS_*
variables, an S3-compatible store with ``--s3-endpoint-url``).

Exit status: 0 every log identical (or consistent, for a log without its end record),
1 a divergence, 2 an unreadable or corrupt log (with its byte offset) or a refused model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import wave
from pathlib import Path
from typing import Any, TextIO

from ..log import records as r
from ..model.engine import ModelEngine
from ..model.errors import ModelError
from ..model.memory import DTYPES
from ..session import events as ev
from .replayer import (
    ReplayReport,
    UnreadableLog,
    header_of,
    logged_batch_width,
    logged_context_policy,
    replay_logic,
    replay_model,
)

LOG_SUFFIX = ".dlog"


class Progress:
    """A one-line progress bar on stderr for long runs (only when stderr is a terminal)."""

    def __init__(self, label: str, stream: TextIO = sys.stderr, enabled: bool | None = None) -> None:
        self.label = label
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < 0.1:
            return
        self._last = now
        frac = done / total if total else 1.0
        bar = "#" * int(frac * 30)
        self.stream.write(f"\r{self.label} [{bar:<30}] {done}/{total}")
        self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * (len(self.label) + 50) + "\r")
            self.stream.flush()


def _record_json(seq: int, record: r.Record) -> dict[str, Any]:
    out: dict[str, Any] = {"seq": seq, "kind": r.KIND_NAMES[type(record)]}
    for name in getattr(record, "__slots__", ()):
        if name.startswith("__"):
            continue
        value = getattr(record, name)
        if isinstance(value, bytes):
            out[name] = {"bytes": len(value)}
        elif isinstance(value, tuple):
            out[name] = list(value)
        else:
            out[name] = value
    return out


def _write_wav(path: Path, pcm16: bytes) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24_000)
        w.writeframes(pcm16)


class EngineCache:
    """One engine per (model spec, family, dtype, batch width, context policy), reused across
    logs (it is reset per epoch). The width is the one each log was served at, unless
    ``batch_width`` overrides it; the context policy and its pin cap are the log's (a log that
    names none was served with moshi's ring)."""

    def __init__(
        self,
        spec: str | None,
        device: str,
        force: bool,
        batch_width: int | None = None,
        dtype: str | None = None,
    ) -> None:
        self.spec = spec
        self.device = device
        self.dtype = dtype  # None: the dtype each log was served in (its header's)
        self.force = force
        self.batch_width = batch_width
        self._engines: dict[tuple[str, str, str, int, str, int | None], ModelEngine] = {}

    def for_header(self, header: r.Header) -> ModelEngine:
        from ..model.factory import open_engine

        spec = self.spec or header.model_id
        family = (header.engine or {}).get("family")
        dtype = self.dtype or header.dtype or "float32"
        width = self.batch_width or logged_batch_width(header)
        policy, pin_max = logged_context_policy(header)
        key = (spec, family or "", dtype, width, policy, pin_max)
        if key not in self._engines:
            self._engines[key] = open_engine(
                spec,
                slots=width,
                device=self.device,
                dtype=dtype,
                family=family,
                context_policy=policy,
                pin_max=pin_max,
            )
        engine = self._engines[key]
        sha = engine.describe().checkpoint_sha256
        if header.checkpoint_sha256 and sha != header.checkpoint_sha256 and not self.force:
            raise UnreadableLog(
                f"the log was recorded with checkpoint {header.checkpoint_sha256[:16]}..., "
                f"{spec} is {sha[:16]}...; use --force to replay anyway"
            )
        return engine


class S3Log:
    """A log in a bucket: fetched when replayed."""

    def __init__(self, client: Any, bucket: str, key: str) -> None:
        self.client = client
        self.bucket = bucket
        self.key = key
        self.name = key.rsplit("/", 1)[-1]

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def fetch(self) -> bytes:
        from ..scaleout.s3 import get_bytes

        try:
            return get_bytes(self.client, self.bucket, self.key)
        except Exception as exc:  # botocore's errors are not OSErrors
            raise UnreadableLog(f"{self}: {exc}") from exc


def replay_one(path: Path | S3Log, args: argparse.Namespace, engines: EngineCache | None) -> ReplayReport:
    progress = Progress(f"{path.name}: logic", enabled=args.progress)
    if isinstance(path, S3Log):
        report = replay_logic(str(path), progress=progress, data=path.fetch())
    else:
        report = replay_logic(path, progress=progress)
    progress.done()
    if engines is not None:
        engine = engines.for_header(header_of(report))
        progress = Progress(f"{path.name}: model", enabled=args.progress)
        replay_model(report, engine, progress=progress)
        progress.done()
    return report


def _collect(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix == LOG_SUFFIX and p.is_file())
    return [path]


def _collect_s3(url: str, endpoint_url: str | None) -> list[S3Log]:
    from ..scaleout.s3 import list_log_keys, make_client, parse_s3_url

    location = parse_s3_url(url, keep_trailing_slash=True)
    client = make_client(endpoint_url)
    try:
        keys = list_log_keys(client, location)
    except Exception as exc:
        raise UnreadableLog(f"{url}: {exc}") from exc
    return [S3Log(client, location.bucket, key) for key in keys]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="duplex-replay", description=__doc__)
    parser.add_argument(
        "path", help="a session log (.dlog), a directory of them, or s3://bucket/key-or-prefix"
    )
    parser.add_argument("--s3-endpoint-url", default=None, help="an S3-compatible endpoint for s3:// paths")
    parser.add_argument(
        "--model",
        nargs="?",
        const="",
        default=None,
        help="also replay at model level: tiny, a checkpoint dir or an HF repo "
        "(no value: the model id in the log's header)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dtype",
        choices=[d for d in DTYPES if d != "auto"],
        default=None,
        help="model replay: the model's dtype (default: the one each log was served in, as its "
        "header records; another dtype is not exact)",
    )
    parser.add_argument(
        "--batch-width",
        type=_positive_int,
        default=None,
        metavar="N",
        help="model replay: run the engine N slots wide (default: the width each log was served at; "
        "another width is faster or slower, but kernels are chosen by width, so it is not always exact)",
    )
    parser.add_argument("--force", action="store_true", help="replay even if the checkpoint hash differs")
    parser.add_argument("--emit", type=Path, help="write the outbound event stream as JSON lines")
    parser.add_argument("--wav", type=Path, help="write the output audio as a 24 kHz WAV")
    parser.add_argument("--dump", action="store_true", help="print the records as JSON lines")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: on a tty)",
    )
    args = parser.parse_args(argv)

    files: list[Path] | list[S3Log]
    if args.path.startswith("s3://"):
        try:
            files = _collect_s3(args.path, args.s3_endpoint_url)
        except (UnreadableLog, ValueError) as exc:
            print(f"duplex-replay: {exc}", file=sys.stderr)
            return 2
    else:
        files = _collect(Path(args.path))
    if not files:
        print(f"duplex-replay: no {LOG_SUFFIX} files in {args.path}", file=sys.stderr)
        return 2
    if len(files) > 1 and (args.emit or args.wav or args.dump):
        print("duplex-replay: --emit, --wav and --dump take a single log", file=sys.stderr)
        return 2
    for flag, value in (("--batch-width", args.batch_width), ("--dtype", args.dtype)):
        if value is not None and args.model is None:
            print(f"duplex-replay: {flag} needs --model", file=sys.stderr)
            return 2
    engines = (
        EngineCache(args.model or None, args.device, args.force, args.batch_width, args.dtype)
        if args.model is not None
        else None
    )
    status = 0
    rows = []
    started = time.perf_counter()
    for path in files:
        try:
            report = replay_one(path, args, engines)
        except (UnreadableLog, ModelError, OSError, KeyError, ValueError) as exc:
            status = 2
            rows.append((path.name, "-", "-", "-", f"UNREADABLE: {exc}"))
            if len(files) == 1:
                print(f"duplex-replay: {exc}", file=sys.stderr)
            continue
        if not report.identical:
            status = max(status, 1)
        rows.append(
            (
                path.name,
                report.level,
                str(report.records),
                f"{report.frames_in}/{report.frames_out}",
                report.summary(),
            )
        )
        if args.dump:
            for seq, record in report.records_list:
                print(json.dumps(_record_json(seq, record)))
        if args.emit:
            with open(args.emit, "w") as f:
                for event in report.events:
                    f.write(json.dumps(ev.event_to_jsonable(event)) + "\n")
        if args.wav:
            _write_wav(args.wav, report.output_pcm16())
    elapsed = time.perf_counter() - started
    if len(files) == 1 and not args.dump:
        name, level, records, frames, summary = rows[0]
        if level != "-":
            at = f" at batch width {report.batch_width}" if report.batch_width is not None else ""
            print(f"{name}: {level} replay{at}, {records} records, frames in/out {frames}: {summary}")
    elif len(files) > 1:
        width = max(len(row[0]) for row in rows)
        print(f"{'log':<{width}}  level  records  frames in/out  result")
        for name, level, records, frames, summary in rows:
            print(f"{name:<{width}}  {level:<5}  {records:>7}  {frames:>13}  {summary}")
        bad = sum(1 for row in rows if not row[4].startswith(("identical", "consistent")))
        print(f"{len(rows)} logs, {len(rows) - bad} reproduced, {bad} not, in {elapsed:.2f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
