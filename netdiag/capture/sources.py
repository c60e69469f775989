"""Where a capture's bytes come from: a local path, or a URL read through fsspec.

A name with a scheme (``file://``, ``memory://``, ``s3://``, ``gs://``... whatever
fsspec has installed) is a URL; anything else is a local path, read as before with
``open``. fsspec is imported only when a URL is met (``pip install 'netdiag[scale]'``).
"""

from __future__ import annotations

import re
import zlib
from typing import IO, Any

from netdiag.capture.reader import _GZIP_MAGIC, _PCAP_MAGICS, _SHB_MAGIC, CaptureReader
from netdiag.errors import InputError, UrlError

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")


def url_scheme(name: str) -> str | None:
    """The scheme of a URL (``s3`` of ``s3://b/k``), None for a local path."""
    m = _SCHEME.match(name)
    return m.group(1).lower() if m else None


def is_url(name: str) -> bool:
    """Is ``name`` a URL (read through fsspec) rather than a local path?"""
    return url_scheme(name) is not None


def fsspec_module() -> Any:
    """fsspec, or a one-line error saying how to install it."""
    try:
        import fsspec
    except ImportError:
        raise UrlError("reading URLs needs fsspec: pip install 'netdiag[scale]'") from None
    return fsspec


def url_filesystem(url: str) -> tuple[Any, str]:
    """``(fsspec file system, path inside it)`` of ``url``; :class:`UrlError` when its
    scheme is unknown or its file system's package is not installed."""
    fsspec = fsspec_module()
    scheme = url_scheme(url) or "file"
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise UrlError(f"{url}: reading {scheme}:// URLs needs a package that is not "
                       f"installed ({e})") from None
    except ValueError as e:
        known = sorted(fsspec.available_protocols())
        raise UrlError(f"{url}: unknown URL scheme {scheme!r} ({e}; fsspec knows "
                       f"{', '.join(known[:12])}...)") from None
    except Exception as e:  # a file system's own error (credentials, endpoint...)
        raise UrlError(f"{url}: cannot open: {type(e).__name__}: {e}") from None
    return fs, path


def open_url(url: str) -> IO[bytes]:
    """The bytes of ``url`` as an opened binary file (fsspec), or one-line errors:
    :class:`InputError` when it cannot be read, :class:`UrlError` when it cannot be
    understood."""
    fs, path = url_filesystem(url)
    try:
        f: IO[bytes] = fs.open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"cannot read {url}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"cannot read {url}: it is a folder") from None
    except OSError as e:
        raise InputError(f"cannot read {url}: {e.strerror or e}") from None
    except Exception as e:
        raise InputError(f"cannot read {url}: {type(e).__name__}: {e}") from None
    return f


def open_capture(name: str) -> CaptureReader:
    """A :class:`CaptureReader` of a local path or of a URL (through fsspec)."""
    if not is_url(name):
        return CaptureReader(name)
    f = open_url(name)
    try:
        return CaptureReader(name, fileobj=f)
    except BaseException:
        f.close()
        raise


def read_tail(name: str, nbytes: int) -> tuple[bytes, int] | None:
    """The last ``nbytes`` bytes of a file (local or URL) and its size, by seeking; None
    when it cannot seek (a pipe)."""
    try:
        if is_url(name):
            fs, path = url_filesystem(name)
            size = int(fs.size(path))
            start = max(0, size - nbytes)
            with fs.open(path, "rb") as f:
                f.seek(start)
                data = f.read(size - start)
        else:
            with open(name, "rb") as f:
                size = f.seek(0, 2)
                start = max(0, size - nbytes)
                f.seek(start)
                data = f.read(size - start)
    except (OSError, ValueError, UrlError):
        return None
    except Exception:  # a remote file system's own error: read it from the start instead
        return None
    return bytes(data), size


def looks_like_capture(head: bytes) -> bool:
    """Do these first bytes of a file (at least 4; gzip-compressed ones decompressed
    here) start a pcap or pcapng capture?"""
    if head[:2] == _GZIP_MAGIC:
        try:
            head = zlib.decompressobj(31).decompress(head, 4)
        except zlib.error:
            return False
    return head[:4] in _PCAP_MAGICS or head[:4] == _SHB_MAGIC


HEAD_BYTES = 4096
"""Bytes read from the start of a file to tell whether it is a capture (compressed
captures need a few hundred to show their first 4 bytes)."""
