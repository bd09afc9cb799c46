"""The one base of every error that carries a wire error code, shared by all layers.

The session core and actor report ``code`` of whatever the model family, the protocol or the
scheduler raised without importing those layers.
"""

from __future__ import annotations

from . import error_codes


class CodedError(Exception):
    """``code`` is stable and user-visible (protocol/errors.py lists the codes)."""

    code: str = error_codes.INTERNAL_ERROR


def code_of(exc: BaseException, default: str) -> str:
    """The wire code of ``exc``, or ``default`` for an error that has none."""
    return exc.code if isinstance(exc, CodedError) else default
