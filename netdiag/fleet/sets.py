"""Capture sets: the files that continue one another, analyzed as one capture.

A *set* is the files of one source (one host's capture, one interface, one ring
buffer) that follow each other in time. A connection that crosses from one file of a
set into the next is one connection, as if the set were one capture (the pipeline
merges a set's files by time); sets are independent of each other.

Two files are of the same source when three things agree:

* the folder they are in (``host-a/`` and ``host-b/`` are two sources);
* their name with the rotation counter or timestamp taken off (:func:`name_pattern`):
  ``ring_00001_20261201093000.pcapng`` -> ``ring_*.pcapng`` (dumpcap's ring buffer),
  ``1764425767.pcap`` -> ``*.pcap`` (``tcpdump -G 60 -w %s.pcap``), ``x.pcap3`` ->
  ``x.pcap*`` (``tcpdump -C``), ``b-00002.pcapng`` (``netdiag capture --rotate-*``),
  ``cap_2026-12-01_09-30-00.pcap``, ``trace.1.pcap``; gzip-compressed or not;
* their pcapng metadata, where they have some: the section header's ``shb_hardware``,
  ``shb_os`` and ``shb_userappl`` and the interfaces' ``if_name`` and
  ``if_description`` (two machines writing ``ring_*.pcapng`` into one folder, or two
  interfaces, are two sources).

The files of one source are then chained in time order: a file joins the set of the
previous one when it starts no later than ``gap_ns`` after the last packet seen so far
in that set (overlapping files are merged by time, as ``mergecap`` would). The
default gap is the flow table's idle timeout: a connection silent for longer is
finished as idle within one capture too.

Only each file's header and first and last packet times are read (:func:`probe_file`):
the last time from the file's end (pcapng blocks are walked back; pcap records are
found again by their headers), or, for a compressed file or when that fails, by
reading the file from its start up to :data:`SCAN_LIMIT` bytes; beyond, the last time
is unknown and the file is taken to continue into the next one of its source (merging
is always exact; splitting is what could cut a connection).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from netdiag.capture.sources import is_url, open_capture, read_tail
from netdiag.errors import CaptureFormatError
from netdiag.flows.table import IDLE_TIMEOUT_NS

DEFAULT_GAP_NS = IDLE_TIMEOUT_NS
"""A file starting within this of the previous file's last packet continues its set."""
TAIL_BYTES = 256 << 10
"""Bytes read from a file's end to find its last packet time..."""
TAIL_BYTES_MAX = 4 << 20
"""... and, when that was not enough (a large last packet), at most this many."""
SCAN_LIMIT = 256 << 20
"""Bytes (of the file as stored) read from the start, at most, when the end cannot be
read back (compressed files, damaged ends)."""
URL_PROBE_THREADS = 8
"""Files of URLs probed at once (the time is in the network round trips)."""

_EXT = re.compile(r"\.(pcapng|pcap|cap|ntar)(\d*)$", re.IGNORECASE)
_SEP = r"(?:^|[-_.])"
_ROTATION = (
    # ISO dates, with a time: 2026-12-01, 2026-12-01T09:30:00Z, 2026-12-01_09-30-00
    re.compile(_SEP + r"\d{4}-\d{2}-\d{2}(?:[T_ ]\d{2}[:\-.h]?\d{2}(?:[:\-.m]?\d{2}"
               r"(?:[.,]\d+)?)?)?Z?$"),
    # compact date and time: 20261201T093000Z
    re.compile(_SEP + r"\d{8}T\d{4,6}(?:[.,]\d+)?Z?$"),
    # a time of day with separators: 09-30-00, 09:30
    re.compile(_SEP + r"\d{2}[:\-h]\d{2}(?:[:\-m]\d{2})?$"),
    # counters and numeric times: 00001, 1764425767, 20261201093000
    re.compile(_SEP + r"\d{4,}$"),
)
_SHORT_COUNTER = re.compile(r"[_.]\d{1,3}$")
"""A short counter ending the name (``trace_3``, ``trace.1``); ``node-1`` is a name."""


