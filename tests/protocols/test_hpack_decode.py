"""netdiag's HPACK decoder against hpack's (issue 10): same headers, same dynamic table,
same exceptions (class and message), on encoder output, crafted blocks and fuzzed
bytes. Runs on whichever core is selected (the suite runs tests/protocols on both)."""

from __future__ import annotations

import random
import re
from collections import deque
from typing import Any

import hpack
import pytest
from hpack import Decoder, Encoder
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.huffman_table import (
    HUFFMAN_COMPLETE,
    HUFFMAN_EMIT_SYMBOL,
    HUFFMAN_FAIL,
    HUFFMAN_TABLE,
)
from hpack.huffman_table import decode_huffman as hpack_huffman
from hpack.table import HeaderTable

from netdiag.protocols import hpack_decode as hd
from netdiag.protocols.hpack_decode import HpackDecoder, decode_huffman

HUFF = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)

NAMES = [b":method", b":path", b":authority", b":status", b"content-type", b"cookie",
         b"user-agent", b"x-request-id", b"x-trace", b"accept", b"set-cookie", b"date",
         b"x-\xc3\xa9t\xc3\xa9", b"x-bad-\xff", b"", b"www-authenticate", b"etag"]
VALUES = [b"", b"GET", b"/", b"/index.html", b"200", b"gzip, deflate", b"text/html",
          "caf\u00e9 \u65e5\u672c".encode(), b"\xff\xfe\xfd", b"\xc3(", b"\xed\xa0\x80",
          b"a" * 40, b"\x00\x01\x7f\x80", b"Mon, 01 Dec 2025 10:00:00 GMT"]


# -- helpers -------------------------------------------------------------------------------

def _int(value: int, bits: int, flags: int) -> bytes:
    out = hpack.hpack.encode_integer(value, bits)
    out[0] |= flags
    return bytes(out)


def _string(s: bytes, huffman: bool) -> bytes:
    if huffman:
        s = HUFF.encode(s)
    return _int(len(s), 7, 0x80 if huffman else 0) + s


def indexed(index: int) -> bytes:
    return _int(index, 7, 0x80)


def size_update(size: int) -> bytes:
    return _int(size, 5, 0x20)


INCREMENTAL, WITHOUT, NEVER = 0x40, 0x00, 0x10


def literal(name: bytes | int, value: bytes, mode: int, huffman: bool) -> bytes:
    """A literal field: ``mode`` INCREMENTAL, WITHOUT (indexing) or NEVER (indexed); the
    name by table index or literal."""
    bits = 6 if mode == INCREMENTAL else 4
    if isinstance(name, int):
        head = _int(name, bits, mode)
    else:
        head = bytes([mode]) + _string(name, huffman)
    return head + _string(value, huffman)


def _norm(exc: BaseException) -> tuple[type[BaseException], str]:
    return type(exc), re.sub(r"<memory at 0x[0-9a-fA-F]+>", "<memory>", str(exc))


def outcome(dec: Decoder | HpackDecoder, block: bytes) -> Any:
    """The decoded list as plain tuples, or the (class, message) of the exception."""
    try:
        got = dec.decode(block, raw=True)
    except Exception as exc:
        return _norm(exc)
    return [tuple(h) for h in got]


def state(dec: Decoder | HpackDecoder) -> Any:
    if isinstance(dec, HpackDecoder):
        return (dec.dynamic_entries(), dec.table_size, dec.header_table_size,
                dec.max_allowed_table_size)
    t = dec.header_table
    return (list(t.dynamic_entries), t._current_size, dec.header_table_size,
            dec.max_allowed_table_size)


def check(ref: Decoder, new: HpackDecoder, block: bytes) -> Any:
    """Decode with both; assert the same outcome and table; return the outcome."""
    want = outcome(ref, block)
    got = outcome(new, block)
    assert got == want, block
    assert state(new) == state(ref), block
    if isinstance(got, list):
        assert all(type(k) is bytes and type(v) is bytes for k, v in got)
    return got


def pair(limit: int = 1 << 20) -> tuple[Decoder, HpackDecoder]:
    return Decoder(max_header_list_size=limit), HpackDecoder(max_header_list_size=limit)


