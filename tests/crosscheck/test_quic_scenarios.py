"""QUIC connection events on real captures, against tshark and the client's own record.

Each scenario of ``tests/protocols/quic_scenarios.py`` (aioquic server and client on
127.0.0.1, tcpdump) is read by ``netdiag report --format json`` with and without the
client's key log:

- ``retry``: ``quic.retry``, ``handshake_rtt_ms`` to the Retry (tshark: the first
  ``quic.long.packet_type == 3``), the client's second Initial in the same connection,
  the request decoded with keys from the restarted ClientHello (at a client 1-RTT frame
  of tshark's, which does not decrypt past the Retry);
- ``zero_rtt``: ``quic.zero_rtt`` (``packets`` = tshark's 0-RTT packets, ``accepted``
  true with keys as the client saw it, null without), the 0-RTT request and its time;
- ``migration`` / ``rebinding``: one connection over two client ports, ``migrations``,
  ``client_endpoints`` and the connection ids against tshark's endpoints per connection
  id and the client's own ids, both requests; without keys, the new connection id's
  packets (tshark decrypting) counted in one warning;
- ``vn_v2`` / ``vn_unknown``: ``quic.version_negotiation`` against tshark's Version
  Negotiation packet, ``handshake_rtt_ms`` to it, the v1 Initial in the same connection
  and the request decoded with keys.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from netdiag.cli import cli

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "tests" / "protocols" / "quic_scenarios.py"
RTT_TOLERANCE_MS = 0.0015
"""``handshake_rtt_ms`` is rounded to the microsecond; tshark's frame times are too."""

pytestmark = [pytest.mark.tshark, pytest.mark.slow]
KEYS = pytest.mark.parametrize("keys", [False, True], ids=["keyless", "keylog"])


def _tshark() -> str:
    exe = shutil.which("tshark")
    if exe is None:
        pytest.skip("tshark is not installed")
    return exe


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """``scenario(name)``: the capture (built once per module), key log and client record."""
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump is not installed")
    if os.geteuid() != 0:
        pytest.skip("capturing on lo needs root")
    _tshark()
    out = tmp_path_factory.mktemp("quic_scenarios")
    built: dict[str, dict[str, Any]] = {}

    def get(name: str) -> dict[str, Any]:
        if name not in built:
            proc = subprocess.run([sys.executable, str(GENERATOR), name, str(out)],
                                  capture_output=True, text=True, timeout=60, cwd=ROOT)
            if proc.returncode != 0:
                if "Address already in use" in proc.stderr:
                    pytest.skip(f"{name}: its server port is taken")
                pytest.fail(f"the {name} capture failed: {proc.stderr[-2000:]}")
            record = json.loads((out / f"{name}.json").read_text())
            built[name] = {"pcap": out / f"{name}.pcap", "keys": out / f"{name}.keys",
                           **record}
        return built[name]

    return get


def estimates_cover(estimates: list[dict[str, Any]], truth_ts: list[float],
                    since: float) -> None:
    """Keyless estimates of a live exchange against the true request times: all
    estimated, one in each true request's slot (at most 1 ms after it, and after the
    request before it, or ``since`` for the first), and at most one more. On a loaded
    machine a client's stream-setup packets sent late read as one more request, or
    with the request as one starting early; the exact agreement is tested on the fixed
    capture (tests/protocols/test_quic_estimates.py)."""
    assert all(r["estimated"] for r in estimates)
    for t in sorted(truth_ts):
        assert any(since <= r["ts"] <= t + 1e-3 for r in estimates), (
            t, since, [r["ts"] for r in estimates])
        since = t + 1e-6
    assert len(truth_ts) <= len(estimates) <= len(truth_ts) + 1, (truth_ts, estimates)


def _report(sc: dict[str, Any], keys: bool) -> dict[str, Any]:
    args = ["report", str(sc["pcap"]), "--format", "json", "--no-profile",
            *(["--keylog", str(sc["keys"])] if keys else [])]
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


FIELDS = ("frame.number", "frame.time_epoch", "udp.srcport", "udp.dstport",
          "quic.connection.number", "quic.version", "quic.long.packet_type", "quic.dcid",
          "quic.scid", "quic.stream.stream_id", "quic.supported_version",
          "tls.handshake.random")


