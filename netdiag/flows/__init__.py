"""netdiag.flows."""
