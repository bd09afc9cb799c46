"""The name a process shows in ``/proc/PID/comm``, ``ps -o comm`` and ``top``."""

from __future__ import annotations

import ctypes
import ctypes.util

_PR_SET_NAME = 15


def set_process_name(name: str) -> None:
    """Name this process (its main thread: Linux keeps 15 bytes); a no-op where prctl is missing."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass
