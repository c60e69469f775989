"""Hostile captures against every output (issue 11): what a packet says is shown, never
obeyed.

A crafted capture puts rich markup, ANSI/OSC escapes, C1 controls and bidirectional
overrides in every string a report prints (SNI, DNS name, HTTP path, Host, Server,
Redis key); the terminal report, ``netdiag paths``, CSV, HTML and HAR must show those
strings as text. Further captures push the export paths past their ranges (timestamps
beyond ``datetime``, link types beyond pcapng's 16 bits, a Redis length beyond Python's
int-digit limit, an endless key log). Every format run on the shipped capture and on a
capture with a key log is searched for the key log's secrets.
"""

from __future__ import annotations

import csv
import json
import os
import re
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import dns.message
import dns.name
import dns.rrset
import dpkt
import pytest

ROOT = Path(__file__).resolve().parent.parent
ANTHO = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"

T0 = 1_700_000_000.0
CLIENT, RESOLVER, WEB, REDIS = "10.0.0.1", "10.0.0.53", "10.0.0.80", "10.0.0.79"

SNI = "[bold red]sni[/bold red]\x1b[31m<script>alert(1)</script>\u202egnp.test"
QLABEL = b"[red]dns[/red]\x1b[2J<script>"
PATH = b"/[red]path[/red]\x1b]0;pwned\x07\x9b31m<script>alert(2)</script>"
HOST = b"[link=https://evil.test]host[/link]"
SERVER = b"\x1b]8;;https://evil.test\x07srv\x1b]8;;\x07"
RKEY = b"[red]key[/red]\x1b[0m"
RCMD = b"[blink]cmd[/blink]\x1b[5m\xe2\x80\xae"
"""A Redis command name (upper-cased by the analyzer) with markup, ESC and U+202E."""
BIG_INT = b"9" * 5000
"""A Redis integer reply longer than Python's default int-digit limit (4300)."""

ESC = "\x1b"
BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
C1 = re.compile("[\x80-\x9f]")


# --- building captures -------------------------------------------------------------

def _ip(addr: str) -> bytes:
    return bytes(int(x) for x in addr.split("."))


class _Pcap:
    """Ethernet/IPv4 packets into a microsecond pcap, with TCP sequence bookkeeping."""

    def __init__(self, path: Path) -> None:
        self.fh = path.open("wb")
        self.pcap = dpkt.pcap.Writer(self.fh)

    def _write(self, ts: float, src: str, dst: str, l4: dpkt.Packet, proto: int) -> None:
        ip = dpkt.ip.IP(src=_ip(src), dst=_ip(dst), p=proto, ttl=64, data=l4)
        ip.len = len(ip)
        eth = dpkt.ethernet.Ethernet(src=b"\x02\x00\x00\x00\x00\x01",
                                     dst=b"\x02\x00\x00\x00\x00\x02",
                                     type=dpkt.ethernet.ETH_TYPE_IP, data=ip)
        self.pcap.writepkt(bytes(eth), ts=ts)

    def udp(self, ts: float, src: str, sport: int, dst: str, dport: int, data: bytes) -> None:
        udp = dpkt.udp.UDP(sport=sport, dport=dport, data=data)
        udp.ulen = len(udp)
        self._write(ts, src, dst, udp, dpkt.ip.IP_PROTO_UDP)

    def tcp(self, ts: float, src: str, sport: int, dst: str, dport: int, seq: int, ack: int,
            flags: int, data: bytes = b"") -> None:
        tcp = dpkt.tcp.TCP(sport=sport, dport=dport, seq=seq, ack=ack, flags=flags,
                           win=65535, data=data)
        self._write(ts, src, dst, tcp, dpkt.ip.IP_PROTO_TCP)

    def conversation(self, t: float, sport: int, server: str, dport: int,
                     messages: list[tuple[float, int, bytes]], client: str = CLIENT) -> None:
        """Handshake at ``t``, then ``(delay s, 0 client / 1 server, bytes)``, then FINs."""
        syn, ack, psh = dpkt.tcp.TH_SYN, dpkt.tcp.TH_ACK, dpkt.tcp.TH_PUSH | dpkt.tcp.TH_ACK
        fin = dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK
        c = 1000
        s = 5000
        self.tcp(t, client, sport, server, dport, c, 0, syn)
        self.tcp(t + 0.001, server, dport, client, sport, s, c + 1, syn | ack)
        self.tcp(t + 0.002, client, sport, server, dport, c + 1, s + 1, ack)
        c, s, t = c + 1, s + 1, t + 0.002
        for delay, side, data in messages:
            t += delay
            if side == 0:
                self.tcp(t, client, sport, server, dport, c, s, psh, data)
                c += len(data)
            else:
                self.tcp(t, server, dport, client, sport, s, c, psh, data)
                s += len(data)
        self.tcp(t + 0.001, client, sport, server, dport, c, s, fin)
        self.tcp(t + 0.002, server, dport, client, sport, s, c + 1, fin)
        self.tcp(t + 0.003, client, sport, server, dport, c + 1, s + 1, ack)

    def close(self) -> None:
        self.pcap.close()


