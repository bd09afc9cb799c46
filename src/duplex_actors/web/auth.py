"""API-key and Origin checks, done before the WebSocket upgrade (HTTP 401 / 403)."""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote_plus

import attrs

from .. import error_codes

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
# Where :func:`take_query_key` leaves a key it took out of the query string.
QUERY_KEY_SCOPE = "duplex_actors.query_key"


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
    query_key: str | None = None,
) -> Refusal | None:
    """Origin, then the API key: a header or subprotocol key, else ``query_key`` (the
    ``auth_id``/``worker_auth_id`` query parameter, accepted on ``/api/chat`` only)."""
    origins = list(allowed_origins)
    origin = headers.get("origin")
    if origins and origin is not None and origin not in origins:
        return Refusal(403, "forbidden", f"origin {origin!r} is not allowed")
    if api_key:
        key = offered_key(headers, subprotocols)
        if key is None:
            key = query_key
        if key is None or not hmac.compare_digest(key.encode(), api_key.encode()):
            return Refusal(401, error_codes.UNAUTHORIZED, "missing or invalid API key")
    return None


def chosen_subprotocol(subprotocols: Sequence[str]) -> str | None:
    """Echo ``realtime`` when the client offered it (browsers must get one they offered)."""
    return "realtime" if "realtime" in subprotocols else None


def take_query_key(scope: dict[str, Any], path: str, names: Sequence[str]) -> None:
    """On ``path`` only: move the API-key query parameters ``names`` out of the ASGI scope's
    query string into ``scope[QUERY_KEY_SCOPE]`` (the first one given), so that no access log
    or later reader of the URL sees the key. The scope is the one hypercorn logs from."""
    if scope.get("path") != path or scope.get("type") not in ("websocket", "http"):
        return
    raw: bytes = scope.get("query_string") or b""
    if not raw:
        return
    kept: list[bytes] = []
    keys: list[str] = []
    for piece in raw.split(b"&"):
        name, _, value = piece.partition(b"=")
        if unquote_plus(name.decode("latin-1")) in names:
            if value:
                keys.append(unquote_plus(value.decode("latin-1")))
        else:
            kept.append(piece)
    if len(kept) == len(raw.split(b"&")):
        return
    if keys:
        scope[QUERY_KEY_SCOPE] = keys[0]
    # Byte for byte the other parameters, in order: only the key's pieces are taken out.
    scope["query_string"] = b"&".join(kept)
