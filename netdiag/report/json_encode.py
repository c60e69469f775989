"""Compact JSON text of one value, through orjson where it is installed.

The long record lists (JSON Lines, the lines of ``--format json``, CSV's JSON cells) are
encoded one value at a time. orjson (Rust) encodes them six to seven times faster than
the standard library's C encoder, and gives the same JSON value. Its text differs from
``json.dumps(v, separators=(",", ":"))`` in two ways only:

* numbers: a float below 1e-4 or from 1e16 up is written as orjson writes it
  (``1e-7``, ``0.00003``, ``1e16``) where Python writes ``1e-07``, ``3e-05``,
  ``1e+16``; a NaN or infinity, which no record holds, is written ``null``;
* nothing else: where orjson cannot give the standard library's text, the value goes
  through the standard library instead. That is a value orjson refuses (an integer
  beyond 64 bits, a key that is not a string, a lone surrogate, a type neither
  knows), and, with ``ensure_ascii``, text with a character outside printable ASCII
  other than the control characters both escape (orjson writes UTF-8 and a raw DEL;
  the standard library ``\\uXXXX``), so capture-borne text stays escaped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; kept working without it
    orjson = None  # type: ignore[assignment]

Encode = Callable[[Any], str]


def standard_encoder(*, ensure_ascii: bool = True, check_circular: bool = True) -> Encode:
    """``json.dumps(v, separators=(",", ":"), ensure_ascii=...)`` without making an
    encoder per call."""
    return json.JSONEncoder(separators=(",", ":"), ensure_ascii=ensure_ascii,
                            check_circular=check_circular).encode


def compact_encoder(*, ensure_ascii: bool = True, check_circular: bool = True) -> Encode:
    """A function giving the compact JSON text of a value: orjson's, or where that is not
    the standard library's, the standard library's (see the module's docstring)."""
    std = standard_encoder(ensure_ascii=ensure_ascii, check_circular=check_circular)
    if orjson is None:
        return std
    dumps, failed = orjson.dumps, orjson.JSONEncodeError

    if ensure_ascii:
        def encode_ascii(value: Any) -> str:
            try:
                b = dumps(value)
            except failed:
                return std(value)
            if b.isascii() and b"\x7f" not in b:
                return b.decode("ascii")
            return std(value)
        return encode_ascii

    def encode(value: Any) -> str:
        try:
            return dumps(value).decode()
        except failed:
            return std(value)
    return encode


def fast() -> bool:
    """Whether :func:`compact_encoder` runs orjson."""
    return orjson is not None