def name_pattern(filename: str) -> str:
    """A file name with its rotation counter or timestamp replaced by ``*`` and without a
    ``.gz`` suffix (module docstring); the name itself when it has none."""
    name = filename[:-3] if filename.lower().endswith(".gz") else filename
    m = _EXT.search(name)
    if m is not None:
        stem, ext = name[:m.start()], "." + m.group(1) + ("*" if m.group(2) else "")
    else:
        dot = name.rfind(".")
        if dot > 0 and name[dot + 1:].isalpha():
            stem, ext = name[:dot], name[dot:]
        else:
            stem, ext = name, ""
    base = stem
    m = _SHORT_COUNTER.search(base)
    if m is not None and m.start() > 0:
        base = base[:m.start()]
    while base:
        for rx in _ROTATION:
            m = rx.search(base)
            if m is not None and m.end() > m.start():
                base = base[:m.start()]
                break
        else:
            break
    if base == stem:
        return stem + ext
    removed = stem[len(base):]
    sep = removed[0] if removed[0] in "-_." else ""
    return f"{base}{sep}*{ext}"


@dataclass
class CaptureFile:
    """What grouping needs to know about one file (:func:`probe_file`)."""

    name: str
    index: int = 0
    """Its place among the inputs (the order within a set)."""
    size: int | None = None
    """Bytes as stored; None when unknown."""
    first_ns: int | None = None
    """Time of its first packet; None without packets."""
    last_ns: int | None = None
    """Time of its last packet; None when unknown (see ``last_known``)."""
    last_known: bool = True
    """False when the end was not reached within :data:`SCAN_LIMIT`."""
    compressed: bool = False
    section: dict[str, str] = field(default_factory=dict)
    """The first pcapng section header's text options."""
    interfaces: list[dict[str, str]] = field(default_factory=list)
    """The pcapng interfaces described before the first packet."""
    error: str | None = None
    """Why its header cannot be read (a damaged capture); None when it can."""

    @property
    def signature(self) -> tuple[object, ...]:
        """The pcapng metadata that tells one source from another (module docstring)."""
        s = self.section
        return (s.get("shb_hardware"), s.get("shb_os"), s.get("shb_userappl"),
                tuple((i.get("if_name"), i.get("if_description")) for i in self.interfaces))

    def describe_source(self) -> str:
        """The metadata in words, to tell two sources of one name pattern apart."""
        ifs = [i.get("if_name") or i.get("if_description") or "" for i in self.interfaces]
        s = self.section
        parts = [", ".join(x for x in ifs if x), s.get("shb_hardware") or "",
                 s.get("shb_os") or "", s.get("shb_userappl") or ""]
        text = "; ".join(p for p in parts if p)
        if not text:
            text = hashlib.sha1(repr(self.signature).encode()).hexdigest()[:8]
        return text


