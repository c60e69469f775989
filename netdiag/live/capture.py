"""Live capture on Linux: an AF_PACKET socket streamed to pcapng as packets arrive.

How it works
------------
* One packet socket per capture, read by one background thread that writes every
  packet to disk at once through :class:`~netdiag.capture.pcapng_writer.PcapngWriter`
  (buffered, flushed twice a second): memory does not grow with the capture.
* Timestamps are the kernel's, in nanoseconds (``SO_TIMESTAMPNS``), written with
  ``if_tsresol = 9``; the original length of each packet comes from
  ``PACKET_AUXDATA``, which also gives back the VLAN tag the NIC stripped (it is put
  back in the frame, as libpcap does).
* Link types, as tcpdump writes them: Ethernet and loopback interfaces give
  ``EN10MB`` frames; interfaces without a link header (tun, WireGuard) give ``RAW``;
  ``any`` (and other link types) give ``LINUX_SLL2`` "cooked" headers built from the
  packet's ``sockaddr_ll`` (scapy has no socket for ``any``, so the socket is ours).
* Capture filters are compiled by libpcap through scapy (``compile_filter``), for the
  link type written. In cooked mode the kernel filters from the network header, so
  the program is rewritten as libpcap does (``fix_program``): offsets past the cooked
  header move back by its length, its protocol and packet-type fields become the
  ``SKF_AD_PROTOCOL``/``SKF_AD_PKTTYPE`` ancillary loads.
* Loopback packets are seen twice by a packet socket, going out and coming in. The
  outgoing copy (``PACKET_OUTGOING`` on a loopback interface) is dropped, on ``lo``
  and on ``any`` alike, so every loopback packet is written once (as libpcap does for
  ``any``). Outgoing packets of real interfaces are kept. The copy is dropped by a
  few instructions put before the capture filter in the kernel, so it costs neither
  socket buffer (drops) nor CPU; the thread checks again in case the kernel refused.
* Capture starts when :meth:`LiveCapture.start` binds the socket: every packet the
  kernel sees after that is queued for the thread, so no marker packet or settle
  time is needed. :meth:`LiveCapture.stop` writes the packets already queued (those
  the kernel stamped before the call) before closing the file.
* Drops are the kernel's (``PACKET_STATISTICS``: the socket buffer was full).

The filter ``keep_addresses`` (used by the lab) is applied in Python after the
kernel filter: only IPv4/IPv6 packets from or to one of the addresses are written.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import os
import re
import select
import socket
import struct
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from netdiag.capture.linktypes import LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL2, LINKTYPE_RAW
from netdiag.capture.pcapng_writer import PcapngWriter
from netdiag.errors import InputError, NetdiagError

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_AUXDATA = 8
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
SO_TIMESTAMPNS = 35
"""Also the cmsg type of the timestamp (``SCM_TIMESTAMPNS``)."""
PACKET_OUTGOING = 4
ARPHRD_ETHER = 1
ARPHRD_LOOPBACK = 772
ARPHRD_NONE = 0xFFFE
TP_STATUS_VLAN_VALID = 0x10
TP_STATUS_VLAN_TPID_VALID = 0x40
SKF_AD_OFF = 0xFFFFF000
"""``-0x1000`` as an unsigned BPF constant: base of the ancillary loads."""
SKF_AD_PROTOCOL = 0
SKF_AD_PKTTYPE = 4
SLL2_LEN = 20

DEFAULT_SNAPLEN = 262144
RCVBUF = 8 << 20
"""Kernel socket buffer asked for (``SO_RCVBUFFORCE`` as root), bytes."""
FILE_BUFFER = 1 << 20
TICK_S = 0.5
"""Flush and drop-counter period, seconds."""
BATCH = 512
"""Packets read per wake-up before the clock is looked at again."""
_ANC_SIZE = socket.CMSG_SPACE(16) + socket.CMSG_SPACE(20) + 32


class CapturePermissionError(NetdiagError):
    """The packet socket could not be opened: not root and no CAP_NET_RAW."""

    exit_code = 1


@dataclass
class CaptureStats:
    """Where a capture is (live, from :attr:`LiveCapture.stats`) or ended (from ``stop``)."""

    packets: int = 0
    """Packets written."""
    bytes: int = 0
    """Sum of their original (on the wire) lengths."""
    drops: int = 0
    """Packets the kernel dropped because the socket buffer was full."""
    elapsed_s: float = 0.0
    """Seconds since :meth:`LiveCapture.start`."""
    files: list[str] = field(default_factory=list)
    """Files written so far, in order."""
    error: str | None = None
    """Why the capture ended early (interface gone, disk full), if it did."""


def rotated_name(out: str | Path, index: int) -> Path:
    """File ``index`` (from 1) of a rotated capture: ``a/b.pcapng`` -> ``a/b-00001.pcapng``."""
    p = Path(out)
    return p.with_name(f"{p.stem}-{index:05d}{p.suffix}")


class _CountingFile:
    """Write-only file wrapper counting the bytes written (for rotation by size)."""

    __slots__ = ("f", "n")

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.n = 0

    def write(self, data: bytes) -> int:
        self.n += len(data)
        return self.f.write(data)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


def compile_filter(bpf: str, linktype: int, snaplen: int) -> list[tuple[int, int, int, int]]:
    """The BPF program for ``bpf`` on packets of ``linktype``, ready for the kernel.

    Raises :class:`InputError` for an invalid filter (libpcap's reason included), or
    one the kernel cannot apply to a cooked (``any``) socket.
    """
    try:
        from scapy.arch.common import compile_filter as scapy_compile
        from scapy.arch.common import free_filter
        from scapy.error import Scapy_Exception
    except ImportError as e:  # pragma: no cover - scapy is a dependency
        raise InputError(f"capture filters need scapy and libpcap: {e}") from e
    try:
        prog = scapy_compile(bpf, linktype=linktype)
    except ImportError as e:
        raise InputError(f"capture filters need libpcap (package libpcap0.8): {e}") from e
    except Scapy_Exception as e:
        m = re.search(r"\((.*)\)\s*$", str(e))
        reason = m.group(1) if m else str(e)
        raise InputError(f"invalid capture filter {bpf!r}: {reason}") from e
    try:
        insns = [(i.code, i.jt, i.jf, i.k) for i in prog.bf_insns[:prog.bf_len]]
    finally:
        with contextlib.suppress(Exception):
            free_filter(prog)
    out = []
    for code, jt, jf, k in insns:
        cls, mode = code & 0x07, code & 0xE0
        if code == 0x06 and k != 0:  # BPF_RET|BPF_K: accept, keeping k bytes
            k = snaplen
        elif linktype == LINKTYPE_LINUX_SLL2 and cls in (0x00, 0x01) and mode in (0x20, 0x40,
                                                                                   0xA0):
            # a load from the packet (ABS, IND, MSH): the kernel's packet starts at
            # the network header; the cooked header only exists in the file
            if k >= SLL2_LEN:
                k -= SLL2_LEN
            elif k == 0:
                k = SKF_AD_OFF + SKF_AD_PROTOCOL
            elif k == 10:
                k = SKF_AD_OFF + SKF_AD_PKTTYPE
            elif k < 0x80000000:
                raise InputError(f"invalid capture filter {bpf!r}: it reads a part of the "
                                 "cooked header the kernel cannot filter on; capture on "
                                 "one interface instead of 'any'")
        out.append((code, jt, jf, k))
    return out


SKF_AD_HATYPE = 28
_SKIP_LOOPBACK_OUTGOING = [
    (0x20, 0, 0, SKF_AD_OFF + SKF_AD_PKTTYPE),  # ld pkttype
    (0x15, 0, 3, PACKET_OUTGOING),              # jeq #OUTGOING ? next : pass
    (0x20, 0, 0, SKF_AD_OFF + SKF_AD_HATYPE),   # ld hatype
    (0x15, 0, 1, ARPHRD_LOOPBACK),              # jeq #LOOPBACK ? drop : pass
    (0x06, 0, 0, 0),                            # drop: ret #0
]
"""Kernel filter prefix dropping the outgoing copy of loopback packets (jumps are
relative, so the user's program follows unchanged)."""


def _kernel_program(insns: list[tuple[int, int, int, int]] | None, snaplen: int
                    ) -> list[tuple[int, int, int, int]]:
    """The program attached: the loopback de-duplication, then the user's filter."""
    return _SKIP_LOOPBACK_OUTGOING + (insns or [(0x06, 0, 0, snaplen)])


def _attach(sock: socket.socket, insns: list[tuple[int, int, int, int]]) -> None:
    arr = (_SockFilter * len(insns))(*insns)
    prog = struct.pack("HL", len(insns), ctypes.addressof(arr))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)


def _interface_names() -> list[str]:
    try:
        return ["any", *sorted(name for _, name in socket.if_nameindex())]
    except OSError:
        return ["any"]


def _hatype(iface: str) -> int | None:
    try:
        return int(Path(f"/sys/class/net/{iface}/type").read_text().strip())
    except (OSError, ValueError):
        return None


def _ip_addresses(rec: bytes, linktype: int) -> tuple[bytes, bytes] | None:
    """``(src, dst)`` of an IPv4/IPv6 packet in a record of ``linktype``, else None."""
    if linktype == LINKTYPE_ETHERNET:
        if len(rec) < 14:
            return None
        et = (rec[12] << 8) | rec[13]
        off = 14
        while et in (0x8100, 0x88A8, 0x9100) and len(rec) >= off + 4:
            et = (rec[off + 2] << 8) | rec[off + 3]
            off += 4
    elif linktype == LINKTYPE_LINUX_SLL2:
        et = (rec[0] << 8) | rec[1]
        off = SLL2_LEN
        if et == 0x8100 and len(rec) >= off + 4:
            et = (rec[off + 2] << 8) | rec[off + 3]
            off += 4
    else:
        off = 0
        v = rec[0] >> 4 if rec else 0
        et = 0x0800 if v == 4 else 0x86DD if v == 6 else 0
    if et == 0x0800 and len(rec) >= off + 20:
        return rec[off + 12:off + 16], rec[off + 16:off + 20]
    if et == 0x86DD and len(rec) >= off + 40:
        return rec[off + 8:off + 24], rec[off + 24:off + 40]
    return None


_RUNNING: weakref.WeakSet[LiveCapture] = weakref.WeakSet()


@atexit.register
def _stop_running() -> None:
    """At interpreter exit, close captures nobody stopped (their thread is a daemon)."""
    for cap in list(_RUNNING):
        with contextlib.suppress(Exception):
            cap.stop()


class LiveCapture:
    """Capture packets from ``iface`` into the pcapng ``out``, written as they arrive.

    ``count`` and ``duration`` end the capture by themselves (:meth:`wait` returns
    then); otherwise it runs until :meth:`stop`. ``rotate_bytes``/``rotate_seconds``
    split it into complete pcapng files named by :func:`rotated_name` (``out``
    itself is not written then): a file is closed once it holds ``rotate_bytes``,
    or when a packet comes after its ``rotate_seconds`` window (counted from the
    start), and the next one is opened for that packet. ``key_log`` is embedded as a
    decryption-secrets block at the start of the first file.
    """

    def __init__(self, out: str | Path, *, iface: str = "any", bpf: str | None = None,
                 count: int | None = None, duration: float | None = None,
                 snaplen: int = DEFAULT_SNAPLEN, rotate_bytes: int | None = None,
                 rotate_seconds: float | None = None, keep_addresses: set[str] | None = None,
                 key_log: bytes | None = None) -> None:
        if count is not None and count < 1:
            raise InputError("the packet count must be at least 1")
        if duration is not None and duration <= 0:
            raise InputError("the duration must be more than 0 seconds")
        if rotate_bytes is not None and rotate_bytes < 1:
            raise InputError("the rotation size must be at least 1 byte")
        if rotate_seconds is not None and rotate_seconds <= 0:
            raise InputError("the rotation period must be more than 0 seconds")
        self.out = Path(out)
        self.iface = iface
        self.bpf = bpf or None
        self.count = count
        self.duration = duration
        self.snaplen = snaplen if snaplen and snaplen > 0 else DEFAULT_SNAPLEN
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.keep_addresses = keep_addresses
        self._keep: frozenset[bytes] | None = None
        if keep_addresses is not None:
            keep = set()
            for a in keep_addresses:
                fam = socket.AF_INET6 if ":" in a else socket.AF_INET
                try:
                    keep.add(socket.inet_pton(fam, a))
                except OSError as e:
                    raise InputError(f"not an IP address: {a!r}") from e
            self._keep = frozenset(keep)
        self.key_log = key_log
        self.linktype = LINKTYPE_ETHERNET
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        self._done = threading.Event()
        self._stopping = False
        self._stop_ns = 0
        self._stopped: CaptureStats | None = None
        self._lock = threading.Lock()
        self._start_mono = 0.0
        self._start_ns = 0
        self._end_mono: float | None = None
        self._packets = 0
        self._bytes = 0
        self._drops = 0
        self._files: list[str] = []
        self._error: str | None = None
        self._file: BinaryIO | None = None
        self._counting: _CountingFile | None = None
        self._writer: PcapngWriter | None = None

    # -- public ------------------------------------------------------------------------

    @property
    def stats(self) -> CaptureStats:
        """A snapshot of the counters (live while capturing)."""
        if self._stopped is not None:
            return self._stopped
        end = self._end_mono if self._end_mono is not None else time.monotonic()
        return CaptureStats(self._packets, self._bytes, self._drops,
                            (end - self._start_mono) if self._start_mono else 0.0,
                            list(self._files), self._error)

    def start(self) -> None:
        """Open the socket and the first file; packets are captured once this returns.

        Raises :class:`InputError` for an unknown interface, an invalid filter or an
        unwritable file, :class:`CapturePermissionError` without the privilege.
        """
        if self._sock is not None or self._stopped is not None:
            raise RuntimeError("a LiveCapture can only be started once")
        cooked = self.iface == "any"
        hatype = None
        if not cooked:
            try:
                socket.if_nametoindex(self.iface)
            except OSError:
                raise InputError(f"no such interface: {self.iface!r} (interfaces: "
                                 f"{', '.join(_interface_names())})") from None
            hatype = _hatype(self.iface)
            cooked = hatype not in (ARPHRD_ETHER, ARPHRD_LOOPBACK, ARPHRD_NONE, None)
        if cooked:
            self.linktype = LINKTYPE_LINUX_SLL2
        elif hatype == ARPHRD_NONE:
            self.linktype = LINKTYPE_RAW
        else:
            self.linktype = LINKTYPE_ETHERNET
        insns = compile_filter(self.bpf, self.linktype, self.snaplen) if self.bpf else None
        sock = self._open_socket(cooked, insns)
        try:
            self._start_mono = time.monotonic()
            self._start_ns = time.time_ns()
            if self.iface != "any":
                sock.bind((self.iface, ETH_P_ALL))
            else:
                # an unbound packet socket gets every interface's packets from its
                # creation on, before its filter was attached: throw those away (it
                # rejects everything meanwhile, so this ends), then filter for real
                with contextlib.suppress(BlockingIOError):
                    while True:
                        sock.recv(1, socket.MSG_DONTWAIT)
                try:
                    self._attach_program(sock, insns)
                except OSError as e:
                    raise InputError(f"invalid capture filter {self.bpf!r}: the kernel "
                                     f"refused it ({e.strerror})") from e
            with contextlib.suppress(OSError):  # reset the kernel's counters
                sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
            sock.setblocking(False)
            self._open_file(1)
        except OSError as e:
            sock.close()
            if e.errno == errno.ENETDOWN or e.errno == errno.ENODEV:
                raise InputError(f"cannot capture on {self.iface}: {e.strerror}") from e
            raise
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="netdiag-capture", daemon=True)
        self._thread.start()
        _RUNNING.add(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the capture ends by itself (count, duration, error); False on timeout."""
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        """The capture has ended (by itself or by :meth:`stop`)."""
        return self._done.is_set()

    def stop(self) -> CaptureStats:
        """End the capture: write what the kernel already queued, close the file. Idempotent."""
        with self._lock:
            if self._stopped is not None:
                return self._stopped
            if self._thread is not None:
                if not self._stopping:
                    self._stop_ns = time.time_ns()
                    self._stopping = True
                with contextlib.suppress(OSError):
                    os.write(self._wake_w, b"x")
                self._thread.join()
            if self._end_mono is None:
                self._end_mono = time.monotonic()
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._wake_r = self._wake_w = -1
            if self._sock is not None:
                self._sock.close()
            self._close_file()
            self._stopped = self.stats
            self._done.set()
            _RUNNING.discard(self)
            return self._stopped

    def __enter__(self) -> LiveCapture:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- setup -------------------------------------------------------------------------

    def _open_socket(self, cooked: bool, insns: list[tuple[int, int, int, int]] | None
                     ) -> socket.socket:
        kind = socket.SOCK_DGRAM if cooked else socket.SOCK_RAW
        # A socket bound later is created with protocol 0: it receives nothing until
        # bind(), by which time its filter is in place.
        proto = socket.htons(ETH_P_ALL) if self.iface == "any" else 0
        try:
            sock = socket.socket(socket.AF_PACKET, kind, proto)
        except PermissionError as e:
            raise CapturePermissionError(
                f"capturing needs root or CAP_NET_RAW (cannot open a packet socket: "
                f"{e.strerror})") from e
        except OSError as e:
            raise NetdiagError(f"cannot open a packet socket: {e.strerror or e}") from e
        try:
            if self.iface == "any":
                _attach(sock, [(0x06, 0, 0, 0)])  # reject all until start() drained it
            else:
                self._attach_program(sock, insns)
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError as e:
            sock.close()
            if insns is not None and e.errno == errno.EINVAL:
                raise InputError(f"invalid capture filter {self.bpf!r}: the kernel "
                                 f"refused it ({e.strerror})") from e
            raise NetdiagError(f"cannot set up the packet socket: {e.strerror or e}") from e
        return sock

    def _attach_program(self, sock: socket.socket,
                        insns: list[tuple[int, int, int, int]] | None) -> None:
        try:
            _attach(sock, _kernel_program(insns, self.snaplen))
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            # a kernel without SKF_AD_HATYPE: the thread alone drops loopback copies
            _attach(sock, insns or [(0x06, 0, 0, self.snaplen)])

    def _path(self, index: int) -> Path:
        if self.rotate_bytes is None and self.rotate_seconds is None:
            return self.out
        return rotated_name(self.out, index)

    def _open_file(self, index: int) -> None:
        path = self._path(index)
        try:
            f = open(path, "wb", buffering=FILE_BUFFER)  # noqa: SIM115 - closed in _close_file
        except OSError as e:
            raise InputError(f"cannot write {path}: {e.strerror or e}") from e
        self._file = f
        self._counting = _CountingFile(f)
        w = PcapngWriter(self._counting)  # type: ignore[arg-type]
        if index == 1 and self.key_log:
            w.secrets(self.key_log)
        w.interface(self.linktype, self.iface, self.snaplen)
        self._writer = w
        self._files.append(os.fspath(path))

    def _close_file(self) -> None:
        f, self._file, self._writer, self._counting = self._file, None, None, None
        if f is not None:
            try:
                f.close()
            except OSError as e:
                if self._error is None:
                    self._error = f"cannot write {self._files[-1]}: {e.strerror or e}"

    # -- the capture thread ------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except OSError as e:
            if self._error is None:
                if e.errno in (errno.ENETDOWN, errno.ENODEV, errno.ENXIO):
                    self._error = f"capture on {self.iface} stopped: {e.strerror}"
                else:
                    name = self._files[-1] if self._files else os.fspath(self.out)
                    self._error = f"capture stopped: {name}: {e.strerror or e}"
        except Exception as e:  # keep the file valid whatever happened
            self._error = f"capture stopped: {type(e).__name__}: {e}"
        finally:
            self._update_drops()
            if self._end_mono is None:
                self._end_mono = time.monotonic()
            with contextlib.suppress(OSError):
                if self._file is not None:
                    self._file.flush()
            self._done.set()

    def _update_drops(self) -> None:
        sock = self._sock
        if sock is None:
            return
        with contextlib.suppress(OSError):
            _received, dropped = struct.unpack(
                "II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
            self._drops += dropped

    def _loop(self) -> None:
        """Read, stamp, filter and write packets; the hot path, kept in one frame."""
        sock = self._sock
        assert sock is not None
        linktype = self.linktype
        cooked = linktype == LINKTYPE_LINUX_SLL2
        ether = linktype == LINKTYPE_ETHERNET
        snaplen = self.snaplen
        keep = self._keep
        count = self.count
        start_ns = self._start_ns
        end_ns = start_ns + int(self.duration * 1e9) if self.duration is not None else None
        deadline = self._start_mono + self.duration if self.duration is not None else None
        rot_bytes = self.rotate_bytes
        rot_ns = int(self.rotate_seconds * 1e9) if self.rotate_seconds is not None else None
        window_end = rot_ns
        file_index = 1
        need_rotate = False
        ifindex: dict[str, int] = {}

        buf = bytearray(snaplen)
        view = memoryview(buf)
        bufs = [buf]
        recv = sock.recvmsg_into
        pack_sll2 = struct.Struct("!HHIHBB8s").pack
        unpack_ts = struct.Struct("qq").unpack_from
        unpack_aux = struct.Struct("IIIHHHH").unpack_from
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        next_tick = time.monotonic() + TICK_S
        limit: int | None = None
        packets = self._packets

        while True:
            if limit is None:
                if self._stopping:
                    limit = self._stop_ns
                elif deadline is not None and time.monotonic() >= deadline:
                    limit = end_ns
            got = 0
            while got < BATCH:
                try:
                    n, anc, _flags, addr = recv(bufs, _ANC_SIZE)
                except BlockingIOError:
                    break
                except InterruptedError:
                    continue
                got += 1
                ts = 0
                wire = n
                tci = -1
                tpid = 0x8100
                for level, kind, data in anc:
                    if level == SOL_PACKET and kind == PACKET_AUXDATA:
                        status, wire, _snap, _mac, _net, vtci, vtpid = unpack_aux(data)
                        if status & TP_STATUS_VLAN_VALID or vtci:
                            tci = vtci
                            if status & TP_STATUS_VLAN_TPID_VALID:
                                tpid = vtpid
                    elif level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                        sec, nsec = unpack_ts(data)
                        ts = sec * 1_000_000_000 + nsec
                if not ts:
                    ts = time.time_ns()
                if (limit is not None and ts > limit) or (end_ns is not None and ts > end_ns):
                    return
                pkttype = addr[2]
                hatype = addr[3]
                if pkttype == PACKET_OUTGOING and hatype == ARPHRD_LOOPBACK:
                    continue  # seen again as it comes in
                if cooked:
                    proto = addr[1]
                    idx = ifindex.get(addr[0])
                    if idx is None:
                        try:
                            idx = socket.if_nametoindex(addr[0])
                        except OSError:
                            idx = 0
                        ifindex[addr[0]] = idx
                    lladdr = addr[4]
                    if tci >= 0:
                        rec = (pack_sll2(tpid, 0, idx, hatype, pkttype, len(lladdr), lladdr)
                               + struct.pack("!HH", tci, proto) + view[:n])
                        wire += 4
                    else:
                        rec = pack_sll2(proto, 0, idx, hatype, pkttype, len(lladdr),
                                        lladdr) + view[:n]
                    wire += SLL2_LEN
                    if len(rec) > snaplen:
                        rec = rec[:snaplen]
                elif ether and tci >= 0 and n >= 12:
                    rec = bytes(view[:12]) + struct.pack("!HH", tpid, tci) + view[12:n]
                    wire += 4
                    if len(rec) > snaplen:
                        rec = rec[:snaplen]
                else:
                    rec = bytes(view[:n])
                if keep is not None:
                    pair = _ip_addresses(rec, linktype)
                    if pair is None or (pair[0] not in keep and pair[1] not in keep):
                        continue
                if rot_ns is not None and window_end is not None and ts - start_ns >= window_end:
                    window_end = ((ts - start_ns) // rot_ns + 1) * rot_ns
                    need_rotate = True
                if need_rotate:
                    need_rotate = False
                    file_index += 1
                    self._close_file()
                    self._open_file(file_index)
                writer = self._writer
                assert writer is not None
                writer.packet(ts, linktype, rec, wire)
                packets += 1
                self._packets = packets
                self._bytes += wire
                if rot_bytes is not None and self._counting is not None \
                        and self._counting.n >= rot_bytes:
                    need_rotate = True
                if count is not None and packets >= count:
                    return
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + TICK_S
                if self._file is not None:
                    self._file.flush()
                self._update_drops()
            if got == 0:
                if limit is not None:
                    return  # everything queued before the stop is written
                wait_s = next_tick - now
                if deadline is not None:
                    wait_s = min(wait_s, deadline - now)
                for fd, _ev in poller.poll(max(0, int(wait_s * 1000) + 1)):
                    if fd == self._wake_r:
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 64)


def embed_key_log(src: str | Path, dst: str | Path, key_log: bytes) -> int:
    """Rewrite the capture ``src`` as the pcapng ``dst`` with ``key_log`` embedded first.

    TLS key logs already embedded at the start of ``src`` are merged into the new
    block (lines in both are written once); secrets met later stay after the
    packets. ``dst`` may be ``src``: the new file replaces it once complete. Returns
    the number of packets written.
    """
    from netdiag.capture.reader import SECRETS_TLS_KEY_LOG, CaptureReader

    dst = Path(dst)
    tmp = dst.with_name(dst.name + ".part")
    with CaptureReader(src) as reader:
        it = reader.packets()
        first = next(it, None)
        known = len(reader.secrets)
        merged = _merge_key_logs([data for stype, data in reader.secrets
                                  if stype == SECRETS_TLS_KEY_LOG] + [key_log])
        n = 0
        try:
            with open(tmp, "wb") as f:
                w = PcapngWriter(f)
                if merged:
                    w.secrets(merged)
                for stype, data in reader.secrets:
                    if stype != SECRETS_TLS_KEY_LOG:
                        w.secrets(data, stype)
                if first is not None:
                    w.packet(*first)
                    n = 1
                    for ts, lt, data, wire in it:
                        w.packet(ts, lt, data, wire)
                        n += 1
                for stype, data in reader.secrets[known:]:
                    w.secrets(data, stype)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise InputError(f"cannot write {dst}: {e.strerror or e}") from e
    os.replace(tmp, dst)
    return n


def _merge_key_logs(logs: list[bytes]) -> bytes:
    """NSS key logs joined, each line once, in the order first met."""
    seen: set[bytes] = set()
    out: list[bytes] = []
    for log in logs:
        for line in log.splitlines():
            line = line.strip()
            if line and line not in seen:
                seen.add(line)
                out.append(line)
    return b"\n".join(out) + b"\n" if out else b""
