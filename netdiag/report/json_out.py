"""A JSON document written fast and still readable: the outline indented, records one a line.

``json.dump(doc, indent=2)`` runs Python's pure-Python encoder (CPython 3.11's C encoder
only serves compact, one-shot output) and took longer than the analysis on big
captures. Here the top levels of the document are indented; every element of a list of
objects, above all of the long record lists (connections, DNS transactions), is encoded
compact in one call (:func:`~netdiag.report.json_encode.compact_encoder`: orjson) and
written on a line of its own; every other deeper value is written on one line by the
standard library's C encoder. The result is the same JSON value as ``json.dump`` gives;
only the whitespace (and the spelling of numbers below 1e-4 or from 1e16 up) differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any, Generic, TypeVar

from netdiag.report.json_encode import Encode, compact_encoder

OUTLINE_DEPTH = 2
"""Object levels laid out one key a line; values below are written compact."""

T = TypeVar("T")


class Records(Generic[T]):
    """A list of JSON objects made from ``items`` only as it is written, one at a time:
    each item is rendered (``render``), then passed with its dict through every one of
    ``steps`` in order. :func:`write_json` writes it as the list of those dicts, so a
    document's long record lists need not all be in memory as dicts at once."""

    def __init__(self, items: Sequence[T], render: Callable[[T], dict[str, Any]]) -> None:
        self.items = items
        self.render = render
        self.steps: list[Callable[[dict[str, Any], T], None]] = []

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        render, steps = self.render, self.steps
        for item in self.items:
            d = render(item)
            for step in steps:
                step(d, item)
            yield d


class Encoded:
    """A JSON list whose elements are already encoded, one compact JSON text each (by
    the encoder :func:`write_json` uses for list elements): written as they are, one a
    line."""

    __slots__ = ("count", "texts")

    def __init__(self, texts: Iterable[str], count: int) -> None:
        self.texts = texts
        """The elements' JSON texts, in order (an iterator is read once)."""
        self.count = count
        """How many there are."""

    def __len__(self) -> int:
        return self.count


def write_json(doc: Any, out: IO[str], *, ensure_ascii: bool = True) -> None:
    """Write ``doc`` (plain JSON types) to ``out``, followed by a newline."""
    encode = json.JSONEncoder(ensure_ascii=ensure_ascii, allow_nan=True,
                              check_circular=False).encode
    line = compact_encoder(ensure_ascii=ensure_ascii, check_circular=False)
    _write(doc, out, 0, encode, line)
    out.write("\n")


def _write(value: Any, out: IO[str], depth: int, encode: Encode, line: Encode) -> None:
    pad = "  " * (depth + 1)
    if isinstance(value, dict) and value and depth < OUTLINE_DEPTH:
        out.write("{")
        sep = "\n"
        for key, item in value.items():
            out.write(f"{sep}{pad}{encode(str(key))}: ")
            _write(item, out, depth + 1, encode, line)
            sep = ",\n"
        out.write(f"\n{'  ' * depth}}}")
    elif ((isinstance(value, list) and value
           and any(isinstance(v, dict | list) for v in value))
          or (isinstance(value, Records | Encoded) and len(value))):
        out.write("[")
        sep = "\n"
        for text in value.texts if isinstance(value, Encoded) else map(line, value):
            out.write(sep + pad)
            out.write(text)
            sep = ",\n"
        out.write(f"\n{'  ' * depth}]")
    elif isinstance(value, Records | Encoded):
        out.write("[]")
    else:
        out.write(encode(value))
