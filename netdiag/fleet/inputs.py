"""What ``netdiag report`` is given, as the list of capture files it names.

* a file (local path or URL): itself, whatever it holds (the reader says if it is
  not a capture);
* a folder (local or URL): every file under it, recursively, in name order, whose first
  bytes are a pcap or pcapng magic (gzip-compressed too); other files are skipped with
  a note, hidden ones (``.name``, local folders) silently;
* a glob (``*``, ``?``, ``[``; quoted on the shell so that netdiag expands it, ``**``
  crosses folders): the matching files, tested as a folder's are, and the captures
  under matching folders;
* a URL (``scheme://...``): the same, through fsspec (``netdiag.capture.sources``).

Local names stay plain paths; URL names keep their scheme.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from netdiag.capture.sources import HEAD_BYTES, is_url, looks_like_capture, url_filesystem
from netdiag.errors import InputError, NoCaptureError

_GLOB_CHARS = frozenset("*?[")
NOTE_NAMES = 5
"""Names of skipped files a note lists."""


def has_glob(name: str) -> bool:
    """Does ``name`` hold glob characters?"""
    return any(ch in _GLOB_CHARS for ch in name)


@dataclass
class Inputs:
    """The capture files named by the arguments, in order, and what was left out."""

    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """One line per file skipped (not a capture) or per argument that needed saying."""
    expanded: bool = False
    """Some argument was a folder or a glob (not only files named one by one)."""
    explicit: set[str] = field(default_factory=set)
    """The files named one by one (a damaged header there is an input error, as it is
    for a single capture; in a folder it is a damaged capture of the fleet)."""


def expand_inputs(args: Sequence[str]) -> Inputs:
    """The capture files of ``args`` (module docstring).

    Raises :class:`NoCaptureError` for a folder without captures or a glob matching
    none, :class:`~netdiag.errors.UrlError` for a URL that cannot be understood.
    """
    out = Inputs()
    seen: set[str] = set()

    def add_found(names: Iterable[str], where: str, head: Any) -> None:
        found = skipped = 0
        others: list[str] = []
        for name in names:
            if name in seen:
                continue
            try:
                ok = looks_like_capture(head(name))
            except (OSError, InputError) as e:
                out.notes.append(f"skipped {name}: cannot read it ({e})")
                skipped += 1
                continue
            if not ok:
                others.append(name)
                skipped += 1
                continue
            seen.add(name)
            out.files.append(name)
            found += 1
        if others:
            shown = ", ".join(others[:NOTE_NAMES])
            more = f" and {len(others) - NOTE_NAMES} more" if len(others) > NOTE_NAMES else ""
            what = ("1 file that is not a pcap or pcapng capture" if len(others) == 1 else
                    f"{len(others)} files that are not pcap or pcapng captures")
            out.notes.append(f"{where}: skipped {what}: {shown}{more}")
        if not found:
            extra = f" ({skipped} other file{'s' if skipped != 1 else ''})" if skipped else ""
            raise NoCaptureError(f"{where}: no pcap or pcapng capture{extra}")

    for arg in args:
        if is_url(arg):
            _expand_url(arg, out, seen, add_found)
            continue
        if has_glob(arg) and not os.path.exists(arg):
            out.expanded = True
            matches = sorted(glob.glob(arg, recursive=True))
            if not matches:
                raise NoCaptureError(f"no file matches {arg}")
            add_found(_walk_local(matches), f"files matching {arg}", _local_head)
        elif os.path.isdir(arg):
            out.expanded = True
            add_found(_walk_local([arg]), f"folder {arg}", _local_head)
        else:
            seen.add(arg)
            out.explicit.add(arg)
            out.files.append(arg)
    return out


def _walk_local(roots: list[str]) -> list[str]:
    """The files of ``roots`` (files as they are, folders recursively), in name order."""
    files: list[str] = []
    for root in roots:
        if not os.path.isdir(root):
            files.append(root)
            continue
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files.extend(os.path.join(folder, n) for n in sorted(names)
                         if not n.startswith("."))
    return files


def _local_head(name: str) -> bytes:
    with open(name, "rb") as f:
        return f.read(HEAD_BYTES)


def _expand_url(arg: str, out: Inputs, seen: set[str], add_found: Any) -> None:
    fs, path = url_filesystem(arg)

    def head(name: str) -> bytes:
        with fs.open(fs._strip_protocol(name), "rb") as f:
            data: bytes = f.read(HEAD_BYTES)
        return data

    try:
        if has_glob(path):
            out.expanded = True
            matches = sorted(fs.glob(path))
            if not matches:
                raise NoCaptureError(f"no file matches {arg}")
            names: list[str] = []
            for m in matches:
                names.extend(sorted(fs.find(m)) if fs.isdir(m) else [m])
            add_found([fs.unstrip_protocol(n) for n in names], f"files matching {arg}", head)
        elif fs.isdir(path):
            out.expanded = True
            names = sorted(fs.find(path))
            add_found([fs.unstrip_protocol(n) for n in names], f"folder {arg}", head)
        else:
            seen.add(arg)
            out.explicit.add(arg)
            out.files.append(arg)
    except InputError:
        raise
    except Exception as e:  # the file system's own errors (network, credentials)
        raise InputError(f"cannot list {arg}: {type(e).__name__}: {e}") from None
