"""Module constructors on the meta device, without their parameters' initialisation.

A model built on the meta device (its tensors have shapes and dtypes, no data) is only a
skeleton for ``load_state_dict(..., assign=True)``: initialising its parameters has nothing to
write. Torch still runs every ``torch.nn.init`` call of every constructor, and on the meta
device each one goes through torch's Python reference ops, whose first call imports
``torch._dynamo``: 2.1-2.9 s of an engine core's start-up on the 2-core VM for the tiny model,
and 2.2 of the 4.5 s that building the 7B's skeleton takes (BENCHMARKS.md, "Start-up and
memory").

Inside :func:`meta_init_skipped`, the ``torch.nn.init`` functions return a meta tensor as it is
and initialise every other tensor as before, in any thread: the swap is process-wide (torch's
modules look the functions up in ``torch.nn.init`` at each call), but what it changes is only
what has no data.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

# The in-place initialisers of torch.nn.init (the ones modules call from reset_parameters).
INIT_FUNCTIONS: tuple[str, ...] = tuple(
    name for name in dir(torch.nn.init) if name.endswith("_") and not name.startswith("_")
)

_lock = threading.Lock()
_users = 0
_originals: dict[str, Callable[..., Any]] = {}


def _skipping_meta(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tensor, torch.Tensor) and tensor.is_meta:
            return tensor
        return original(tensor, *args, **kwargs)

    return init


@contextmanager
def meta_init_skipped() -> Iterator[None]:
    """``torch.nn.init`` leaves meta tensors alone while any caller is inside (nested and
    concurrent uses share one swap; the last to leave restores torch's functions)."""
    global _users
    with _lock:
        if _users == 0:
            for name in INIT_FUNCTIONS:
                original = getattr(torch.nn.init, name)
                _originals[name] = original
                setattr(torch.nn.init, name, _skipping_meta(original))
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                for name, original in _originals.items():
                    setattr(torch.nn.init, name, original)
                _originals.clear()


__all__ = ["INIT_FUNCTIONS", "meta_init_skipped"]