@dataclass
class CaptureSet:
    """Files of one source that continue one another, analyzed as one capture."""

    key: str
    """Its name in the report: the host, and ``#n`` when the host has several sets."""
    host: str
    """The source (``--by host``): folder, name pattern and, where needed, metadata."""
    files: list[CaptureFile]
    """In the order they were given (the pipeline merges them by time)."""

    @property
    def paths(self) -> list[str]:
        return [f.name for f in self.files]

    @property
    def size(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def first_ns(self) -> int | None:
        times = [f.first_ns for f in self.files if f.first_ns is not None]
        return min(times) if times else None


@dataclass
class Plan:
    """The sets of a run, in report order (by key), and the files left out."""

    sets: list[CaptureSet]
    damaged: list[CaptureFile] = field(default_factory=list)
    """Files whose header cannot be read: reported as damaged, in no set."""

    @property
    def files(self) -> list[CaptureFile]:
        return [f for s in self.sets for f in s.files]


# -- reading the facts of a file ---------------------------------------------------------

def probe_file(name: str, index: int = 0, scan_limit: int = SCAN_LIMIT) -> CaptureFile:
    """The header, first and last packet times of one capture (module docstring).

    A file that is not a capture at all, or whose header is cut, comes back with
    ``error`` set; a file that cannot be read raises :class:`~netdiag.errors.InputError`.
    """
    info = CaptureFile(name=name, index=index)
    try:
        reader = open_capture(name)
    except CaptureFormatError as e:
        info.error = str(e)
        return info
    with reader:
        info.size = reader.progress()[1]
        info.compressed = reader.compressed
        packets = reader.packets()
        first = next(packets, None)
        info.section = dict(reader.sections[0]) if reader.sections else {}
        info.interfaces = [dict(i) for i in reader.interfaces]
        if first is None:
            info.last_known = True
            return info
        info.first_ns = first_ns = first[0]
        if not reader.compressed:
            for nbytes in (TAIL_BYTES, TAIL_BYTES_MAX):
                got = read_tail(name, nbytes)
                if got is None:
                    break
                tail, size = got
                ts = reader.tail_time_ns(tail, first_ns)
                if ts is not None:
                    info.last_ns = ts
                    return info
                if len(tail) >= size:
                    break
        last = first_ns
        for i, pkt in enumerate(packets):
            last = pkt[0]
            if not i & 4095 and reader.progress()[0] > scan_limit:
                info.last_known = False
                info.last_ns = None
                return info
        info.last_ns = last
    return info


def probe_files(names: Sequence[str], scan_limit: int = SCAN_LIMIT) -> list[CaptureFile]:
    """:func:`probe_file` of each name, in order (URLs several at a time)."""
    if len(names) > 1 and any(is_url(n) for n in names):
        with ThreadPoolExecutor(URL_PROBE_THREADS) as pool:
            return list(pool.map(lambda a: probe_file(a[1], a[0], scan_limit),
                                 enumerate(names)))
    return [probe_file(n, i, scan_limit) for i, n in enumerate(names)]


# -- grouping ------------------------------------------------------------------------------

def _split(name: str) -> tuple[list[str], str]:
    """``(folder components, file name)`` of a path or URL."""
    parts = name.split("/")
    return parts[:-1], parts[-1]


def host_labels(files: Sequence[CaptureFile]) -> dict[int, str]:
    """The source of each file (by ``index``), in words: the folder below the folders
    all files share, the name pattern, and the metadata where one pattern has several."""
    folders = {f.index: _split(f.name)[0] for f in files}
    common: list[str] | None = None
    for parts in folders.values():
        if common is None:
            common = list(parts)
            continue
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    depth = len(common or [])
    base: dict[int, str] = {}
    for f in files:
        rel = "/".join(folders[f.index][depth:])
        pattern = name_pattern(_split(f.name)[1])
        base[f.index] = f"{rel}/{pattern}" if rel else pattern
    sigs: dict[str, set[tuple[object, ...]]] = {}
    for f in files:
        sigs.setdefault(base[f.index], set()).add(f.signature)
    return {f.index: (base[f.index] if len(sigs[base[f.index]]) == 1
                      else f"{base[f.index]} [{f.describe_source()}]") for f in files}


def plan_sets(files: Sequence[CaptureFile], gap_ns: int = DEFAULT_GAP_NS) -> Plan:
    """Group probed files into sets (module docstring), in report order."""
    good = [f for f in files if f.error is None]
    damaged = [f for f in files if f.error is not None]
    labels = host_labels(good)
    by_source: dict[tuple[object, ...], list[CaptureFile]] = {}
    for f in good:
        folder, _ = _split(f.name)
        source: tuple[object, ...] = (labels[f.index], "/".join(folder), f.signature)
        by_source.setdefault(source, []).append(f)
    grouped: list[tuple[str, list[CaptureFile]]] = []
    for src, members in by_source.items():
        host = str(src[0])
        timed = sorted((f for f in members if f.first_ns is not None),
                       key=lambda f: (f.first_ns, f.index))
        chains: list[list[CaptureFile]] = []
        end: float = float("-inf")
        for f in timed:
            assert f.first_ns is not None
            if chains and f.first_ns <= end + gap_ns:
                chains[-1].append(f)
            else:
                chains.append([f])
                end = float("-inf")
            end = max(end, float("inf") if f.last_ns is None else f.last_ns, f.first_ns)
        chains.extend([f] for f in members if f.first_ns is None)  # no packets: alone
        grouped.extend((host, sorted(chain, key=lambda f: f.index)) for chain in chains)
    grouped.sort(key=lambda hc: (hc[0], _start(hc[1]), hc[1][0].index))
    count: dict[str, int] = {}
    for host, _chain in grouped:
        count[host] = count.get(host, 0) + 1
    seen: dict[str, int] = {}
    sets = []
    for host, chain in grouped:
        seen[host] = seen.get(host, 0) + 1
        key = host if count[host] == 1 else f"{host} #{seen[host]}"
        sets.append(CaptureSet(key=key, host=host, files=chain))
    return Plan(sets=sets, damaged=damaged)


def _start(chain: list[CaptureFile]) -> float:
    times = [f.first_ns for f in chain if f.first_ns is not None]
    return min(times) if times else float("inf")