def _frames(sc: dict[str, Any], keys: bool = False) -> list[dict[str, list[str]]]:
    """tshark's QUIC frames: per field, every occurrence (one per coalesced packet)."""
    args = [_tshark(), "-n", "-r", str(sc["pcap"]), "-T", "fields", "-E", "occurrence=a",
            "-E", "aggregator=|", "-E", "separator=\t", "-Y", "quic"]
    if keys:
        args += ["-o", f"tls.keylog_file:{sc['keys']}"]
    for f in FIELDS:
        args += ["-e", f]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [{f: [x for x in v.split("|") if x] for f, v in zip(FIELDS, line.split("\t"),
                                                              strict=True)}
            for line in out.splitlines() if line]


def _ts(row: dict[str, list[str]]) -> float:
    return float(row["frame.time_epoch"][0])


def _from_client(row: dict[str, list[str]], port: int) -> bool:
    return int(row["udp.dstport"][0]) == port


def _ep(port: int) -> str:
    return f"127.0.0.1:{port}"


def _quic(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in doc["connections"] if c.get("transport") == "udp"]


# -- Retry ---------------------------------------------------------------------------------

@KEYS
def test_retry_one_connection_rtt_to_the_retry(scenario: Callable[[str], dict[str, Any]],
                                               keys: bool) -> None:
    sc = scenario("retry")
    (conn,) = _quic(_report(sc, keys))
    rows = _frames(sc)
    port = sc["port"]
    q = conn["quic"]
    retries = [r for r in rows if not _from_client(r, port)
               and "3" in r["quic.long.packet_type"]]
    (retry,) = retries  # tshark: one Retry (v1 long packet type 3)
    assert q["retry"] is True and q["packets"]["retry"] == 1
    first = rows[0]
    assert _from_client(first, port) and first["quic.long.packet_type"][0] == "0"
    assert conn["ts"] == pytest.approx(_ts(first), abs=1e-6)
    want = (_ts(retry) - _ts(first)) * 1e3
    assert conn["handshake_rtt_ms"] == pytest.approx(want, abs=RTT_TOLERANCE_MS)
    # the client's second Initial goes to the Retry's Source Connection ID: same connection
    again = next(r for r in rows[rows.index(retry):] if _from_client(r, port))
    assert again["quic.dcid"][0] == retry["quic.scid"][0]
    assert retry["quic.scid"][0] in q["connection_ids"]["server"]
    assert q["client_endpoints"] == [_ep(sc["connections"][0]["local_ports"][0])]
    assert conn["packets"] == len(rows)  # every datagram of the capture is this one's
    assert len({r["quic.connection.number"][0] for r in rows}) == 1
    # the client restarted its handshake: the ClientHello of its key log (the one that
    # completed) is not the first Initial's
    assert first["tls.handshake.random"] and first["tls.handshake.random"][0] != (
        sc["connections"][0]["client_random"])
    print(f"retry: handshake_rtt_ms netdiag {conn['handshake_rtt_ms']}, tshark {want:.3f}")


def test_retry_request_decoded_with_keys(scenario: Callable[[str], dict[str, Any]]) -> None:
    sc = scenario("retry")
    (conn,) = _quic(_report(sc, True))
    (want,) = sc["connections"][0]["requests"]
    assert conn["tls"]["decrypted"] is True
    assert conn["quic"]["undecrypted"] == 0
    assert [(r["path"], r["status"], r["stream_id"]) for r in conn["requests"]] == [
        (want["path"], 200, want["stream_id"])]
    _request_at_its_packet(sc, conn, want)
    # the handshake still starts at the first Initial, before the Retry
    assert conn["ts"] == pytest.approx(_ts(_frames(sc)[0]), abs=1e-6)


