"""Attribution: profile matches, inferred paths with their evidence, never a silent guess."""

from __future__ import annotations

from paths_synth import PROFILE, conn, dpf_request, req, roc_request

from netdiag.paths.attribute import attribute
from netdiag.paths.profile import parse_profile
from netdiag.records import Connection


def _lab(k: int = 4) -> list[Connection]:
    out: list[Connection] = []
    for i in range(k):
        out += roc_request(i * 100, 1 + 4 * i)
    out += [dpf_request(1000 + i * 100, 100 + i) for i in range(k)]
    return out


def test_profile_attributes_every_hop() -> None:
    conns = _lab()
    attribute(conns, parse_profile(PROFILE, "p.toml"))
    got = {(c.server, c.path["name"], c.path["hop"], c.path["inferred"])  # type: ignore[index]
           for c in conns}
    assert got == {("127.0.0.10:443", "ROC", "edge", False),
                   ("127.0.0.11:8080", "ROC", "router", False),
                   ("127.0.0.12:6379", "ROC", "token-store", False),
                   ("127.0.0.21:443", "ROC", "origin", False),
                   ("127.0.0.31:443", "DPF", "origin", False)}
    assert conns[0].path is not None
    assert conns[0].path["evidence"][0] == (
        "server 127.0.0.10:443 matches ROC.edge (127.0.0.10/32)")
    assert conns[0].path["evidence"][2] == "sni api.roc.test matches api.roc.test"


def test_without_profile_paths_are_inferred_with_evidence() -> None:
    conns = _lab()
    attribute(conns, None)
    by = {c.id: c.path for c in conns}
    edge, router, redis, origin = by["C1"], by["C2"], by["C3"], by["C4"]
    assert edge == {"name": "via 127.0.0.10:443", "hop": "edge", "inferred": True,
                    "evidence": [
                        "4 of 4 requests to 127.0.0.10:443 contained upstream "
                        "requests (sent from 127.0.0.10)",
                        "no captured request caused the requests on it: 127.0.0.10:443 is "
                        "the client-facing hop"]}
    assert router is not None and (router["name"], router["hop"]) == ("via 127.0.0.10:443",
                                                                      "proxy")
    assert router["evidence"] == [
        "1 of 1 requests on it were sent from 127.0.0.10 while it served requests of C1 "
        "(via 127.0.0.10:443, edge); linked by time containment; sent from 127.0.0.10, "
        "where 127.0.0.10:443 listens",
        "4 of 4 requests to 127.0.0.10:443 contained upstream requests (sent from "
        "127.0.0.10)"]
    assert redis is not None and redis["hop"] == "store"
    assert origin is not None and origin["hop"] == "origin"
    assert "4 of 4 requests to 127.0.0.11:8080 contained upstream requests (sent from " \
           "127.0.0.11)" in origin["evidence"]
    dpf = by["C100"]
    assert dpf == {"name": "direct 127.0.0.31:443", "hop": "origin", "inferred": True,
                   "evidence": [
                       "no captured request caused the requests on it, and none of the "
                       "requests to 127.0.0.31:443 contained requests to another server "
                       "from 127.0.0.31 or in steady timing"]}


def test_too_few_requests_is_not_a_proxy_and_says_so() -> None:
    conns = roc_request(0, 1) + roc_request(100, 5)  # 2 requests: below the 3 needed
    attribute(conns, None)
    edge = conns[0].path
    assert edge is not None and edge["name"] == "direct 127.0.0.10:443"
    assert "2 of 2 requests to 127.0.0.10:443 contained upstream requests (sent from " \
           "127.0.0.10) (not taken for a proxy: that needs 80% of at least 3 requests" \
           in edge["evidence"][0]
    # upstream connections are then client-facing in their own right, never guessed
    assert conns[1].path is not None and conns[1].path["name"] == "direct 127.0.0.11:8080"


def test_unmatched_hop_under_a_profile_path_is_inferred() -> None:
    text = PROFILE.replace('[[path.rule]]\nhop = "token-store"\nserver = ["127.0.0.12/32"]'
                           '\nport = [6379]\n', "")
    conns = _lab()
    attribute(conns, parse_profile(text))
    redis = conns[2].path
    assert redis is not None
    assert (redis["name"], redis["hop"], redis["inferred"]) == ("ROC", "store", True)
    assert redis["evidence"][0] == "no rule of the profile matches"
    assert redis["evidence"][1].startswith("1 of 1 requests on it were sent from 127.0.0.11 "
                                           "while it served requests of C2 (ROC, router)")


def test_request_id_links_make_a_proxy_without_consistency() -> None:
    client = conn("C1", "127.0.0.1:5000", "127.0.0.1:443", [req(0, 30, rid="a")])
    up = conn("C2", "127.0.0.5:5001", "127.0.0.1:8080", [req(5, 25, rid="a")])
    attribute([client, up], None)
    assert client.path is not None and client.path["name"] == "via 127.0.0.1:443"
    assert up.path is not None and up.path["hop"] == "origin"
    assert up.path["evidence"][0].endswith("linked by the same request id")


def test_connections_without_requests() -> None:
    conns = _lab()
    idle = conn("C90", "127.0.0.2:49999", "127.0.0.10:443", [], syn=5, ack=5.1)
    failed = conn("C91", "127.0.0.9:49999", "127.0.0.99:443", [], syn=5, ack=5.1)
    dns = conn("C92", "127.0.0.2:5353", "127.0.0.53:53", [], protocol="dns")
    attribute([*conns, idle, failed, dns], None)
    assert idle.path is not None and idle.path["name"] == "via 127.0.0.10:443"
    assert idle.path["evidence"] == [
        "no request seen on it; C1 from the same client address to the same server "
        "127.0.0.10:443 is on via 127.0.0.10:443 (edge)"]
    assert failed.path is None and dns.path is None


def test_attribute_replaces_previous_paths() -> None:
    conns = _lab()
    attribute(conns, parse_profile(PROFILE))
    attribute(conns, None)
    assert all(c.path is not None and c.path["inferred"] for c in conns)


def test_a_shared_upstream_connection_names_the_other_paths_by_count() -> None:
    """One pooled upstream connection serves three client-facing proxies (linked by
    request id): it goes on the path that caused most of its requests, and its evidence
    names the others, most requests first, then in the order first seen."""
    edges = {
        "A": conn("C1", "127.0.0.1:5000", "127.0.0.10:443",
                  [req(0, 40, rid="a1"), req(100, 140, rid="a2")]),
        "C": conn("C2", "127.0.0.1:5001", "127.0.0.30:443", [req(200, 240, rid="c1")]),
        "B": conn("C3", "127.0.0.1:5002", "127.0.0.20:443", [req(300, 340, rid="b1")]),
    }
    shared = conn("C4", "127.0.0.50:6000", "127.0.0.60:8080", [
        req(5, 30, rid="a1"), req(105, 130, rid="a2"), req(205, 230, rid="c1"),
        req(305, 330, rid="b1")])
    attribute([*edges.values(), shared], None)
    assert shared.path is not None
    assert shared.path["name"] == "via 127.0.0.10:443"
    assert shared.path["evidence"][-1] == (
        "requests of other paths caused some of its requests too: "
        "via 127.0.0.30:443 1, via 127.0.0.20:443 1")
