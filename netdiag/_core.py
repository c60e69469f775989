"""Which core runs: the hot path compiled with mypyc, or its pure-Python twin.

``setup.py`` compiles :data:`COMPILED_MODULES` with mypyc: one shared library inside
the package (``netdiag/_core__mypyc*.so``, from :data:`GROUP_NAME`) and one small
extension module next to each module's ``.py`` file. It also writes
:data:`BUILD_RECORD` beside this file: the SHA-256 of every source it compiled, or why
it built pure Python instead.

:func:`select` runs at ``import netdiag``. The compiled modules share one library, so
they are used all together or not at all: only when ``NETDIAG_CORE`` is not
``python``, the build record says they were compiled, every extension is there, the
library loads, and every source still has the digest it was compiled from. Otherwise
a finder put first on ``sys.meta_path`` loads each of them from its ``.py`` source, so
an edited source (a stale build) or a partial build never runs; the two cores give
the same output.

This module imports only the standard library: ``setup.py`` runs it on its own.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

COMPILED_MODULES: tuple[str, ...] = (
    "netdiag.records",
    "netdiag.limits",
    "netdiag.capture.linktypes",
    "netdiag.capture.reader",
    "netdiag.flows.defrag",
    "netdiag.flows.dns_shape",
    "netdiag.flows.tcp",
    "netdiag.flows.table",
    "netdiag.protocols.dns",
    "netdiag.tls.names",
    "netdiag.protocols.tls_infer",
    "netdiag.protocols.tls",
    "netdiag.protocols.hpack_decode",
    "netdiag.protocols.sse",
    "netdiag.protocols.http2",
    "netdiag.tls.decrypt",
    "netdiag.protocols.tls_decrypt",
    "netdiag.analysis.stats",
    "netdiag.analysis.tally",
    "netdiag.analysis.summary",
    "netdiag.paths.endpoint",
    "netdiag.paths.chains",
    "netdiag.paths.budget",
    "netdiag.protocols.resp",
    "netdiag.paths.attribute",
    "netdiag.paths.edge",
    "netdiag.paths.load",
    "netdiag.report.har",
    "netdiag.report.csv_out",
    "netdiag.report.parquet_out",
    "netdiag.report.svg",
    "netdiag.report.html",
)
"""The modules mypyc compiles (the per-packet path, DNS message parsing, the keyless TLS
record walk, HPACK decoding, the HTTP/2 analyzer and its event-stream counter, record
decryption and the decrypting TLS analyzer, RESP, the summary and its per-request loop,
and the path analysis: hop linking, attribution, the edge facts, the budgets and the load
over time, and the HAR, CSV, Parquet and HTML writers with the HTML page's charts);
everything else is pure Python (HTTP/1.x, QUIC and HTTP/3 among them)."""
GROUP_NAME = "netdiag._core"
"""mypyc group name: its shared library is the extension module ``netdiag._core__mypyc``
(inside the package, which an editable install maps onto the source tree)."""
BUILD_RECORD = "_core_build.json"
"""Written by ``setup.py`` beside this file: ``{"compiled": true, "mypy": version,
"sources": {module: sha256}}`` or ``{"compiled": false, "reason": text}``."""
ENV_VAR = "NETDIAG_CORE"
"""``python`` forces the pure-Python twin; ``compiled`` insists on the compiled core
(``import netdiag`` fails when it cannot be used); unset or ``auto``: compiled if usable."""
COMPILED = "compiled (mypyc)"
PURE = "pure Python"

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

_pure_reason: str | None = None
"""Why the pure-Python twin was chosen by :func:`select`; None when the compiled core was."""


def source_path(module: str, package_dir: str = PACKAGE_DIR) -> str:
    """The ``.py`` file of ``module`` (``netdiag.x.y``) under the package directory."""
    return os.path.join(package_dir, *module.split(".")[1:]) + ".py"


def source_digest(path: str) -> str:
    """SHA-256 (hex) of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def extension_path(module: str, package_dir: str = PACKAGE_DIR) -> str | None:
    """The extension file Python would import for ``module`` there, or None."""
    base = os.path.join(package_dir, *module.split(".")[1:])
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if os.path.exists(base + suffix):
            return base + suffix
    return None


def shared_library() -> str:
    """Module name of the mypyc shared library (mypyc's ``shared_lib_name``)."""
    return GROUP_NAME + "__mypyc"


def compiled_problem(package_dir: str = PACKAGE_DIR) -> str | None:
    """Why the compiled core cannot be used from ``package_dir``; None when it can."""
    try:
        with open(os.path.join(package_dir, BUILD_RECORD), encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return (f"not compiled here (no {BUILD_RECORD}; pip install . or pip install -e . "
                "compiles it)")
    except (OSError, ValueError) as exc:
        return f"unreadable build record {BUILD_RECORD} ({exc})"
    if not isinstance(record, dict) or not record.get("compiled"):
        reason = record.get("reason") if isinstance(record, dict) else None
        return f"built without compiling ({reason or 'no reason recorded'})"
    sources = record.get("sources")
    if not isinstance(sources, dict) or sorted(sources) != sorted(COMPILED_MODULES):
        return "the build compiled other modules than netdiag._core lists; rebuild"
    if extension_path(shared_library(), package_dir) is None:
        return f"the compiled library {shared_library()} is missing; rebuild"
    for module in COMPILED_MODULES:
        path = source_path(module, package_dir)
        shown = os.path.relpath(path, os.path.dirname(package_dir))
        if extension_path(module, package_dir) is None:
            return f"{module} has no compiled extension; rebuild"
        try:
            digest = source_digest(path)
        except OSError:
            return f"{shown} cannot be read"
        if digest != sources[module]:
            return f"{shown} changed since it was compiled (pip install -e . recompiles)"
    return None


class PureFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`COMPILED_MODULES` as their ``.py`` sources only."""

    def __init__(self, names: Sequence[str] = COMPILED_MODULES) -> None:
        self.names = frozenset(names)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self.names or not path:
            return None
        leaf = fullname.rpartition(".")[2] + ".py"
        for entry in path:
            file = os.path.join(entry, leaf)
            if os.path.isfile(file):
                return importlib.util.spec_from_file_location(fullname, file)
        return None


def select(environ: Mapping[str, str] = os.environ) -> None:
    """Choose the core for this process (see the module docstring); run by ``import netdiag``."""
    global _pure_reason
    choice = environ.get(ENV_VAR, "").strip().lower()
    if choice in ("python", "pure"):
        reason: str | None = f"{ENV_VAR}={choice}"
    elif choice in ("", "auto", "compiled", "mypyc"):
        reason = compiled_problem()
        if reason is None:
            try:  # built for another interpreter, or damaged: better pure than a crash later
                importlib.import_module(shared_library())
            except ImportError as exc:
                reason = f"the compiled library does not load ({exc})"
        if reason is not None and choice in ("compiled", "mypyc"):
            raise ImportError(f"{ENV_VAR}={choice}, but the compiled core cannot be used: "
                              f"{reason}")
    else:
        raise ImportError(f"{ENV_VAR}={choice!r}: expected 'python', 'compiled' or 'auto'")
    _pure_reason = reason
    if reason is not None and not any(isinstance(f, PureFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, PureFinder())


def is_compiled(module: ModuleType) -> bool:
    """The module was loaded from an extension (a mypyc build), not from Python source."""
    file = getattr(module, "__file__", None) or ""
    return file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def core_name() -> str:
    """``compiled (mypyc)`` or ``pure Python``: what the compiled modules were imported as."""
    compiled = [is_compiled(importlib.import_module(m)) for m in COMPILED_MODULES]
    if all(compiled):
        return COMPILED
    if not any(compiled):
        return PURE
    return "mixed: compiled " + ", ".join(m for m, c in zip(COMPILED_MODULES, compiled,
                                                             strict=True) if c)


def pure_reason() -> str | None:
    """Why the pure-Python twin runs (``NETDIAG_CORE=python``, a stale build...), or None."""
    return _pure_reason


def version_label() -> str:
    """The core for ``netdiag --version``: ``compiled, mypyc`` or ``pure Python; why``."""
    name = core_name()
    if name == COMPILED:
        return "compiled, mypyc"
    reason = pure_reason()
    return f"{name}; {reason}" if name == PURE and reason else name
