"""``netdiag capture``: live capture to pcapng, optionally while probing an API."""

from __future__ import annotations

import contextlib
import re
import signal
import tempfile
from pathlib import Path
from typing import Any

import click

from netdiag.console import stderr_console
from netdiag.errors import InputError, NetdiagError
from netdiag.textsafe import print_warning

PROBE_GRACE_S = 0.5
"""Capture kept running after the last probe, for the packets closing its connections."""

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?b?\s*$", re.IGNORECASE)
_SIZE_EXP = {"k": 1, "m": 2, "g": 3, "t": 4}


class _Size(click.ParamType):
    """A byte count: ``100M``, ``1.5G``, ``64KiB``, ``4096``."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        m = _SIZE_RE.match(str(value))
        if not m:
            self.fail(f"{value!r} is not a size (examples: 100M, 1.5G, 64KiB, 4096)", param, ctx)
        number, unit, binary = float(m.group(1)), m.group(2), m.group(3)
        scale = (1024 if binary else 1000) ** _SIZE_EXP[unit.lower()] if unit else 1
        size = int(number * scale)
        if size < 1:
            self.fail(f"{value!r} is less than one byte", param, ctx)
        return size


class _Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP arrived (raised once, in the main thread)."""


class _Signals:
    """SIGINT/SIGTERM/SIGHUP end the capture cleanly: the first raises, later ones are noted.

    Once :meth:`finalizing` is called nothing raises any more, so the file is always
    closed; :meth:`restore` gives the usual behaviour back (Ctrl-C stops the report).
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._armed = True
        self._old: dict[int, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # nohup: keep capturing when the terminal goes
            self._old[sig] = signal.signal(sig, self._handler)

    def _handler(self, signum: int, _frame: Any) -> None:
        first = self.received is None
        if first:
            self.received = signum
        if first and self._armed:
            self._armed = False
            raise _Interrupted(signum)

    def finalizing(self) -> None:
        self._armed = False

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


@click.command()
@click.option("-i", "--interface", "iface", default="any", show_default=True,
              help="Interface to capture on; 'any' captures on all of them (Linux cooked "
                   "headers, LINUX_SLL2).")
@click.option("-f", "--filter", "bpf", metavar="BPF",
              help="Capture filter, tcpdump syntax (e.g. \"port 443 or port 53\").")
@click.option("-c", "--count", type=click.IntRange(min=1),
              help="Stop after this many packets.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Stop after this many seconds.")
@click.option("-s", "--snaplen", type=click.IntRange(min=0), default=262144, show_default=True,
              help="Bytes kept of each packet (0: 262144).")
@click.option("-w", "--write", "out", required=True, type=click.Path(dir_okay=False),
              help="The pcapng file to write (streamed as packets arrive).")
@click.option("--rotate-size", type=_Size(), metavar="SIZE",
              help="Start a new file once one holds SIZE bytes (100M, 1G; K/M/G are "
                   "powers of 1000, KiB/MiB/GiB of 1024).")
@click.option("--rotate-seconds", type=click.FloatRange(min=0, min_open=True),
              metavar="SECONDS", help="Start a new file every SECONDS (counted from the start).")
@click.option("--probe", "probes", multiple=True, metavar="URL",
              help="While capturing, send requests to this HTTPS URL (repeatable).")
@click.option("--probe-dns", "probe_dns", multiple=True, metavar="NAME",
              help="While capturing, resolve this name (repeatable).")
@click.option("--probe-count", type=click.IntRange(min=1), default=10, show_default=True,
              help="Requests per --probe URL and queries per --probe-dns name.")
@click.option("--dns-server", metavar="IP",
              help="DNS server (IP or IP:PORT) for --probe-dns and for resolving the "
                   "--probe hosts (default: the system's).")
@click.option("--keylog", type=click.Path(dir_okay=False),
              help="Also append the probes' TLS keys (NSS key log) to this file.")
@click.option("--cafile", type=click.Path(dir_okay=False, exists=True),
              help="CA certificates the probes trust (PEM), instead of the system's.")
@click.option("--insecure", is_flag=True, help="Probes do not verify certificates.")
@click.option("--no-report", is_flag=True, help="With probes: do not print the report.")
def capture(iface: str, bpf: str | None, count: int | None, duration: float | None,
            snaplen: int, out: str, rotate_size: int | None, rotate_seconds: float | None,
            probes: tuple[str, ...], probe_dns: tuple[str, ...], probe_count: int,
            dns_server: str | None, keylog: str | None, cafile: str | None, insecure: bool,
            no_report: bool) -> None:
    """Capture packets live into a pcapng file, written to disk as they arrive.

    \b
      netdiag capture -i any -f "port 443 or port 53" -c 100 -w antho.pcapng
      netdiag capture -i any --probe https://api.example.com/v1/messages \\
          --probe-dns api.example.com --probe-count 20 -w antho.pcapng

    The capture ends after --count packets or --duration seconds, or when interrupted:
    Ctrl-C (SIGINT) or SIGTERM is the normal way to end it; the file is then complete
    and valid and the exit status is 0. Timestamps are the kernel's, in nanoseconds.
    A live counter (packets, bytes, kernel drops, elapsed time) is shown on stderr when
    it is a terminal; a one-line summary ends the capture in any case.

    With --rotate-size or --rotate-seconds, -w out.pcapng names the series:
    out-00001.pcapng, out-00002.pcapng, ..., each a complete pcapng.

    On loopback each packet is seen twice by the kernel (going out, coming in); the
    outgoing copy is dropped, on 'lo' and on 'any', so each is written once.

    With --probe/--probe-dns the probes run (DNS first, then HTTPS, one after the
    other) while capturing, and the capture ends half a second after the last one
    (or before, at --count or --duration). Their TLS keys are then embedded in the
    pcapng (each file, when rotating: Wireshark decrypts it as is) and the netdiag
    report of the capture is printed on stdout, unless --no-report.

    Capturing needs root or the CAP_NET_RAW capability (exit status 1 without it).
    """
    from netdiag.live.capture import LiveCapture

    err = stderr_console()
    probing = bool(probes or probe_dns)
    run_probes = _probe_runner(probes, probe_dns, probe_count, dns_server, cafile,
                               insecure) if probing else None
    cap = LiveCapture(out, iface=iface, bpf=bpf, count=count, duration=duration,
                      snaplen=snaplen, rotate_bytes=rotate_size, rotate_seconds=rotate_seconds)
    signals = _Signals()
    tmpdir = tempfile.TemporaryDirectory(prefix="netdiag-capture-") if probing else None
    key_path = Path(tmpdir.name) / "keys.log" if tmpdir else None
    interrupted = False
    try:
        try:
            cap.start()
            with _counter(cap, iface, err):
                if run_probes is not None:
                    assert key_path is not None
                    run_probes(key_path, err)
                    cap.wait(PROBE_GRACE_S)
                else:
                    while not cap.wait(0.25):
                        pass
        except _Interrupted:
            interrupted = True
        finally:
            signals.finalizing()
            stats = cap.stop()
            signals.restore()
        interrupted = interrupted or signals.received is not None
        _summary(err, iface, stats, interrupted)
        if stats.error:
            raise NetdiagError(stats.error)
        if probing:
            assert key_path is not None
            keys = key_path.read_bytes() if key_path.exists() else b""
            _finish_probes(err, stats.files, keys, keylog, no_report, dns_server)
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()


def _probe_runner(probes: tuple[str, ...], names: tuple[str, ...], count: int,
                  dns_server: str | None, cafile: str | None, insecure: bool) -> Any:
    """A function running every probe once capture has started (imports checked now)."""
    try:
        from netdiag.probe.dns import system_nameservers
    except ImportError as e:
        raise InputError(f"probes are not available in this installation ({e})") from e
    servers = [dns_server] if dns_server else (system_nameservers() if names else [])

    def run(key_path: Path, err: Any) -> None:
        from netdiag.probe.dns import run_dns_probe
        from netdiag.probe.http import run_http_probe

        for name in names:
            err.print(f"probing DNS {name} ({count}x, {', '.join(servers)})", highlight=False)
            dns_result = run_dns_probe(name, servers=servers, count=count)
            asked = len(dns_result.queries)
            err.print(f"  {dns_result.answered}/{asked} answered", highlight=False)
        for url in probes:
            err.print(f"probing {url} ({count}x)", highlight=False)
            result = run_http_probe(url, count=count, keylog=key_path, dns_server=dns_server,
                                    cafile=cafile, insecure=insecure)
            line = f"  {result.succeeded}/{len(result.requests)} ok"
            errors = result.summary().get("errors") or {}
            if errors:
                from rich.markup import escape

                line += f" ([yellow]{escape(next(iter(errors)))}[/])"
            err.print(line, highlight=False)

    return run


def _finish_probes(err: Any, files: list[str], keys: bytes, keylog: str | None,
                   no_report: bool, dns_server: str | None) -> None:
    """Append the keys to --keylog, embed them in the capture, print the report."""
    from netdiag.live.capture import embed_key_log

    if keylog and keys:
        try:
            with open(keylog, "ab") as f:
                f.write(keys)
        except OSError as e:
            raise InputError(f"cannot write {keylog}: {e.strerror or e}") from e
    if keys:
        for f in files:
            embed_key_log(f, f, keys)
        randoms = {line.split()[1] for line in keys.splitlines() if len(line.split()) == 3}
        err.print(f"embedded the TLS keys of {len(randoms)} connection(s) in "
                  f"{_files_text(files)}", highlight=False)
    if no_report:
        return
    from rich.console import Console

    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink
    from netdiag.report.terminal import render

    dns_ports = {53}
    if dns_server:  # a DNS server on another port: parse its traffic as DNS too
        from netdiag.probe.dns import parse_server

        dns_ports.add(parse_server(dns_server)[1])
    result = analyze(list(files), CollectingSink(), Options(dns_ports=frozenset(dns_ports)))
    render(result, Console())
    for w in result.capture.warnings:
        if w.kind == "capture":
            print_warning(w.message)


@contextlib.contextmanager
def _counter(cap: Any, iface: str, err: Any) -> Any:
    """A live counter on stderr while the block runs, when stderr is a terminal."""
    if not err.is_terminal:
        yield
        return
    from rich.live import Live
    from rich.text import Text

    def render() -> Text:
        s = cap.stats
        more = f" (file {len(s.files)})" if len(s.files) > 1 else ""
        return Text.assemble(
            ("● ", "red"), f"capturing on {iface}  ",
            (f"{s.packets:,}", "bold"), " packets  ", (_human(s.bytes), "bold"), "  ",
            (f"{s.drops:,}", "bold red" if s.drops else "bold"), " dropped  ",
            (f"{s.elapsed_s:,.1f} s", "bold"), f"  → {s.files[-1] if s.files else ''}{more}")

    with Live(get_renderable=render, console=err, refresh_per_second=4, transient=True):
        yield


def _human(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB"):
        value /= 1000
        if value < 1000 or unit == "GB":
            break
    return f"{value:,.1f} {unit}"


def _files_text(files: list[str]) -> str:
    if len(files) == 1:
        return files[0]
    return f"{files[0]} … {files[-1]} ({len(files)} files)"


def _summary(err: Any, iface: str, stats: Any, interrupted: bool) -> None:
    how = ", interrupted" if interrupted else ""
    err.print(f"netdiag: {stats.packets:,} packets ({_human(stats.bytes)}) captured on {iface} "
              f"in {stats.elapsed_s:.1f} s{how}, {stats.drops:,} dropped by the kernel → "
              f"{_files_text(stats.files)}", highlight=False, soft_wrap=True)
