"""Running tshark and reading its ``-T json`` output one packet at a time, in order.

tshark's JSON repeats a key when a packet carries several of the same thing (two
``tls`` layers, three ``http2`` frames, a ``tcp.segments`` list before the first of
them). The order of those keys is what says which message a reassembly belongs to,
so the output is parsed keeping every (key, value) pair in order (:class:`Node`).

pyshark's JSON mode asks tshark for ``--no-duplicate-keys``, which merges repeated
keys into one array and loses that order (which HTTP/2 frame came out of which TLS
record, which DNS message a ``tcp.segments`` list reassembled); its PDML mode keeps
the order of layers but flattens the fields inside each. So the engine starts tshark
itself (:class:`TsharkRun`), and uses pyshark's tshark wrapper only to find the
binary (pyshark's ``config.ini`` ``tshark_path`` is honoured) and its version.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from typing import IO, Any

from netdiag.errors import InputError

PROTOCOLS = ("frame ip ipv6 udp tcp tcp.segments dns tls tls.segments http http2 "
             "icmp icmpv6")
"""What ``-J`` keeps of each packet (every other layer shows as ``filtered``)."""


class TsharkMissing(InputError):
    """tshark is not installed (or not where pyshark's configuration says)."""


class Node(list):  # type: ignore[type-arg]
    """A JSON object as its (key, value) pairs, in order, duplicate keys kept."""

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self:
            if k == key:
                return v
        return default

    def all(self, key: str) -> list[Any]:
        """Every value of ``key`` among the direct members, in order."""
        return [v for k, v in self if k == key]

    def has(self, key: str) -> bool:
        return any(k == key for k, _ in self)


def walk(value: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair below ``value``, depth first, in document order."""
    if isinstance(value, Node):
        for k, v in value:
            yield k, v
            yield from walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk(v)


def _scalars(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and not isinstance(value, Node):
        return [v for v in value if isinstance(v, str)]
    return []


def find_all(value: Any, key: str) -> list[str]:
    """Every string value of ``key`` anywhere below ``value``, in order."""
    out: list[str] = []
    for k, v in walk(value):
        if k == key:
            out.extend(_scalars(v))
    return out


def find_first(value: Any, key: str) -> str | None:
    for k, v in walk(value):
        if k == key:
            found = _scalars(v)
            if found:
                return found[0]
    return None


def has_key(value: Any, key: str) -> bool:
    return any(k == key for k, _ in walk(value))


def nodes_with(value: Any, key: str) -> Iterator[Node]:
    """Every object below ``value`` (itself included) that has ``key`` as a direct member."""
    if isinstance(value, Node):
        if value.has(key):
            yield value
        for _, v in value:
            yield from nodes_with(v, key)
    elif isinstance(value, list):
        for v in value:
            yield from nodes_with(v, key)


def segment_frames(value: Any, kind: str) -> list[int]:
    """The frame numbers of a ``tcp.segments`` (``kind`` ``"tcp"``) or ``tls.segments``
    (``"tls"``) list, in order."""
    return [n for n in map(to_int, find_all(value, f"{kind}.segment")) if n is not None]


def dns_messages(layers: Node) -> list[tuple[Node, list[int]]]:
    """Each ``dns`` layer of a packet's ``layers``, with the frames of the
    ``tcp.segments`` list that reassembled it (the one just before it; empty if none)."""
    out: list[tuple[Node, list[int]]] = []
    pending: list[int] = []
    for key, value in layers:
        if not isinstance(value, Node):
            continue
        if key == "tcp.segments":
            pending = segment_frames(value, "tcp")
        elif key == "dns":
            out.append((value, pending))
            pending = []
    return out


def hex_bytes(value: Any) -> bytes:
    """A bytes field (``"16:03:01"``) as bytes; ``b""`` when absent or not hex."""
    if not isinstance(value, str) or not value:
        return b""
    try:
        return bytes.fromhex(value.replace(":", ""))
    except ValueError:
        return b""


def http2_frames(layer: Node) -> tuple[bool, list[Node]]:
    """Whether an ``http2`` layer carries the client preface (``http2.magic``), and its
    frames in order (the ``http2.stream`` objects with an ``http2.type``)."""
    magic = False
    frames: list[Node] = []
    for key, node in layer:
        if key == "http2.magic":
            magic = True
        elif key == "http2.stream" and isinstance(node, Node) \
                and node.get("http2.type") is not None:
            frames.append(node)
    return magic, frames


def to_int(value: Any) -> int | None:
    """``"12"``, ``"0x0c"`` -> 12; anything else -> None."""
    if not isinstance(value, str):
        return None
    try:
        return int(value, 0)
    except ValueError:
        try:
            return int(value, 10)  # "0012"
        except ValueError:
            return None


def epoch_ns(text: str) -> int:
    """``frame.time_epoch`` (``"1795964430.931777562"``) as integer nanoseconds, exactly."""
    whole, _, frac = text.strip().partition(".")
    sign = -1 if whole.startswith("-") else 1
    ns = abs(int(whole or "0")) * 1_000_000_000 + int((frac + "000000000")[:9])
    return sign * ns


# ----------------------------------------------------------------------------- binary


def tshark_path(explicit: str | None = None) -> str | None:
    """The tshark binary: ``explicit``, else pyshark's choice (its ``config.ini``, then
    ``$PATH``), else ``$PATH``; None when there is none."""
    if explicit:
        return explicit if os.path.exists(explicit) else shutil.which(explicit)
    try:
        from pyshark.tshark.tshark import TSharkNotFoundException, get_process_path
    except ImportError:
        return shutil.which("tshark")
    try:
        path: str = get_process_path()
        return path
    except TSharkNotFoundException:
        return None


def tshark_version(path: str) -> str:
    """``"4.0.17"`` (the first line of ``tshark -v``, reduced to its version)."""
    try:
        from pyshark.tshark.tshark import get_tshark_version

        return str(get_tshark_version(path))
    except Exception:
        out = subprocess.run([path, "-v"], capture_output=True, text=True, check=False,
                             timeout=30).stdout
        first = out.splitlines()[0] if out else ""
        words = [w for w in first.split() if w[:1].isdigit()]
        return words[0] if words else first


def require_tshark(explicit: str | None = None) -> str:
    path = tshark_path(explicit)
    if path is None:
        raise TsharkMissing("tshark is not installed (Debian: apt-get install tshark; or "
                            "set tshark_path in pyshark's config.ini)")
    return path


# ----------------------------------------------------------------------------- run


class TsharkRun:
    """One ``tshark -T json`` run over one file; iterate it for each packet's ``layers``.

    After the iteration: ``returncode``, ``stderr`` (text) and ``command``. tshark exits
    2 on a capture cut short after printing every complete packet: that is not an error
    here (``truncated`` says so); any other failure raises :class:`InputError`.
    """

    def __init__(self, exe: str, path: str, *, prefs: dict[str, str] | None = None,
                 decode_as: Sequence[str] = (), extra_args: Sequence[str] = (),
                 protocols: str = PROTOCOLS) -> None:
        self.path = path
        cmd = [exe, "-n", "-2"]
        for name, value in (prefs or {}).items():
            cmd += ["-o", f"{name}:{value}"]
        for rule in decode_as:
            cmd += ["-d", rule]
        cmd += list(extra_args)
        cmd += ["-r", path, "-T", "json", "-J", protocols]
        self.command = cmd
        self.returncode: int | None = None
        self.stderr = ""
        self.packets = 0

    @property
    def truncated(self) -> bool:
        low = self.stderr.lower()
        return self.returncode == 2 and ("cut short" in low or "truncated" in low)

    def __iter__(self) -> Iterator[Node]:
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL)
            assert proc.stdout is not None
            try:
                yield from self._packets(proc.stdout)
                proc.stdout.close()
                self.returncode = proc.wait()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                err.seek(0)
                self.stderr = err.read().decode("utf-8", "replace").strip()
        if self.returncode not in (0, 2) or (self.returncode == 2 and not self.packets
                                             and not self.truncated):
            first = self.stderr.splitlines()[0] if self.stderr else "no output"
            raise InputError(f"tshark could not read {self.path}: {first} "
                             f"(exit status {self.returncode})")

    def _packets(self, out: IO[bytes]) -> Iterator[Node]:
        buf: list[bytes] = []
        inside = False
        for line in out:
            if not inside:
                if line.rstrip(b"\r\n") == b"  {":
                    inside = True
                    buf = [line]
                continue
            buf.append(line)
            stripped = line.rstrip(b"\r\n")
            if stripped in (b"  }", b"  },"):
                inside = False
                text = b"".join(buf).rstrip().rstrip(b",")
                pkt = json.loads(text, object_pairs_hook=Node)
                source = pkt.get("_source") if isinstance(pkt, Node) else None
                layers = source.get("layers") if isinstance(source, Node) else None
                if isinstance(layers, Node):
                    self.packets += 1
                    yield layers
