"""netdiag.analysis."""
