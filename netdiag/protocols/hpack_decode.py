"""HPACK (RFC 7541) header block decoder, compiled with mypyc: ``hpack.Decoder`` as
:mod:`netdiag.protocols.http2` uses it, faster.

:class:`HpackDecoder` behaves like ``hpack.Decoder`` (hpack 4) called with
``raw=True``: the same header list (``(name, value)`` tuples of ``bytes``, in block
order; plain tuples where hpack returns its ``HeaderTuple`` subclasses, which
:mod:`~netdiag.protocols.http2` does not look at), the same dynamic table (entries,
size, eviction, size updates, ``header_table_size``, ``max_allowed_table_size``),
the same ``max_header_list_size`` check, and the same exceptions -- the classes of
``hpack.exceptions``, with hpack's messages -- raised at the same point of the same
inputs, after the same changes to the table. ``tests/protocols/test_hpack_decode.py``
checks all of that against hpack (differential and fuzzed).

Design. The block is read in place as one ``bytes`` object with a position: an
integer is read inline when it fits its prefix and by :func:`_read_int` otherwise;
no field is sliced off the block except its literal strings. The static table is a
tuple; the dynamic table is a list, oldest entry first, with the index of its oldest
live entry and a running size (eviction moves that index; the dead head is dropped
now and then). Huffman strings are decoded by a finite state machine built at import
(about 10 ms compiled, 20-40 ms as pure Python) from the RFC 7541 Appendix B code table (hpack's
``huffman_constants``): 256 states (the internal nodes of the code tree) x 256 input
bytes, each transition giving the next state and the bytes it decodes (none, one or
two, a shared ``bytes`` object) or a sentinel when it meets EOS (``Invalid Huffman
string``); a string may end in a state whose bits since the last symbol are fewer
than 8 ones (else ``Incomplete Huffman string``). That is hpack's own nibble machine,
a byte at a time (the tests check the two machines are the same). Short Huffman
strings are memoised (:data:`MEMO_MAX_ENTRIES` strings of at most
:data:`MEMO_MAX_LEN` bytes, the least recently used dropped first: bounded whatever
the input): values repeated outside the dynamic table (by other connections, or
never indexed) are decoded once.

hpack's error messages include the rest of the block: as a memoryview for an indexed
field or a size update (its ``repr``, with an address) and as ``bytes`` in a literal
field, from the integer that could not be read. They are rebuilt here the same way,
only when an error is raised.
"""

from __future__ import annotations

from typing import Final, final

from hpack.exceptions import (
    HPACKDecodingError,
    InvalidTableIndex,
    InvalidTableSizeError,
    OversizedHeaderListError,
)
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

__all__ = [
    "DEFAULT_HEADER_TABLE_SIZE",
    "DEFAULT_MAX_HEADER_LIST_SIZE",
    "STATIC_TABLE",
    "HpackDecoder",
    "decode_huffman",
]

DEFAULT_HEADER_TABLE_SIZE = 4096
"""Initial dynamic table size (RFC 7540 SETTINGS_HEADER_TABLE_SIZE default), hpack's."""
DEFAULT_MAX_HEADER_LIST_SIZE = 1 << 16
"""hpack's default ``max_header_list_size``."""
VARINT_MAX_LENGTH = 5
"""hpack reads at most this many bytes after an integer's prefix byte."""
ENTRY_OVERHEAD: Final = 32
"""RFC 7541 4.1: an entry's size is its name and value lengths plus 32."""
MEMO_MAX_ENTRIES: Final = 4096
"""Huffman strings kept decoded (the least recently used goes first)."""
MEMO_MAX_LEN: Final = 96
"""Longest Huffman string (encoded bytes) memoised: the memo holds at most
MEMO_MAX_ENTRIES * (MEMO_MAX_LEN + 8 * MEMO_MAX_LEN / 5) bytes of strings."""
_COMPACT_AT = 32
"""Dead entries at the head of the dynamic table's list before it is compacted (when
they are also half of it)."""

STATIC_TABLE: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
)
"""RFC 7541 Appendix A: index 1 is ``STATIC_TABLE[0]``."""

# -- Huffman ---------------------------------------------------------------------------

