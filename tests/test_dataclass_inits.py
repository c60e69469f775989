"""Dataclasses of the compiled core that write their own ``__init__``.

Compiled by mypyc, a dataclass keeps the ``__init__`` that :mod:`dataclasses` generates,
which is interpreted Python: building a request record or a linker node took ten times
as long as a compiled ``__init__`` (``docs/performance.md``). The classes built once per
packet, record or candidate link therefore spell their ``__init__`` out. These tests
hold each such ``__init__`` to its fields: the same names in the same order, the same
defaults, a factory's value where the field has one, every field assigned once; and
check that the ``__init__`` that runs is that one.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from netdiag._core import COMPILED_MODULES

ROOT = Path(__file__).resolve().parent.parent

HOT = {
    "netdiag.records": {"Warning_", "DnsTransaction", "TlsInfo", "Request", "Connection"},
    "netdiag.paths.chains": {"Node", "Step", "_Edge"},
    "netdiag.analysis.tally": {"RequestTimes"},
}
"""Classes built per packet, record or candidate link: they must keep their own
``__init__``."""


def _is_dataclass(cls: ast.ClassDef) -> bool:
    for d in cls.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Name) and target.id == "dataclass":
            return True
    return False


def _fields(cls: ast.ClassDef) -> list[ast.AnnAssign]:
    out = []
    for st in cls.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            ann = ast.unparse(st.annotation)
            if not ann.startswith(("ClassVar", "Final")):
                out.append(st)
    return out


def _init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next((st for st in cls.body
                 if isinstance(st, ast.FunctionDef) and st.name == "__init__"), None)


def _factory_value(call: ast.Call) -> str | None:
    """The expression a ``field(default_factory=...)`` stands for, as source."""
    for kw in call.keywords:
        if kw.arg == "default_factory":
            f = kw.value
            if isinstance(f, ast.Lambda):
                return ast.unparse(f.body)
            if isinstance(f, ast.Name) and f.id in ("list", "dict"):
                return "[]" if f.id == "list" else "{}"
            raise AssertionError(f"unexpected factory {ast.unparse(f)}")
    return None


def _field_default(value: ast.expr | None) -> tuple[str | None, str | None]:
    """(default as source, factory value as source) of a field's right-hand side."""
    if value is None:
        return None, None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
            and value.func.id == "field":
        factory = _factory_value(value)
        if factory is not None:
            return None, factory
        default = next((kw.value for kw in value.keywords if kw.arg == "default"), None)
        return (None if default is None else ast.unparse(default)), None
    return ast.unparse(value), None


def _classes_with_init() -> list[tuple[str, ast.ClassDef]]:
    out = []
    for module in COMPILED_MODULES:
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and _is_dataclass(node) and _init(node):
                out.append((module, node))
    return out


CLASSES = _classes_with_init()


def test_the_hot_classes_write_their_own_init() -> None:
    have = {(m, c.name) for m, c in CLASSES}
    for module, names in HOT.items():
        for name in names:
            assert (module, name) in have, f"{module}.{name} lost its own __init__"


@pytest.mark.parametrize(("module", "cls"), CLASSES, ids=[f"{m}.{c.name}" for m, c in CLASSES])
def test_init_agrees_with_the_fields(module: str, cls: ast.ClassDef) -> None:
    init = _init(cls)
    assert init is not None
    args = init.args
    assert not args.vararg and not args.kwarg and not args.kwonlyargs and not args.posonlyargs
    params = [a.arg for a in args.args]
    assert params[0] == "self"
    fields = _fields(cls)
    names = [f.target.id for f in fields]  # type: ignore[union-attr]
    assert params[1:] == names, f"{cls.name}: parameters {params[1:]} != fields {names}"
    defaults: dict[str, ast.expr] = dict(zip(params[len(params) - len(args.defaults):],
                                             args.defaults, strict=True))
    assigned: dict[str, str] = {}
    for st in init.body:
        assert isinstance(st, ast.Assign) and len(st.targets) == 1, ast.unparse(st)
        target = st.targets[0]
        assert isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
            and target.value.id == "self", ast.unparse(st)
        assert target.attr not in assigned, f"{cls.name}.{target.attr} assigned twice"
        assigned[target.attr] = ast.unparse(st.value)
    assert list(assigned) == names, f"{cls.name}: assigns {list(assigned)}, fields {names}"
    for f in fields:
        name = f.target.id  # type: ignore[union-attr]
        default, factory = _field_default(f.value)
        given = defaults.get(name)
        if factory is not None:
            assert given is not None and ast.unparse(given) == "None", f"{cls.name}.{name}"
            assert assigned[name] == f"{factory} if {name} is None else {name}", \
                f"{cls.name}.{name}: {assigned[name]}"
            continue
        assert assigned[name] == name, f"{cls.name}.{name}: {assigned[name]}"
        if default is None:
            assert given is None, f"{cls.name}.{name} has a default the field has not"
        else:
            assert given is not None and ast.unparse(given) == default, \
                f"{cls.name}.{name}: default {given and ast.unparse(given)} != {default}"


@pytest.mark.parametrize(("module", "cls"), CLASSES, ids=[f"{m}.{c.name}" for m, c in CLASSES])
def test_the_init_that_runs_is_the_written_one(module: str, cls: ast.ClassDef) -> None:
    """Not the one :mod:`dataclasses` generates (whose code comes from ``<string>``);
    compiled, an ``__init__`` has no code object at all."""
    runtime = getattr(importlib.import_module(module), cls.name)
    code = getattr(runtime.__init__, "__code__", None)
    if code is not None:
        assert code.co_filename.endswith(module.replace(".", "/") + ".py"), code.co_filename
