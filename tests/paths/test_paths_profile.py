"""Path profiles: parsing, every validation error with its line, matching."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from paths_synth import EDGE, PROFILE, conn, req

from netdiag.errors import InputError
from netdiag.paths.profile import hop_distance, load_profile, parse_profile, split_endpoint
from netdiag.records import Request

ROOT = Path(__file__).resolve().parents[2]

HEAD = 'version = 1\n[[path]]\nname = "A"\nhops = ["edge", "origin"]\n[[path.rule]]\n'
"""Lines 1-5; a rule's keys start on line 6."""


def test_parses_documented_example() -> None:
    text = (ROOT / "docs" / "profiles.md").read_text()
    block = text.split("```toml\n", 1)[1].split("```", 1)[0]
    p = parse_profile(block, "profiles.md")
    assert [x.name for x in p.paths] == ["ROC", "DPF"]
    roc = p.paths[0]
    assert roc.hops == ("edge", "router", "token-store", "origin")
    assert roc.origin_hop == "origin"
    r = roc.rules[0]
    assert r.hop == "edge" and r.port == (443,) and r.sni == ("api.roc.test",)
    assert r.server == (ipaddress.ip_network("127.0.0.10/32"),)
    # host bits set are accepted (127.0.0.30/28 is 127.0.0.16/28)
    assert p.paths[1].rules[0].server == (ipaddress.ip_network("127.0.0.16/28"),)
    assert r.line == 7


def test_every_key_and_single_values() -> None:
    p = parse_profile(HEAD + 'hop = "edge"\nserver = "10.0.0.0/8"\nport = 443\n'
                      'sni = "*.x.test"\nauthority = ["api.*"]\nalpn = "h2"\n'
                      'client = ["192.0.2.0/24", "2001:db8::/32"]\n'
                      'header = { server = "edge*", Via = ["a", "b"] }\nttl_hops = [0, 1]\n')
    r = p.paths[0].rules[0]
    assert r.port == (443,) and r.sni == ("*.x.test",) and r.alpn == ("h2",)
    assert len(r.client) == 2 and r.ttl_hops == (0, 1)
    assert r.header == (("server", ("edge*",)), ("via", ("a", "b")))
    assert r.conditions() == ["server", "port", "sni", "authority", "alpn", "client",
                              "header", "ttl_hops"]


def test_rule_without_hop_on_a_one_hop_path() -> None:
    p = parse_profile('version = 1\n[[path]]\nname = "D"\nhops = ["origin"]\n'
                      '[[path.rule]]\nserver = ["1.2.3.4"]\n')
    assert p.paths[0].rules[0].hop == "origin"


def test_empty_profile_has_no_paths() -> None:
    assert parse_profile("version = 1\n").paths == []


