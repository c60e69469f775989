"""Path profiles (``docs/profiles.md``): read, validate, and match connections against them.

A profile names the paths between clients and an API, the chain of hops on each
(client-facing hop first), and rules that recognise a connection as one hop of one
path. Every key of a rule is optional, all the keys a rule has must match, a list
matches when any of its items does, and the first path whose rule matches wins.

Errors are :class:`~netdiag.errors.InputError` with ``FILE:LINE: message``: tomllib
gives the line of a syntax error; for a value that is valid TOML but not a valid
profile, the line is found by scanning the text for the offending key inside its
``[[path]]`` / ``[[path.rule]]`` table.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import ipaddress
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from netdiag.errors import InputError
from netdiag.paths.endpoint import split_endpoint
from netdiag.records import Connection

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

PROFILE_VERSION = 1
TOP_KEYS = ("version", "path", "edge")
PATH_KEYS = ("name", "hops", "rule")
EDGE_KEYS = ("name", "ranges")
"""Keys of an ``[[edge]]`` entry: an edge name and the CIDRs of its servers."""
RULE_KEYS = ("hop", "server", "port", "sni", "authority", "alpn", "client", "header",
             "ttl_hops")
"""Keys of a rule, in the order they are checked and reported as evidence."""
INITIAL_TTLS = (32, 64, 128, 255)
"""Initial IP TTLs (hop limits) operating systems use; the distance of a host is the
smallest of these at or above the TTL seen, minus the TTL seen."""


def hop_distance(ttl: int) -> int:
    """Routers between a sender and the capture point, from the TTL of its packets."""
    for initial in INITIAL_TTLS:
        if ttl <= initial:
            return initial - ttl
    return 0


@functools.lru_cache(maxsize=1 << 16)
def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``text`` as an address, None where it is not one (parsed once per text: a capture
    has one per host, not one per connection)."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _glob(value: str, pattern: str) -> bool:
    """Case-insensitive shell-style glob (``*``, ``?``, ``[...]``)."""
    return fnmatch.fnmatchcase(value.lower(), pattern.lower())


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of a path: the conditions that make a connection the hop ``hop``."""

    hop: str
    """The hop of the path a matching connection is."""
    server: tuple[IPNetwork, ...] = ()
    """CIDRs of the server address."""
    port: tuple[int, ...] = ()
    """Server ports."""
    sni: tuple[str, ...] = ()
    """Globs on the TLS SNI."""
    authority: tuple[str, ...] = ()
    """Globs on a request's ``:authority`` / ``Host`` (with or without its port)."""
    alpn: tuple[str, ...] = ()
    """Globs on the selected ALPN protocol (or the decoded protocol when it is hidden)."""
    client: tuple[IPNetwork, ...] = ()
    """CIDRs of the client address."""
    header: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(response header name, globs) pairs; all of them must match one response."""
    ttl_hops: tuple[int, ...] = ()
    """Hop distances of the server inferred from the IP TTL of its packets."""
    line: int = 0
    """Line of the rule's ``[[path.rule]]`` header in the profile."""

    def conditions(self) -> list[str]:
        """The keys this rule has, in evaluation order."""
        return [k for k in RULE_KEYS[1:] if getattr(self, k)]


@dataclass(frozen=True, slots=True)
class PathDef:
    """A named path: its hops (client-facing first) and its rules."""

    name: str
    hops: tuple[str, ...]
    rules: tuple[Rule, ...] = ()
    line: int = 0

    @property
    def origin_hop(self) -> str:
        """The hop whose wait is the origin's think time: ``origin`` if named so, else the
        last hop."""
        return "origin" if "origin" in self.hops else self.hops[-1]


@dataclass(frozen=True, slots=True)
class EdgeDef:
    """An ``[[edge]]`` entry: servers in ``ranges`` are the edge ``name``
    (``netdiag.paths.edge``; checked before the published ranges netdiag ships)."""

    name: str
    """The edge's name, as ``connections[].edge.name`` shows it."""
    ranges: tuple[IPNetwork, ...]
    """CIDRs of its server addresses."""
    line: int = 0
    """Line of the entry's ``[[edge]]`` header in the profile."""