def _hs(hs_type: int, body: bytes, version: bytes = b"\x03\x01") -> bytes:
    msg = bytes([hs_type]) + len(body).to_bytes(3, "big") + body
    return b"\x16" + version + len(msg).to_bytes(2, "big") + msg


def _ext(ext_type: int, data: bytes) -> bytes:
    return ext_type.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data


def client_hello(sni: bytes, sid: bytes) -> bytes:
    server_name = b"\x00" + len(sni).to_bytes(2, "big") + sni
    protos = b"\x08http/1.1"
    exts = (_ext(0, len(server_name).to_bytes(2, "big") + server_name)
            + _ext(16, len(protos).to_bytes(2, "big") + protos))
    body = (b"\x03\x03" + bytes(range(32)) + bytes([len(sid)]) + sid
            + b"\x00\x02\xc0\x2f" + b"\x01\x00" + len(exts).to_bytes(2, "big") + exts)
    return _hs(1, body)


def server_hello(sid: bytes) -> bytes:
    body = (b"\x03\x03" + bytes(range(64, 96)) + bytes([len(sid)]) + sid
            + b"\xc0\x2f\x00" + b"\x00\x00")
    return _hs(2, body, b"\x03\x03")


CCS_AND_FINISHED = b"\x14\x03\x03\x00\x01\x01" + b"\x16\x03\x03\x00\x28" + bytes(range(40))


def write_hostile(path: Path) -> Path:
    """DNS, TLS, HTTP/1.1 and Redis exchanges whose every name is hostile, each slow
    enough to be a finding."""
    w = _Pcap(path)
    qname = dns.name.Name([QLABEL, b"test", b""])
    q = dns.message.make_query(qname, "A")
    q.id = 0x1234
    r = dns.message.make_response(q)
    r.answer.append(dns.rrset.from_text(qname, 60, "IN", "A", WEB))
    w.udp(T0, CLIENT, 40000, RESOLVER, 53, q.to_wire())
    w.udp(T0 + 0.300, RESOLVER, 53, CLIENT, 40000, r.to_wire())
    sid = bytes(range(200, 232))
    w.conversation(T0 + 1.0, 40001, WEB, 443, [
        (0.001, 0, client_hello(SNI.encode(), sid)),
        (0.400, 1, server_hello(sid) + CCS_AND_FINISHED),
        (0.001, 0, CCS_AND_FINISHED),
    ])
    request = b"GET " + PATH + b" HTTP/1.1\r\nHost: " + HOST + b"\r\nX-Evil: " + SERVER + \
        b"\r\n\r\n"
    response = (b"HTTP/1.1 200 OK\r\nServer: " + SERVER + b"\r\nContent-Type: "
                b"text/[red]plain\r\nContent-Length: 2\r\n\r\nok")
    w.conversation(T0 + 3.0, 40002, WEB, 80, [(0.001, 0, request), (1.5, 1, response)])
    def cmd(*args: bytes) -> bytes:
        return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
    w.conversation(T0 + 6.0, 40003, REDIS, 6379, [
        (0.001, 0, cmd(b"INCRBY", RKEY, b"1")),
        (0.050, 1, b":" + BIG_INT + b"\r\n"),
        (0.001, 0, cmd(b"GET", RKEY)),
        (0.050, 1, b"$2\r\nok\r\n"),
        (0.001, 0, cmd(RCMD, RKEY)),
        (0.080, 1, b"+OK\r\n"),
    ])
    w.close()
    return path