def _request_at_its_packet(sc: dict[str, Any], conn: dict[str, Any],
                           want: dict[str, Any]) -> None:
    """The decoded request after a restarted handshake: its ``ts`` is a client 1-RTT
    frame of tshark's, just after the client sent it (its own clock), and the keyless
    estimate's; the ClientHello read is the restarted one (its SNI and ALPN). tshark
    4.0 itself does not decrypt past a Retry or Version Negotiation (it keeps the first
    Initial's keys), so it cannot show the request stream."""
    (req,) = conn["requests"]
    rows = _frames(sc)
    (frame,) = [r for r in rows if abs(_ts(r) - req["ts"]) < 1e-6]
    assert _from_client(frame, sc["port"]) and not frame["quic.long.packet_type"]
    sent = want["sent_ns"] / 1e9
    # the client's clock brackets its request: read before aioquic queues the stream,
    # and the response's first byte after (under load the datagram can leave several
    # ms after the send call, so no fixed delay bounds it)
    assert sent - 2e-4 <= req["ts"] < want["first_ns"] / 1e9
    (keyless,) = _quic(_report(sc, False))
    estimates_cover(keyless["requests"], [req["ts"]], keyless["ts"])
    assert keyless["tls"]["handshake_ms"] == conn["tls"]["handshake_ms"]
    assert conn["tls"]["sni"] == "quic.test" and conn["tls"]["alpn_offered"] == ["h3"]
    assert conn["tls"]["alpn"] == "h3" and conn["protocol"] == "h3"
    print(f"{sc['scenario']}: request {req['path']} ts netdiag {req['ts']:.6f}, tshark "
          f"frame {frame['frame.number'][0]} {_ts(frame):.6f}, client sent {sent:.6f}; "
          f"ttfb_ms {req['ttfb_ms']}, handshake_ms {conn['tls']['handshake_ms']}")


# -- 0-RTT ---------------------------------------------------------------------------------

@KEYS
def test_zero_rtt_attempt_and_acceptance(scenario: Callable[[str], dict[str, Any]],
                                         keys: bool) -> None:
    sc = scenario("zero_rtt")
    first, resumed = sc["connections"]
    assert resumed["session_resumed"] and resumed["early_data_accepted"]
    # the client sent its request before its handshake ended
    assert resumed["requests"][0]["sent_ns"] < resumed["handshake_ns"]
    keylog = sc["keys"].read_text()
    assert f"CLIENT_EARLY_TRAFFIC_SECRET {resumed['client_random']} " in keylog
    conns = _quic(_report(sc, keys))
    assert [c["client"] for c in conns] == [_ep(first["local_ports"][0]),
                                           _ep(resumed["local_ports"][0])]
    rows = _frames(sc)
    port = sc["port"]
    for rec, conn in zip(sc["connections"], conns, strict=True):
        mine = [r for r in rows if rec["local_ports"][0] in (int(r["udp.srcport"][0]),
                                                             int(r["udp.dstport"][0]))]
        zero = sum(r["quic.long.packet_type"].count("1") for r in mine
                   if _from_client(r, port))
        z = conn["quic"]["zero_rtt"]
        assert z["packets"] == zero
        assert conn["quic"]["packets"].get("0rtt", 0) == zero
        if rec is first:
            assert zero == 0 and z == {"attempted": False, "accepted": False, "packets": 0}
        else:
            assert zero > 0 and z["attempted"] is True
            # accepted only seen in EncryptedExtensions: with keys, as the client saw it
            assert z["accepted"] is (rec["early_data_accepted"] if keys else None)
        print(f"zero_rtt {conn['id']}: packets netdiag {z['packets']}, tshark {zero}; "
              f"accepted {z['accepted']}")
    summary = _report(sc, keys)["summary"]["quic"]
    assert summary["zero_rtt_attempted"] == 1


def test_zero_rtt_request_decoded_at_its_packet(
        scenario: Callable[[str], dict[str, Any]]) -> None:
    sc = scenario("zero_rtt")
    resumed = sc["connections"][1]
    (want,) = resumed["requests"]
    conn = _quic(_report(sc, True))[1]
    (req,) = conn["requests"]
    assert (req["path"], req["status"], req["stream_id"]) == (want["path"], 200,
                                                              want["stream_id"])
    # tshark, decrypting: the 0-RTT packet that carries the request stream
    rows = _frames(sc, keys=True)
    cport = resumed["local_ports"][0]
    carrying = [r for r in rows if int(r["udp.srcport"][0]) == cport
                and "1" in r["quic.long.packet_type"]
                and str(want["stream_id"]) in r["quic.stream.stream_id"]]
    assert carrying, "tshark saw no 0-RTT packet with the request stream"
    assert req["ts"] == pytest.approx(_ts(carrying[0]), abs=1e-6)
    assert want["sent_ns"] / 1e9 <= req["ts"] + 2e-4
    assert req["ts"] < resumed["handshake_ns"] / 1e9
    print(f"zero_rtt request ts {req['ts']:.6f}, tshark 0-RTT frame {_ts(carrying[0]):.6f}")