@dataclass(frozen=True, slots=True)
class Match:
    """Which path and hop a connection matched, and why."""

    path: str
    hop: str
    evidence: tuple[str, ...]
    rule: int
    """0-based index of the matching rule within its path."""

    def to_path(self) -> dict[str, Any]:
        """The contract's ``connections[].path`` object."""
        return {"name": self.path, "hop": self.hop, "evidence": list(self.evidence),
                "inferred": False}


@dataclass(frozen=True)
class Profile:
    """A validated path profile."""

    paths: list[PathDef]
    source: str = "<profile>"
    version: int = PROFILE_VERSION
    _by_name: dict[str, PathDef] = field(default_factory=dict, repr=False, compare=False)
    edges: tuple[EdgeDef, ...] = ()
    """``[[edge]]`` entries, in order (the first whose ranges hold an address wins)."""

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.paths})

    def path(self, name: str) -> PathDef | None:
        """The path named ``name``."""
        return self._by_name.get(name)

    def match(self, conn: Connection) -> Match | None:
        """The first path whose rule matches ``conn``, with one evidence line per key."""
        facts = _ConnFacts(conn)
        for p in self.paths:
            for i, rule in enumerate(p.rules):
                ev = _match_rule(p, rule, facts)
                if ev is not None:
                    return Match(p.name, rule.hop, tuple(ev), i)
        return None

    def match_address(self, ip: str, port: int | None = None,
                      hops: int | None = None) -> tuple[str, str] | None:
        """(path, hop) of the first rule whose ``server`` CIDRs contain ``ip``.

        For an address seen without a connection (a traceroute hop): only rules with a
        ``server`` key take part; their ``port`` is checked when ``port`` is given,
        their ``ttl_hops`` when ``hops`` (the hop's distance) is given; keys about a
        connection's content (``sni``, ``authority``, ``alpn``, ``client``, ``header``)
        are not looked at.
        """
        addr = parse_ip(ip.strip("[]"))
        if addr is None:
            return None
        for p in self.paths:
            for rule in p.rules:
                if not rule.server or not any(addr in net for net in rule.server
                                              if net.version == addr.version):
                    continue
                if port is not None and rule.port and port not in rule.port:
                    continue
                if hops is not None and rule.ttl_hops and hops not in rule.ttl_hops:
                    continue
                return p.name, rule.hop
        return None


