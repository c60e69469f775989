"""netdiag: where the time goes between a client and an HTTPS API, from packets."""

from netdiag import _core

__version__ = "0.1.0"
CONTRACT_VERSION = 1

_core.select()  # the compiled core, or its pure-Python twin (NETDIAG_CORE=python)
