"""Ship every finished session log to S3-compatible storage (``--log-upload s3://bucket/prefix``).

One background task per process; the S3 calls run in one worker thread of their own
(``trio.to_thread`` with a private limiter), never on the event loop and never on the model's
step path. Each log becomes its own object, ``<prefix>/<session_id>.dlog``, written with
``If-None-Match: *``: a retry after a lost answer (or an upload repeated after a crash) cannot
overwrite anything, and a ``412 Precondition Failed`` means the object is already there. The
local file is deleted only after ``HEAD`` confirms an object of the same size; a same-named
object of another size is a conflict: the local file is kept and reported. Failures are retried
with exponential backoff and jitter, without limit (the file waits on disk meanwhile).

Logs finished by an earlier run of the process (a crash or a restart left them; start-up
recovery has already truncated any torn tail) are found by :meth:`LogUploader.scan` at start-up
and uploaded too.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from .s3 import LOG_SUFFIX, S3Location, error_status, make_client

log = logging.getLogger(__name__)


class UploadUnconfirmed(Exception):
    """The object's size after the upload is not the file's: try again."""


@attrs.frozen(slots=True)
class UploadStatistics:
    uploaded: int  # new objects, confirmed
    already_present: int  # 412 on If-None-Match and the object's size matches: also confirmed
    bytes_uploaded: int
    failures: int  # failed attempts (each retried)
    pending: int  # logs waiting (or being uploaded)
    abandoned: tuple[tuple[str, int], ...]  # (reason, logs): missing, unreadable, conflict


class LogUploader:
    def __init__(
        self,
        location: S3Location,
        log_dir: str | Path,
        *,
        endpoint_url: str | None = None,
        client_factory: Callable[[], Any] | None = None,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        is_open: Callable[[str], bool] = lambda session_id: False,
    ) -> None:
        self.location = location
        self.log_dir = Path(log_dir)
        self._client_factory = client_factory or (lambda: make_client(endpoint_url))
        self._client: Any = None
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._is_open = is_open
        self._send, self._receive = trio.open_memory_channel[Path](math.inf)
        self._pending: set[str] = set()
        self._limiter = trio.CapacityLimiter(1)
        self._idle = trio.Event()
        self._idle.set()
        self.uploaded = 0
        self.already_present = 0
        self.bytes_uploaded = 0
        self.failures = 0
        self.abandoned: dict[str, int] = {}
        self.last_error: str | None = None

    # -- what to upload ----------------------------------------------------------------------------
    def submit(self, session_id: str, path: Path) -> None:
        """Queue a finished log (``DuplexServer.on_log_finished`` calls this); never blocks."""
        path = Path(path)
        if path.name in self._pending:
            return
        self._pending.add(path.name)
        if self._idle.is_set():
            self._idle = trio.Event()
        self._send.send_nowait(path)

    def scan(self) -> int:
        """Queue the finished logs already in the directory (from an earlier run); returns how many."""
        found = 0
        try:
            names = sorted(p.name for p in self.log_dir.iterdir() if p.name.endswith(LOG_SUFFIX))
        except FileNotFoundError:
            return 0
        for name in names:
            session_id = name[: -len(LOG_SUFFIX)]
            if self._is_open(session_id) or name in self._pending:
                continue
            self.submit(session_id, self.log_dir / name)
            found += 1
        return found

    @property
    def pending(self) -> int:
        return len(self._pending)

    def statistics(self) -> UploadStatistics:
        return UploadStatistics(
            uploaded=self.uploaded,
            already_present=self.already_present,
            bytes_uploaded=self.bytes_uploaded,
            failures=self.failures,
            pending=self.pending,
            abandoned=tuple(sorted(self.abandoned.items())),
        )

    async def wait_idle(self) -> None:
        """Return once nothing is pending."""
        while self._pending:
            await self._idle.wait()

    # -- the worker --------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for path in self._receive:
            attempt = 0
            while True:
                try:
                    # Abandoned on cancel (shutdown): a cut upload is safe to repeat (If-None-Match,
                    # and the file is deleted only after the object is confirmed).
                    outcome = await trio.to_thread.run_sync(
                        self._upload_one, path, limiter=self._limiter, abandon_on_cancel=True
                    )
                except Exception as exc:
                    self.failures += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    delay = min(self.backoff_max_s, self.backoff_initial_s * 2**attempt)
                    delay *= random.uniform(0.5, 1.0)
                    attempt += 1
                    log.warning(
                        "uploading %s to %s failed (attempt %d), retrying in %.1f s: %s",
                        path.name,
                        self.location.url(),
                        attempt,
                        delay,
                        self.last_error,
                    )
                    await trio.sleep(delay)
                    continue
                break
            self._settle(path, outcome)

    def _settle(self, path: Path, outcome: tuple[str, int]) -> None:
        what, size = outcome
        if what == "uploaded":
            self.uploaded += 1
            self.bytes_uploaded += size
        elif what == "already_present":
            self.already_present += 1
        else:
            self.abandoned[what] = self.abandoned.get(what, 0) + 1
            log.error("session log %s not uploaded: %s", path, what)
        self._pending.discard(path.name)
        if not self._pending:
            self._idle.set()

    def _upload_one(self, path: Path) -> tuple[str, int]:
        """In the worker thread: upload, confirm, delete. Returns (outcome, bytes)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return "missing", 0  # pruned by retention, or removed by hand
        except OSError as exc:
            log.error("session log %s is unreadable: %s", path, exc)
            return "unreadable", 0
        if self._client is None:
            self._client = self._client_factory()
        client = self._client
        bucket, key = self.location.bucket, self.location.key_for(path.name)
        outcome = "uploaded"
        try:
            client.put_object(
                Bucket=bucket,
                Key=key,
                Body=data,
                IfNoneMatch="*",
                ContentType="application/octet-stream",
            )
        except Exception as exc:
            code, status = error_status(exc)
            if status == 412 or code == "PreconditionFailed":
                outcome = "already_present"
            else:
                raise  # 409 ConditionalRequestConflict (a concurrent write) included: retry
        head = client.head_object(Bucket=bucket, Key=key)
        size = int(head["ContentLength"])
        if size != len(data):
            if outcome == "already_present":
                log.error(
                    "%s already holds %d bytes, the local log has %d: keeping %s",
                    self.location.url(key),
                    size,
                    len(data),
                    path,
                )
                return "conflict", 0
            raise UploadUnconfirmed(f"{key}: {size} bytes stored, {len(data)} sent")
        path.unlink(missing_ok=True)
        return outcome, len(data)