def random_headers(r: random.Random, n: int) -> list[tuple[bytes, bytes]]:
    out = []
    for _ in range(n):
        name = r.choice(NAMES) if r.random() < 0.8 else r.randbytes(r.randint(0, 12))
        if r.random() < 0.7:
            value = r.choice(VALUES)
        elif r.random() < 0.5:
            value = bytes(r.choice(b"abcdefghijklmnopqrstuvwxyz0123456789-/=;. ")
                          for _ in range(r.randint(0, 60)))
        else:
            value = r.randbytes(r.randint(0, 30))
        out.append((name, value))
    return out


# -- the tables ----------------------------------------------------------------------------

def test_static_table_is_hpacks() -> None:
    assert hd.STATIC_TABLE == HeaderTable.STATIC_TABLE
    assert len(hd.STATIC_TABLE) == 61


def test_huffman_machine_is_hpacks() -> None:
    """Every state reachable by both machines in step, every input byte: the same bytes
    out, the same EOS failure, the same 'may end here' -- so the same result on every
    string (the product automaton is explored whole)."""
    nxt, outs, accept = hd._H_NEXT, hd._H_OUT, hd._H_ACCEPT
    assert len(nxt) == len(outs) == 256 * 256 and len(accept) == 256
    seen = {(0, 0)}
    todo = deque([(0, 0)])
    while todo:
        mine, theirs = todo.popleft()
        for byte in range(256):
            out = []
            fail = False
            complete = 0
            st = theirs
            for nib in (byte >> 4, byte & 15):
                st, fl, sym = HUFFMAN_TABLE[st * 16 + nib]
                if fl & HUFFMAN_FAIL:
                    fail = True
                    break
                if fl & HUFFMAN_EMIT_SYMBOL:
                    out.append(sym)
                complete = fl & HUFFMAN_COMPLETE
            k = mine << 8 | byte
            assert (outs[k] is hd._EOS_MET) == fail, (mine, theirs, byte)
            if fail:
                continue
            assert list(outs[k]) == out, (mine, theirs, byte)
            assert accept[nxt[k]] == bool(complete), (mine, theirs, byte)
            nxt_pair = (nxt[k], st)
            if nxt_pair not in seen:
                seen.add(nxt_pair)
                todo.append(nxt_pair)
    assert len(seen) == 256  # one hpack state for each of ours: the same machine


def _huffman_outcome(fn: Any, s: bytes) -> Any:
    try:
        return fn(s)
    except Exception as exc:
        return _norm(exc)


