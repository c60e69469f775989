"""The one exception hierarchy of netdiag.

Every error a user can cause derives from :class:`NetdiagError` and carries the
exit status the CLI returns for it (see ``docs/cli.md``).
"""

from __future__ import annotations


class NetdiagError(Exception):
    """Base of every error netdiag raises on purpose."""

    exit_code = 1


class InputError(NetdiagError):
    """Bad input: a missing or unreadable file, not a capture, an invalid option file."""

    exit_code = 1


class CaptureFormatError(InputError):
    """The file is not a pcap or pcapng capture at all (bad magic, unusable header)."""


class ParseError(NetdiagError):
    """A protocol message could not be parsed; analyzers turn it into a warning."""


class UrlError(InputError):
    """A URL netdiag cannot read at all: an unknown scheme, a missing fsspec backend."""


class NoCaptureError(InputError):
    """An input names no capture: an empty folder, a pattern that matches nothing."""


class SchedulerError(NetdiagError):
    """The Dask scheduler cannot be reached, or the ``scale`` extra is not installed."""

    exit_code = 1
