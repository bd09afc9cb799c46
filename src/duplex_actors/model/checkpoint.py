"""Finding checkpoints: a local directory or a Hugging Face repo, in the layout of :mod:`.layout`.

The built-in tiny models are resolved one layer up, in :mod:`.factory` (they are built by
:mod:`.tiny`, which needs torch and moshi; this module needs neither).
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from .digest import Progress, file_sha256
from .errors import CheckpointError, CheckpointUnavailable
from .layout import (
    HF_ALLOW_PATTERNS,
    LM_CONFIG_NAME,
    LM_NAME,
    MIMI_CONFIG_NAME,
    MIMI_NAME,
    TOKENIZER_NAME,
    VOICES_DIR,
    VOICES_TGZ,
    cache_root,
)

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@attrs.frozen(slots=True)
class CheckpointFiles:
    """The files of one checkpoint, resolved to local paths."""

    model_id: str
    root: Path
    lm: Path
    mimi: Path
    tokenizer: Path
    voices: Mapping[str, Path]
    lm_config: Mapping[str, Any]
    mimi_config: Mapping[str, Any] | None

    def lm_sha256(self, progress: Progress | None = None) -> str:
        """The LM file's SHA-256 (the log header's checkpoint identity), through the digest
        cache (:mod:`.digest`)."""
        return file_sha256(self.lm, progress=progress)


def _require(path: Path, what: str) -> Path:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; expected {what}")
    return path


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: expected {what} as a JSON object ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected {what} as a JSON object")
    return data


def _voices(root: Path) -> dict[str, Path]:
    """Bundled ``.pt`` voices: ``voices/*.pt``, else ``voices.tgz`` extracted into the cache."""
    folder = root / VOICES_DIR
    if not folder.is_dir() and (root / VOICES_TGZ).is_file():
        folder = _extract_voices(root / VOICES_TGZ)
    if not folder.is_dir():
        return {}
    return {p.name: p for p in sorted(folder.glob("*.pt")) if p.is_file()}


def _extract_voices(archive: Path) -> Path:
    target = cache_root() / "voices" / file_sha256(archive)[:16]
    if target.is_dir():
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar.getmembers():
                name = Path(member.name).name
                if not member.isfile() or not name.endswith(".pt") or name.startswith("."):
                    continue
                src = tar.extractfile(member)
                assert src is not None
                (tmp / name).write_bytes(src.read())
    except (OSError, tarfile.TarError) as exc:
        raise CheckpointError(f"{archive}: expected a gzipped tar of .pt voice prompts ({exc})") from exc
    try:
        tmp.rename(target)
    except OSError:  # another process extracted it first
        pass
    return target


def checkpoint_from_dir(root: Path, model_id: str | None = None) -> CheckpointFiles:
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory")
    lm_config: dict[str, Any] = {}
    if (root / LM_CONFIG_NAME).is_file():
        lm_config = _read_json(root / LM_CONFIG_NAME, "the LM dimensions (moshi LMModel kwargs)")
    mimi_config = None
    if (root / MIMI_CONFIG_NAME).is_file():
        mimi_config = _read_json(root / MIMI_CONFIG_NAME, "a moshi Mimi config")
    return CheckpointFiles(
        # A local directory is named by its absolute path, so a log's header finds it again.
        model_id=model_id or str(root.resolve()),
        root=root,
        lm=_require(root / LM_NAME, "the LM weights (safetensors)"),
        mimi=_require(root / MIMI_NAME, "the Mimi codec weights (safetensors)"),
        tokenizer=_require(root / TOKENIZER_NAME, "the SentencePiece text tokenizer"),
        voices=_voices(root),
        lm_config=lm_config,
        mimi_config=mimi_config,
    )


def checkpoint_from_hf(repo_id: str, revision: str | None = None) -> CheckpointFiles:
    """Download (or find in the local cache) a Hugging Face repo with huggingface_hub.

    Honours ``HF_TOKEN`` (the PersonaPlex repo is gated), ``HF_HOME``/``HF_HUB_CACHE`` and
    ``HF_HUB_OFFLINE=1`` (cache only). A hub that cannot be reached (or answers 429/5xx) raises
    :class:`CheckpointUnavailable`, which may heal; anything else (no such repo or revision, no
    access, offline and not cached) raises :class:`CheckpointError`.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        local = snapshot_download(repo_id, revision=revision, allow_patterns=list(HF_ALLOW_PATTERNS))
    except LocalEntryNotFoundError as exc:
        if constants.HF_HUB_OFFLINE:
            raise CheckpointError(
                f"{repo_id}: not in the local Hugging Face cache, and HF_HUB_OFFLINE=1"
            ) from exc
        raise CheckpointUnavailable(
            f"{repo_id}: the Hugging Face hub cannot be reached and the repo is not in the local cache"
        ) from exc
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError) as exc:
        raise CheckpointError(
            f"{repo_id}: {_first_line(exc)} (gated repos need HF_TOKEN with access)"
        ) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status is None or status == 429 or status >= 500:
            raise CheckpointUnavailable(f"{repo_id}: download failed: {_first_line(exc)}") from exc
        raise CheckpointError(
            f"{repo_id}: download failed ({_first_line(exc)}); gated repos need HF_TOKEN"
        ) from exc
    except OSError as exc:  # requests' connection errors and timeouts are OSErrors
        raise CheckpointUnavailable(f"{repo_id}: download failed: {_first_line(exc)}") from exc
    name = repo_id if revision is None else f"{repo_id}@{revision}"
    return checkpoint_from_dir(Path(local), model_id=name)


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def find_checkpoint(spec: str, revision: str | None = None) -> CheckpointFiles | None:
    """An existing local directory, else a Hugging Face repo id (``owner/name``); None when
    ``spec`` is neither."""
    path = Path(spec).expanduser()
    if path.exists():
        return checkpoint_from_dir(path)
    if _REPO_ID.match(spec):
        return checkpoint_from_hf(spec, revision)
    return None
