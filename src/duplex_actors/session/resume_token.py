"""The resume token of a resumable session: who may take the session over after a drop.

A token is 256 random bits, handed to the client once (``session.created``, then each
``session.resumed``) and never written anywhere: only its SHA-256 is kept, compared in
constant time, and only together with the fingerprint of the API key that opened the session.
Each resume rotates it. The rotated token counts as delivered once the client proves it has
it (an ack or a heartbeat on the new connection); until then the previous token is accepted
one more time, so a ``session.resumed`` lost in flight does not strand the client.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


def fingerprint(api_key: str | None) -> bytes:
    """What a session remembers of the API key that opened it."""
    return hashlib.sha256(b"duplex-actors key:" + (api_key or "").encode()).digest()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class ResumeCredential:
    def __init__(self, key_fingerprint: bytes) -> None:
        self._key = key_fingerprint
        self._current: bytes | None = None
        self._previous: bytes | None = None  # the one retry, until the current one is proven

    def __repr__(self) -> str:
        return "ResumeCredential(<hidden>)"

    def issue(self) -> str:
        """A new token; the one it replaces stays good for one retry until :meth:`proven`."""
        token = secrets.token_urlsafe(32)
        self._previous, self._current = self._current, _digest(token)
        return token

    def proven(self) -> None:
        """The client showed it has the current token's successor chain: no retry with the
        previous one any more."""
        self._previous = None

    def matches(self, token: str, key_fingerprint: bytes) -> bool:
        """Whether ``token`` (with the key that presents it) may take the session over now."""
        if not hmac.compare_digest(key_fingerprint, self._key):
            return False
        digest = _digest(token)
        current = self._current is not None and hmac.compare_digest(digest, self._current)
        previous = self._previous is not None and hmac.compare_digest(digest, self._previous)
        return current or previous

    def consume(self, token: str) -> str:
        """Take the session over with ``token`` (which :meth:`matches`): it is spent, and the
        new token is returned. A retry with the previous token spends that retry."""
        digest = _digest(token)
        if self._previous is not None and hmac.compare_digest(digest, self._previous):
            self._previous = None  # the retry: the token issued since was never seen
            self._current = None
        return self.issue()


__all__ = ["ResumeCredential", "fingerprint"]
