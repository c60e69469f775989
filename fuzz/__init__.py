"""Fuzzing netdiag's parsers (docs/fuzzing.md): atheris targets, seeds, regressions.

Not part of the installed package: ``fuzz/run.py`` runs one target under atheris,
``tests/test_fuzz_regressions.py`` replays ``fuzz/regressions/`` without it.
"""
