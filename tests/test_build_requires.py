"""The build can compile the core on a fresh machine.

mypyc type-checks the compiled modules (``COMPILED_MODULES`` of ``netdiag/_core.py``)
inside pip's isolated build environment, where only ``[build-system] requires`` is
installed: a third-party package those modules import that is missing there fails the
check, and ``pip install .`` quietly builds pure Python. So every distribution they
import must be a build requirement.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import runpy
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_ONLY = {"mypy_extensions"}
"""Imported by the compiled modules and brought by mypy (a build requirement itself)."""


def _imported_top_levels(source: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _requirement_name(spec: str) -> str:
    name = re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def test_compiled_modules_third_party_imports_are_build_requirements() -> None:
    core = runpy.run_path(str(ROOT / "netdiag" / "_core.py"))
    with open(ROOT / "pyproject.toml", "rb") as f:
        requires = {_requirement_name(r) for r in tomllib.load(f)["build-system"]["requires"]}
    dists = importlib.metadata.packages_distributions()
    needed: dict[str, set[str]] = {}
    for module in core["COMPILED_MODULES"]:
        for top in _imported_top_levels(Path(core["source_path"](module))):
            if top in sys.stdlib_module_names or top == "netdiag" or top.startswith("_") \
                    or top in BUILD_ONLY:
                continue
            for dist in dists.get(top, [top]):
                needed.setdefault(_requirement_name(dist), set()).add(module)
    assert needed, "no third-party import found: the parse above is broken"
    missing = {d: sorted(m) for d, m in needed.items() if d not in requires}
    assert not missing, (f"imported by compiled modules but not in [build-system] requires "
                         f"(mypyc cannot type-check them in pip's build environment): {missing}")
