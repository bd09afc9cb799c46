"""API-key and Origin checks, done before the WebSocket upgrade (HTTP 401 / 403)."""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence

import attrs

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"


@attrs.frozen(slots=True)
class Refusal:
    status: int
    code: str
    message: str


def offered_key(headers: dict[str, str], subprotocols: Sequence[str]) -> str | None:
    """``Authorization: Bearer <key>``, else the browser subprotocol ``openai-insecure-api-key.<key>``."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    for proto in subprotocols:
        if proto.startswith(KEY_SUBPROTOCOL_PREFIX):
            return proto[len(KEY_SUBPROTOCOL_PREFIX) :]
    return None


def check(
    *,
    api_key: str | None,
    allowed_origins: Iterable[str],
    headers: dict[str, str],
    subprotocols: Sequence[str],
) -> Refusal | None:
    origins = list(allowed_origins)
    origin = headers.get("origin")
    if origins and origin is not None and origin not in origins:
        return Refusal(403, "forbidden", f"origin {origin!r} is not allowed")
    if api_key:
        key = offered_key(headers, subprotocols)
        if key is None or not hmac.compare_digest(key.encode(), api_key.encode()):
            return Refusal(401, "unauthorized", "missing or invalid API key")
    return None


def chosen_subprotocol(subprotocols: Sequence[str]) -> str | None:
    """Echo ``realtime`` when the client offered it (browsers must get one they offered)."""
    return "realtime" if "realtime" in subprotocols else None
