"""netdiag.capture."""