# -- migration -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["migration", "rebinding"])
def test_migration_one_connection_two_endpoints(scenario: Callable[[str], dict[str, Any]],
                                                name: str) -> None:
    sc = scenario(name)
    (rec,) = sc["connections"]
    p1, p2 = rec["local_ports"]
    (conn,) = _quic(_report(sc, True))
    q = conn["quic"]
    assert q["migrations"] == 1
    assert q["client_endpoints"] == [_ep(p1), _ep(p2)]
    rows = _frames(sc, keys=True)
    port = sc["port"]
    # tshark: one connection; the client endpoints in order of appearance
    assert {r["quic.connection.number"][0] for r in rows} == {"0"}
    seen: list[str] = []
    by_cid: dict[str, set[int]] = {}
    for r in rows:
        if _from_client(r, port):
            src = int(r["udp.srcport"][0])
            if _ep(src) not in seen:
                seen.append(_ep(src))
            for cid in set(r["quic.dcid"]):
                by_cid.setdefault(cid, set()).add(src)
    assert seen == q["client_endpoints"]
    assert conn["packets"] == len(rows)
    # the server's ids the client used (its record) are netdiag's, and tshark saw them
    # from the endpoints the client used them on
    server_ids = q["connection_ids"]["server"]
    used = rec["peer_cids_used"]
    assert set(used) <= set(server_ids)
    assert set(rec["host_cids"]) <= set(q["connection_ids"]["client"])
    if name == "migration":
        old, new = used
        assert old != new and by_cid[new] == {p2} and p1 in by_cid[old]
    else:
        (cid,) = used
        assert by_cid[cid] >= {p1, p2}
    # both requests, each at the first packet of its stream (tshark, decrypting)
    got = {r["path"]: r for r in conn["requests"]}
    assert sorted(got) == sorted(x["path"] for x in rec["requests"])
    for want in rec["requests"]:
        req = got[want["path"]]
        assert (req["stream_id"], req["status"]) == (want["stream_id"], 200)
        first = next(r for r in rows if _from_client(r, port)
                     and int(r["udp.srcport"][0]) == want["local_port"]
                     and str(want["stream_id"]) in r["quic.stream.stream_id"])
        assert req["ts"] == pytest.approx(_ts(first), abs=1e-6)
    print(f"{name}: endpoints {q['client_endpoints']}; tshark dcid -> ports "
          f"{ {k: sorted(v) for k, v in by_cid.items()} }")


def test_rebinding_without_keys(scenario: Callable[[str], dict[str, Any]]) -> None:
    """A NAT rebinding keeps the connection id: found without keys."""
    sc = scenario("rebinding")
    (rec,) = sc["connections"]
    (conn,) = _quic(_report(sc, False))
    q = conn["quic"]
    assert q["migrations"] == 1
    assert q["client_endpoints"] == [_ep(p) for p in rec["local_ports"]]
    assert conn["packets"] == len(_frames(sc))
    # the requests are estimated from packet sizes, at the times the keys show
    (keyed,) = _quic(_report(sc, True))
    estimates_cover(conn["requests"], [r["ts"] for r in keyed["requests"]], conn["ts"])


def test_migration_to_a_new_connection_id_without_keys(
        scenario: Callable[[str], dict[str, Any]]) -> None:
    """With a new connection id (announced in encrypted NEW_CONNECTION_ID frames) the new
    path cannot be linked without keys (RFC 9000 section 9.5): netdiag keeps the first
    path only, its packet count says what it attributed, and one warning counts the new
    path's packets (short headers to or from the server whose connection id matches no
    connection)."""
    sc = scenario("migration")
    (rec,) = sc["connections"]
    doc = _report(sc, False)
    (conn,) = _quic(doc)
    q = conn["quic"]
    assert q["migrations"] == 0 and q["client_endpoints"] == [_ep(rec["local_ports"][0])]
    p1, p2 = rec["local_ports"]
    rows = _frames(sc)
    first_path = [r for r in rows if p1 in (int(r["udp.srcport"][0]),
                                            int(r["udp.dstport"][0]))]
    assert conn["packets"] == len(first_path)
    assert len(first_path) == len(rows)  # tshark without keys does not link it either
    # tshark, decrypting, follows the connection to the new path: those packets
    keyed_rows = _frames(sc, keys=True)
    new_path = [r for r in keyed_rows if p2 in (int(r["udp.srcport"][0]),
                                                int(r["udp.dstport"][0]))]
    assert new_path and len(first_path) + len(new_path) == len(keyed_rows)
    assert all(not r["quic.long.packet_type"] for r in new_path)  # short headers only
    server = _ep(sc["port"])
    stray = [m["message"] for m in doc["capture"]["warnings"] if m["kind"] == "quic"
             and "match no connection id seen" in m["message"]]
    assert stray == [f"{conn['id']} {conn['client']} -> {server}: {len(new_path)} QUIC "
                     f"packets to or from {server} match no connection id seen (a migration "
                     "to a new connection id, invisible without keys, or a connection that "
                     "started before the capture)"]
    # with keys the new path is followed (NEW_CONNECTION_ID): no such warning
    keyed = _report(sc, True)
    assert not [m for m in keyed["capture"]["warnings"]
                if "match no connection id" in m["message"]]
    print(f"migration without keys: {len(new_path)} packets of the new path (tshark), "
          f"warning: {stray[0]}")


