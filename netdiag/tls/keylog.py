"""TLS key logs in the NSS key log format (``SSLKEYLOGFILE``).

The format (https://firefox-source-docs.mozilla.org/security/nss/legacy/key_log_format/)
is one secret a line, ``<LABEL> <client random, 64 hex digits> <secret in hex>``;
lines starting with ``#`` and blank lines are ignored. Labels read here:

==================================  ==========================================
``CLIENT_RANDOM``                   TLS <= 1.2 master secret (48 bytes)
``CLIENT_EARLY_TRAFFIC_SECRET``     TLS 1.3 0-RTT data from the client
``CLIENT_HANDSHAKE_TRAFFIC_SECRET`` TLS 1.3 handshake records from the client
``SERVER_HANDSHAKE_TRAFFIC_SECRET`` TLS 1.3 handshake records from the server
``CLIENT_TRAFFIC_SECRET_0``         TLS 1.3 first application secret, client
``SERVER_TRAFFIC_SECRET_0``         TLS 1.3 first application secret, server
``EARLY_EXPORTER_SECRET``           TLS 1.3 early exporter secret
``EXPORTER_SECRET``                 TLS 1.3 exporter secret
==================================  ==========================================

TLS 1.3 secrets are as long as the suite's hash (32 or 48 bytes). Other labels
(``RSA <encrypted pre-master prefix> <pre-master>``, ``PMS_CLIENT_RANDOM``, the ECH
labels of newer drafts...) are skipped; they do not identify a connection by its
client random or need data this program does not keep.

Secrets are key material: nothing here prints them. Error messages say which line
is wrong and why, never what it holds, and ``repr`` shows counts only.

A key log file is read in pieces, never whole: at most :data:`MAX_KEYLOG_BYTES` bytes
(64 MiB, about 300 000 lines; ``NETDIAG_KEYLOG_MAX_MB`` sets another limit in MiB) and
lines of at most :data:`MAX_LINE_BYTES` (1 MiB). A file beyond either limit (a key log
that never ends, such as ``/dev/zero``, or one that is not a key log) is an input error
naming the limit, raised as soon as the limit is passed, before anything is parsed:
a key log cut short would silently decrypt less, so none of it is used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from netdiag.errors import InputError

CLIENT_RANDOM = "CLIENT_RANDOM"
CLIENT_EARLY_TRAFFIC_SECRET = "CLIENT_EARLY_TRAFFIC_SECRET"
CLIENT_HANDSHAKE_TRAFFIC_SECRET = "CLIENT_HANDSHAKE_TRAFFIC_SECRET"
SERVER_HANDSHAKE_TRAFFIC_SECRET = "SERVER_HANDSHAKE_TRAFFIC_SECRET"
CLIENT_TRAFFIC_SECRET_0 = "CLIENT_TRAFFIC_SECRET_0"
SERVER_TRAFFIC_SECRET_0 = "SERVER_TRAFFIC_SECRET_0"
EARLY_EXPORTER_SECRET = "EARLY_EXPORTER_SECRET"
EXPORTER_SECRET = "EXPORTER_SECRET"

MASTER_SECRET_LENGTH = 48
CLIENT_RANDOM_LENGTH = 32

LABELS: dict[str, tuple[int, ...]] = {
    CLIENT_RANDOM: (MASTER_SECRET_LENGTH,),
    CLIENT_EARLY_TRAFFIC_SECRET: (32, 48),
    CLIENT_HANDSHAKE_TRAFFIC_SECRET: (32, 48),
    SERVER_HANDSHAKE_TRAFFIC_SECRET: (32, 48),
    CLIENT_TRAFFIC_SECRET_0: (32, 48),
    SERVER_TRAFFIC_SECRET_0: (32, 48),
    EARLY_EXPORTER_SECRET: (32, 48),
    EXPORTER_SECRET: (32, 48),
}
"""The labels kept, with the secret lengths each may have."""

MAX_KEYLOG_BYTES = 64 * 1024 * 1024
"""Largest key log file read (bytes), unless ``NETDIAG_KEYLOG_MAX_MB`` says otherwise."""
MAX_LINE_BYTES = 1024 * 1024
"""Longest line of a key log file (bytes); real lines are under 300."""
MAX_ENV = "NETDIAG_KEYLOG_MAX_MB"
"""Environment variable: the largest key log file read, in MiB (a positive integer)."""
_READ_CHUNK = 256 * 1024

_LABEL_RE = re.compile(r"[A-Z][A-Z0-9_]*\Z")
_HEX_RE = re.compile(r"[0-9a-fA-F]*\Z")


class KeyLog:
    """Secrets by ClientHello random, read from NSS key log text.

    When one client random and label appear twice, the later line (or the log
    merged later) wins.
    """

    __slots__ = ("_by_random", "sources")

    def __init__(self) -> None:
        self._by_random: dict[bytes, dict[str, bytes]] = {}
        self.sources: list[str] = []
        """Where the secrets came from (file names, ``decryption secrets block``)."""

    # -- reading ------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str | bytes, source: str = "<keylog>") -> KeyLog:
        """Read key log text; ``source`` names it in error messages.

        Raises :class:`~netdiag.errors.InputError` ``"SOURCE:LINE: what is wrong"``
        on the first malformed line.
        """
        log = cls()
        log.sources.append(source)
        if isinstance(text, bytes | bytearray | memoryview):
            data = bytes(text)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as e:
                bad_line = data[:e.start].count(b"\n") + 1
                raise InputError(f"{source}:{bad_line}: not text (a key log is lines of "
                                 f"'LABEL CLIENT_RANDOM SECRET' in hex)") from None
        if text.startswith("\ufeff"):
            text = text[1:]
        by_random = log._by_random
        for lineno, raw in enumerate(text.split("\n"), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            label = fields[0]
            if not _LABEL_RE.match(label):
                raise InputError(f"{source}:{lineno}: not a key log line (expected "
                                 f"'LABEL CLIENT_RANDOM SECRET')")
            lengths = LABELS.get(label)
            if lengths is None:
                if len(fields) < 3:
                    raise InputError(f"{source}:{lineno}: {label} line has {len(fields)} "
                                     f"field(s), expected 3")
                continue  # RSA, PMS_CLIENT_RANDOM, ECH...: not used, not checked
            if len(fields) != 3:
                raise InputError(f"{source}:{lineno}: {label} line has {len(fields)} "
                                 f"field(s), expected 3 (LABEL CLIENT_RANDOM SECRET)")
            random = _unhex(fields[1], source, lineno, "client random")
            if len(random) != CLIENT_RANDOM_LENGTH:
                raise InputError(f"{source}:{lineno}: client random is {len(random)} bytes, "
                                 f"expected {CLIENT_RANDOM_LENGTH}")
            secret = _unhex(fields[2], source, lineno, f"{label} secret")
            if len(secret) not in lengths:
                expected = " or ".join(str(n) for n in lengths)
                raise InputError(f"{source}:{lineno}: {label} secret is {len(secret)} bytes, "
                                 f"expected {expected}")
            entry = by_random.get(random)
            if entry is None:
                entry = by_random[random] = {}
            entry[label] = secret
        return log

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], max_bytes: int | None = None,
                  max_line: int = MAX_LINE_BYTES) -> KeyLog:
        """Read a key log file; InputError when it cannot be read, is malformed, is
        larger than ``max_bytes`` (default :func:`max_keylog_bytes`) or has a line
        longer than ``max_line`` bytes."""
        name = os.fspath(path)
        limit = max_keylog_bytes() if max_bytes is None else max_bytes
        try:
            with open(name, "rb") as f:
                data = _read_capped(f, name, limit, max_line)
        except OSError as e:
            raise InputError(f"cannot read key log {name}: {e.strerror or e}") from None
        return cls.parse(data, name)

    # -- using --------------------------------------------------------------------------
    def merge(self, other: KeyLog) -> None:
        """Add ``other``'s secrets; for the same random and label, ``other`` wins."""
        by_random = self._by_random
        for random, secrets in other._by_random.items():
            entry = by_random.get(random)
            if entry is None:
                by_random[random] = dict(secrets)
            else:
                entry.update(secrets)
        self.sources.extend(s for s in other.sources if s not in self.sources)

    def secrets_for(self, client_random: bytes) -> dict[str, bytes]:
        """``{label: secret}`` of the connection with this ClientHello random ({} if none)."""
        entry = self._by_random.get(bytes(client_random))
        return dict(entry) if entry else {}

    def __contains__(self, client_random: object) -> bool:
        if not isinstance(client_random, bytes | bytearray):
            return False
        return bytes(client_random) in self._by_random

    def __len__(self) -> int:
        """Number of client randoms (connections) with at least one secret."""
        return len(self._by_random)

    def __bool__(self) -> bool:
        return bool(self._by_random)

    def client_randoms(self) -> Iterator[bytes]:
        """The client randoms known, in the order first read."""
        return iter(list(self._by_random))

    def to_bytes(self, client_randoms: Iterable[bytes] | None = None) -> bytes:
        """The secrets as NSS key log text, e.g. for a pcapng decryption-secrets block.

        ``client_randoms`` (an iterable of randoms) limits the output to those
        connections; by default every connection is written.
        """
        if client_randoms is None:
            randoms: list[bytes] = list(self._by_random)
        else:
            randoms = [bytes(r) for r in client_randoms]
        lines: list[str] = []
        for random in randoms:
            secrets = self._by_random.get(random)
            if not secrets:
                continue
            rhex = random.hex()
            lines.extend(f"{label} {rhex} {secret.hex()}\n" for label, secret in secrets.items())
        return "".join(lines).encode("ascii")

    def __repr__(self) -> str:
        n = len(self._by_random)
        return f"<KeyLog: secrets of {n} connection{'' if n == 1 else 's'}>"

    __str__ = __repr__

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickling (to a worker process) keeps the secrets but never shows them.
        return (_rebuild, (self.to_bytes(), list(self.sources)))


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def max_keylog_bytes() -> int:
    """The size limit of a key log file: ``$NETDIAG_KEYLOG_MAX_MB`` MiB when set, else
    :data:`MAX_KEYLOG_BYTES`. InputError when the variable is not a positive integer."""
    env = os.environ.get(MAX_ENV)
    if env is None or not env.strip():
        return MAX_KEYLOG_BYTES
    try:
        mib = int(env.strip())
    except ValueError:
        mib = 0
    if not 0 < mib <= 1 << 20:
        raise InputError(f"{MAX_ENV} must be a whole number of MiB between 1 and "
                         f"{1 << 20}")
    return mib * 1024 * 1024


