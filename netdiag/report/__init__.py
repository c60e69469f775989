"""netdiag.report."""