def pcapng_with_offset(src: Path, out: Path, tsoffset_s: int, linktype: int | None = None
                       ) -> Path:
    """``src``'s packets in a pcapng whose one interface has ``if_tsoffset`` =
    ``tsoffset_s`` seconds (and link type ``linktype``, else the packets' own)."""
    from netdiag.capture.reader import CaptureReader

    def block(btype: int, body: bytes) -> bytes:
        body += b"\0" * (-len(body) % 4)
        return struct.pack("<II", btype, 12 + len(body)) + body + struct.pack(
            "<I", 12 + len(body))

    with CaptureReader(src) as r:
        packets = list(r.packets())
    lt = packets[0][1] if linktype is None else linktype
    opts = (struct.pack("<HH", 9, 1) + b"\x09\0\0\0"
            + struct.pack("<HHq", 14, 8, tsoffset_s) + struct.pack("<HH", 0, 0))
    data = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    data += block(1, struct.pack("<HHI", lt, 0, 0) + opts)
    for ts, _, pkt, wire in packets:
        data += block(6, struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, len(pkt), wire)
                      + pkt)
    out.write_bytes(data)
    return out


def write_formulas(path: Path) -> Path:
    """Names a spreadsheet would run as formulas: a DNS name, an SNI, an HTTP path and
    Host, a Redis key."""
    w = _Pcap(path)
    qname = dns.name.Name([b"=1+2", b"test", b""])
    q = dns.message.make_query(qname, "A")
    q.id = 0x4321
    r = dns.message.make_response(q)
    r.answer.append(dns.rrset.from_text(qname, 60, "IN", "A", WEB))
    w.udp(T0, CLIENT, 40000, RESOLVER, 53, q.to_wire())
    w.udp(T0 + 0.002, RESOLVER, 53, CLIENT, 40000, r.to_wire())
    sid = bytes(range(200, 232))
    w.conversation(T0 + 1.0, 40001, WEB, 443, [
        (0.001, 0, client_hello(b"+cmd|' /C calc'!A0", sid)),
        (0.010, 1, server_hello(sid) + CCS_AND_FINISHED),
        (0.001, 0, CCS_AND_FINISHED),
    ])
    request = (b"GET @SUM(1+1)*cmd HTTP/1.1\r\nHost: =HYPERLINK(\"http://evil.test\")\r\n"
               b"\r\n")
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    w.conversation(T0 + 3.0, 40002, WEB, 80, [(0.001, 0, request), (0.010, 1, response)])
    body = b"-2+3+cmd|' /C calc'!A0"
    w.conversation(T0 + 6.0, 40003, REDIS, 6379, [
        (0.001, 0, b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(body), body)),
        (0.001, 1, b"$-1\r\n"),
    ])
    w.close()
    return path


# --- running the CLI ---------------------------------------------------------------

