"""Fixed-size frame rings in shared memory between the engine core and one front end (no trio).

One ring carries one kind of frame one way: the front end's input frames (float32, 1920
samples) to the core, the core's output frames (PCM16) back. The producer writes frame ``seq``
at ``seq % capacity`` and names ``seq`` in its next message on the link; the consumer copies it
out when it reads that message and acknowledges the highest ``seq`` it copied in its next message
the other way (at once when half of the ring waits for that acknowledgement). The producer never
writes past ``acked + capacity``: a full ring sends the frame inline in the message instead (no
loss, just a copy more). The memory is a ``memfd`` whose
descriptor the core passes to the front end over the link's socket (SCM_RIGHTS): nothing is
named in /dev/shm and the kernel frees it when both have closed it.
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import numpy.typing as npt

from ..audio import FRAME_SAMPLES

INPUT_DTYPE = np.dtype(np.float32)
OUTPUT_DTYPE = np.dtype("<i2")


class FrameRing:
    """``capacity`` frames of ``FRAME_SAMPLES`` samples of ``dtype`` over the memfd ``fd``."""

    def __init__(self, fd: int, capacity: int, dtype: np.dtype[np.generic]) -> None:
        self.fd = fd
        self.capacity = capacity
        self.dtype = dtype
        self.frame_bytes = FRAME_SAMPLES * dtype.itemsize
        self._map = mmap.mmap(fd, capacity * self.frame_bytes)
        self.frames: npt.NDArray[np.generic] = np.frombuffer(self._map, dtype=dtype).reshape(
            capacity, FRAME_SAMPLES
        )
        self.written = 0  # producer: the next seq to write
        self.acked = 0  # producer: every seq below this one has been copied out
        self._copied = -1  # consumer: every seq up to this one has been copied out
        self._ack_sent = -1  # consumer: the last seq acknowledged to the producer

    @classmethod
    def create(cls, name: str, capacity: int, dtype: np.dtype[np.generic]) -> FrameRing:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, capacity * FRAME_SAMPLES * dtype.itemsize)
        return cls(fd, capacity, dtype)

    # -- the producer ----------------------------------------------------------------------------
    def put(self, frame: npt.NDArray[np.generic] | bytes) -> int | None:
        """Write one frame; its seq, or None when the ring is full (send it inline)."""
        seq = self.written
        if seq - self.acked >= self.capacity:
            return None
        row = self.frames[seq % self.capacity]
        if isinstance(frame, bytes):
            row[:] = np.frombuffer(frame, dtype=self.dtype)
        else:
            row[:] = frame
        self.written = seq + 1
        return seq

    def ack(self, seq: int) -> None:
        """The consumer has copied every frame up to ``seq`` (inclusive)."""
        self.acked = max(self.acked, seq + 1)

    # -- the consumer ----------------------------------------------------------------------------
    def get(self, seq: int) -> npt.NDArray[np.generic]:
        """A copy of frame ``seq`` (the producer may reuse its place once this is acked)."""
        frame: npt.NDArray[np.generic] = self.frames[seq % self.capacity].copy()
        return frame

    def get_bytes(self, seq: int) -> bytes:
        return bytes(self.frames[seq % self.capacity].tobytes())

    def copied(self, seq: int) -> bool:
        """Every frame up to ``seq`` is copied out. The acknowledgement rides with the next
        message to the producer (:meth:`ack_to_send`); True when half of the ring waits for it,
        so that it goes now."""
        self._copied = max(self._copied, seq)
        return self._copied - self._ack_sent >= self.capacity // 2

    def ack_to_send(self) -> int | None:
        """The seq to acknowledge in the message going to the producer now (None: nothing new
        since the last one)."""
        if self._copied <= self._ack_sent:
            return None
        self._ack_sent = self._copied
        return self._copied

    def close(self) -> None:
        self.frames = np.empty((0, FRAME_SAMPLES), dtype=self.dtype)
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with it
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass
