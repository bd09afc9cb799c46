"""A frame ring's acknowledgements, as its consumer keeps them."""

from __future__ import annotations

import numpy as np

from duplex_actors.core.rings import INPUT_DTYPE, FrameRing


def test_an_ack_rides_along_until_half_the_ring_waits_for_it():
    ring = FrameRing.create("test-ring", 8, INPUT_DTYPE)
    try:
        assert ring.ack_to_send() is None  # nothing copied yet
        assert ring.copied(0) is False
        assert ring.copied(2) is False
        assert ring.ack_to_send() == 2
        assert ring.ack_to_send() is None  # sent once
        assert ring.copied(1) is False  # an older seq changes nothing
        assert ring.ack_to_send() is None
        assert ring.copied(5) is False  # 3 frames wait for their ack
        assert ring.copied(6) is True  # 4 of 8: send it now
        assert ring.ack_to_send() == 6
    finally:
        ring.close()


def test_a_producer_acked_as_the_consumer_says_never_fills_its_ring():
    ring = FrameRing.create("test-ring", 8, INPUT_DTYPE)
    frame = np.ones(ring.frame_bytes // INPUT_DTYPE.itemsize, dtype=INPUT_DTYPE)
    try:
        for _ in range(40):  # a tick of three frames, copied, then acked with the next message
            seqs = [ring.put(frame) for _ in range(3)]
            for seq in seqs:
                assert seq is not None  # not inline: the ring had room
                np.testing.assert_array_equal(ring.get(seq), frame)
                ring.copied(seq)
            ack = ring.ack_to_send()
            assert ack is not None and ack == seqs[-1]
            ring.ack(ack)
    finally:
        ring.close()