def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items()
            if k not in ("SSLKEYLOGFILE", "NETDIAG_KEYLOG_MAX_MB")}
    full.update({"COLUMNS": "200", **(env or {})})
    return subprocess.run([sys.executable, "-m", "netdiag", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=full,
                          encoding="utf-8", errors="surrogateescape")


def one_line_error(p: subprocess.CompletedProcess[str], code: int) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


def assert_terminal_safe(out: str) -> None:
    """Nothing a terminal would obey: no ESC, no C1 control, no bidirectional override
    (the box drawing and text of the report are all that is left)."""
    assert ESC not in out
    assert not C1.search(out), C1.findall(out)
    assert not BIDI.search(out), BIDI.findall(out)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", out)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hostile(tmp_path_factory.mktemp("hostile") / "hostile.pcap")


# --- 1. the terminal ---------------------------------------------------------------

@pytest.mark.parametrize("fmt", [(), ("--format", "text")])
def test_terminal_report_shows_capture_text_and_obeys_none(hostile: Path,
                                                           fmt: tuple[str, ...]) -> None:
    p = run("report", str(hostile), *fmt)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert_terminal_safe(out)
    assert_terminal_safe(p.stderr)
    # the SNI in the slowest-connections table: its markup is shown, not applied
    assert "[bold red]sni[/bold red" in out
    # the Redis command (upper-cased) in a finding's title and detail, shown escaped
    shown = "[BLINK]CMD[/BLINK]\\u001b[5M"
    assert out.count(shown) >= 2
    # the DNS name in a finding's detail and evidence
    assert "[red]dns[/red]" in out


def test_terminal_report_to_a_file_is_safe_too(hostile: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    p = run("report", str(hostile), "-o", str(out))
    assert p.returncode == 0, p.stderr
    text = out.read_text(encoding="utf-8")
    assert_terminal_safe(text)
    assert "[bold red]sni[/bold red" in text


def test_paths_command_shows_capture_text_and_obeys_none(hostile: Path) -> None:
    p = run("paths", str(hostile), "--connections")
    assert p.returncode == 0, p.stderr
    assert_terminal_safe(p.stdout)
    # the hop tree lists the Redis commands; the findings quote them
    assert p.stdout.count("[BLINK]CMD[/BLINK]\\u001b[5M\\xe2\\x80\\xae") >= 2


PROFILE = r'''
version = 1

[[path]]
name = "[red]P[/red]\u001b[7m\u202eX"
hops = ["[link=https://evil.test]edge[/link]\u001b]8;;x\u0007", "st[b]o[/b]re\u009b"]

[[path.rule]]
hop = "[link=https://evil.test]edge[/link]\u001b]8;;x\u0007"
server = ["10.0.0.80/32"]

[[path.rule]]
hop = "st[b]o[/b]re\u009b"
server = ["10.0.0.79/32"]
'''


def test_paths_names_shown_as_text_in_tree_budget_and_attribution(hostile: Path,
                                                                   tmp_path: Path) -> None:
    profile = tmp_path / "hostile.paths.toml"
    profile.write_text(PROFILE, encoding="utf-8")
    for args in (("paths", str(hostile), "--profile", str(profile), "--connections"),
                 ("report", str(hostile), "--profile", str(profile))):
        p = run(*args)
        assert p.returncode == 0, p.stderr
        out = p.stdout
        assert_terminal_safe(out)
        assert "[red]P[/red]\\u001b[7m\\u202eX" in out      # path: tree, budget column
        assert "[link=https://evil.test]edge[/link]\\u001b]8;;x\\u0007" in out  # hop rows
        assert "st[b]o[/b]re\\u009b" in out


def test_textsafe_replaces_every_kind_of_unsafe_character() -> None:
    from rich.console import Console

    from netdiag.textsafe import ELLIPSIS, safe_cell, safe_markup, safe_text

    assert safe_text("api.example.test") == "api.example.test"
    assert safe_text(None) == ""
    assert safe_text("a\x1b[31mb") == "a\\u001b[31mb"
    assert safe_text("\t\n\r\x00\x7f") == "\\t\\n\\r\\u0000\\u007f"
    assert safe_text("\x9b31m\x85") == "\\u009b31m\\u0085"                   # C1
    bidi = "".join(chr(c) for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)])
    assert safe_text(bidi) == "".join(f"\\u{ord(c):04x}" for c in bidi)
    assert safe_text("\u200b\u200e\u061c\ufeff\u2028\u2029") == (
        "\\u200b\\u200e\\u061c\\ufeff\\u2028\\u2029")
    assert safe_text("\ud800") == "\\ud800"                                  # lone surrogate
    assert safe_text("\U000e0041") == "\\ue0041"                             # tag character
    assert safe_text("café ñ 日本 🙂") == "café ñ 日本 🙂"                     # printable kept
    assert safe_text("x" * 300) == "x" * 255 + ELLIPSIS
    assert safe_text("x" * 300, None) == "x" * 300
    assert safe_markup("[red]x[/red]") == "\\[red]x\\[/red]"
    console = Console(width=200, record=True, force_terminal=True, color_system="truecolor")
    console.print(safe_cell("[red]x[/red][link=https://evil.test]y[/link]\x1b[2J"))
    console.print(f"[bold]{safe_markup('[red]x[/red]')}[/]")
    text = console.export_text()
    assert "[red]x[/red][link=https://evil.test]y[/link]\\u001b[2J" in text
    assert "[red]x[/red]" in text.splitlines()[1]


# --- 2. CSV formulas ---------------------------------------------------------------

