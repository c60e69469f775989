"""The JSON report: numbers without float noise, and the fast writer's layout."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from netdiag.report.json_out import write_json

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"


def _floats(obj: Any, path: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _floats(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for v in obj:
            yield from _floats(v, f"{path}[]")
    elif isinstance(obj, float):
        yield path, obj


def test_durations_have_at_most_nanosecond_decimals() -> None:
    out = subprocess.run([sys.executable, "-m", "netdiag", "report", str(CAPTURE), "--format",
                          "json", "--keylog", str(KEYS)], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    doc = json.loads(out)
    checked = 0
    for path, x in _floats(doc):
        if "_ms" not in path:
            continue
        checked += 1
        text = repr(x)
        decimals = len(text.split(".")[1]) if "." in text and "e" not in text else 0
        assert decimals <= 6, f"{path} = {text}"
    assert checked > 100  # percentile blocks, per-request timings, path figures


def test_writer_gives_the_same_value_with_records_one_a_line() -> None:
    doc = {"contract": 1, "capture": {"files": ["a"], "packets": 3},
           "summary": {"dns": {"latency_ms": {"p50": 1.5}}, "ratio": 0.25},
           "connections": [{"id": "C1", "requests": [{"ts": 1.0, "path": "/é\u2028"}]},
                           {"id": "C2", "requests": []}],
           "findings": [], "nan": float("nan")}
    for ascii_only in (True, False):
        buf = io.StringIO()
        write_json(doc, buf, ensure_ascii=ascii_only)
        text = buf.getvalue()
        again = json.loads(text)
        assert json.dumps(again, sort_keys=True) == json.dumps(doc, sort_keys=True)
        lines = text.splitlines()
        assert any(line.strip().startswith('{"id":"C1"') for line in lines)
        assert any(line.strip().startswith('{"id":"C2"') for line in lines)
        assert text.endswith("}\n")


def test_records_are_written_as_the_list_they_render_one_at_a_time() -> None:
    """``Records`` gives exactly the text of the list of its dicts, empty or not, each
    dict made and passed through the steps only when it is written."""
    from netdiag.report.json_out import Records

    made: list[int] = []

    def render(i: int) -> dict[str, Any]:
        made.append(i)
        return {"id": f"C{i}", "requests": [{"n": i}]}

    def mark(d: dict[str, Any], i: int) -> None:
        d["path"] = "even" if i % 2 == 0 else None
        d["requests"][0]["seen"] = len(made)

    for items in ([], [1, 2, 3]):
        made.clear()
        lazy: Records[int] = Records(items, render)
        lazy.steps.append(mark)
        assert not made  # nothing rendered before it is written
        text = io.StringIO()
        write_json({"connections": lazy, "n": len(items)}, text)
        want = [{"id": f"C{i}", "requests": [{"n": i, "seen": k + 1}],
                 "path": "even" if i % 2 == 0 else None} for k, i in enumerate(items)]
        plain = io.StringIO()
        write_json({"connections": want, "n": len(items)}, plain)
        assert text.getvalue() == plain.getvalue()
        assert made == items
