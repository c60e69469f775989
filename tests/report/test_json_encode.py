"""The compact JSON encoder of the record lists: orjson's text where it is the standard
library's JSON value, the standard library's text wherever orjson would differ in more
than a number's spelling (non-ASCII, DEL, values orjson refuses)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netdiag.report import json_encode
from netdiag.report.json_encode import compact_encoder, standard_encoder

pytest.importorskip("orjson")

ASCII = compact_encoder()
UTF8 = compact_encoder(ensure_ascii=False)
STD_ASCII = standard_encoder()
STD_UTF8 = standard_encoder(ensure_ascii=False)


class Text(str):
    """A str subclass, as a decoder could hand one over."""


# numbers spelled alike by both encoders: integers of 64 bits, floats of 1e-4 to 1e16
_ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)
_floats = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda x: x == 0 or 1e-4 <= abs(x) < 1e16)
_special = st.sampled_from(["\x7f", "\x1b", "\x00", "\u00e9", "\u2028", "\ud800", '"', "\\"])
_text = (st.text(st.characters(codec="utf-8"), max_size=20) | st.text(max_size=20)
         | st.lists(_special | st.text(max_size=3), max_size=4).map("".join))
_leaves = st.none() | st.booleans() | _ints | _floats | _text
_values = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=5)
                       | st.dictionaries(_text, inner, max_size=5), max_leaves=30)


def test_runs_orjson() -> None:
    assert json_encode.fast()


@settings(max_examples=400, deadline=None)
@given(_values)
def test_text_is_the_standard_librarys(value: Any) -> None:
    assert ASCII(value) == STD_ASCII(value)
    assert UTF8(value) == STD_UTF8(value)


@settings(max_examples=200, deadline=None)
@given(_values | st.floats(allow_nan=False, allow_infinity=False))
def test_ascii_text_is_printable_ascii_and_the_same_value(value: Any) -> None:
    text = ASCII(value)
    assert all(" " <= ch <= "~" for ch in text)
    assert json.loads(text) == value


@pytest.mark.parametrize("value", [
    {"path": "/\x1b[31mred\x1b[0m", "host": "caf\u00e9", "sep": "\u2028", "del": "\x7f"},
    ["\ud800 lone surrogate", "\udcff"],
    {"big": 2**64, "negative": -(2**63) - 1, "bigger": 10**40},
    {7: "int key", None: "none key", 2.5: "float key", True: "bool key"},
    [Text("subclass"), (1, 2, "tuple")],
    {"control": "\x00\x01\t\n\r\x1f"},
    {"del": "a\x7fb"},
    ["\u00e9"],
])
def test_what_orjson_would_write_otherwise_is_the_standard_librarys(value: Any) -> None:
    assert ASCII(value) == STD_ASCII(value)
    assert UTF8(value) == STD_UTF8(value)
    assert all(" " <= ch <= "~" for ch in ASCII(value))


def test_numbers_keep_their_value() -> None:
    values = [1e-7, -3e-5, 0.00006281058616417798, 1e16, 1.5e300, -0.0, 5e-324]
    for encode in (ASCII, UTF8):
        back = json.loads(encode(values))
        assert back == values
        assert math.copysign(1, back[5]) == -1  # -0.0 stays negative


def test_what_no_encoder_can_write_still_fails() -> None:
    for encode in (ASCII, UTF8):
        with pytest.raises(TypeError):
            encode({"a": {1, 2}})
        with pytest.raises(TypeError):
            encode([object()])


def test_without_orjson_it_is_the_standard_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_encode, "orjson", None)
    encode = compact_encoder()
    assert not json_encode.fast()
    assert encode({"a": [1, 2.5, "\u00e9"]}) == '{"a":[1,2.5,"\\u00e9"]}'
