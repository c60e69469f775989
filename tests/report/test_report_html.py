"""HTML report: one self-contained page, every capture string escaped."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest
from report_docs import (
    HOSTILE,
    hostile_doc,
    lab_http_requests,
    lab_tls_requests,
    ledger,
    profile,
    with_paths,
)

from netdiag.report.html import MAX_WATERFALLS, render_html

TAGS = {"html", "head", "meta", "title", "style", "body", "header", "main", "section",
        "nav", "footer", "div", "p", "h1", "h2", "h3", "a", "b", "i", "code", "span", "ul",
        "li", "table", "thead", "tbody", "tr", "th", "td", "details", "summary", "svg",
        "rect", "line", "path", "text", "tspan"}
"""Every element the report may contain."""
ATTRS = {"lang", "charset", "http-equiv", "content", "name", "class", "href", "title",
         "colspan", "open", "id", "style", "viewbox", "width", "height", "role", "aria-label",
         "x", "y", "x1", "y1", "x2", "y2", "rx", "d", "text-anchor"}
"""Every attribute the report may use (none of them an event handler)."""


class Page(HTMLParser):
    """Elements, attributes and style text of a page, as a browser's tokenizer sees them."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.styles: list[str] = []
        self.texts: list[str] = []
        self._in_style = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        self._in_style = tag == "style"
        self.styles += [v or "" for k, v in attrs if k == "style"]

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        (self.styles if self._in_style else self.texts).append(data)


def assert_safe_and_self_contained(out: str) -> Page:
    page = Page(out)
    assert "<script" not in out.lower()
    for tag, attrs in page.tags:
        assert tag in TAGS, tag
        for k, v in attrs:
            assert k in ATTRS, (tag, k)
            assert not k.startswith("on")
            v = v or ""
            if k == "href":                  # in-page links only
                assert v.startswith("#") and "/" not in v and ":" not in v, v
            if k == "style":                 # the report's own fixed styles
                assert re.fullmatch(r"[a-z:.0-9 -]*", v), v
    css = "\n".join(page.styles).lower()
    assert "@import" not in css and "url(" not in css and "@font-face" not in css
    head = out[:out.index("</head>")]
    assert head.index('http-equiv="Content-Security-Policy"') < head.index("<title>")
    assert "default-src &#x27;none&#x27;" in head or "default-src 'none'" in head
    return page


def test_hostile_capture_cannot_run_script(doc_keys: dict[str, Any]) -> None:
    out = render_html(hostile_doc(doc_keys), title=HOSTILE)
    page = assert_safe_and_self_contained(out)
    # the hostile text is there, as text
    text = "".join(page.texts)
    assert text.count("<script>alert(1)</script>") > 20
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in out
    assert "&lt;/svg&gt;&lt;script&gt;" in out
    # bidi override and NUL are shown, not obeyed
    assert "\u202e" not in out and "\x00" not in out
    assert "\\u202eevil\\u0000" in text
    # charts still drawn
    assert out.count("<svg") >= 5


@pytest.mark.parametrize("fixture", ["doc_keys", "doc_nokeys"])
def test_page_needs_no_network(fixture: str, request: pytest.FixtureRequest) -> None:
    doc = request.getfixturevalue(fixture)
    for d in (doc, with_paths(doc)):
        out = render_html(d)
        assert_safe_and_self_contained(out)
        assert "http://" not in out and "https://" not in out
        assert not re.search(r"\b(src|srcset|xlink:href|action|poster)\s*=", out)


def test_sections_of_a_decrypted_report_with_paths(doc_keys: dict[str, Any]) -> None:
    out = render_html(with_paths(doc_keys))
    for heading in ("Summary", "Findings", "Latency budget per path", "Time to first byte",
                    "Waterfall per connection", "Slowest requests", "DNS", "Connections"):
        assert f"<h2>{heading}</h2>" in out
    assert "<title>netdiag report — antho.pcapng</title>" in out
    assert "/captures/antho.pcapng · " in out           # the full name under the title
    assert "Estimated timings" not in out
    # budget: every path of the profile, ROC's hops with the edge's upstream setup
    names = [p.name for p in profile().paths]
    assert len(names) == 2
    for name in names:
        assert f'colspan="2">{name}</th>' in out
    assert "hop edge: own time" in out and "hop edge: upstream setup" in out
    assert 'aria-label="median latency budget per path"' in out
    assert "supported" in out and "inconclusive" in out
    # one CDF with a line per path, one histogram per path
    cdf = out[out.index('aria-label="cumulative distribution'):]
    cdf = cdf[:cdf.index("</svg>")]
    assert cdf.count('<path class="line') == len(names)
    assert out.count('aria-label="histogram of time to first byte') == len(names)
    # a waterfall per connection with requests or TLS: all but the DNS-over-TCP ones,
    # which are only in the table
    tcp = ledger()["tcp_connections"]
    drawn = [c for c in doc_keys["connections"] if c["requests"] or c["tls"]]
    assert len(drawn) == sum(tcp.values()) - tcp["dns"]
    assert out.count('<details class="conn"') == len(drawn)
    assert out.count('aria-label="waterfall of connection') == len(drawn)
    # the SSE answers' events are ticks
    events = [r["sse_events"] for c in doc_keys["connections"] for r in c["requests"]
              if r["sse_events"]]
    assert len(events) == doc_keys["summary"]["http"]["streaming"]["responses"]
    assert set(events) == {ledger()["params"]["sse_events"]}
    assert out.count('<line class="tick"') == sum(events)
    for phase in ("ph-dns", "ph-tcp", "ph-tls", "ph-wait", "ph-recv"):
        assert f'<rect class="{phase}"' in out
    # decoded headers are shown (folded)
    assert "user-agent" in out and ledger()["params"]["user_agent"] in out


