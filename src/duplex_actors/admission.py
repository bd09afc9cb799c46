"""Why a session is not admitted: the errors admission raises, each with its wire code.

The scheduler, the engine core's link and the server raise them; the connection refuses the
session with the error's code.
"""

from __future__ import annotations

from . import error_codes
from .error_codes import CodedError


class ResourceExhausted(CodedError):
    """No free slot, or the server is not accepting sessions."""

    code = error_codes.RESOURCE_EXHAUSTED


class SchedulerFailed(CodedError):
    """The model scheduler (in this process or the engine core's) has failed."""

    code = error_codes.INTERNAL_ERROR


class LogUnavailable(CodedError):
    """The session log cannot be written, so no session is admitted."""

    code = error_codes.LOG_UNAVAILABLE


__all__ = ["LogUnavailable", "ResourceExhausted", "SchedulerFailed"]