# -- Version Negotiation -------------------------------------------------------------------

def _vn_check(sc: dict[str, Any], conn: dict[str, Any]) -> None:
    rows = _frames(sc)
    port = sc["port"]
    first = rows[0]
    assert _from_client(first, port)
    (vn,) = [r for r in rows if r["quic.version"][:1] == ["0x00000000"]]
    assert not _from_client(vn, port)
    offered = [str(int(v, 16)) for v in vn["quic.supported_version"]]
    q = conn["quic"]
    assert q["version_negotiation"] == offered == ["1"]
    assert q["packets"]["version_negotiation"] == 1
    assert q["version"] == "1"
    assert conn["ts"] == pytest.approx(_ts(first), abs=1e-6)
    want = (_ts(vn) - _ts(first)) * 1e3
    assert conn["handshake_rtt_ms"] == pytest.approx(want, abs=RTT_TOLERANCE_MS)
    assert conn["packets"] == len(rows)
    print(f"{sc['scenario']}: handshake_rtt_ms netdiag {conn['handshake_rtt_ms']}, "
          f"tshark VN {want:.3f}")


@KEYS
def test_version_negotiation_from_v2(scenario: Callable[[str], dict[str, Any]],
                                     keys: bool) -> None:
    sc = scenario("vn_v2")
    assert sc["connections"][0]["version"] == 1
    (conn,) = _quic(_report(sc, keys))
    _vn_check(sc, conn)
    rows = _frames(sc)
    # the v1 Initial after the VN keeps the v2 Initial's Destination Connection ID, and
    # carries a new ClientHello (the key log's random is not the first Initial's)
    v1 = next(r for r in rows if r["quic.version"][:1] == ["0x00000001"])
    assert v1["quic.dcid"][0] == rows[0]["quic.dcid"][0]
    assert rows[0]["tls.handshake.random"][0] != sc["connections"][0]["client_random"]


def test_version_negotiation_from_v2_request_with_keys(
        scenario: Callable[[str], dict[str, Any]]) -> None:
    sc = scenario("vn_v2")
    (conn,) = _quic(_report(sc, True))
    (want,) = sc["connections"][0]["requests"]
    assert conn["tls"]["decrypted"] is True and conn["quic"]["undecrypted"] == 0
    assert [r["path"] for r in conn["requests"]] == [want["path"]]
    _request_at_its_packet(sc, conn, want)
    assert conn["quic"]["version"] == "1"


@KEYS
def test_version_negotiation_from_an_unknown_version(
        scenario: Callable[[str], dict[str, Any]], keys: bool) -> None:
    sc = scenario("vn_unknown")
    assert sc["port"] == 4433
    (conn,) = _quic(_report(sc, keys))
    _vn_check(sc, conn)
    # the client's v1 Initial (same Destination Connection ID) continues the connection
    rows = _frames(sc)
    assert rows[0]["quic.version"][0] == "0x1a2a3a4a"
    v1 = next(r for r in rows if r["quic.version"][:1] == ["0x00000001"])
    assert v1["quic.dcid"][0] == rows[0]["quic.dcid"][0]
    assert conn["quic"]["packets"]["initial"] == sum(
        r["quic.long.packet_type"].count("0") for r in rows)  # the unknown one included
    if keys:
        (want,) = sc["connections"][0]["requests"]
        assert conn["tls"]["decrypted"] is True
        assert conn["quic"]["undecrypted"] == 0  # the 0x1a2a3a4a packet is not counted
        _request_at_its_packet(sc, conn, want)
