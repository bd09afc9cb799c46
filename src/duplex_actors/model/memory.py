"""Will the model fit? The memory a checkpoint needs in a dtype, against what the device has.

Checked before anything is loaded (from the safetensors headers, no weights read), so a model
that cannot fit is refused at once with the numbers, instead of the kernel killing the process
half-way through the load.

What a start needs (:class:`MemoryNeed`), at its peak: the LM weights in the dtype after the
depformer cut with the KV caches of every slot and of the prompt twin, or, while loading and
before any cache exists, the file's own tensors if they are larger (they are read whole, the
cut steps dropped, then converted one by one); plus Mimi's weights. The prompt snapshot cache
grows later, with the personas in use, and is not counted.

What is available: on CPU, ``MemAvailable`` of ``/proc/meminfo`` (or the cgroup's limit less
its usage, if smaller); on CUDA, the device's free memory. ``--memory-limit`` /
``DUPLEX_MEMORY_LIMIT`` lowers it (a machine shared with other processes).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from .errors import ModelError

if TYPE_CHECKING:
    import torch

    from .checkpoint import CheckpointFiles

GIB = 1 << 30
DTYPES = ("auto", "bfloat16", "float16", "float32")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


class InsufficientMemory(ModelError):
    """The model does not fit in the memory available for it, in the dtype asked for."""

    code = "insufficient_memory"


def parse_size(text: str) -> int:
    """Bytes from ``"24G"``, ``"512MiB"``, ``"1.5g"`` or a plain number (powers of 1024);
    ValueError otherwise."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"{text!r}: expected a size such as 24G, 512M or a number of bytes")
    scale = 1024 ** "bkmgt".index((m.group(2) or "b").lower())
    return int(float(m.group(1)) * scale)


def gib(n: int) -> str:
    """``n`` bytes for a person: GiB, or MiB below a tenth of one."""
    return f"{n / GIB:.1f} GiB" if n >= GIB // 10 else f"{n / (1 << 20):.1f} MiB"


@attrs.frozen(slots=True)
class MemoryNeed:
    weights: int  # the LM's weights in the dtype, after the cut
    loading: int  # the LM while it loads: the larger of the file's tensors and ``weights``
    kv_caches: int  # every slot's and the prompt twin's
    mimi: int

    @property
    def total(self) -> int:
        """The peak: while loading (before any KV cache exists), or once serving."""
        return max(self.loading, self.weights + self.kv_caches) + self.mimi

    def describe(self) -> str:
        parts = f"LM {gib(self.weights)}"
        if self.loading > self.weights:
            parts += f", {gib(self.loading)} while loading"
        return f"{gib(self.total)} ({parts}, KV caches {gib(self.kv_caches)}, Mimi {gib(self.mimi)})"


@attrs.frozen(slots=True)
class Available:
    bytes: int
    source: str  # where the figure comes from, for the error message


def memory_need(files: CheckpointFiles, dtype: torch.dtype, slots: int, *, twin: bool = True) -> MemoryNeed:
    """What loading ``files`` in ``dtype`` for ``slots`` slots needs (see the module doc)."""
    import torch

    from .loading import cut_depformer, depformer_steps, lm_header, lm_kwargs

    header = lm_header(files)
    stored = sum(t.numel() * t.element_size() for t in header.values())
    steps = depformer_steps(header)
    kept = cut_depformer(dict(header), steps) if steps > 8 else header
    size = torch.empty((), dtype=dtype).element_size()
    weights = sum(
        t.numel() * (size if t.dtype.is_floating_point else t.element_size()) for t in kept.values()
    )
    return MemoryNeed(
        weights=weights,
        loading=max(weights, stored),
        kv_caches=kv_cache_bytes(lm_kwargs(files), size, slots + (1 if twin else 0)),
        mimi=Path(files.mimi).stat().st_size,
    )


def kv_cache_bytes(kwargs: Mapping[str, Any], element_size: int, rows: int) -> int:
    """moshi's ring KV caches of the main transformer: keys and values of ``context`` positions
    per layer and row (the depformer's are a few positions, made per step)."""
    return 2 * int(kwargs["num_layers"]) * int(kwargs["context"]) * int(kwargs["dim"]) * element_size * rows


def available_memory(device: torch.device, limit: int | None = None) -> Available:
    """The memory free for the model on ``device``, at most ``limit`` bytes."""
    found: Available | None = None
    if device.type == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        found = Available(int(free), f"free on {device}")
    else:
        found = _host_available()
    if limit is not None and (found is None or limit < found.bytes):
        return Available(limit, "the memory limit (--memory-limit / DUPLEX_MEMORY_LIMIT)")
    if found is None:
        return Available(1 << 62, "unknown")
    return found


def _host_available() -> Available | None:
    found: Available | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found = Available(int(line.split()[1]) * 1024, "available on this machine (MemAvailable)")
                break
    except (OSError, ValueError, IndexError):
        pass
    if found is None:
        try:
            pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            found = Available(int(pages), "available on this machine")
        except (ValueError, OSError, AttributeError):
            pass
    cgroup = _cgroup_room()
    if cgroup is not None and (found is None or cgroup < found.bytes):
        found = Available(cgroup, "left under this container's memory limit (cgroup memory.max)")
    return found


def _cgroup_room() -> int | None:
    """cgroup v2: memory.max less memory.current of this process's group, if it has a limit."""
    try:
        group = Path("/proc/self/cgroup").read_text().strip().splitlines()[0].split(":", 2)[2]
        base = Path("/sys/fs/cgroup") / group.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text()))
    except (OSError, ValueError, IndexError):
        return None


def choose_dtype(
    requested: str,
    device: torch.device,
    files: CheckpointFiles,
    slots: int,
    *,
    limit: int | None = None,
    twin: bool = True,
) -> torch.dtype:
    """The dtype to load ``files`` in, checked against the memory available.

    ``auto``: bfloat16 on CUDA; float32 on CPU (the dtype every CPU kernel is fast and exact in)
    when it fits. A dtype that does not fit raises :class:`InsufficientMemory` with the memory
    needed and available, naming ``--dtype bfloat16`` when that would fit."""
    import torch

    if requested not in DTYPES:
        raise ValueError(f"dtype {requested!r}: expected one of {', '.join(DTYPES)}")
    if requested == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, requested)
    need = memory_need(files, dtype, slots, twin=twin)
    room = available_memory(device, limit)
    if need.total <= room.bytes:
        return dtype
    name = str(dtype).removeprefix("torch.")
    message = (
        f"{files.model_id} in {name} does not fit: it needs {need.describe()}, "
        f"{gib(room.bytes)} is {room.source}"
    )
    if dtype != torch.bfloat16:
        half = memory_need(files, torch.bfloat16, slots, twin=twin)
        fits = "fits" if half.total <= room.bytes else "does not fit either"
        message += f"; --dtype bfloat16 needs {gib(half.total)} ({fits})"
    if slots > 1:
        message += "; fewer --max-sessions need less KV cache"
    raise InsufficientMemory(message)