def test_decode_huffman_is_hpacks() -> None:
    r = random.Random(7)
    samples = [b"", b"\xff", b"\xff" * 4, b"\xfe", b"\x00", b"\x1f\xff\xff\xff"]
    for _ in range(3000):
        plain = r.randbytes(r.randint(0, 40))
        enc = HUFF.encode(plain)
        assert decode_huffman(enc) == plain
        samples.append(enc)
        samples.append(enc + b"\xff")  # padding of 8 bits or more
        if enc:
            m = bytearray(enc)
            m[r.randrange(len(m))] ^= 1 << r.randrange(8)
            samples.append(bytes(m))
            samples.append(enc[:-1])
            samples.append(enc[:-1] + bytes([enc[-1] & 0xFE]))  # padding not all ones
        samples.append(r.randbytes(r.randint(1, 12)))
    # EOS (30 ones) inside the string, at every bit offset
    for shift in range(8):
        bits = "0" * shift + "1" * 30 + "1" * ((8 - (shift + 30) % 8) % 8)
        samples.append(int(bits, 2).to_bytes(len(bits) // 8, "big"))
    for s in samples:
        assert _huffman_outcome(decode_huffman, s) == _huffman_outcome(hpack_huffman, s), s


# -- encoder output -----------------------------------------------------------------------

@pytest.mark.parametrize("huffman", [True, False])
def test_encoder_output_with_a_shared_table(huffman: bool) -> None:
    r = random.Random(1 if huffman else 2)
    for _ in range(60):
        enc = Encoder()
        ref, new = pair()
        for _ in range(12):
            if r.random() < 0.15:
                size = r.choice([0, 64, 256, 1000, 4096])
                enc.header_table_size = size
            hdrs: list[Any] = random_headers(r, r.randint(0, 25))
            if r.random() < 0.3:  # sensitive fields: never indexed
                hdrs = [(k, v, r.random() < 0.5) for k, v in hdrs]
            block = enc.encode(hdrs, huffman=huffman)
            got = check(ref, new, block)
            assert got == [(k, v) for k, v, *_ in hdrs]


def test_every_representation() -> None:
    """Indexed fields, the three literal kinds with indexed and literal names, Huffman or
    not, size updates at the start (several), eviction, and table indices in and out."""
    r = random.Random(3)
    for seed in range(400):
        ref, new = pair(r.choice([1 << 20, 300]))
        if r.random() < 0.3:
            allowed = r.choice([0, 100, 4096, 10000])
            ref.max_allowed_table_size = new.max_allowed_table_size = allowed
        for _ in range(6):
            parts = [size_update(r.choice([0, 50, 200, 4096, 10000]))
                     for _ in range(r.choice([0, 0, 1, 2]))]
            dyn = len(ref.header_table.dynamic_entries)
            for _ in range(r.randint(0, 20)):
                kind = r.random()
                if kind < 0.3:
                    parts.append(indexed(r.randint(1, 61 + dyn + (r.random() < 0.1))))
                else:
                    name: bytes | int = (r.randint(1, 61 + dyn) if r.random() < 0.5
                                         else random_headers(r, 1)[0][0])
                    mode = r.choice([INCREMENTAL, WITHOUT, NEVER])
                    parts.append(literal(name, random_headers(r, 1)[0][1], mode,
                                         r.random() < 0.5))
            got = check(ref, new, b"".join(parts))
            if not isinstance(got, list):
                break
        del seed


def test_size_updates_and_settings() -> None:
    ref, new = pair()
    fields = b"".join(literal(b"x-k%d" % i, b"v" * 30, INCREMENTAL, False) for i in range(60))
    check(ref, new, fields)
    assert len(new.dynamic_entries()) == 60
    check(ref, new, size_update(1000) + indexed(62))  # shrinks: oldest evicted
    check(ref, new, size_update(0) + size_update(4096))  # emptied, then back
    assert new.dynamic_entries() == [] and new.table_size == 0
    check(ref, new, size_update(5000))  # beyond the allowed 4096
    ref, new = pair()
    ref.max_allowed_table_size = new.max_allowed_table_size = 100_000
    check(ref, new, size_update(100_000) + fields)
    ref.max_allowed_table_size = new.max_allowed_table_size = 1000
    check(ref, new, indexed(62))  # the peer did not shrink: error at the end
    ref, new = pair()
    ref.header_table_size = new.header_table_size = 500  # direct, like hpack's setter
    assert state(new) == state(ref)
    check(ref, new, fields + indexed(2) + size_update(10))  # update after a field


def test_max_header_list_size() -> None:
    for limit in (0, 31, 32, 33, 100, 1000):
        ref, new = pair(limit)
        block = (literal(b"a", b"b", INCREMENTAL, False) + indexed(2)
                 + literal(3, b"x" * 40, WITHOUT, True))
        check(ref, new, block)
        new.max_header_list_size = ref.max_header_list_size = limit + 50
        check(ref, new, block)


def test_errors_carry_hpacks_messages() -> None:
    cases = [
        indexed(0), indexed(62), indexed(1 << 20),
        b"\xff", b"\xff\xff", b"\xff\xff\xff\xff\xff\xff\x01",  # integers cut short, too long
        b"\xff\x80\x80\x80\x80\x00",  # five continuation bytes: still accepted
        b"\xff\x80\x80\x80\x80\x80\x00",
        b"\x40", b"\x00", b"\x10", b"\x40\x01a", b"\x41", b"\x7f", b"\x7f\xff",
        b"\x40\x7f", b"\x40\x05abc", b"\x40\x01a\x05abc", b"\x0f\xff\xff\xff\xff\xff\x01",
        b"\x40\x81\xff\x00", b"\x40\x01a\x82\xff\xff", b"\x40\x01a\x81\x00",
        b"\x3f", b"\x3f\xe1\x1f", size_update(4097), indexed(2) + size_update(0),
        literal(b"x", b"y", INCREMENTAL, False) + b"\x40",
    ]
    for block in cases:
        ref, new = pair()
        check(ref, new, block)


def test_raw_false_is_refused() -> None:
    with pytest.raises(ValueError):
        HpackDecoder().decode(b"\x82", raw=False)


def test_plain_tuples_of_bytes() -> None:
    dec = HpackDecoder()
    a = dec.decode(indexed(2) + literal(b"x-a", b"1", INCREMENTAL, False)
                   + literal(b"x-s", b"\xff", NEVER, True))
    b = dec.decode(indexed(2) + indexed(62))
    assert a == [(b":method", b"GET"), (b"x-a", b"1"), (b"x-s", b"\xff")]
    assert b == a[:2]
    assert all(type(h) is tuple for h in a + b)


def test_the_memo_is_bounded() -> None:
    """At most MEMO_MAX_ENTRIES short strings; one in use stays (least recently used
    goes first)."""
    dec = HpackDecoder()
    r = random.Random(5)
    hot = literal(b"x", b"hot value", WITHOUT, True)
    for i in range(2 * hd.MEMO_MAX_ENTRIES):
        v = b"%d-%d" % (i, r.randrange(1 << 30))
        assert dec.decode(literal(b"x", v, WITHOUT, True)) == [(b"x", v)]
        if i % 1000 == 0:
            assert dec.decode(hot) == [(b"x", b"hot value")]
            assert next(reversed(hd._memo)) == HUFF.encode(b"hot value")  # used last
    assert len(hd._memo) <= hd.MEMO_MAX_ENTRIES
    assert HUFF.encode(b"hot value") in hd._memo
    assert all(len(k) <= hd.MEMO_MAX_LEN for k in hd._memo)
    long_value = b"z" * 500
    assert dec.decode(literal(b"x", long_value, WITHOUT, True)) == [(b"x", long_value)]
    assert HUFF.encode(long_value) not in hd._memo


def test_a_long_block_in_one_call() -> None:
    """Linear: the block is read in place (hpack copies its rest at every literal)."""
    fields = [(b"x-f", b"%04d" % i) for i in range(4000)]
    block = Encoder().encode(fields, huffman=False)
    ref, new = pair()
    check(ref, new, block)


# -- fuzz --------------------------------------------------------------------------------

def _mutate(r: random.Random, block: bytes) -> bytes:
    b = bytearray(block)
    for _ in range(r.randint(1, 3)):
        op = r.random()
        if op < 0.35 and b:
            b[r.randrange(len(b))] = r.randrange(256)
        elif op < 0.5 and b:
            b[r.randrange(len(b))] ^= 1 << r.randrange(8)
        elif op < 0.65:
            b.insert(r.randint(0, len(b)), r.randrange(256))
        elif op < 0.75:
            b[r.randint(0, len(b)):r.randint(0, len(b))] = size_update(r.randint(0, 5000))
        elif op < 0.9 and b:
            del b[r.randint(0, len(b)):]
        elif b:
            i = r.randrange(len(b))
            del b[i:i + r.randint(1, 4)]
    return bytes(b)


def test_fuzz_against_hpack() -> None:
    """20,000 blocks (mutated encoder output and random bytes) through pairs of decoders
    that keep their table across blocks: equal results and tables, or the same exception
    (class and message) with equal tables."""
    r = random.Random(20251201)
    enc = Encoder()
    ref, new = pair()
    errors = ok = 0
    for i in range(20_000):
        if i % 50 == 0:
            enc = Encoder()
            limit = r.choice([1 << 20, 1 << 16, 400])
            ref, new = pair(limit)
            if r.random() < 0.3:
                allowed = r.choice([0, 256, 4096, 65536])
                ref.max_allowed_table_size = new.max_allowed_table_size = allowed
        kind = r.random()
        if kind < 0.15:
            block = r.randbytes(r.randint(0, 40))
        else:
            if r.random() < 0.1:
                enc.header_table_size = r.choice([0, 100, 1000, 4096, 8192])
            hdrs = random_headers(r, r.randint(0, 12))
            block = enc.encode(hdrs, huffman=r.random() < 0.6)
            if kind < 0.75:
                block = _mutate(r, block)
        got = check(ref, new, block)
        if isinstance(got, list):
            ok += 1
        else:
            errors += 1
            if r.random() < 0.5:  # go on with the tables the error left, or start over
                enc = Encoder()
                ref, new = pair()
    assert ok > 5000 and errors > 5000
