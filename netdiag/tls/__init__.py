"""TLS key material and record decryption: pure functions of bytes, no I/O.

- :mod:`netdiag.tls.keylog`: NSS key logs (``SSLKEYLOGFILE``) by client random.
- :mod:`netdiag.tls.suites`: what each decryptable cipher suite needs.
- :mod:`netdiag.tls.decrypt`: one connection's record decryption, per direction.
"""

from __future__ import annotations

from netdiag.tls.decrypt import DecryptError, TlsDecryptor
from netdiag.tls.keylog import KeyLog
from netdiag.tls.suites import SUITES, CipherSpec, cipher_spec

__all__ = ["SUITES", "CipherSpec", "DecryptError", "KeyLog", "TlsDecryptor", "cipher_spec"]