def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_csv_cells_that_would_be_formulas_are_defused(tmp_path: Path) -> None:
    cap = write_formulas(tmp_path / "formulas.pcap")
    p = run("report", str(cap), "--format", "csv", "-o", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    dns_rows = read_csv(tmp_path / "out" / "dns.csv")
    assert dns_rows[0]["qname"] == "'=1+2.test"
    conns = read_csv(tmp_path / "out" / "connections.csv")
    assert [c["tls.sni"] for c in conns if c["tls.sni"]] == ["'+cmd|' /C calc'!A0"]
    reqs = read_csv(tmp_path / "out" / "requests.csv")
    http = next(r for r in reqs if r["protocol"] != "resp")
    assert http["path"] == "'@SUM(1+1)*cmd"
    assert http["authority"] == "'=HYPERLINK(\"http://evil.test\")"
    redis = next(r for r in reqs if r["protocol"] == "resp")
    assert redis["path"] == "'-2+3+cmd|' /C calc'!A0"
    # no text cell of any file starts a formula; numbers stay numbers
    for name in ("dns.csv", "connections.csv", "requests.csv", "findings.csv",
                 "summary.csv"):
        for row in read_csv(tmp_path / "out" / name):
            for k, v in row.items():
                assert not k.startswith(("=", "+", "-", "@", "\t", "\r"))
                if v.startswith(("=", "+", "@", "\t", "\r")):
                    pytest.fail(f"{name} {k}: {v!r}")
                if v.startswith("-"):
                    float(v)                      # only a negative number may


def test_csv_negative_numbers_untouched_text_and_keys_defused(tmp_path: Path) -> None:
    from netdiag.report.csv_out import write_csv

    doc: dict[str, Any] = {
        "dns": [{"ts": 1.0, "qname": "-cmd", "latency_ms": -1.5, "answers": ["=x"],
                 "retransmissions": -2, "truncated": False}],
        "connections": [{"id": "C1", "tls": {"sni": "\t=x"}, "=k": 1,
                         "requests": [{"path": "\r=x", "ttfb_ms": -0.25, "method": "GET"}]}],
        "findings": [{"title": "@x", "detail": "fine", "evidence": ["=C1"]}],
        "summary": {"=1+1": 3, "tls": {"versions": {"=2": 4}}},
    }
    paths = write_csv(doc, tmp_path)
    d = read_csv(paths[0])[0]
    assert (d["qname"], d["latency_ms"], d["retransmissions"]) == ("'-cmd", "-1.5", "-2")
    assert d["answers"] == '["=x"]' and d["truncated"] == "false"   # JSON, bool: as they are
    c = read_csv(paths[1])[0]
    assert c["tls.sni"] == "'\t=x" and c["'=k"] == "1"      # a column named by data
    r = read_csv(paths[2])[0]
    assert (r["path"], r["ttfb_ms"]) == ("'\r=x", "-0.25")
    f = read_csv(paths[3])[0]
    assert f["title"] == "'@x" and f["evidence"] == '["=C1"]'
    s = {row["key"]: row["value"] for row in read_csv(paths[4])}
    assert s["'=1+1"] == "3" and s["tls.versions.=2"] == "4"
    exact = write_csv(doc, tmp_path / "exact", excel_safe=False)
    assert read_csv(exact[0])[0]["qname"] == "-cmd"


# --- 3. HTML and HAR ---------------------------------------------------------------

class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.text.extend(v for _, v in attrs if v)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_escapes_every_capture_string(hostile: Path) -> None:
    p = run("report", str(hostile), "--format", "html")
    assert p.returncode == 0, p.stderr
    page = p.stdout
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page          # SNI
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page          # path
    assert "\\027[2J&lt;script&gt;.test" in page                     # DNS name
    assert_terminal_safe(page.replace("\n", " "))
    parsed = _Collect()
    parsed.feed(page)
    assert "script" not in parsed.tags
    shown = " ".join(parsed.text)
    assert "<script>alert(1)</script>" in shown and "[bold red]sni" in shown


def test_har_stays_valid_json_with_hostile_strings(hostile: Path) -> None:
    p = run("report", str(hostile), "--format", "har")
    assert p.returncode == 0, p.stderr
    har = json.loads(p.stdout)
    entries = har["log"]["entries"]
    url = next(e["request"]["url"] for e in entries if "path" in e["request"]["url"])
    assert PATH.decode("latin-1").split("]", 1)[0] in url
    server = next(h["value"] for e in entries for h in e["response"]["headers"]
                  if h["name"].lower() == "server")
    assert server == SERVER.decode("latin-1")           # exact, JSON-escaped in the file
    assert ESC not in p.stdout                           # JSON escapes C0 controls


# --- 4. exceptions in output and export paths --------------------------------------

@pytest.fixture(scope="module")
def far_and_negative(hostile: Path, tmp_path_factory: pytest.TempPathFactory
                     ) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("offsets")
    return {"far": pcapng_with_offset(hostile, d / "far.pcapng", 2**62),
            "negative": pcapng_with_offset(hostile, d / "negative.pcapng", -2**40)}


@pytest.mark.parametrize("which", ["far", "negative"])
def test_har_clamps_times_beyond_iso8601(far_and_negative: dict[str, Path],
                                         which: str) -> None:
    from netdiag.report.har import CLAMPED_COMMENT, ISO_MAX, ISO_MIN

    p = run("report", str(far_and_negative[which]), "--format", "har")
    assert p.returncode == 0, p.stderr
    har = json.loads(p.stdout)
    edge = ISO_MAX if which == "far" else ISO_MIN
    entries = har["log"]["entries"]
    assert entries and all(e["startedDateTime"] == edge for e in entries)
    assert all(CLAMPED_COMMENT in e["comment"] and e["_netdiag"]["started_clamped"]
               for e in entries)
    assert "clamped" in har["log"]["comment"]
    line = one_line_error(p, 0)
    assert line.startswith("warning: HAR:") and "clamped" in line


@pytest.mark.parametrize("fmt", ["text", "json", "jsonl", "html", "csv"])
@pytest.mark.parametrize("which", ["far", "negative"])
def test_other_formats_survive_times_beyond_iso8601(far_and_negative: dict[str, Path],
                                                    which: str, fmt: str,
                                                    tmp_path: Path) -> None:
    extra = ("-o", str(tmp_path / "csv")) if fmt == "csv" else ()
    p = run("report", str(far_and_negative[which]), "--format", fmt, *extra)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("which", ["far", "negative"])
def test_write_pcapng_keeps_times_pcapng_cannot_count(far_and_negative: dict[str, Path],
                                                      which: str, tmp_path: Path) -> None:
    from netdiag.capture.reader import CaptureReader

    src = far_and_negative[which]
    out = tmp_path / "copy.pcapng"
    p = run("report", str(src), "--format", "json", "--write-pcapng", str(out))
    assert p.returncode == 0, p.stderr
    with CaptureReader(src) as a, CaptureReader(out) as b:
        packets = list(a.packets())
        assert list(b.packets()) == packets             # times exact, via if_tsoffset
        assert not b.truncated
    assert f": {len(packets)} packets" in p.stderr


def test_write_pcapng_skips_link_types_above_16_bits(tmp_path: Path) -> None:
    from netdiag.capture.reader import CaptureReader

    src = tmp_path / "lt.pcap"
    rec = struct.pack("<IIII", 1_700_000_000, 0, 4, 4) + b"abcd"
    src.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 0x10000)
                    + rec * 3)
    out = tmp_path / "copy.pcapng"
    p = run("report", str(src), "--format", "json", "--write-pcapng", str(out))
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    warning = next(line for line in p.stderr.splitlines() if "not written" in line)
    assert "3 packets not written: 3 with a link type above 65535" in warning
    assert "0 packets" in p.stderr
    with CaptureReader(out) as r:
        assert list(r.packets()) == [] and not r.truncated


