"""Typed errors of the model layer; ``code`` is the wire error code the server reports."""

from __future__ import annotations

from .. import error_codes
from ..error_codes import CodedError


class ModelError(CodedError):
    """Base class; ``code`` is stable and user-visible."""

    code = error_codes.INTERNAL_ERROR


class CheckpointError(ModelError):
    """A checkpoint file is missing or malformed; the message names the file and what was expected."""

    code = error_codes.CHECKPOINT_ERROR


class CheckpointUnavailable(ModelError):
    """The checkpoint cannot be fetched now (the hub is unreachable or overloaded); a later
    attempt may work, so the server keeps trying."""

    code = error_codes.CHECKPOINT_UNAVAILABLE


class InvalidVoice(ModelError):
    """The requested voice prompt is not a bundled ``.pt`` basename of this checkpoint."""

    code = error_codes.INVALID_VOICE


class InvalidRuntimeConfig(ModelError):
    """A session tried to set a server-owned runtime key, or a sampling value is out of range."""

    code = error_codes.INVALID_DUPLEX_RUNTIME_CONFIG
