"""Ogg/Opus for the ``/api/chat`` dialect (moshi / PersonaPlex clients).

- :mod:`.ogg`: Ogg pages (RFC 3533), sans-io: a validating incremental reader, a page writer.
- :mod:`.codec`: per-stream codec state (sphn 0.2), sans-io: :class:`~.codec.OggOpusDecoder`,
  :class:`~.codec.OggOpusEncoder`, :class:`~.codec.OpusUndecodable`.
- :mod:`.wire` / :mod:`.worker`: the codec worker process and its pipe protocol.
- :mod:`.pool`: the trio shell: :func:`~.pool.open_opus_pool`, ``OpusPool``, ``OpusStream``.

Nothing is imported here, so a worker process loads no trio and the server no sphn.
"""
