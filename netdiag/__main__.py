"""``python -m netdiag``."""

from netdiag.cli import main

main()