class _ConnFacts:
    """What a rule can look at in one connection, computed once."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        sip, sport = split_endpoint(conn.server)
        cip, _ = split_endpoint(conn.client)
        self.server_ip = parse_ip(sip)
        self.server_port = sport
        self.client_ip = parse_ip(cip)
        tls = conn.tls
        self.sni = tls.sni if tls is not None else None
        alpn = tls.alpn if tls is not None else None
        if alpn is None and conn.protocol not in (None, "tls", "dns"):
            alpn = conn.protocol
        self.alpn = alpn
        seen: list[str] = []
        for r in conn.requests:
            if r.authority and r.authority not in seen and r.protocol != "resp":
                seen.append(r.authority)
        self.authorities = seen
        ttl = getattr(conn, "server_ttl", None)
        self.distance = hop_distance(ttl) if isinstance(ttl, int) else None

    def responses(self) -> Iterable[list[tuple[str, str]]]:
        for r in self.conn.requests:
            if r.response_headers:
                yield r.response_headers


def _in_nets(addr: Any, nets: tuple[IPNetwork, ...]) -> IPNetwork | None:
    if addr is None:
        return None
    for net in nets:
        if net.version == addr.version and addr in net:
            return net
    return None


def _first_glob(values: Iterable[str], globs: tuple[str, ...]) -> tuple[str, str] | None:
    for v in values:
        host = v
        if v.startswith("["):
            host = v[1:].partition("]")[0]
        elif v.count(":") == 1:
            host = v.partition(":")[0]
        for g in globs:
            if _glob(v, g) or (host != v and _glob(host, g)):
                return v, g
    return None


def _match_rule(p: PathDef, rule: Rule, f: _ConnFacts) -> list[str] | None:
    """Evidence lines if every key of ``rule`` matches, else None."""
    ev: list[str] = []
    where = f"{p.name}.{rule.hop}"

    def add(key: str, value: Any, pattern: str) -> None:
        if ev:
            ev.append(f"{key} {value} matches {pattern}")
        else:
            ev.append(f"{key} {value} matches {where} ({pattern})")

    if rule.server:
        net = _in_nets(f.server_ip, rule.server)
        if net is None:
            return None
        add("server", f.conn.server, str(net))
    if rule.port:
        if f.server_port not in rule.port:
            return None
        add("port", f.server_port, ", ".join(str(x) for x in rule.port))
    if rule.sni:
        hit = _first_glob([f.sni] if f.sni else [], rule.sni)
        if hit is None:
            return None
        add("sni", *hit)
    if rule.authority:
        hit = _first_glob(f.authorities, rule.authority)
        if hit is None:
            return None
        add("authority", *hit)
    if rule.alpn:
        hit = _first_glob([f.alpn] if f.alpn else [], rule.alpn)
        if hit is None:
            return None
        add("alpn", *hit)
    if rule.client:
        net = _in_nets(f.client_ip, rule.client)
        if net is None:
            return None
        add("client", f.conn.client, str(net))
    if rule.header:
        hit_h = _match_headers(f, rule.header)
        if hit_h is None:
            return None
        for name, value, g in hit_h:
            add(f"header {name}:", value, g)
    if rule.ttl_hops:
        if f.distance is None or f.distance not in rule.ttl_hops:
            return None
        add("ttl hop distance", f.distance, ", ".join(str(x) for x in rule.ttl_hops))
    return ev


def _match_headers(f: _ConnFacts, want: tuple[tuple[str, tuple[str, ...]], ...]
                   ) -> list[tuple[str, str, str]] | None:
    """(name, value, glob) for each wanted header, all from one response."""
    for headers in f.responses():
        got: list[tuple[str, str, str]] = []
        for name, globs in want:
            values = [v for k, v in headers if k.lower() == name]
            hit = next(((v, g) for v in values for g in globs if _glob(v, g)), None)
            if hit is None:
                break
            got.append((name, hit[0], hit[1]))
        else:
            return got
    return None


# --- reading and validating --------------------------------------------------------


def load_profile(path: str) -> Profile:
    """Read and validate the profile at ``path`` (``InputError`` when it is not one)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise InputError(f"cannot read profile {path}: {e.strerror or e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: not UTF-8 text") from e
    return parse_profile(text, path)


_TOML_POS = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_TOML_EOF = re.compile(r"\s*\(at end of document\)\s*$")
_LONG_NUMBER = re.compile(r"[0-9_]{4300,}")


