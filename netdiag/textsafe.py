"""Text from a capture, made safe to show on a terminal.

A capture is untrusted input: an SNI, a DNS name, an HTTP path or header, a Redis key
can hold anything a peer chose to send. Printed as it is, such a string could restyle
or hide parts of a report (rich markup such as ``[red]`` or ``[link=...]``), drive the
terminal (ESC/CSI/OSC sequences, C1 controls), or reorder what is displayed
(bidirectional overrides). Every terminal output path passes capture-borne text
through this module:

* :func:`safe_text` shows every control, format, bidirectional, zero-width and
  line-separator character as a visible escape (``\\u001b``, ``\\n``, ``\\u202e``) and
  cuts the text to a length, for use in a :class:`rich.text.Text` (which never reads
  markup);
* :func:`safe_markup` is the same text with rich markup escaped, for the places that
  build a markup string (tree labels, titles);
* :func:`safe_cell` is a ready :class:`~rich.text.Text`, for table cells and columns
  (a plain ``str`` cell is read as markup by rich);
* :func:`print_warning` prints one ``warning:`` line on standard error, its message
  made safe the same way.

What is replaced: C0 controls (U+0000..U+001F, tab and line ends included) and DEL;
C1 controls (U+0080..U+009F, among them the 8-bit CSI U+009B); every Unicode ``Cf``
(format: the bidirectional embeddings and overrides U+202A..U+202E, the isolates
U+2066..U+2069, the marks U+200E/U+200F/U+061C, zero-width characters, the BOM, the
tag characters U+E0000..U+E007F), ``Cs`` (lone surrogates, which would not even
encode) and ``Zl``/``Zp`` (line and paragraph separators).
Tab, line feed and carriage return are shown as ``\\t``, ``\\n``, ``\\r``, every other
one as ``\\u`` and its code in (at least four) hex digits, the escapes of the HTML
report (:func:`netdiag.report.svg.esc`), so that a hostile name reads alike in both.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

DEFAULT_LIMIT = 256
"""Characters of capture-borne text shown by default (longer text ends with ``…``)."""
SENTENCE_LIMIT = 4096
"""Characters shown of a sentence that quotes capture-borne text (a finding's title or
detail, a path difference)."""
ELLIPSIS = "…"
"""Marks where text was cut."""

_ASCII_UNSAFE = re.compile("[\x00-\x1f\x7f]")
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape_char(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    return f"\\u{ord(ch):04x}"


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


def safe_text(value: Any, limit: int | None = DEFAULT_LIMIT) -> str:
    """``value`` as text a terminal shows and never obeys: unsafe characters become
    visible escapes (see the module docstring); at most ``limit`` characters of the
    original are kept (None: no limit), a cut marked with ``…``. None is ``""``."""
    s = "" if value is None else value if isinstance(value, str) else str(value)
    cut = limit is not None and len(s) > limit
    if cut:
        s = s[:max((limit or 0) - 1, 0)]
    if s.isascii():
        if _ASCII_UNSAFE.search(s) is not None:
            s = _ASCII_UNSAFE.sub(lambda m: _escape_char(m.group()), s)
    elif not s.isprintable():  # every unsafe character is unprintable
        s = "".join(_escape_char(ch) if _unsafe(ch) else ch for ch in s)
    return s + ELLIPSIS if cut else s


def safe_markup(value: Any, limit: int | None = DEFAULT_LIMIT) -> str:
    """:func:`safe_text` with rich markup escaped: to put inside a markup string."""
    from rich.markup import escape

    return escape(safe_text(value, limit))


def print_warning(message: str, limit: int | None = SENTENCE_LIMIT) -> None:
    """``warning: <message>`` on standard error (the shared stderr console), on one line
    however wide the terminal: the message through :func:`safe_text`, never markup."""
    from rich.text import Text

    from netdiag.console import stderr_console

    stderr_console().print(Text.assemble(("warning:", "yellow"), " ",
                                         safe_text(message, limit)), soft_wrap=True)


def safe_cell(value: Any, limit: int | None = DEFAULT_LIMIT, style: str = "") -> Any:
    """:func:`safe_text` as a :class:`rich.text.Text` (``style`` applied), for table cells,
    column headers and tree labels, which rich would otherwise read as markup."""
    from rich.text import Text

    return Text(safe_text(value, limit), style=style)