def _read_capped(f: BinaryIO, name: str, max_bytes: int, max_line: int) -> bytes:
    """All of ``f``, read in chunks; InputError once more than ``max_bytes`` bytes or a
    line longer than ``max_line`` bytes has been seen (the rest is never read)."""
    chunks: list[bytes] = []
    total = 0
    line_len = 0      # bytes of the line still open at the end of what was read
    lines = 0         # line ends seen
    chunk_size = max(1, min(_READ_CHUNK, max_line))
    while True:
        chunk = f.read(min(chunk_size, max_bytes + 1 - total))
        if not chunk:
            break
        total += len(chunk)
        if total > max_bytes:
            raise InputError(f"key log {name} is larger than {_mib(max_bytes)}, the most "
                             f"netdiag reads ({MAX_ENV} sets another limit; or keep only "
                             "the lines of this capture's connections)")
        first = chunk.find(b"\n")
        if first < 0:
            line_len += len(chunk)
        else:
            if line_len + first > max_line:
                line_len += first
            else:
                lines += chunk.count(b"\n")
                line_len = len(chunk) - chunk.rfind(b"\n") - 1
        if line_len > max_line:
            raise InputError(f"{name}:{lines + 1}: line longer than {_mib(max_line)}: "
                             "not a key log (lines of 'LABEL CLIENT_RANDOM SECRET')")
        chunks.append(chunk)
    return b"".join(chunks)


def _rebuild(data: bytes, sources: list[str]) -> KeyLog:
    log = KeyLog.parse(data, "<pickled key log>")
    log.sources = sources
    return log


def _unhex(field: str, source: str, lineno: int, what: str) -> bytes:
    if len(field) % 2 or not _HEX_RE.match(field):
        raise InputError(f"{source}:{lineno}: {what} is not an even number of hex digits")
    return bytes.fromhex(field)
