"""The session log: append-only, CRC-framed records; the source of truth of every session."""