ERRORS = [
    # (text, line, words in the message)
    ("version = 1\nfoo = 2\n", 2, "unknown key 'foo'"),
    ("version = 2\n", 1, "version must be 1, not 2"),
    ('version = "1"\n', 1, 'version must be 1, not "1"'),
    ('[[path]]\nname = "A"\nhops = ["o"]\n', 1, "missing 'version = 1'"),
    ('version = 1\n[[path]]\nname = "A\n', 3, "invalid TOML"),
    ('version = 1\npath = 3\n', 2, "array of tables"),
    ('version = 1\n[[path]]\nhops = ["o"]\n', 2, "has no name"),
    ('version = 1\n[[path]]\nname = ""\nhops = ["o"]\n', 3, "non-empty string"),
    ('version = 1\n[[path]]\nname = "A"\n', 2, "has no hops"),
    ('version = 1\n[[path]]\nname = "A"\nhops = []\n', 4, "non-empty array"),
    ('version = 1\n[[path]]\nname = "A"\nhops = ["o", 3]\n', 4, "non-empty strings"),
    ('version = 1\n[[path]]\nname = "A"\nhops = ["o", "o"]\n', 4, "appears twice"),
    ('version = 1\n[[path]]\nname = "A"\nhops = ["o"]\nnmae = "x"\n', 5,
     "did you mean 'name'"),
    ('version = 1\n[[path]]\nname = "A"\nhops = ["o"]\n\n[[path]]\n# again\nname = "A"\n'
     'hops = ["o"]\n', 8, "duplicate path name 'A' (first defined on line 3)"),
    (HEAD + 'hop = "edge"\nsever = ["1.2.3.4"]\n', 7, "did you mean 'server'"),
    (HEAD + 'hop = "edge"\nserver = [\n  "10.0.0.0/8",\n  "300.1.1.1/32",\n]\n', 9,
     'bad CIDR "300.1.1.1/32" in server'),
    (HEAD + 'hop = "edge"\nclient = ["10.0.0.0/33"]\n', 7, 'bad CIDR "10.0.0.0/33" in client'),
    (HEAD + 'server = ["1.2.3.4"]\nhop = "router"\n', 7,
     "hop 'router' is not one of the hops of path 'A' (edge, origin)"),
    (HEAD + 'server = ["1.2.3.4"]\n', 5, "has no hop"),
    (HEAD + 'hop = 1\nserver = ["1.2.3.4"]\n', 6, "hop must be a string"),
    (HEAD + 'hop = "edge"\n', 5, "has no condition"),
    (HEAD + 'hop = "edge"\nsni = [1]\n', 7, "sni must be a glob string or an array of them, "
     "not an integer 1"),
    (HEAD + 'hop = "edge"\nauthority = [""]\n', 7, "empty glob in authority"),
    (HEAD + 'hop = "edge"\nalpn = true\n', 7, "not a boolean true"),
    (HEAD + 'hop = "edge"\nsni = []\n', 7, "must not be empty"),
    (HEAD + 'hop = "edge"\nheader = { server = 5 }\n', 7, "header server must be a glob"),
    (HEAD + 'hop = "edge"\nheader = "server"\n', 7, "header must be a non-empty table"),
    (HEAD + 'hop = "edge"\nport = [443, 70000]\n', 7, "port 70000 is out of range"),
    (HEAD + 'hop = "edge"\nport = ["443"]\n', 7, "port must be an integer"),
    (HEAD + 'hop = "edge"\nttl_hops = [1, 300]\n', 7, "ttl_hops 300 is out of range"),
    # an error in the second rule of the second path points into that rule
    ('version = 1\n[[path]]\nname = "A"\nhops = ["o"]\n[[path.rule]]\nalpn = "h2"\n'
     '[[path]]\nname = "B"\nhops = ["o"]\n[[path.rule]]\nalpn = "h2"\n[[path.rule]]\n'
     'alpn = "h2"\nport = 0\n', 14, "port 0 is out of range"),
]


