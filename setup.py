"""Build netdiag with its hot path compiled by mypyc, or as pure Python when that fails.

The modules compiled are ``COMPILED_MODULES`` of ``netdiag/_core.py``; mypy (which
brings mypyc) is a build requirement in ``pyproject.toml``. ``pip install .`` and
``pip install -e .`` both compile them (the editable install puts the extensions next
to the sources). ``NETDIAG_PURE_PYTHON=1`` at build time builds pure Python. When
mypyc or the C compiler fails, or there is no C compiler, the build goes on without
extensions and prints one line saying why (``pip install -v`` shows it).

Either way the build writes ``netdiag/_core_build.json``: the SHA-256 of each source it
compiled, or why it did not compile. ``import netdiag`` reads it to choose its core
(see ``netdiag/_core.py``); ``netdiag --version`` says which core runs.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import runpy
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_PACKAGE = os.path.join(HERE, "netdiag")
CORE: dict[str, Any] = runpy.run_path(os.path.join(SOURCE_PACKAGE, "_core.py"))
MODULES: tuple[str, ...] = CORE["COMPILED_MODULES"]

BUILD_COMMANDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install",
                  "bdist", "bdist_egg"}
"""setup.py commands that build modules; metadata ones (egg_info, dist_info, sdist) do not
need mypyc to run."""


def note(message: str) -> None:
    """One line on stderr (pip shows the build's output with -v or when it fails)."""
    print("netdiag: " + " ".join(message.split()), file=sys.stderr, flush=True)


def write_record(package_dir: str, record: dict[str, Any]) -> None:
    """Write the build record read by ``netdiag._core`` into ``package_dir``."""
    os.makedirs(package_dir, exist_ok=True)
    with open(os.path.join(package_dir, CORE["BUILD_RECORD"]), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")


def remove_extensions(package_dir: str) -> None:
    """Delete compiled modules of an earlier build from ``package_dir`` (never anything else)."""
    for module in (*MODULES, CORE["shared_library"]()):
        while True:
            path = CORE["extension_path"](module, package_dir)
            if path is None:
                break
            os.remove(path)


def pure_record(reason: str) -> dict[str, Any]:
    return {"compiled": False, "reason": reason}


def mypyc_extensions() -> tuple[list[Any], dict[str, Any]]:
    """The extensions to build and the record of a successful build, or ``[]`` and the
    record saying why not."""
    if os.environ.get("NETDIAG_PURE_PYTHON", "").strip() not in ("", "0"):
        return [], pure_record("NETDIAG_PURE_PYTHON was set at build time")
    try:
        import mypy.version
        from mypyc.build import mypycify
    except ImportError as exc:
        return [], pure_record(f"mypyc is not installed ({exc})")
    paths = [os.path.relpath(CORE["source_path"](m, SOURCE_PACKAGE)) for m in MODULES]
    # digests of the sources as mypyc is about to read them (see netdiag._core)
    sources = {m: CORE["source_digest"](CORE["source_path"](m, SOURCE_PACKAGE))
               for m in MODULES}
    try:
        extensions = mypycify(paths, group_name=CORE["GROUP_NAME"])
    except (Exception, SystemExit) as exc:  # mypyc prints type errors, then exits
        return [], pure_record(f"mypyc failed ({type(exc).__name__}: {exc})")
    fix_runtime(extensions)
    return extensions, {"compiled": True, "mypy": mypy.version.__version__, "sources": sources}


RUNTIME_FIXES = {
    # b"abc"[2:1] is b"" in Python; mypyc's bytes slice passes a negative size to
    # PyBytes_FromStringAndSize (SystemError) when both bounds are within the object
    "bytes_ops.c": ("        Py_ssize_t slice_len = endn - startn;\n",
                    "        Py_ssize_t slice_len = endn > startn ? endn - startn : 0;\n"),
}
"""Fixes to mypyc's C runtime (``mypyc/lib-rt``), by file: (text, replacement)."""


def fix_runtime(extensions: list[Any]) -> None:
    """Compile the extensions against a copy of mypyc's runtime files with
    :data:`RUNTIME_FIXES` applied: the generated C includes them as ``<name.c>``, so a
    directory first on the include path replaces them. A file whose text no longer
    matches (a mypyc that changed or fixed it) is left as mypyc ships it, said in one
    line; ``tests/test_cores.py`` checks the behaviour either way."""
    import mypyc

    lib_rt = os.path.join(os.path.dirname(mypyc.__file__), "lib-rt")
    fixed = os.path.join(HERE, "build", "mypyc-runtime-fixes")
    os.makedirs(fixed, exist_ok=True)
    for name, (text, replacement) in RUNTIME_FIXES.items():
        with open(os.path.join(lib_rt, name), encoding="utf-8") as f:
            source = f.read()
        target = os.path.join(fixed, name)
        if text not in source:
            note(f"mypyc's {name} no longer has the text netdiag fixes; used as shipped")
            if os.path.exists(target):
                os.remove(target)
            continue
        with open(target, "w", encoding="utf-8") as f:
            f.write(source.replace(text, replacement))
    for ext in extensions:
        ext.include_dirs.insert(0, fixed)


if BUILD_COMMANDS & set(sys.argv[1:]):
    EXTENSIONS, RECORD = mypyc_extensions()
else:
    EXTENSIONS, RECORD = [], pure_record("built without a build command")


class BuildPy(build_py):
    """Writes the record of a pure build (a compiled build's is written by BuildExt)."""

    def run(self) -> None:
        super().run()
        if EXTENSIONS:
            return
        if self.editable_mode:
            remove_extensions(SOURCE_PACKAGE)
            remove_stale_extensions(SOURCE_PACKAGE)
            write_record(SOURCE_PACKAGE, RECORD)
        else:
            write_record(os.path.join(self.build_lib, "netdiag"), RECORD)
        note(f"building pure Python, without the compiled core: {RECORD['reason']}")


def remove_stale_extensions(package_dir: str) -> None:
    """Delete extensions of modules no longer compiled: a ``.so`` beside a ``.py`` of
    the package whose module ``COMPILED_MODULES`` does not list (an earlier build's; it
    would shadow the source and fail to load from the new shared library)."""
    keep = set(MODULES)
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for root, _dirs, files in os.walk(package_dir):
        for name in files:
            if not name.endswith(suffixes) or "__mypyc" in name:
                continue
            stem = name.split(".", 1)[0]
            if not os.path.exists(os.path.join(root, stem + ".py")):
                continue
            rel = os.path.relpath(os.path.join(root, stem), package_dir)
            if "netdiag." + rel.replace(os.sep, ".") not in keep:
                os.remove(os.path.join(root, name))


class BuildExt(build_ext):
    """Builds the mypyc extensions; on any failure, goes on as a pure-Python build."""

    def run(self) -> None:
        inplace = self.inplace or self.editable_mode
        target = SOURCE_PACKAGE if inplace else os.path.join(self.build_lib, "netdiag")
        if inplace:
            remove_stale_extensions(SOURCE_PACKAGE)
        try:
            super().run()
        except Exception as exc:  # no compiler, compile or link error: pure Python instead
            self.extensions = []
            remove_extensions(os.path.join(self.build_lib, "netdiag"))
            if inplace:
                remove_extensions(SOURCE_PACKAGE)
            reason = f"compiling failed ({type(exc).__name__}: {exc})"
            write_record(target, pure_record(reason))
            note(f"building pure Python, without the compiled core: {reason}")
            return
        if self.extensions:
            write_record(target, RECORD)
            note(f"compiled core built with mypyc {RECORD['mypy']}: {', '.join(MODULES)}")


setup(ext_modules=EXTENSIONS, cmdclass={"build_py": BuildPy, "build_ext": BuildExt})