def test_pcapng_writer_offsets_skips_and_counts(tmp_path: Path) -> None:
    import io

    from netdiag.capture.pcapng_writer import (
        SKIP_LINKTYPE,
        SKIP_TIME,
        PcapngWriter,
        write_pcapng,
    )
    from netdiag.capture.reader import CaptureReader

    ns = 10**9
    kept = [(-1, 1, b"a", 1), (-5 * ns - 7, 1, b"b", 1), ((1 << 64) + 3, 1, b"c", 1),
            (1_700_000_000 * ns, 1, b"d", 1), (2**62 * ns + 5, 1, b"e", 1),
            (-(2**62) * ns + 1, 101, b"f", 1)]
    dropped = [(0, 1 << 16, b"x", 1), (0, -1, b"y", 1), (2**64 * ns, 1, b"z", 1),
               (-(2**64) * ns, 1, b"w", 1)]
    path = tmp_path / "edges.pcapng"
    warnings: list[str] = []
    with path.open("wb") as f:
        assert write_pcapng(f, kept + dropped, None, warn=warnings.append) == len(kept)
    assert len(warnings) == 1 and "4 packets not written" in warnings[0]
    with CaptureReader(path) as r:
        assert list(r.packets()) == kept         # exact, through if_tsoffset
        assert not r.truncated
    w = PcapngWriter(io.BytesIO())
    assert w.packet(0, 70000, b"", 0) is False and w.packet(2**70 * ns, 1, b"", 0) is False
    assert w.skipped == {SKIP_LINKTYPE: 1, SKIP_TIME: 1}


