"""netdiag's HTTP requests agree with tshark's, connection by connection and request by
request (CONTRACT.md: ``requests[].ts``, ``requests[].ttfb_ms``).

For every third-party capture carrying HTTP (``http_ref.HTTP_THIRDPARTY``; the folder
``../shared/captures/thirdparty/`` may be absent: nothing to run then) and every
``captures/*.pcap*`` of the project, each read by tshark and by netdiag with its key
log (MANIFEST.tsv / ``STEM.keys``):

* per TCP connection (matched by client and server endpoints): netdiag's request
  count EQUALS tshark's - HTTP/2 streams with a client HEADERS frame plus HTTP/1.x
  requests (an ``Upgrade: h2c`` request counts once);
* per request (HTTP/2 by stream id, HTTP/1.x in order): ``ttfb_ms`` within 0.05 ms of
  tshark's frame times, each message timed by the packet carrying its first byte
  (http_ref.py says how that packet is found); ``ts`` likewise; ``method``, ``path``,
  ``authority`` and final ``status`` equal; ``estimated`` false.

A request whose first-byte packet tshark's output cannot place is excluded from the
TTFB comparison with its reason, and counted ("excluded") in the summary.

The other third-party captures must carry no HTTP for tshark (so none is forgotten),
and netdiag must report no request on them but estimated ones on connections it could
not decrypt. ``test_reference_method`` checks the first-byte rules on a synthetic
capture where tshark's reporting packet and the first-byte packet differ.

Counts: printed at the end of the session (``crosscheck HTTP: ...``) and by
report_counts.py.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from http_ref import (
    HttpOutcome,
    compare_http,
    http_captures,
    http_reference,
    http_summary_line,
    other_thirdparty_captures,
    run_tshark_http,
)
from tshark_ref import CaptureSpec, tshark_path

HTTP = http_captures()
OTHERS = other_thirdparty_captures()

pytestmark = [
    pytest.mark.tshark,
    pytest.mark.skipif(tshark_path() is None, reason="tshark is not installed"),
]

HTTP_TALLY = pytest.StashKey[dict[tuple[str, str], dict[str, Any]]]()
_PLUGIN = "netdiag-http-crosscheck-summary"


class _Summary:
    """Prints the HTTP tally at the end of the session (registered on first use)."""

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int,
                                config: pytest.Config) -> None:
        tally = config.stash.get(HTTP_TALLY, None)
        if not tally:
            return
        captures = len({c for (c, _), row in tally.items() if row["compared"]})
        terminalreporter.write_sep("-", "tshark HTTP cross-check")
        terminalreporter.write_line(f"{http_summary_line(list(tally.values()))} "
                                    f"({captures} captures)")
        for (capture, kind), row in sorted(tally.items()):
            for reason in row["skip_reasons"]:
                what = "excluded from TTFB" if kind == "ttfb" else "not compared"
                terminalreporter.write_line(f"  {what}: {capture}: {reason}")


@pytest.fixture
def http_tally(request: pytest.FixtureRequest) -> dict[tuple[str, str], dict[str, Any]]:
    config = request.config
    if HTTP_TALLY not in config.stash:
        config.stash[HTTP_TALLY] = {}
    if not config.pluginmanager.has_plugin(_PLUGIN):
        config.pluginmanager.register(_Summary(), _PLUGIN)
    return config.stash[HTTP_TALLY]


def _check(out: HttpOutcome, kind: str, tally: dict[tuple[str, str], dict[str, Any]]) -> None:
    reasons = [f"{s.desc}: {s.reason}" for s in out.skips if s.kind == kind]
    tally[(out.spec.name, kind)] = {"kind": kind, "agreed": out.agreed(kind),
                                    "compared": out.compared(kind), "skipped": len(reasons),
                                    "skip_reasons": reasons}
    failures = out.failures(kind)
    if failures:
        what = "connections' request counts" if kind == "count" else "requests"
        pytest.fail(f"{len(failures)} of {out.compared(kind)} {what} disagree with tshark:\n  "
                    + "\n  ".join(failures), pytrace=False)


@pytest.mark.parametrize("spec", HTTP, ids=[s.name for s in HTTP])
def test_request_counts(spec: CaptureSpec, http_tally) -> None:
    out = compare_http(spec)
    _check(out, "count", http_tally)
    if out.compared("count") == 0:
        pytest.fail(f"{spec.name}: tshark sees no HTTP request (is the key log "
                    f"{spec.keylog} right?)", pytrace=False)


@pytest.mark.parametrize("spec", HTTP, ids=[s.name for s in HTTP])
def test_ttfb(spec: CaptureSpec, http_tally) -> None:
    out = compare_http(spec)
    _check(out, "ttfb", http_tally)
    if out.compared("ttfb") == 0:
        pytest.fail(f"{spec.name}: no request compared; "
                    + "; ".join(f"{s.desc}: {s.reason}" for s in out.skips), pytrace=False)


@pytest.mark.parametrize("spec", OTHERS, ids=[s.name for s in OTHERS])
def test_no_http_elsewhere(spec: CaptureSpec, http_tally) -> None:
    ref = http_reference(spec)
    assert not ref.requests, (f"tshark sees HTTP in {spec.name}: add it to "
                              f"http_ref.HTTP_THIRDPARTY")
    out = compare_http(spec)
    _check(out, "count", http_tally)


# ----------------------------------------------------------------------------- method


def _synthetic(path: Path) -> dict[str, Any]:
    """A cleartext capture whose messages span segments, so that tshark reports them
    at a later packet than the one carrying their first byte.

    A: HTTP/1.1 on port 80, request in 2 segments, response in 3 (headers split).
    B: HTTP/2 with prior knowledge on port 80, the request HEADERS and the response
       HEADERS each split over two segments.
    """
    import hpack
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    pkts = []
    t0 = 1_700_000_000

    def conn(cport: int, start: float, flights: list[tuple[str, float, bytes]]) -> None:
        c, s = "10.0.0.1", "10.0.0.2"
        seq = {"c": 1000, "s": 5000}

        def add(who: str, t: float, flags: str, data: bytes = b"") -> None:
            src, dst, sp, dp = (c, s, cport, 80) if who == "c" else (s, c, 80, cport)
            other = "s" if who == "c" else "c"
            p = (Ether() / IP(src=src, dst=dst) /
                 TCP(sport=sp, dport=dp, flags=flags, seq=seq[who], ack=seq[other]) / data)
            p.time = Decimal(t0) + Decimal(str(t))
            pkts.append(p)
            seq[who] += len(data) + (1 if "S" in flags or "F" in flags else 0)

        add("c", start, "S")
        add("s", start + 0.001, "SA")
        add("c", start + 0.002, "A")
        for who, t, data in flights:
            add(who, start + t, "PA", data)
        add("c", start + 0.9, "FA")
        add("s", start + 0.901, "FA")
        add("c", start + 0.902, "A")

    body = b"hello world\n"
    req = b"GET /split HTTP/1.1\r\nHost: a.test\r\nUser-Agent: synthetic\r\n\r\n"
    resp = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)
    conn(40001, 0.0, [("c", 0.010, req[:10]), ("c", 0.020, req[10:]),
                      ("s", 0.100, resp[:8]), ("s", 0.130, resp[8:30]),
                      ("s", 0.140, resp[30:])])

    def frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
        return (len(payload).to_bytes(3, "big") + bytes([ftype, flags])
                + sid.to_bytes(4, "big") + payload)

    enc_c, enc_s = hpack.Encoder(), hpack.Encoder()
    h_req = frame(1, 0x05, 1, enc_c.encode([(":method", "GET"), (":scheme", "http"),
                                             (":authority", "b.test"), (":path", "/h2")]))
    h_resp = frame(1, 0x04, 1, enc_s.encode([(":status", "200"),
                                              ("content-type", "text/plain")]))
    data = frame(0, 0x01, 1, body)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")
    conn(40002, 1.0, [("c", 0.010, preface), ("s", 0.015, frame(4, 0, 0, b"")),
                      ("c", 0.020, frame(4, 1, 0, b"")),
                      ("c", 0.030, h_req[:12]), ("c", 0.040, h_req[12:]),
                      ("s", 0.045, frame(4, 1, 0, b"")),
                      ("s", 0.200, h_resp[:5]), ("s", 0.230, h_resp[5:] + data)])
    wrpcap(str(path), pkts)
    # path: (request first byte at, response first byte at, TTFB in ms), times from t0
    return {"/split": (0.010, 0.100, 90.0), "/h2": (1.030, 1.200, 170.0)}


def test_reference_method(tmp_path: Path) -> None:
    path = tmp_path / "http_split.pcap"
    expected = _synthetic(path)
    spec = CaptureSpec(path.name, path, None, (), "synthetic")
    assert run_tshark_http(spec), "tshark read nothing"
    ref = http_reference(spec)
    reqs = {r.path: r for r in ref.requests}
    assert set(reqs) == set(expected), [r.describe() for r in ref.requests]
    for name, (req_at, resp_at, ttfb) in expected.items():
        r = reqs[name]
        assert r.request is not None and r.response is not None, r.timing()
        # tshark reports both messages at a later packet than their first byte's
        assert r.request.frame < r.request_frame, r.timing()
        assert r.response_frame is not None and r.response.frame < r.response_frame
        assert r.request.ts == Decimal(1_700_000_000) + Decimal(str(req_at)), r.timing()
        assert r.response.ts == Decimal(1_700_000_000) + Decimal(str(resp_at)), r.timing()
        assert r.ttfb_ms == Decimal(str(ttfb)), r.timing()
    assert reqs["/split"].kind == "http1" and reqs["/h2"].kind == "h2"
    assert reqs["/h2"].stream_id == 1 and reqs["/h2"].status == 200

    out = compare_http(spec)
    assert (out.compared("count"), out.compared("ttfb")) == (2, 2), out.skips
    assert not out.failures(), "\n".join(out.failures())
