"""Equal facts of different connections kept once (netdiag.shared_facts): on a real
capture the records share them and the report is unchanged; hostile facts neither
raise nor grow the table past its cap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from netdiag import shared_facts
from netdiag.pipeline import Options, analyze
from netdiag.records import Connection, TlsInfo
from netdiag.report.records_out import CollectingSink, JsonlSink
from netdiag.shared_facts import SHARED_FACTS_MAX, FactSharer

ANTHO = Path(__file__).resolve().parents[1] / "captures" / "antho.pcapng"


def _records() -> tuple[CollectingSink, Any]:
    sink = CollectingSink()
    result = analyze([str(ANTHO)], sink, Options(jobs=1))
    return sink, result


def _groups(values: list[Any]) -> list[list[Any]]:
    """The values grouped by equality (in first-seen order)."""
    groups: list[list[Any]] = []
    for v in values:
        for g in groups:
            if g[0] == v:
                g.append(v)
                break
        else:
            groups.append([v])
    return groups


def test_equal_facts_are_one_object_on_a_real_capture() -> None:
    sink, _ = _records()
    conns = sink.connections
    settings = [c.http2["settings"] for c in conns if c.http2 is not None]
    certs = [c.tls.certificate for c in conns
             if c.tls is not None and c.tls.certificate is not None]
    alpns = [c.tls.alpn_offered for c in conns if c.tls is not None and c.tls.alpn_offered]
    for name, values in (("settings", settings), ("certificate", certs), ("alpn", alpns)):
        groups = _groups(values)
        assert any(len(g) > 1 for g in groups), f"the capture repeats no {name}"
        for g in groups:
            assert all(v is g[0] for v in g), f"equal {name} facts are separate objects"
        assert len({id(g[0]) for g in groups}) == len(groups)


def test_the_report_is_the_same_without_sharing(monkeypatch: pytest.MonkeyPatch) -> None:
    sink, result = _records()
    shared = json.dumps(sink.document(result), sort_keys=False)
    monkeypatch.setattr(FactSharer, "connection", lambda self, conn: None)
    sink2, result2 = _records()
    own = json.dumps(sink2.document(result2), sort_keys=False)
    assert shared == own
    settings = [c.http2["settings"] for c in sink2.connections if c.http2 is not None]
    assert len({id(s) for s in settings}) == len(settings)  # the check above can fail


def test_a_streaming_sink_shares_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(FactSharer, "connection", lambda self, conn: calls.append(conn.id))

    class Out:
        def write(self, s: str) -> int:
            return len(s)

        def flush(self) -> None:
            pass

    analyze([str(ANTHO)], JsonlSink(Out()), Options(jobs=1))  # type: ignore[arg-type]
    assert calls == []
    analyze([str(ANTHO)], CollectingSink(), Options(jobs=1))
    assert calls


def _conn(i: int, certificate: dict[str, Any] | None, alpn: list[str]) -> Connection:
    tls = TlsInfo(version="TLS 1.3", sni="x.test", alpn_offered=alpn, certificate=certificate)
    return Connection(id=f"C{i}", ts_ns=i, client=f"10.0.0.1:{1000 + i}",
                      server="10.0.0.2:443", tls=tls,
                      http2={"settings": {"client": {"A": 1}, "server": {"B": i % 2}}})


def test_unhashable_facts_stay_their_own() -> None:
    sharer = FactSharer()
    a = _conn(1, {"subject": "CN=x", "san": ["x", "y"]}, ["h2"])
    b = _conn(2, {"subject": "CN=x", "san": ["x", "y"]}, ["h2"])
    sharer.connection(a)
    sharer.connection(b)
    assert a.tls is not None and b.tls is not None
    assert a.tls.certificate == b.tls.certificate
    assert a.tls.certificate is not b.tls.certificate
    assert a.tls.alpn_offered is b.tls.alpn_offered


def test_settings_in_another_order_are_not_shared() -> None:
    sharer = FactSharer()
    a = _conn(1, None, [])
    b = _conn(3, None, [])
    assert b.http2 is not None
    b.http2["settings"] = {"server": {"B": 1}, "client": {"A": 1}}
    sharer.connection(a)
    sharer.connection(b)
    assert a.http2 is not None
    assert list(b.http2["settings"]) == ["server", "client"]
    assert a.http2["settings"] is not b.http2["settings"]


def test_the_table_stops_at_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_facts, "SHARED_FACTS_MAX", 8)
    sharer = FactSharer()
    conns = [_conn(i, {"subject": f"CN={i}"}, [f"p{i}"]) for i in range(20)]
    for c in conns:
        sharer.connection(c)
    assert len(sharer) == 8
    again = _conn(99, {"subject": "CN=19"}, ["p19"])
    sharer.connection(again)
    assert again.tls is not None and again.tls.certificate == {"subject": "CN=19"}
    assert SHARED_FACTS_MAX >= 1024