_EOS = 256
_EOS_MET = b"<EOS>"
"""The output of a transition that meets the EOS code (hpack: ``Invalid Huffman
string``): a sentinel, compared by identity."""


def _build_huffman() -> tuple[bytes, list[bytes], bytes]:
    """The byte-at-a-time decoding machine, from the code table: for the transition
    ``state << 8 | byte``, the next state and the bytes decoded (or :data:`_EOS_MET`);
    for each state, whether a string may end there (1) or not (0)."""
    # The code tree: internal node i has children zero[i] and one[i]; a child >= 0 is an
    # internal node, a child < 0 the leaf of symbol ~child.
    zero: list[int] = [0]
    one: list[int] = [0]
    ones: list[int] = [0]  # bits from the root to the node when they are all ones, else -1
    for sym in range(_EOS + 1):
        code = REQUEST_CODES[sym]
        node = 0
        for k in range(REQUEST_CODES_LENGTH[sym] - 1, -1, -1):
            bit = (code >> k) & 1
            children = one if bit else zero
            if k == 0:
                children[node] = ~sym
                break
            child = children[node]
            if child == 0:
                child = len(zero)
                zero.append(0)
                one.append(0)
                ones.append(ones[node] + 1 if bit and ones[node] >= 0 else -1)
                children[node] = child
            node = child
    if len(zero) != 256 or 0 in zero[1:] or 0 in one[1:]:
        raise AssertionError("the Huffman code is not a complete tree of 256 internal nodes")
    # (state << 4 | nibble) -> next state and the symbol met (-1: none; a nibble holds at
    # most one, the shortest code being 5 bits long)
    nib_next: list[int] = []
    nib_sym: list[int] = []
    for state in range(256):
        for nibble in range(16):
            node = state
            sym = -1
            for k in (3, 2, 1, 0):
                child = one[node] if (nibble >> k) & 1 else zero[node]
                if child >= 0:
                    node = child
                    continue
                sym = ~child
                node = 0
                if sym == _EOS:
                    break
            nib_next.append(node)
            nib_sym.append(sym)
    single = [bytes([i]) for i in range(256)]
    pairs: dict[int, bytes] = {}
    nxt = bytearray(256 * 256)
    out: list[bytes] = [b""] * (256 * 256)
    for state in range(256):
        for hi in range(16):
            first = state << 4 | hi
            s1 = nib_sym[first]
            base = state << 8 | hi << 4
            if s1 == _EOS:
                for lo in range(16):
                    out[base | lo] = _EOS_MET
                continue
            mid = nib_next[first] << 4
            for lo in range(16):
                s2 = nib_sym[mid | lo]
                k = base | lo
                if s2 == _EOS:
                    out[k] = _EOS_MET
                    continue
                nxt[k] = nib_next[mid | lo]
                if s1 < 0:
                    if s2 >= 0:
                        out[k] = single[s2]
                elif s2 < 0:
                    out[k] = single[s1]
                else:
                    two = pairs.get(s1 << 8 | s2)
                    if two is None:
                        two = pairs[s1 << 8 | s2] = single[s1] + single[s2]
                    out[k] = two
    # A string may end with fewer than 8 bits of padding, all ones (RFC 7541 5.2).
    accept = bytes(1 if 0 <= n <= 7 else 0 for n in ones)
    return bytes(nxt), out, accept


_H_NEXT, _H_OUT, _H_ACCEPT = _build_huffman()

_memo: Final[dict[bytes, bytes]] = {}
"""Huffman strings decoded lately (encoded -> decoded), least recently used first."""


def _huffman(encoded: bytes) -> bytes:
    """``encoded`` Huffman-decoded, as hpack's ``decode_huffman`` (non-empty input)."""
    nxt = _H_NEXT
    outs = _H_OUT
    eos = _EOS_MET
    parts: list[bytes] = []
    state = 0
    for b in encoded:
        k = state << 8 | b
        got = outs[k]
        if got is eos:
            raise HPACKDecodingError("Invalid Huffman string")
        parts.append(got)
        state = nxt[k]
    if not _H_ACCEPT[state]:
        raise HPACKDecodingError("Incomplete Huffman string")
    return b"".join(parts)


