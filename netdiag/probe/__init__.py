"""Active probes: netdiag as a client that measures its own requests.

Everything else in netdiag is passive (bytes and timestamps in, records out, no
clock, no socket). This package is the one exception, on purpose: it *is* the
client, so it owns sockets and reads the clocks, and keeps both at its edge:

* :mod:`netdiag.probe.http` -- ``run_http_probe``: DNS, TCP connect, TLS handshake,
  request, first byte, last byte, over HTTP/2 (ssl + h2) or HTTP/1.1, with reuse
  or a fresh connection per request (``netdiag probe``).
* :mod:`netdiag.probe.http3` -- ``run_http3_probe``: the same over HTTP/3 (QUIC
  via aioquic on a connected UDP socket): DNS, QUIC handshake, request, first and
  last byte (``netdiag probe --http3``).
* :mod:`netdiag.probe.dns` -- ``run_dns_probe``: one question asked repeatedly of
  several servers over UDP or TCP (``netdiag dns``).

Durations come from ``time.perf_counter_ns`` (monotonic), absolute times from
``time.time_ns`` (the clock a capture's timestamps are taken with), so that a
probe run and a capture of it can be compared request by request. Results are
plain dataclasses with ``to_json()``; the commands only format them.
"""

from __future__ import annotations
