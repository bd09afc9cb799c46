"""SHA-256 of checkpoint files, cached so that a 16 GB file is hashed once, not at every start.

A digest is kept in ``<cache root>/digests/`` (:func:`.layout.cache_root`), one small JSON file
per checkpoint file, keyed by the file's resolved path, size, modification time (ns), inode and
device. It is used only while ``stat`` of the file still gives all of them; a file that was
replaced, rewritten or touched is hashed again. A file rewritten in place to the same size
with its mtime set back is not noticed (nothing short of reading it would notice).

A Hugging Face cache blob is named by its SHA-256 already: its name is the digest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

from .layout import cache_root

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (bytes hashed, total bytes)
_CHUNK = 1 << 22
_SHA256 = re.compile(r"[0-9a-f]{64}")


def digest_cache_dir() -> Path:
    return cache_root() / "digests"


def _key(real: Path, st: os.stat_result) -> dict[str, object]:
    return {
        "path": str(real),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "inode": st.st_ino,
        "device": st.st_dev,
    }


def _entry(real: Path) -> Path:
    return digest_cache_dir() / (hashlib.sha256(str(real).encode()).hexdigest()[:32] + ".json")


def cached_sha256(path: Path) -> str | None:
    """The cached digest of ``path`` if the file is unchanged since it was hashed, else None."""
    real = Path(path).resolve()
    if real.parent.name == "blobs" and _SHA256.fullmatch(real.name):
        return real.name
    try:
        data = json.loads(_entry(real).read_text())
        st = real.stat()
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != _key(real, st):
        return None
    digest = data.get("sha256")
    return digest if isinstance(digest, str) and _SHA256.fullmatch(digest) else None


def file_sha256(path: Path, *, progress: Progress | None = None) -> str:
    """SHA-256 of ``path``: from the cache when the file is unchanged, else read (``progress``
    is called as it goes) and cached. An unwritable cache only costs the next start a re-hash."""
    cached = cached_sha256(path)
    if cached is not None:
        return cached
    real = Path(path).resolve()
    before = real.stat()
    total = before.st_size
    digest = hashlib.sha256()
    done = 0
    with open(real, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    value = digest.hexdigest()
    after = real.stat()
    if _key(real, after) == _key(real, before):  # not changed while it was read
        _store(real, after, value)
    return value


def _store(real: Path, st: os.stat_result, value: str) -> None:
    entry = _entry(real)
    tmp = entry.with_name(f"{entry.name}.tmp{os.getpid()}")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": _key(real, st), "sha256": value}, sort_keys=True) + "\n")
        tmp.replace(entry)
    except OSError as exc:
        log.warning("cannot cache the digest of %s in %s: %s", real, entry.parent, exc)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
