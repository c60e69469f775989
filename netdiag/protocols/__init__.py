"""Passive, I/O-free protocol analyzers: fed bytes and capture times, they build records."""