def test_redis_numbers_beyond_int_digits_do_not_stop_the_connection(hostile: Path) -> None:
    p = run("report", str(hostile), "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    conn = next(c for c in doc["connections"] if c["protocol"] == "resp")
    reqs = conn["requests"]
    assert [r["method"] for r in reqs][:2] == ["INCRBY", "GET"] and len(reqs) == 3
    assert all(r["ttfb_ms"] is not None for r in reqs)     # every reply matched
    assert "internal error" not in json.dumps(doc)


@pytest.mark.parametrize("reply", [
    b":" + BIG_INT + b"\r\n",                        # integer
    b"(" + BIG_INT + b"\r\n",                        # big number
    b"," + BIG_INT + b".5\r\n",                      # double
    b":" + b"9" * 70_000 + b"\r\n",                  # over MAX_LINE: skipped to its end
    b"*1\r\n:" + BIG_INT + b"\r\n",                  # inside an aggregate
    b"%" + b"0" * 5000 + b"1\r\n+a\r\n:" + BIG_INT + b"\r\n",   # count with 5000 zeros
], ids=["integer", "big-number", "double", "over-max-line", "in-array", "zero-padded-map"])
def test_resp_long_numbers_are_values(reply: bytes) -> None:
    from netdiag.protocols.resp import RespAnalyzer

    an = RespAnalyzer()
    an.feed(0, 1, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n", 1)
    for i in range(0, len(reply), 1400):             # as TCP segments
        an.feed(1, 2, reply[i:i + 1400], 2 + i)
    an.feed(1, 3, b"+PONG\r\n", 99)
    an.close(4)
    assert [(r.method, r.first_byte_ns is not None) for r in an.requests] == [
        ("GET", True), ("PING", True)]
    assert an.requests[1].first_byte_ns == 3
    assert not any("internal error" in w for w in an.warnings)
    if reply[:1] != b"%" or BIG_INT in reply:
        assert an.oversized_numbers == 1
        assert any("more than 4300 digits" in w for w in an.warnings)


@pytest.mark.parametrize("line", [b"*" + BIG_INT, b"$" + BIG_INT, b"$?\r\n;" + BIG_INT,
                                  b"*1\r\n$" + BIG_INT],
                         ids=["array", "bulk", "streamed-chunk", "nested-bulk"])
def test_resp_lengths_beyond_int_digits_are_a_protocol_warning(line: bytes) -> None:
    from netdiag.protocols.resp import RespAnalyzer

    an = RespAnalyzer()
    an.feed(0, 1, b"*1\r\n$4\r\nPING\r\n", 1)
    an.feed(1, 2, line + b"\r\n", 2)
    an.feed(0, 3, b"*1\r\n$4\r\nPING\r\n", 3)       # the client side is still read
    an.close(4)
    assert len(an.requests) == 2
    assert not any("internal error" in w for w in an.warnings), an.warnings
    assert any("length over 2**40" in w or "chunk" in w for w in an.warnings)


def test_keylog_that_never_ends_is_one_line_exit_1(tmp_path: Path) -> None:
    line = one_line_error(run("report", str(ANTHO), "--keylog", "/dev/zero",
                              timeout=30), 1)
    assert line.startswith("netdiag: error: /dev/zero:1: line longer than 1 MiB")
    line = one_line_error(run("report", str(ANTHO), env={"SSLKEYLOGFILE": "/dev/zero"},
                              timeout=30), 1)
    assert "/dev/zero" in line and "1 MiB" in line
    big = tmp_path / "big.keys"
    text = KEYS.read_text()
    big.write_text(text * (1024 * 1024 // len(text) + 2))
    line = one_line_error(run("report", str(ANTHO), "--keylog", str(big),
                              env={"NETDIAG_KEYLOG_MAX_MB": "1"}), 1)
    assert "larger than 1 MiB" in line and "NETDIAG_KEYLOG_MAX_MB" in line
    p = run("report", str(ANTHO), "--keylog", str(big), "--format", "json",
            env={"NETDIAG_KEYLOG_MAX_MB": "2"})
    assert p.returncode == 0, p.stderr
    line = one_line_error(run("report", str(ANTHO), "--keylog", str(KEYS),
                              env={"NETDIAG_KEYLOG_MAX_MB": "lots"}), 1)
    assert "NETDIAG_KEYLOG_MAX_MB" in line


def test_keylog_reader_caps_bytes_and_lines(tmp_path: Path) -> None:
    from netdiag.errors import InputError
    from netdiag.tls.keylog import MAX_KEYLOG_BYTES, MAX_LINE_BYTES, KeyLog

    assert (MAX_KEYLOG_BYTES, MAX_LINE_BYTES) == (64 * 1024 * 1024, 1024 * 1024)
    size = KEYS.stat().st_size
    assert len(KeyLog.from_file(KEYS, max_bytes=size)) == len(KeyLog.from_file(KEYS))
    with pytest.raises(InputError, match=f"larger than {size - 1} bytes"):
        KeyLog.from_file(KEYS, max_bytes=size - 1)
    long_line = tmp_path / "long.keys"
    long_line.write_bytes(KEYS.read_bytes() + b"#" + b"x" * (MAX_LINE_BYTES + 1) + b"\n")
    lineno = KEYS.read_bytes().count(b"\n") + 1
    with pytest.raises(InputError, match=f"long.keys:{lineno}: line longer than 1 MiB"):
        KeyLog.from_file(long_line)
    ok = tmp_path / "ok.keys"                      # a long comment under the cap is fine
    ok.write_bytes(b"#" + b"x" * (MAX_LINE_BYTES - 10) + b"\n" + KEYS.read_bytes())
    assert len(KeyLog.from_file(ok)) == len(KeyLog.from_file(KEYS))


# --- 5. key material never in an output --------------------------------------------

def _secrets() -> list[str]:
    out = []
    for line in KEYS.read_text().splitlines():
        fields = line.split()
        if len(fields) == 3 and not line.startswith("#"):
            out.append(fields[2].lower())
    assert out
    return out


def _without_keys(dst: Path) -> Path:
    from netdiag.capture.pcapng_writer import write_pcapng
    from netdiag.capture.reader import CaptureReader

    with CaptureReader(ANTHO) as reader, open(dst, "wb") as f:
        write_pcapng(f, reader.packets(), None)
        assert reader.secrets, "the shipped capture embeds its keys"
    return dst


@pytest.mark.parametrize("source", ["embedded", "keylog"])
def test_no_output_format_carries_a_secret(source: str, tmp_path: Path) -> None:
    secrets = _secrets()
    if source == "embedded":
        base: tuple[str, ...] = (str(ANTHO),)
    else:
        base = (str(_without_keys(tmp_path / "bare.pcapng")), "--keylog", str(KEYS))
    outputs: dict[str, str] = {}
    for fmt in ("text", "json", "jsonl", "har", "html"):
        p = run("report", *base, "--format", fmt)
        assert p.returncode == 0, p.stderr
        outputs[fmt] = p.stdout + p.stderr
        if fmt == "json":
            assert json.loads(p.stdout)["summary"]["tls"]["decrypted"] > 0
    csv_dir = tmp_path / "csv"
    p = run("report", *base, "--format", "csv", "-o", str(csv_dir))
    assert p.returncode == 0, p.stderr
    outputs["csv"] = p.stdout + p.stderr + "".join(
        f.read_text(encoding="utf-8") for f in sorted(csv_dir.iterdir()))
    for fmt in ("text", "json"):
        p = run("paths", *base, "--format", fmt)
        assert p.returncode == 0, p.stderr
        outputs[f"paths-{fmt}"] = p.stdout + p.stderr
    for fmt, text in outputs.items():
        low = text.lower()
        leaked = [s[:8] for s in secrets if s in low or s[:32] in low]
        assert not leaked, f"{fmt} shows secrets starting {leaked}"


@pytest.mark.parametrize("which", ["far", "negative"])
def test_capture_first_and_last_times_hold_beyond_2_62_ns(far_and_negative: dict[str, Path],
                                                         which: str) -> None:
    """The capture's first and last times are its packets' own, however far out."""
    from netdiag.capture.reader import CaptureReader

    with CaptureReader(far_and_negative[which]) as r:
        times = [ts for ts, *_ in r.packets()]
    p = run("report", str(far_and_negative[which]), "--format", "json")
    assert p.returncode == 0, p.stderr
    cap = json.loads(p.stdout)["capture"]
    assert cap["first_ts"] == pytest.approx(min(times) / 1e9, rel=1e-12)
    assert cap["last_ts"] == pytest.approx(max(times) / 1e9, rel=1e-12)


def test_two_requests_naming_each_other_do_not_hang_the_report(tmp_path: Path) -> None:
    """Two unanswered HTTP/1.1 requests with one ``X-Request-Id``, sent at the same
    microsecond to two servers (one from the other's address, as a proxy sends): each
    is the other's parent by id. The path analysis looped forever on them; now the
    report ends, and one request is caused by the other, not both."""
    w = _Pcap(tmp_path / "twins.pcap")
    request = b"GET /v1/twin HTTP/1.1\r\nHost: twin.test\r\nX-Request-Id: same\r\n\r\n"
    w.conversation(T0, 40010, WEB, 80, [(0.001, 0, request)])
    w.conversation(T0, 40011, "10.0.0.81", 80, [(0.001, 0, request)], client=WEB)
    w.close()
    p = run("report", str(tmp_path / "twins.pcap"), "--format", "json", timeout=60)
    assert p.returncode == 0, p.stderr
    requests = [r for c in json.loads(p.stdout)["connections"] for r in c["requests"]]
    assert len(requests) == 2
    assert sum("caused_by" in r for r in requests) == 1
