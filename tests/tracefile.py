"""Trace files taken apart and put back together (docs/format.md), for tests that
damage them on purpose: chunks parsed, edited and re-sealed with the right CRC."""

import struct
from dataclasses import dataclass
from typing import List

CHUNK_MAGIC = 0x4B4E4843
HEADER_FIXED = 16
CHUNK_HEADER = 16
NAMES, TRACK, EVENTS, STATS, END, GPU, LAUNCH_CONFIGS, PYSTACKS, PYSAMPLES = range(1, 10)


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C; crc32c(b, crc32c(a)) == crc32c(a + b)."""
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ _TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def read_varint(b: bytes, at: int):
    v = shift = 0
    while True:
        byte = b[at]
        at += 1
        v |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return v, at


@dataclass
class Chunk:
    type: int
    payload: bytes
    flags: int = 0
    reserved: int = 0


@dataclass
class Trace:
    major: int
    minor: int
    header_json: bytes
    chunks: List[Chunk]

    def to_bytes(self) -> bytes:
        out = bytearray(b"STEPSCP\n" + struct.pack("<HHI", self.major, self.minor, len(self.header_json)))
        out += self.header_json
        for ch in self.chunks:
            out += seal(ch, self.minor)
        return bytes(out)


def seal(ch: Chunk, minor: int) -> bytes:
    """A chunk's bytes with the CRC the format version asks for (1.3: header fields too)."""
    fields = struct.pack("<BBHI", ch.type, ch.flags, ch.reserved, len(ch.payload))
    crc = crc32c(ch.payload, crc32c(fields)) if minor >= 3 else crc32c(ch.payload)
    return struct.pack("<I", CHUNK_MAGIC) + fields + struct.pack("<I", crc) + ch.payload


def parse(data: bytes) -> Trace:
    major, minor, jlen = struct.unpack_from("<HHI", data, 8)
    at = HEADER_FIXED + jlen
    chunks = []
    while at + CHUNK_HEADER <= len(data):
        _, typ, flags, reserved, length, _ = struct.unpack_from("<IBBHII", data, at)
        chunks.append(Chunk(typ, data[at + CHUNK_HEADER:at + CHUNK_HEADER + length], flags, reserved))
        at += CHUNK_HEADER + length
    return Trace(major, minor, data[HEADER_FIXED:HEADER_FIXED + jlen], chunks)


def chunk_offsets(data: bytes) -> List[int]:
    """Byte offsets of the chunk headers of a well-formed file."""
    jlen = struct.unpack_from("<I", data, 12)[0]
    at, out = HEADER_FIXED + jlen, []
    while at + CHUNK_HEADER <= len(data):
        out.append(at)
        at += CHUNK_HEADER + struct.unpack_from("<I", data, at + 8)[0]
    return out


def names_payload(entries) -> bytes:
    """A NAMES payload from (id, bytes) pairs."""
    out = bytearray(varint(len(entries)))
    for i, raw in entries:
        out += varint(i) + varint(len(raw)) + raw
    return bytes(out)


def parse_names(payload: bytes):
    n, at = read_varint(payload, 0)
    out = []
    for _ in range(n):
        i, at = read_varint(payload, at)
        length, at = read_varint(payload, at)
        out.append((i, payload[at:at + length]))
        at += length
    return out


def parse_pystacks(payload: bytes):
    """A PYSTACKS payload as (strings, frames, stacks): each (first id, entries)."""
    at, parts = 0, []
    for fields in (None, 3, 2):  # strings: len + bytes; frames: func, file, line; stacks: parent + 1, frame
        first, at = read_varint(payload, at)
        n, at = read_varint(payload, at)
        entries = []
        for _ in range(n):
            if fields is None:
                length, at = read_varint(payload, at)
                entries.append(payload[at:at + length])
                at += length
            else:
                values = []
                for _ in range(fields):
                    v, at = read_varint(payload, at)
                    values.append(v)
                entries.append(values)
        parts.append((first, entries))
    return parts


def pystacks_payload(parts) -> bytes:
    out = bytearray()
    for i, (first, entries) in enumerate(parts):
        out += varint(first) + varint(len(entries))
        for e in entries:
            out += varint(len(e)) + e if i == 0 else b"".join(varint(v) for v in e)
    return bytes(out)