def _huffman_string(data: bytes, start: int, end: int) -> bytes:
    """``data[start:end]`` (not empty) Huffman-decoded, through the memo of short strings."""
    encoded = data[start:end]
    if end - start > MEMO_MAX_LEN:
        return _huffman(encoded)
    memo = _memo
    got = memo.pop(encoded, None)  # a hit goes back in last: least recently used first
    if got is None:
        got = _huffman(encoded)
        if len(memo) >= MEMO_MAX_ENTRIES:
            del memo[next(iter(memo))]
    memo[encoded] = got
    return got


def decode_huffman(data: bytes) -> bytes:
    """A whole Huffman-coded string decoded (hpack's ``decode_huffman``: ``b""`` stays
    ``b""``; EOS in the string, padding over 7 bits or not all ones raise
    ``HPACKDecodingError``)."""
    if not data:
        return b""
    return _huffman(data)


# -- integers and errors -----------------------------------------------------------------

def _rest(data: bytes, pos: int, view: bool) -> str:
    """The ``repr`` hpack shows of the block from ``pos``: a memoryview or bytes."""
    if view:
        return repr(memoryview(data)[pos:])
    return repr(data[pos:])


def _read_int(data: bytes, pos: int, mask: int, view: bool) -> tuple[int, int]:
    """(value, end) of the integer at ``pos`` with a ``mask``-bit prefix (hpack's
    ``decode_integer``, its limits and messages included)."""
    n = len(data)
    if pos >= n:
        raise HPACKDecodingError(
            f"Unable to decode HPACK integer representation from {_rest(data, pos, view)}")
    value = data[pos] & mask
    if value < mask:
        return value, pos + 1
    i = pos + 1
    shift = 0
    while True:
        if i >= n:
            raise HPACKDecodingError(
                f"Unable to decode HPACK integer representation from {_rest(data, pos, view)}")
        b = data[i]
        i += 1
        if b < 128:
            value += b << shift
            return value, i
        value += (b - 128) << shift
        shift += 7
        if i - pos > VARINT_MAX_LENGTH:
            raise HPACKDecodingError(
                f"Variable integer representation is too long: {_rest(data, pos, view)}")


def _truncated() -> HPACKDecodingError:
    return HPACKDecodingError("Truncated header block")


# -- the decoder ---------------------------------------------------------------------------

