"""The Ogg page layer: CRC, incremental reading in any split, refusals, the page writer."""

from __future__ import annotations

import os
import random
import struct

import pytest

from duplex_actors.opus.ogg import (
    BOS,
    CONTINUED,
    MAX_PAGE_BYTES,
    OggError,
    OggPageReader,
    encode_page,
    ogg_crc,
    ogg_crc_bitwise,
)


def test_crc_matches_the_bitwise_definition():
    rng = random.Random(1)
    for n in [0, 1, 2, 3, 27, 255, 4096, *[rng.randrange(1, 3000) for _ in range(30)]]:
        data = bytes(rng.randrange(256) for _ in range(n))
        assert ogg_crc(data) == ogg_crc_bitwise(data)


def test_crc_of_a_known_page():
    # the standard check value of the Ogg parametrisation (poly 0x04C11DB7, init 0, unreflected,
    # no xorout; the catalogue's "CRC-32/OGG")
    assert ogg_crc(b"123456789") == 0x89A1897F


def _pages(n: int) -> list[bytes]:
    rng = random.Random(n)
    return [
        encode_page(
            [os.urandom(rng.randrange(0, 600)) for _ in range(rng.randrange(1, 4))],
            serial=7,
            sequence=i,
            granule=i * 960,
            header_type=BOS if i == 0 else 0,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("step", [1, 7, 27, 28, 100, 10_000])
def test_any_split_gives_the_same_pages(step):
    pages = _pages(12)
    blob = b"".join(pages)
    reader = OggPageReader()
    got = []
    for i in range(0, len(blob), step):
        got += reader.feed(blob[i : i + step])
    assert [p.raw for p in got] == pages
    assert [p.sequence for p in got] == list(range(12))
    assert got[0].bos and not got[1].bos
    assert reader.pending == 0


def test_a_page_is_returned_as_soon_as_its_last_byte_arrives():
    page = _pages(1)[0]
    reader = OggPageReader()
    assert reader.feed(page[:-1]) == []
    assert reader.pending == len(page) - 1
    assert [p.raw for p in reader.feed(page[-1:])] == [page]


def test_lacing_of_long_packets_and_first_packet():
    long = bytes(range(256)) * 3  # 768 bytes: segments 255, 255, 255, 3
    page = encode_page([long, b"tail"], serial=1, sequence=0, granule=0)
    (parsed,) = OggPageReader().feed(page)
    assert parsed.lacing == bytes([255, 255, 255, 3, 4])
    assert parsed.first_packet() == long
    cont = encode_page([b"x" * 10, b"next"], serial=1, sequence=1, granule=0, header_type=CONTINUED)
    (parsed,) = OggPageReader().feed(cont)
    assert parsed.continued and parsed.first_packet() == b"next"


def test_refusals_name_the_problem():
    page = bytearray(_pages(1)[0])
    with pytest.raises(OggError, match="capture pattern"):
        OggPageReader().feed(b"RIFF")
    with pytest.raises(OggError, match="capture pattern"):
        OggPageReader().feed(b"Og" + b"x")  # refused before a whole header arrives
    bad = bytearray(page)
    bad[4] = 1
    with pytest.raises(OggError, match="version"):
        OggPageReader().feed(bytes(bad))
    bad = bytearray(page)
    bad[5] |= 0x10
    with pytest.raises(OggError, match="reserved header-type"):
        OggPageReader().feed(bytes(bad))
    bad = bytearray(page)
    bad[-1] ^= 0x01
    with pytest.raises(OggError, match="CRC"):
        OggPageReader().feed(bytes(bad))
    # garbage after a good page: the good page is read, the rest refused at its own offset
    reader = OggPageReader()
    with pytest.raises(OggError, match=f"byte {len(page)}"):
        reader.feed(bytes(page) + b"\x00" * 8)


def test_writer_limits():
    with pytest.raises(ValueError, match="at most 255"):
        encode_page([b"x" * 255 * 255], serial=0, sequence=0, granule=0)
    biggest = encode_page([b"x" * (255 * 254 + 254)], serial=0, sequence=0, granule=0)
    assert len(biggest) <= MAX_PAGE_BYTES
    assert struct.unpack_from("<B", biggest, 26)[0] == 255