@pytest.mark.parametrize(("text", "line", "words"), ERRORS)
def test_errors_name_file_and_line(text: str, line: int, words: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_profile(text, "p.toml")
    msg = str(exc.value)
    assert msg.startswith(f"p.toml:{line}: "), msg
    assert words in msg, msg


def test_load_profile_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read profile"):
        load_profile(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"version = 1\n\xff\n")
    with pytest.raises(InputError, match=r"bad.toml:2: not UTF-8"):
        load_profile(str(bad))
    good = tmp_path / "p.toml"
    good.write_text(PROFILE)
    assert load_profile(str(good)).source == str(good)


def _roc(**kw: object) -> object:
    return conn("C1", "127.0.0.2:40000", EDGE, [req(0, 10, authority="api.roc.test")],
                sni="api.roc.test", alpn="h2", **kw)  # type: ignore[arg-type]


def test_match_with_evidence() -> None:
    p = parse_profile(PROFILE, "p.toml")
    m = p.match(_roc())  # type: ignore[arg-type]
    assert m is not None and (m.path, m.hop) == ("ROC", "edge")
    assert m.evidence == ("server 127.0.0.10:443 matches ROC.edge (127.0.0.10/32)",
                          "port 443 matches 443", "sni api.roc.test matches api.roc.test")
    assert m.to_path() == {"name": "ROC", "hop": "edge", "evidence": list(m.evidence),
                           "inferred": False}


def test_all_keys_must_match_and_first_path_wins() -> None:
    text = ('version = 1\n[[path]]\nname = "A"\nhops = ["o"]\n[[path.rule]]\n'
            'server = ["127.0.0.10/32"]\nsni = ["*.other.test"]\n'
            '[[path]]\nname = "B"\nhops = ["o"]\n[[path.rule]]\nsni = ["*.roc.test"]\n'
            '[[path]]\nname = "C"\nhops = ["o"]\n[[path.rule]]\nsni = ["API.ROC.*"]\n')
    m = parse_profile(text).match(_roc())  # type: ignore[arg-type]
    assert m is not None and m.path == "B"
    assert m.evidence == ("sni api.roc.test matches B.o (*.roc.test)",)


def test_match_authority_alpn_client_header_ttl() -> None:
    text = HEAD + ('hop = "edge"\nauthority = ["api.*.test"]\nalpn = ["h2"]\n'
                   'client = ["127.0.0.0/24"]\nheader = { via = "roc-*" }\n')
    p = parse_profile(text)
    c = _roc()
    assert p.match(c) is None  # no response header visible: never a guess  # type: ignore[arg-type]
    c.requests[0].response_headers = [(":status", "200"), ("Via", "roc-edge")]  # type: ignore[attr-defined]
    m = p.match(c)  # type: ignore[arg-type]
    assert m is not None
    assert m.evidence == ("authority api.roc.test matches A.edge (api.*.test)",
                          "alpn h2 matches h2", "client 127.0.0.2:40000 matches 127.0.0.0/24",
                          "header via: roc-edge matches roc-*")
    assert p.paths[0].rules[0].conditions() == ["authority", "alpn", "client", "header"]
    # authority with a port still matches the host glob
    c.requests[0].authority = "api.roc.test:443"  # type: ignore[attr-defined]
    assert p.match(c) is not None  # type: ignore[arg-type]
    ttl = parse_profile(HEAD + 'hop = "edge"\nttl_hops = [2]\n')
    assert ttl.match(c) is None  # type: ignore[arg-type]
    c.server_ttl = 62  # type: ignore[attr-defined]  # 64 - 62: two routers away
    m = ttl.match(c)  # type: ignore[arg-type]
    assert m is not None and any("ttl hop distance 2" in e for e in m.evidence)
    c.server_ttl = 60  # type: ignore[attr-defined]
    assert ttl.match(c) is None  # type: ignore[arg-type]


def test_resp_keys_are_not_authorities() -> None:
    p = parse_profile(HEAD + 'hop = "origin"\nauthority = ["roc:*"]\n')
    c = conn("C1", "127.0.0.11:5000", "127.0.0.12:6379",
             [Request(ts_ns=1, first_byte_ns=2, method="GET", authority="roc:budget",
                      protocol="resp")], protocol="resp")
    assert p.match(c) is None


def test_match_address_for_traceroute() -> None:
    p = parse_profile(PROFILE)
    assert p.match_address("127.0.0.10") == ("ROC", "edge")
    assert p.match_address("127.0.0.10", 443) == ("ROC", "edge")
    assert p.match_address("127.0.0.10", 80) is None
    assert p.match_address("127.0.0.22", 443) == ("ROC", "origin")
    assert p.match_address("127.0.0.31") == ("DPF", "origin")
    assert p.match_address("127.0.0.33") is None  # 127.0.0.30/28 is .16-.31
    assert p.match_address("192.0.2.1") is None
    assert p.match_address("not an address") is None
    ttl = parse_profile(HEAD + 'hop = "edge"\nserver = ["10.0.0.0/8"]\nttl_hops = [2, 3]\n')
    assert ttl.match_address("10.1.1.1") == ("A", "edge")
    assert ttl.match_address("10.1.1.1", hops=3) == ("A", "edge")
    assert ttl.match_address("10.1.1.1", hops=5) is None


def test_helpers() -> None:
    assert hop_distance(64) == 0 and hop_distance(61) == 3 and hop_distance(120) == 8
    assert hop_distance(255) == 0 and hop_distance(30) == 2
    assert split_endpoint("[2001:db8::1]:443") == ("2001:db8::1", 443)
    assert split_endpoint("10.0.0.1:80") == ("10.0.0.1", 80)
    assert split_endpoint("2001:db8::1") == ("2001:db8::1", None)


def test_split_endpoint_memo_is_bounded_and_changes_nothing(monkeypatch) -> None:
    from netdiag.paths import endpoint

    monkeypatch.setattr(endpoint, "_SPLIT_MEMO_SIZE", 8)
    endpoint._SPLIT_MEMO.clear()
    eps = [f"10.0.0.{i}:{1000 + i}" for i in range(20)] + [
        "[2001:db8::1]:443", "2001:db8::1", "host:notaport", "[::1]"]
    for _round in range(2):  # the second time from the memo, where it still holds them
        for ep in eps:
            assert split_endpoint(ep) == endpoint._split_endpoint(ep)
            assert len(endpoint._SPLIT_MEMO) <= 8
    assert split_endpoint("host:notaport") == ("host", None)
    assert split_endpoint("[::1]") == ("::1", None)
