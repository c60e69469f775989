"""HAR 1.2 export: valid against the spec's schema, one entry per HTTP request, timings
that add up and sit where the packets put them."""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
from report_docs import host, lab_http_requests, lab_tls_requests, ledger

from netdiag.report.har import ESTIMATED_COMMENT, attribute_dns, build_har

SCHEMA = json.loads((Path(__file__).parent / "har12.schema.json").read_text())
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)
PHASES = ("blocked", "dns", "connect", "send", "wait", "receive")


def validate(har: dict[str, Any]) -> None:
    errors = sorted(VALIDATOR.iter_errors(har), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])


def http_requests(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(c, r) for c in doc["connections"] for r in c["requests"]
            if r.get("protocol") != "resp"]


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def own_lookups(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Connection id -> the answered lookups it may have waited for: a connection is the
    first from its client address to a server address that a lookup from that client
    answered (a later one, like the resumed ROC connection, uses the cached answer; the
    router reaches its origins and the edge its router by address, without DNS)."""
    answered = [d for d in doc["dns"] if d["answers"]]
    first: dict[tuple[str, str], dict[str, Any]] = {}
    for c in sorted(doc["connections"], key=lambda c: c["ts"]):
        first.setdefault((host(c["client"]), host(c["server"])), c)
    out = {}
    for (client, server), c in first.items():
        lookups = [d for d in answered
                   if host(d["client"]) == client and server in d["answers"]]
        if lookups:
            out[c["id"]] = lookups
    return out


def test_schema_is_a_valid_draft7_schema() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("fixture", ["doc_keys", "doc_nokeys"])
def test_har_is_valid_and_has_one_entry_per_request(fixture: str,
                                                    request: pytest.FixtureRequest) -> None:
    doc = request.getfixturevalue(fixture)
    har = build_har(doc)
    json.dumps(har, allow_nan=False)           # serialisable as strict JSON
    validate(har)
    log = har["log"]
    assert log["version"] == "1.2"
    assert log["creator"] == {"name": "netdiag", "version": doc["netdiag_version"],
                              "comment": "report contract 1"}
    # every HTTP request the lab made (Redis commands are not HTTP), found with or
    # without keys
    assert len(log["entries"]) == len(http_requests(doc)) == lab_http_requests()
    assert [p["id"] for p in log["pages"]] == ["capture"]
    assert all(e["pageref"] == "capture" for e in log["entries"])
    starts = [epoch(e["startedDateTime"]) for e in log["entries"]]
    assert starts == sorted(starts)


@pytest.mark.parametrize("fixture", ["doc_keys", "doc_nokeys"])
def test_timings_add_up_and_end_at_the_last_byte(fixture: str,
                                                 request: pytest.FixtureRequest) -> None:
    doc = request.getfixturevalue(fixture)
    ttlb = {(c["id"], r["ts"]): r["ttlb_ms"] for c, r in http_requests(doc)}
    for e in build_har(doc)["log"]["entries"]:
        t = e["timings"]
        assert min(t["send"], t["wait"], t["receive"]) >= 0
        for k in ("blocked", "dns", "connect", "ssl"):
            assert t[k] == -1 or t[k] >= 0
        total = sum(t[k] for k in PHASES if t[k] >= 0)
        assert e["time"] == pytest.approx(total, abs=0.002)
        if t["ssl"] >= 0:
            assert t["connect"] >= t["ssl"]
        # the entry ends where the response's last byte is
        nd = e["_netdiag"]
        end = epoch(e["startedDateTime"]) + e["time"] / 1000
        expected = nd["request_ts"] + ttlb[(nd["connection"], nd["request_ts"])] / 1000
        assert end == pytest.approx(expected, abs=5e-6)


def test_first_request_pays_for_the_connection_later_ones_do_not(
        doc_keys: dict[str, Any]) -> None:
    conns = {c["id"]: c for c in doc_keys["connections"]}
    lookups = own_lookups(doc_keys)
    entries = build_har(doc_keys)["log"]["entries"]
    by_conn: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_conn.setdefault(e["connection"], []).append(e)
    assert set(by_conn) == {c["id"] for c in doc_keys["connections"]
                            if any(r["protocol"] != "resp" for r in c["requests"])}
    assert any(conns[cid]["tls"] is None for cid in by_conn)         # h2c is there too
    for cid, es in by_conn.items():
        c = conns[cid]
        first, rest = es[0], es[1:]
        t = first["timings"]
        rtt = c["handshake_rtt_ms"]
        if c["tls"]:
            tls = c["tls"]["handshake_ms"]
            assert t["connect"] == pytest.approx(rtt + tls, abs=0.002)
            assert t["ssl"] == pytest.approx(tls, abs=0.001)
        else:                                  # cleartext (h2c): no TLS to pay for
            assert t["connect"] == pytest.approx(rtt, abs=0.001)
            assert t["ssl"] == -1
        # a connection preceded by its own lookup pays for it, the others have no DNS
        if cid in lookups:
            assert any(t["dns"] == pytest.approx(d["latency_ms"], abs=0.001)
                       for d in lookups[cid])
            assert first["_netdiag"]["dns"]["qname"] == c["tls"]["sni"]
        else:
            assert t["dns"] == -1 and "dns" not in first["_netdiag"]
        assert t["blocked"] >= 0
        assert first["_netdiag"]["reused_connection"] is False
        for e in rest:
            assert all(e["timings"][k] == -1 for k in ("blocked", "dns", "connect", "ssl"))
            assert e["_netdiag"]["reused_connection"] is True
            assert epoch(e["startedDateTime"]) == pytest.approx(e["_netdiag"]["request_ts"],
                                                                abs=2e-6)
    # every answered lookup of the lab was paid for by the connection it was made for
    paid = [e for e in entries if e["timings"]["dns"] >= 0]
    lg = ledger()
    assert len(paid) == len(lookups) == lg["dns_queries"] - lg["dns_nxdomain"]


def test_each_dns_lookup_is_given_to_one_connection(doc_keys: dict[str, Any]) -> None:
    given = attribute_dns(doc_keys)
    ids = [id(d) for d in given.values()]
    assert len(ids) == len(set(ids))
    # each answered lookup went to the connection it was made for (the first from its
    # client to the answered address); DNS over TCP (to the resolver), the resumed
    # connection (cached answer) and the hops behind the edge got none
    lookups = own_lookups(doc_keys)
    assert set(given) == set(lookups)
    assert all(any(given[cid] is d for d in ds) for cid, ds in lookups.items())
    assert sorted(ids) == sorted(id(d) for d in doc_keys["dns"] if d["answers"])
    dns_tcp = {c["id"] for c in doc_keys["connections"] if c["protocol"] == "dns"}
    assert dns_tcp and not dns_tcp & set(given)


def test_decrypted_entries_carry_what_was_decoded(doc_keys: dict[str, Any]) -> None:
    lg = ledger()
    srv = lg["servers"]
    names = {srv["edge"]["name"]} | {o["name"] for o in srv["roc_origins"] + srv["dpf_origins"]}
    addresses = {host(srv["edge"]["address"]), host(srv["router"]["address"])} | {
        host(o["address"]) for o in srv["roc_origins"] + srv["dpf_origins"]}
    url_paths = {r["url_path"] for r in lg["request_log"]}
    conns = {c["id"]: c for c in doc_keys["connections"]}
    entries = build_har(doc_keys)["log"]["entries"]
    assert not any("comment" in e for e in entries)
    for e in entries:
        req, resp = e["request"], e["response"]
        c = conns[e["connection"]]
        url = urlsplit(req["url"])
        assert url.scheme == ("https" if c["tls"] else "http")    # h2c edge -> router
        assert url.hostname in names and url.path in url_paths and not url.query
        if c["tls"]:
            assert url.hostname == c["tls"]["sni"]
        assert req["method"] in ("GET", "POST")
        assert req["httpVersion"] == resp["httpVersion"] == "HTTP/2"
        names_sent = [h["name"] for h in req["headers"]]
        assert ":method" in names_sent and ":path" in names_sent
        assert resp["status"] == 200
        assert any(h["name"] == "content-type" for h in resp["headers"])
        assert e["serverIPAddress"] in addresses
        assert e["serverIPAddress"] == host(c["server"])
        assert e["_netdiag"]["stream_id"] % 2 == 1
        if req["method"] == "POST":
            assert req["bodySize"] > 0
    # each streamed answer, at every HTTP hop it crossed: DPF's at the origin, ROC's at
    # the edge, the router and the origin
    sse = [e for e in entries if e["request"]["url"].endswith("/v1/stream")]
    assert len(sse) == lg["paths"]["DPF"]["sse"] + 3 * lg["paths"]["ROC"]["sse"]
    assert len(sse) == doc_keys["summary"]["http"]["streaming"]["responses"]
    events = lg["params"]["sse_events"]
    for e in sse:
        assert e["response"]["content"]["mimeType"] == "text/event-stream"
        assert e["_netdiag"]["sse_events"] == events
        assert len(e["_netdiag"]["chunk_gaps_ms"]) == events - 1


def test_estimated_entries_say_so(doc_nokeys: dict[str, Any]) -> None:
    conns = {c["id"]: c for c in doc_nokeys["connections"]}
    har = build_har(doc_nokeys)
    entries = har["log"]["entries"]
    estimated = [e for e in entries if conns[e["connection"]]["tls"]]
    cleartext = [e for e in entries if not conns[e["connection"]]["tls"]]
    # every request inside TLS is estimated; the edge's h2c requests are still exact
    assert len(estimated) == lab_tls_requests()
    assert len(cleartext) == ledger()["edge"]["requests"]
    for e in estimated:
        assert e["comment"] == ESTIMATED_COMMENT
        assert e["_netdiag"]["estimated"] is True
        sni = conns[e["connection"]]["tls"]["sni"]
        assert e["request"]["url"] == f"https://{sni}/"
        assert e["response"]["status"] == 0
        assert e["response"]["bodySize"] == -1
    for e in cleartext:
        assert "comment" not in e and e["_netdiag"]["estimated"] is False
        assert e["request"]["url"].startswith("http://") and e["response"]["status"] == 200
    assert doc_nokeys["summary"]["http"]["estimated_requests"] == len(estimated)
    assert f"{len(estimated)} of {len(entries)} entries are estimated" in har["log"]["comment"]


def _synthetic() -> dict[str, Any]:
    base = {"retransmissions": 0, "resets": 0, "transport": "tcp", "handshake_seen": True}
    req = {"stream_id": None, "status": 200, "ttfb_ms": 10.0, "ttlb_ms": 12.0,
           "send_ms": 0.5, "estimated": False, "protocol": "http/1.1", "method": "GET",
           "authority": "shop.test:8080", "response_bytes": 5, "request_bytes": 0,
           "request_headers": None, "response_headers": None}
    return {
        "contract": 1, "netdiag_version": "0.1.0",
        "capture": {"files": ["x.pcap"], "first_ts": 100.0},
        "dns": [{"ts": 100.0, "client": "10.0.0.1:5000", "server": "10.0.0.53:53",
                 "qname": "shop.test", "qtype": "A", "answers": ["10.0.0.80"],
                 "latency_ms": 2.0}],
        "connections": [
            {**base, "id": "C1", "ts": 100.010, "client": "10.0.0.1:40000",
             "server": "10.0.0.80:8080", "handshake_rtt_ms": 1.0, "tls": None,
             "protocol": "http/1.1", "path": None,
             "requests": [{**req, "ts": 100.012, "path": "/search?q=a%20b&x=&y=1#frag"}]},
            {**base, "id": "C2", "ts": 100.500, "client": "10.0.0.1:40002",
             "server": "10.0.0.80:8080", "handshake_rtt_ms": 1.0, "tls": None,
             "protocol": "http/1.1", "path": None,
             "requests": [{**req, "ts": 100.502, "path": "/"}]},
            {**base, "id": "C3", "ts": 100.600, "client": "10.0.0.1:40004",
             "server": "10.0.0.90:6379", "handshake_rtt_ms": 1.0, "tls": None,
             "protocol": "resp", "path": None,
             "requests": [{**req, "ts": 100.601, "protocol": "resp", "method": "GET",
                           "path": "roc:budget:m", "authority": None}]},
        ],
        "findings": [], "summary": {},
    }


def test_cleartext_query_string_cached_lookup_and_redis() -> None:
    har = build_har(_synthetic())
    validate(har)
    entries = har["log"]["entries"]
    assert [e["connection"] for e in entries] == ["C1", "C2"]      # Redis left out
    first, second = entries
    assert first["request"]["url"] == "http://shop.test:8080/search?q=a%20b&x=&y=1"
    assert first["request"]["queryString"] == [
        {"name": "q", "value": "a b"}, {"name": "x", "value": ""},
        {"name": "y", "value": "1"}]
    assert first["request"]["httpVersion"] == "HTTP/1.1"
    t = first["timings"]
    assert (t["dns"], t["connect"], t["ssl"]) == (2.0, 1.0, -1)
    assert t["blocked"] == pytest.approx(12.0 - 2.0 - 1.0, abs=0.002)
    assert (t["send"], t["wait"], t["receive"]) == (0.5, 9.5, 2.0)
    assert first["startedDateTime"] == "1970-01-01T00:01:40.000000Z"
    # C2 reused the cached answer: a new connection, but no lookup of its own
    t2 = second["timings"]
    assert t2["dns"] == -1 and t2["connect"] == 1.0
    assert "dns" not in second["_netdiag"]


def test_connection_without_captured_handshake_has_no_setup() -> None:
    doc = _synthetic()
    c = doc["connections"][0]
    c["handshake_seen"] = False
    c["handshake_rtt_ms"] = None
    entries = {e["connection"]: e for e in build_har(doc)["log"]["entries"]}
    e = entries["C1"]
    assert all(e["timings"][k] == -1 for k in ("blocked", "dns", "connect", "ssl"))
    assert e["time"] == 12.0
    # the lookup goes to the next connection that could have used it
    assert entries["C2"]["timings"]["dns"] == 2.0


def test_response_before_request_end_keeps_phases_non_negative() -> None:
    doc = _synthetic()
    r = doc["connections"][1]["requests"][0]
    r.update(send_ms=15.0, ttfb_ms=10.0, ttlb_ms=12.0)       # early response
    e = build_har(doc)["log"]["entries"][1]
    assert (e["timings"]["send"], e["timings"]["wait"], e["timings"]["receive"]) == (
        15.0, 0.0, 0.0)
    validate(build_har(doc))


def test_missing_fields_still_make_a_valid_har() -> None:
    doc = {"connections": [{"id": "C1", "ts": 5.0, "server": "[2001:db8::1]:443",
                            "tls": {"sni": None},
                            "requests": [{"ts": 5.1}, {"ts": None}]}]}
    har = build_har(doc)
    validate(har)
    (e,) = har["log"]["entries"]
    assert e["request"]["url"] == "https://[2001:db8::1]/"
    assert e["serverIPAddress"] == "2001:db8::1"
    assert e["response"]["status"] == 0
    assert (e["timings"]["send"], e["timings"]["wait"], e["timings"]["receive"]) == (0, 0, 0)
    assert "pages" not in har["log"]


@pytest.mark.parametrize("breakage", [
    lambda e: e["timings"].__setitem__("wait", -1),
    lambda e: e["timings"].__delitem__("send"),
    lambda e: e["timings"].__setitem__("dns", -2),
    lambda e: e.__setitem__("netdiag", {}),
    lambda e: e["request"].__delitem__("headersSize"),
    lambda e: e["response"]["content"].__delitem__("mimeType"),
    lambda e: e.__setitem__("startedDateTime", "yesterday"),
])
def test_schema_rejects_what_the_spec_forbids(doc_keys: dict[str, Any], breakage: Any) -> None:
    har = build_har(doc_keys)
    broken = copy.deepcopy(har)
    breakage(broken["log"]["entries"][0])
    assert list(VALIDATOR.iter_errors(broken))


@pytest.mark.parametrize("fixture", ["doc_keys", "doc_nokeys"])
def test_a_lazy_document_gives_the_same_har(fixture: str,
                                           request: pytest.FixtureRequest) -> None:
    """``netdiag report --format har`` hands a document whose connections and DNS
    transactions are made as they are read (``Records``): the HAR, its DNS lookups
    included, is the plain document's."""
    from netdiag.report.json_out import Records

    doc = request.getfixturevalue(fixture)
    conns, dns = doc["connections"], doc["dns"]
    lazy = dict(doc, connections=Records(list(range(len(conns))),
                                         lambda i: copy.deepcopy(conns[i])),
                dns=Records(list(range(len(dns))), lambda i: copy.deepcopy(dns[i])))
    assert attribute_dns(lazy) == attribute_dns(doc)
    assert attribute_dns(doc)  # the check above compares lookups, not two empty maps
    assert build_har(lazy, warn=None) == build_har(doc, warn=None)


@pytest.mark.parametrize("fixture", ["doc_keys", "doc_nokeys", "no_request"])
def test_entries_kept_as_text_write_the_same_har(fixture: str,
                                                 request: pytest.FixtureRequest) -> None:
    """``netdiag report --format har`` keeps each entry as its JSON text until the HAR is
    written (``encode``): the file is byte for byte the one the entries' dicts give, and
    the log's counts (estimated entries) are the same."""
    import io

    from netdiag.report.json_encode import compact_encoder
    from netdiag.report.json_out import Encoded, write_json

    doc = (dict(request.getfixturevalue("doc_nokeys"), connections=[])
           if fixture == "no_request" else request.getfixturevalue(fixture))
    plain = build_har(doc, warn=None)
    as_text = build_har(doc, warn=None,
                        encode=compact_encoder(ensure_ascii=False, check_circular=False))
    assert isinstance(as_text["log"]["entries"], Encoded)
    assert len(as_text["log"]["entries"]) == len(plain["log"]["entries"])
    assert as_text["log"]["comment"] == plain["log"]["comment"]
    written = []
    for har in (plain, as_text):
        out = io.StringIO()
        write_json(har, out, ensure_ascii=False)
        written.append(out.getvalue())
    assert written[0] == written[1]
    assert json.loads(written[1]) == json.loads(json.dumps(plain))
    if fixture == "no_request":
        assert '"entries": []' in written[1]