def parse_profile(text: str, source: str = "<profile>") -> Profile:
    """Parse and validate profile ``text``; errors name ``source`` and a line."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_POS.search(msg)
        if m:
            raise InputError(f"{source}:{m.group(1)}: invalid TOML: {msg[:m.start()]} "
                             f"(column {m.group(2)})") from None
        if _TOML_EOF.search(msg):
            last = text.count("\n") + (0 if text.endswith("\n") else 1)
            raise InputError(f"{source}:{max(last, 1)}: invalid TOML: "
                             f"{_TOML_EOF.sub('', msg)} (at end of file)") from None
        raise InputError(f"{source}:1: invalid TOML: {msg}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise InputError(f"{source}:1: invalid profile: arrays or inline tables nested "
                         "too deeply") from None
    except ValueError as e:  # not a TOMLDecodeError: int() of an integer beyond
        # sys.get_int_max_str_digits() digits, which tomllib does not catch
        m = _LONG_NUMBER.search(text)
        line = text.count("\n", 0, m.start()) + 1 if m else 1
        raise InputError(f"{source}:{line}: invalid profile: a number is too long "
                         f"({str(e).split(':', 1)[0]})") from None
    return _Validator(text, source).profile(doc)


_HEADER = re.compile(r"^\s*(\[\[|\[)\s*([^\[\]#]+?)\s*(\]\]|\])\s*(#.*)?$")


class _Locator:
    """Finds the line of a key in the profile text, table by table."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.tables: list[tuple[str, int]] = []
        """(normalised table name, 1-based header line) in order."""
        for n, line in enumerate(self.lines, 1):
            m = _HEADER.match(line)
            if m:
                name = ".".join(part.strip().strip("\"'") for part in m.group(2).split("."))
                self.tables.append((name, n))

    def _range(self, where: tuple[Any, ...]) -> tuple[int, int] | None:
        """[first, last] lines of the table ``where`` names: (), ("path", i) or
        ("path", i, "rule", j); None when it is not written as a table header."""
        ends = [n for _name, n in self.tables] + [len(self.lines) + 1]
        if not where:
            return 1, ends[0] - 1
        paths = [k for k, (name, _n) in enumerate(self.tables) if name == where[0]]
        i = where[1]
        if i >= len(paths):
            return None
        k = paths[i]
        if len(where) == 2:
            return self.tables[k][1], ends[k + 1] - 1
        stop = paths[i + 1] if i + 1 < len(paths) else len(self.tables)
        rules = [q for q in range(k + 1, stop) if self.tables[q][0] == "path.rule"]
        j = where[3]
        if j >= len(rules):
            return None
        q = rules[j]
        return self.tables[q][1], ends[q + 1] - 1

    def line(self, where: tuple[Any, ...], key: str | None = None,
             needle: str | None = None) -> int:
        rng = self._range(where)
        first, last = rng if rng is not None else (1, len(self.lines))
        key_re = re.compile(rf"^\s*(\"{re.escape(key)}\"|'{re.escape(key)}'|{re.escape(key)})"
                            r"\s*[=.]") if key else None
        found = None
        if key_re is not None:
            for n in range(first, last + 1):
                if n - 1 < len(self.lines) and key_re.match(self.lines[n - 1]):
                    found = n
                    break
            if found is None and rng is not None and key:
                # keys of an inline table (header = { ... }) or written elsewhere
                word = re.compile(rf"(^|[{{,\s]){re.escape(key)}\s*=")
                for n in range(first, last + 1):
                    if n - 1 < len(self.lines) and word.search(self.lines[n - 1]):
                        found = n
                        break
        if needle is not None:
            start = found if found is not None else first
            for n in range(start, last + 1):
                if n - 1 < len(self.lines) and needle in self.lines[n - 1]:
                    return n
        if found is not None:
            return found
        return first if rng is not None else 1


def _type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a float"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "a table"
    return type(v).__name__


