"""Honest statements: per-hop sentences only from linked chains, upstream requests never
counted as client requests, no sentence twice, and the profile beside the capture."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from paths_sim import SimParams, simulate
from test_paths_matching import PROFILE

from netdiag.paths.apply import analyze_paths
from netdiag.paths.profile import parse_profile
from netdiag.paths.render import render_all

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"
SKEW_NS = 5_000_000_000


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netdiag", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "400"})


def _skewed() -> tuple[list, int]:
    """A capture merged from two hosts whose clocks differ by 5 s: the upstream
    requests lie outside the client requests, so nothing can be linked."""
    conns, truth = simulate(SimParams(requests=30, concurrency=4, seed=7))
    clients = {t.client[0] for t in truth}
    for c in conns:
        if c.id in clients:
            continue
        c.ts_ns += SKEW_NS
        c.last_ns += SKEW_NS
        if c.syn_ns is not None:
            c.syn_ns += SKEW_NS
        for r in c.requests:
            r.ts_ns += SKEW_NS
            for k in ("first_byte_ns", "last_byte_ns"):
                if getattr(r, k) is not None:
                    setattr(r, k, getattr(r, k) + SKEW_NS)
    return conns, len(truth)


def test_unlinked_chains_give_no_hop_statement_and_say_why() -> None:
    conns, n = _skewed()
    a = analyze_paths(conns, [], parse_profile(PROFILE))
    roc = a.budgets["ROC"]
    assert roc.requests == n  # the router's and origins' requests are not client requests
    # the router's requests: the token calls and origin requests are still its children
    assert roc.linked == 0 and roc.upstream_unlinked == n
    assert not roc.hops["edge"].own  # no own time: it would be the whole wait
    assert not any(d.supported and d.phase.startswith("hop:") for d in a.differences)
    (f,) = [f for f in a.findings if f.code == "path-unlinked"]
    assert f.title == (f"ROC: only 0 of {n} client requests could be linked to their "
                       "upstream requests; no per-hop time is stated")
    assert "router" in f.detail and "request ids" in f.detail
    assert not [f for f in a.findings if f.code == "path-dominant-hop" and "ROC" in f.title]
    assert a.summary()["ROC"]["chains"] == {"linked": 0, "ambiguous": 0, "unlinked": n,
                                            "upstream_unlinked": roc.upstream_unlinked}


def test_linked_chains_state_hops_with_their_count() -> None:
    conns, truth = simulate(SimParams(requests=40, concurrency=4, direct=20, seed=8))
    a = analyze_paths(conns, [], parse_profile(PROFILE))
    roc = a.budgets["ROC"]
    assert roc.requests == len(truth) and roc.linked >= 0.95 * len(truth)
    router = next(d for d in a.differences if d.phase == "hop:router")
    assert router.supported and router.n_a == roc.linked
    assert f", {roc.linked} linked requests)" in router.sentence
    assert not [f for f in a.findings if f.code == "path-unlinked"]


def _plain(renderables: list) -> str:
    from rich.console import Console

    console = Console(width=400, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for r in renderables:
        console.print(r)
    return console.export_text()


def test_no_sentence_twice_with_many_paths() -> None:
    """Three profile paths: a hop only one of them has is stated once, not once per
    compared pair, and the differences and findings do not repeat each other."""
    conns, _ = simulate(SimParams(requests=40, concurrency=4, direct=30, seed=9))
    text = PROFILE + ('\n[[path]]\nname = "OTHER"\nhops = ["origin"]\n[[path.rule]]\n'
                      'hop = "origin"\nserver = ["127.0.0.3/32"]\n')
    for c in conns:  # half of the direct requests go to a third path's server
        if c.server == "127.0.0.31:443" and int(c.id[1:]) % 2:
            c.server = "127.0.0.3:443"
    a = analyze_paths(conns, [], parse_profile(text))
    router = [d for d in a.differences if d.phase == "hop:router"]
    assert len(router) == 1
    out = _plain(render_all(a, conns))
    lines = [x.strip() for x in out.splitlines() if x.strip().startswith(("•", "info",
                                                                          "warning"))]
    bodies = [re.sub(r"^(•|info|warning)\s+", "", x) for x in lines]
    assert len(bodies) == len(set(bodies)), bodies
    for f in a.findings:
        assert out.count(f.title) <= 1, f.title


def test_terminal_report_says_nothing_twice() -> None:
    for extra in ((), ("--no-profile",)):
        r = run("report", str(ANTHO), *extra)
        assert r.returncode == 0, r.stderr
        bullets = [x.strip() for x in r.stdout.splitlines() if x.strip().startswith("•")]
        assert bullets and len(bullets) == len(set(bullets))
        for b in bullets:
            assert r.stdout.count(b[2:]) == 1, b


def test_profile_beside_the_capture_is_used_and_said(tmp_path: Path) -> None:
    cap = tmp_path / "run.1.pcapng"
    shutil.copy(ANTHO, cap)
    # none beside it: inferred paths
    r = run("report", str(cap), "--format", "json")
    assert r.returncode == 0
    assert all(n.startswith(("via ", "direct "))
               for n in json.loads(r.stdout)["summary"]["paths"])
    assert "path profile" not in r.stderr
    shutil.copy(ANTHO.with_name("antho.paths.toml"), tmp_path / "run.1.paths.toml")
    r = run("report", str(cap), "--format", "json")
    assert r.returncode == 0
    assert set(json.loads(r.stdout)["summary"]["paths"]) == {"ROC", "DPF"}
    assert "using the path profile" in r.stderr and "run.1.paths.toml" in r.stderr
    r = run("report", str(cap), "--format", "json", "--no-profile")
    assert not set(json.loads(r.stdout)["summary"]["paths"]) & {"ROC", "DPF"}
    r = run("paths", str(cap), "--format", "json")
    assert r.returncode == 0 and set(json.loads(r.stdout)["paths"]) == {"ROC", "DPF"}
