"""``netdiag diff``: two captures (or two JSON reports) side by side, with deltas and
whether each latency change is bigger than the noise.

:func:`netdiag.diff.compare.compare` builds the comparison (a JSON-ready dict);
:mod:`netdiag.diff.render` writes it for the terminal, as JSON, or as one HTML page.
"""
