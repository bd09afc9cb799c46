"""Server settings: from ``duplex-actors serve`` flags or, for the hypercorn entry, ``DUPLEX_*``."""

from __future__ import annotations

import os

import attrs


@attrs.frozen(slots=True)
class ServerConfig:
    model: str = "tiny"
    revision: str | None = None
    family: str | None = None
    max_sessions: int = 8
    device: str = "cpu"
    torch_threads: int = 1

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ServerConfig:
        env = dict(os.environ if env is None else env)
        return cls(
            model=env.get("DUPLEX_MODEL", "tiny"),
            revision=env.get("DUPLEX_MODEL_REVISION") or None,
            family=env.get("DUPLEX_FAMILY") or None,
            max_sessions=int(env.get("DUPLEX_MAX_SESSIONS", "8")),
            device=env.get("DUPLEX_DEVICE", "cpu"),
            torch_threads=int(env.get("DUPLEX_TORCH_THREADS", "1")),
        )
