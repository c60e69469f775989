"""Settings for the whole suite."""

from __future__ import annotations

import signal

# A suite started in the background by a shell without job control (``cmd &`` in a
# script, nohup) inherits SIGINT ignored, and so would every netdiag it starts: the
# tests that press Ctrl-C on a report, a lab or a fleet would see it ignored, as a
# user's netdiag rightly does when started that way. Here SIGINT gets Python's
# default handler, so that the children start with it at its default, as from a
# terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
