"""netdiag: where the time goes between a client and an HTTPS API, from packets."""

__version__ = "0.1.0"
CONTRACT_VERSION = 1