def _quote(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f'"{v}"' if isinstance(v, str) else str(v)


class _Validator:
    def __init__(self, text: str, source: str) -> None:
        self.loc = _Locator(text)
        self.source = source

    def fail(self, where: tuple[Any, ...], key: str | None, message: str,
             needle: str | None = None) -> InputError:
        return InputError(f"{self.source}:{self.loc.line(where, key, needle)}: {message}")

    def unknown(self, where: tuple[Any, ...], table: str, keys: Iterable[str],
                allowed: tuple[str, ...]) -> None:
        for key in keys:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise self.fail(where, key, f"unknown key '{key}' in {table} (allowed: "
                                f"{', '.join(sorted(allowed))}){hint}")

    def profile(self, doc: dict[str, Any]) -> Profile:
        self.unknown((), "the profile", doc, TOP_KEYS)
        if "version" not in doc:
            raise self.fail((), None, f"missing 'version = {PROFILE_VERSION}'")
        version = doc["version"]
        if version != PROFILE_VERSION or isinstance(version, bool):
            raise self.fail((), "version", f"version must be {PROFILE_VERSION}, not "
                            f"{_quote(version)} (this netdiag reads profile version "
                            f"{PROFILE_VERSION})")
        raw_paths = doc.get("path", [])
        if not isinstance(raw_paths, list):
            raise self.fail((), "path", "'path' must be an array of tables ([[path]]), not "
                            f"{_type_name(raw_paths)}")
        paths: list[PathDef] = []
        seen: dict[str, int] = {}
        for i, raw in enumerate(raw_paths):
            where = ("path", i)
            if not isinstance(raw, dict):
                raise self.fail((), "path", f"path {i + 1} must be a table, not "
                                f"{_type_name(raw)}")
            p = self.path(where, raw)
            if p.name in seen:
                raise self.fail(where, "name", f"duplicate path name '{p.name}' (first "
                                f"defined on line {seen[p.name]})")
            seen[p.name] = self.loc.line(where, "name")
            paths.append(p)
        raw_edges = doc.get("edge", [])
        if not isinstance(raw_edges, list):
            raise self.fail((), "edge", "'edge' must be an array of tables ([[edge]]), not "
                            f"{_type_name(raw_edges)}")
        edges = tuple(self.edge(("edge", i), raw) for i, raw in enumerate(raw_edges))
        return Profile(paths, self.source, version, edges=edges)

    def edge(self, where: tuple[Any, ...], raw: Any) -> EdgeDef:
        if not isinstance(raw, dict):
            raise self.fail((), "edge", f"edge {where[1] + 1} must be a table, not "
                            f"{_type_name(raw)}")
        self.unknown(where, "[[edge]]", raw, EDGE_KEYS)
        name = raw.get("name")
        if not isinstance(name, str) or not name.strip():
            raise self.fail(where, "name" if "name" in raw else None,
                            "[[edge]] needs a name = \"...\" (a non-empty string)")
        if "ranges" not in raw:
            raise self.fail(where, None, f"edge '{name}' has no ranges (e.g. ranges = "
                            "[\"10.0.0.0/8\"])")
        return EdgeDef(name.strip(), self._cidrs(where, "ranges", raw["ranges"]),
                       self.loc.line(where))

    def path(self, where: tuple[Any, ...], raw: dict[str, Any]) -> PathDef:
        self.unknown(where, "[[path]]", raw, PATH_KEYS)
        name = raw.get("name")
        if name is None:
            raise self.fail(where, None, "[[path]] has no name (add name = \"...\")")
        if not isinstance(name, str) or not name.strip():
            raise self.fail(where, "name", "path name must be a non-empty string, not "
                            f"{_type_name(name) if not isinstance(name, str) else 'empty'}")
        hops = raw.get("hops")
        if hops is None:
            raise self.fail(where, None, f"path '{name}' has no hops (e.g. hops = "
                            "[\"edge\", \"origin\"], client-facing hop first)")
        if not isinstance(hops, list) or not hops:
            raise self.fail(where, "hops", f"hops of path '{name}' must be a non-empty "
                            "array of hop names")
        for h in hops:
            if not isinstance(h, str) or not h.strip():
                raise self.fail(where, "hops", f"hops of path '{name}' must be non-empty "
                                f"strings, not {_type_name(h)}")
        dup = next((h for k, h in enumerate(hops) if h in hops[:k]), None)
        if dup is not None:
            raise self.fail(where, "hops", f"hop '{dup}' appears twice in path '{name}'")
        raw_rules = raw.get("rule", [])
        if not isinstance(raw_rules, list):
            raise self.fail(where, "rule", "'rule' must be an array of tables "
                            f"([[path.rule]]), not {_type_name(raw_rules)}")
        rules = []
        for j, rr in enumerate(raw_rules):
            rwhere = (*where, "rule", j)
            if not isinstance(rr, dict):
                raise self.fail(where, "rule", f"rule {j + 1} of path '{name}' must be a "
                                f"table, not {_type_name(rr)}")
            rules.append(self.rule(rwhere, name, tuple(hops), rr))
        return PathDef(name, tuple(hops), tuple(rules), self.loc.line(where))

    def _list(self, where: tuple[Any, ...], key: str, value: Any, kind: type,
              what: str, label: str | None = None) -> list[Any]:
        label = label or key
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not value:
            raise self.fail(where, key, f"{label} must not be empty (leave the key out to "
                            "match anything)")
        for v in items:
            if not isinstance(v, kind) or isinstance(v, bool):
                shown = "" if isinstance(v, list | dict) else f" {_quote(v)}"
                raise self.fail(where, key, f"{label} must be {what} or an array of them, "
                                f"not {_type_name(v)}{shown}")
        return items

    def _cidrs(self, where: tuple[Any, ...], key: str, value: Any) -> tuple[IPNetwork, ...]:
        out = []
        for v in self._list(where, key, value, str, "a CIDR string"):
            try:
                out.append(ipaddress.ip_network(v.strip(), strict=False))
            except ValueError as e:
                raise self.fail(where, key, f"bad CIDR \"{v}\" in {key}: {e}",
                                needle=v) from None
        return tuple(out)

    def _globs(self, where: tuple[Any, ...], key: str, value: Any,
               label: str | None = None) -> tuple[str, ...]:
        items = self._list(where, key, value, str, "a glob string", label)
        for v in items:
            if not v:
                raise self.fail(where, key, f"empty glob in {label or key}")
        return tuple(items)

    def _ints(self, where: tuple[Any, ...], key: str, value: Any, lo: int, hi: int
              ) -> tuple[int, ...]:
        items = self._list(where, key, value, int, "an integer")
        for v in items:
            if not lo <= v <= hi:
                raise self.fail(where, key, f"{key} {v} is out of range ({lo}..{hi})",
                                needle=str(v))
        return tuple(items)

    def rule(self, where: tuple[Any, ...], pname: str, hops: tuple[str, ...],
             raw: dict[str, Any]) -> Rule:
        self.unknown(where, "[[path.rule]]", raw, RULE_KEYS)
        hop = raw.get("hop")
        if hop is None:
            if len(hops) != 1:
                raise self.fail(where, None, f"rule of path '{pname}' has no hop (one of "
                                f"{', '.join(hops)})")
            hop = hops[0]
        if not isinstance(hop, str):
            raise self.fail(where, "hop", f"hop must be a string, not {_type_name(hop)}")
        if hop not in hops:
            raise self.fail(where, "hop", f"hop '{hop}' is not one of the hops of path "
                            f"'{pname}' ({', '.join(hops)})")
        kw: dict[str, Any] = {}
        if "server" in raw:
            kw["server"] = self._cidrs(where, "server", raw["server"])
        if "client" in raw:
            kw["client"] = self._cidrs(where, "client", raw["client"])
        if "port" in raw:
            kw["port"] = self._ints(where, "port", raw["port"], 1, 65535)
        if "ttl_hops" in raw:
            kw["ttl_hops"] = self._ints(where, "ttl_hops", raw["ttl_hops"], 0, 255)
        for key in ("sni", "authority", "alpn"):
            if key in raw:
                kw[key] = self._globs(where, key, raw[key])
        if "header" in raw:
            h = raw["header"]
            if not isinstance(h, dict) or not h:
                raise self.fail(where, "header", "header must be a non-empty table of "
                                "header name = glob, e.g. header = { server = \"edge*\" }")
            kw["header"] = tuple(
                (name.lower(), self._globs(where, "header", globs, f"header {name}"))
                for name, globs in h.items())
        rule = Rule(hop=hop, line=self.loc.line(where), **kw)
        if not rule.conditions():
            raise self.fail(where, None, f"rule of {pname}.{hop} has no condition, so it "
                            "would match every connection (use server = [\"0.0.0.0/0\", "
                            "\"::/0\"] if that is meant)")
        return rule
