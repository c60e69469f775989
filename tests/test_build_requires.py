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


def _netdiag_imports(source: Path) -> set[str]:
    """The netdiag modules a source imports (``from netdiag.a import b``: ``netdiag.a``,
    and ``netdiag.a.b`` too where that is a module), wherever the import stands: mypy
    reads them all."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "netdiag")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "netdiag":
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _module_source(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _checked_with(compiled: list[str]) -> dict[str, Path]:
    """The modules mypy type-checks when it compiles ``compiled``: those and every netdiag
    module they import, directly or not, with their packages' ``__init__``."""
    seen: dict[str, Path] = {}
    todo = list(compiled)
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for k in range(1, len(parts) + 1):
            name = ".".join(parts[:k])
            source = _module_source(name)
            if name in seen or source is None:
                continue
            seen[name] = source
            todo.extend(_netdiag_imports(source))
    return seen


def test_compiled_modules_third_party_imports_are_build_requirements() -> None:
    """Those of the modules compiled and of every netdiag module mypy reads with them (a
    compiled writer importing ``report/json_encode``, which imports orjson, failed the
    fresh build while this test looked at the compiled modules' own imports only)."""
    core = runpy.run_path(str(ROOT / "netdiag" / "_core.py"))
    with open(ROOT / "pyproject.toml", "rb") as f:
        requires = {_requirement_name(r) for r in tomllib.load(f)["build-system"]["requires"]}
    dists = importlib.metadata.packages_distributions()
    needed: dict[str, set[str]] = {}
    checked = _checked_with(list(core["COMPILED_MODULES"]))
    assert set(core["COMPILED_MODULES"]) <= set(checked)
    for module, source in checked.items():
        for top in _imported_top_levels(source):
            if top in sys.stdlib_module_names or top == "netdiag" or top.startswith("_") \
                    or top in BUILD_ONLY:
                continue
            for dist in dists.get(top, [top]):
                needed.setdefault(_requirement_name(dist), set()).add(module)
    assert needed, "no third-party import found: the parse above is broken"
    missing = {d: sorted(m) for d, m in needed.items() if d not in requires}
    assert not missing, (f"imported by compiled modules but not in [build-system] requires "
                         f"(mypyc cannot type-check them in pip's build environment): {missing}")