def test_estimated_report_says_so(doc_nokeys: dict[str, Any]) -> None:
    out = render_html(doc_nokeys)
    http = [r for c in doc_nokeys["connections"] for r in c["requests"]
            if r["protocol"] != "resp"]
    estimated = [r for r in http if r["estimated"]]
    # the requests inside TLS are estimated; the edge's h2c requests are still exact
    assert (len(estimated), len(http)) == (lab_tls_requests(), lab_http_requests())
    assert 0 < len(estimated) < len(http)
    assert "Estimated timings" in out and f"{len(estimated)} of {len(http)} requests" in out
    assert "Time to first byte (estimated)" in out
    assert "request 1 (estimated)" in out
    assert "Latency budget per path" not in out
    assert "over all requests (no paths attributed)" in out
    assert out.count('aria-label="histogram of time to first byte') == 1


def test_waterfalls_are_capped_to_the_slowest(doc_keys: dict[str, Any]) -> None:
    doc = doc_keys
    template = next(c for c in doc["connections"] if len(c["requests"]) == 1)
    conns = []
    for i in range(1, 61):
        c = {**template, "id": f"C{i}", "ts": template["ts"] + i,
             "requests": [{**template["requests"][0], "ts": template["ts"] + i + 0.005,
                           "ttfb_ms": float(i), "ttlb_ms": float(i) + 1}]}
        conns.append(c)
    doc["connections"] = conns
    out = render_html(doc)
    assert out.count('<details class="conn"') == MAX_WATERFALLS
    assert "Showing the 50 slowest of 60 connections" in out
    shown = re.findall(r'aria-label="waterfall of connection (C\d+)"', out)
    assert shown == [f"C{i}" for i in range(11, 61)]         # slowest, in order of start
    assert out.count('<details class="conn" open>') == 12


def test_empty_and_partial_documents_render() -> None:
    out = render_html({})
    assert_safe_and_self_contained(out)
    assert "No request with a measured time to first byte." in out
    assert "Nothing crossed a threshold." in out
    out = render_html({"summary": {"paths": {}, "http": None}, "dns": [None, {"qname": 1}],
                       "connections": [{"id": "C1", "requests": [{"ts": None}]}, None],
                       "findings": [{"severity": None}]})
    assert_safe_and_self_contained(out)


def test_title_is_escaped(doc_keys: dict[str, Any]) -> None:
    out = render_html(doc_keys, title="<b>x</b> & y")
    assert "<title>&lt;b&gt;x&lt;/b&gt; &amp; y</title>" in out
    assert "<h1>&lt;b&gt;x&lt;/b&gt; &amp; y</h1>" in out


@pytest.mark.parametrize("size", [1, 3, 25, 200])
def test_top_keeps_what_a_stable_sort_keeps(size: int) -> None:
    """The slowest requests and connections are kept in one pass (``_Top``): the same
    items, in the same order, as a stable sort by decreasing key cut to ``size``, ties
    (many here) to the first seen."""
    import random

    from netdiag.report.html import _Top

    rng = random.Random(size)
    keys = [float(rng.randint(0, 20)) for _ in range(150)]
    top = _Top(size)
    for i, k in enumerate(keys):
        top.add(k, i)
    assert top.added == len(keys)
    expected = sorted(range(len(keys)), key=lambda i: -keys[i])[:size]
    assert top.best() == expected


def test_a_lazy_document_gives_the_same_page(doc_keys: dict[str, Any]) -> None:
    """``netdiag report --format html`` hands a document whose connections and DNS
    transactions are made as they are read (``Records``): each connection is rendered
    once, and the page is the plain document's, counts past the tables' caps included."""
    import copy

    from netdiag.report.html import MAX_TABLE_ROWS, SLOWEST_REQUESTS
    from netdiag.report.json_out import Records

    base = doc_keys["connections"]
    conns = [dict(copy.deepcopy(base[i % len(base)]), id=f"C{i + 1}")
             for i in range(MAX_TABLE_ROWS + 7)]
    dns = [copy.deepcopy(doc_keys["dns"][i % len(doc_keys["dns"])])
           for i in range(MAX_TABLE_ROWS + 3)]
    doc = dict(doc_keys, connections=conns, dns=dns)
    rendered: list[int] = []

    def render(i: int) -> dict[str, Any]:
        rendered.append(i)
        return copy.deepcopy(conns[i])

    lazy = dict(doc, connections=Records(list(range(len(conns))), render),
                dns=Records(list(range(len(dns))), lambda i: copy.deepcopy(dns[i])))
    from netdiag.report.har import attribute_dns, is_http

    plain = render_html(doc)
    made = render_html(lazy, dns_of=attribute_dns(doc))
    assert made == plain
    assert sorted(rendered) == list(range(len(conns)))  # each once
    assert f"Showing {MAX_TABLE_ROWS} of {len(conns)} connections" in plain
    assert f"Showing {MAX_TABLE_ROWS} of {len(dns)} transactions" in plain
    timed = sum(1 for c in conns for r in c["requests"]
                if is_http(c, r) and r.get("ttfb_ms") is not None)
    assert timed > SLOWEST_REQUESTS
    assert f"The {SLOWEST_REQUESTS} longest times to first byte of {timed} requests" in plain