@final
class HpackDecoder:
    """One direction's HPACK decoding context (see the module docstring).

    ``max_header_list_size``: largest decoded header list (the sum of the entry sizes
    of its fields) :meth:`decode` returns; ``max_allowed_table_size``: largest dynamic
    table size the peer may set (SETTINGS_HEADER_TABLE_SIZE), checked at each size
    update and at the end of each block.
    """

    __slots__ = ("_entries", "_head", "_maxsize", "_size", "max_allowed_table_size",
                 "max_header_list_size")

    def __init__(self, max_header_list_size: int = DEFAULT_MAX_HEADER_LIST_SIZE) -> None:
        self.max_header_list_size: int = max_header_list_size
        self.max_allowed_table_size: int = DEFAULT_HEADER_TABLE_SIZE
        self._maxsize: int = DEFAULT_HEADER_TABLE_SIZE
        self._size: int = 0
        self._entries: list[tuple[bytes, bytes]] = []
        """The dynamic table, oldest entry first; ``_entries[_head:]`` are live."""
        self._head: int = 0

    # -- the dynamic table -------------------------------------------------------------

    @property
    def header_table_size(self) -> int:
        """The dynamic table's maximum size (hpack's ``header_table_size``); setting it
        evicts what no longer fits (0 or less empties the table)."""
        return self._maxsize

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        old = self._maxsize
        self._maxsize = value
        if value <= 0:
            self._clear()
        elif old > value:
            self._shrink()

    @property
    def table_size(self) -> int:
        """Size of the dynamic table's entries (RFC 7541 4.1)."""
        return self._size

    def dynamic_entries(self) -> list[tuple[bytes, bytes]]:
        """The dynamic table, newest entry (index 62) first, as hpack's
        ``header_table.dynamic_entries``."""
        live = self._entries[self._head:]
        live.reverse()
        return live

    def _clear(self) -> None:
        self._entries = []
        self._head = 0
        self._size = 0

    def _shrink(self) -> None:
        entries = self._entries
        head = self._head
        size = self._size
        maxsize = self._maxsize
        while size > maxsize:
            name, value = entries[head]
            size -= ENTRY_OVERHEAD + len(name) + len(value)
            head += 1
        self._size = size
        if head > _COMPACT_AT and head * 2 > len(entries):
            del entries[:head]
            head = 0
        self._head = head

    def _add(self, header: tuple[bytes, bytes], size: int) -> None:
        """hpack's ``HeaderTable.add``: an entry larger than the table empties it."""
        if size > self._maxsize:
            self._clear()
            return
        self._entries.append(header)
        self._size += size
        if self._size > self._maxsize:
            self._shrink()

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        """Table entry ``index`` (1-based: static, then dynamic newest first)."""
        if 1 <= index <= 61:
            return STATIC_TABLE[index - 1]
        if index > 61:
            pos = len(self._entries) - (index - 61)
            if pos >= self._head:
                return self._entries[pos]
        raise InvalidTableIndex(f"Invalid table index {index}")

    # -- decoding ------------------------------------------------------------------------

    def decode(self, data: bytes, raw: bool = True) -> list[tuple[bytes, bytes]]:
        """The header list of one complete header block (``hpack.Decoder.decode(data,
        raw=True)``). Raises hpack's ``HPACKDecodingError`` or its subclasses for a bad
        block; the table then keeps the changes made before the error, as hpack's does.
        ``raw=False`` (text output) is not supported."""
        if not raw:
            raise ValueError("HpackDecoder decodes to bytes only (raw=True)")
        headers: list[tuple[bytes, bytes]] = []
        n = len(data)
        pos = 0
        inflated = 0
        while pos < n:
            first = data[pos]
            header: tuple[bytes, bytes]
            if first & 0x80:  # indexed field
                index = first & 0x7F
                if index == 0x7F:
                    index, pos = _read_int(data, pos, 0x7F, True)
                else:
                    pos += 1
                header = self._entry(index)
                name, value = header
            elif first & 0x40 or not first & 0x20:  # literal field
                indexing = first & 0x40 != 0
                mask = 0x3F if indexing else 0x0F
                index = first & mask
                if index:
                    if index == mask:
                        index, pos = _read_int(data, pos, mask, False)
                    else:
                        pos += 1
                    name = self._entry(index)[0]
                else:
                    pos += 1
                    if pos >= n:
                        raise HPACKDecodingError(
                            "Unable to decode HPACK integer representation from b''")
                    b = data[pos]
                    length = b & 0x7F
                    if length == 0x7F:
                        length, start = _read_int(data, pos, 0x7F, False)
                    else:
                        start = pos + 1
                    pos = start + length
                    if pos > n:
                        raise _truncated()
                    if b & 0x80 and length:
                        name = _huffman_string(data, start, pos)
                    else:
                        name = data[start:pos]
                if pos >= n:
                    raise HPACKDecodingError(
                        "Unable to decode HPACK integer representation from b''")
                b = data[pos]
                length = b & 0x7F
                if length == 0x7F:
                    length, start = _read_int(data, pos, 0x7F, False)
                else:
                    start = pos + 1
                pos = start + length
                if pos > n:
                    raise _truncated()
                value = (_huffman_string(data, start, pos) if b & 0x80 and length
                         else data[start:pos])
                header = (name, value)
                if indexing:
                    self._add(header, ENTRY_OVERHEAD + len(name) + len(value))
            else:  # dynamic table size update
                if headers:
                    raise HPACKDecodingError("Table size update not at the start of the block")
                size = first & 0x1F
                if size == 0x1F:
                    size, pos = _read_int(data, pos, 0x1F, True)
                else:
                    pos += 1
                if size > self.max_allowed_table_size:
                    raise InvalidTableSizeError("Encoder exceeded max allowable table size")
                self.header_table_size = size
                continue
            headers.append(header)
            inflated += ENTRY_OVERHEAD + len(name) + len(value)
            if inflated > self.max_header_list_size:
                raise OversizedHeaderListError(
                    f"A header list larger than {self.max_header_list_size} has been received")
        if self._maxsize > self.max_allowed_table_size:
            raise InvalidTableSizeError("Encoder did not shrink table size to within the max")
        return headers
