"""The ROC/DPF lab: real servers on loopback, real load, a real capture.

``netdiag lab --write lab.pcapng`` (or :func:`run_lab`) starts the topology, captures
``lo``, drives a request mix through both paths, stops everything and writes the
capture (TLS keys embedded), its path profile ``<stem>.paths.toml`` and its ledger
``<stem>.expected.json``. :class:`Lab` is the same as a context manager::

    from netdiag.lab import Lab, LabParams

    with Lab(LabParams(router_delay_ms=25)) as lab:
        lab.start_capture()
        ledger = lab.drive()          # what the clients, the edge and the router did
        lab.stop_capture()
        lab.write_capture(out)        # before leaving the block

Topology (addresses in ``netdiag.lab.params``), each role in a process of its own
(``netdiag.lab.serve``) with a real-time priority where allowed, so that the delays it
is told to inject are the delays the capture sees:

* DNS ``127.0.0.53:53`` (UDP, TCP): the lab's names, answers held ``dns_delay_ms``;
* ROC: edge ``127.0.0.10:443`` (TLS 1.3 + HTTP/2, ``api.roc.test``) -> one pooled h2c
  connection (or pooled HTTP/1.1) -> router ``127.0.0.11:8080`` -> ``EVALSHA`` of a
  budget script in ``redis-server`` ``127.0.0.12:6379`` -> ``router_delay_ms`` -> a new
  TLS + HTTP/2 connection per request (or pooled ones, or HTTP/1.1) -> origins
  ``127.0.0.21..`` (``gpu-N.roc.test``); the proxies connect from their own addresses
  or from ``127.0.0.1`` (``upstream_source``);
* DPF: clients pick an origin ``127.0.0.31..`` (``gpu-N.dpf.test``) with
  ``xxh64(model|user|time bucket) % origins`` and connect to it directly;
* origins answer JSON or server-sent events ``think_ms`` after a request arrived,
  events ``token_gap_ms`` apart;
* clients (``netdiag.lab.driver``): ROC from ``127.0.0.2``, DPF from ``127.0.0.3``,
  httpx over HTTP/2, the key log written by their ssl context (and the router's).

The ledger's ``chains`` say which upstream requests and token-store calls each client
request caused, by endpoints and stream ids or ordinals (``netdiag.lab.chains``,
``docs/lab.md``). :func:`run_lab` runs in a network namespace of its own when it can
(``netdiag.lab.netns``); :class:`Lab` runs in the caller's.

``LabParams.ramp`` makes the load open loop (``netdiag.lab.ramp``): per path, Poisson
arrivals whose rate ramps linearly, each request sent at its scheduled time by
clients in a process of their own (``netdiag.lab.loadgen``); with
``router_budget_per_s`` the router admits requests through a queue in Redis
(``netdiag.lab.redis_store.QUEUE_SCRIPT``), so the latency knee is real. Every hop
logs its own wall-clock timestamps per request: the ledger's ``request_log[].hops``.

``netdiag.lab.recover`` reads a lab capture back with netdiag's pipeline and finds
each injected delay on the wire. Heavy imports (hypercorn, httpx, h2, dnspython)
happen when a lab starts, not on import.
"""

from __future__ import annotations

from netdiag.lab.errors import LabError
from netdiag.lab.lab import Lab, run_lab
from netdiag.lab.params import LabParams

__all__ = ["Lab", "LabError", "LabParams", "run_lab"]
