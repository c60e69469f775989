"""Precise waits in asyncio.

``asyncio.sleep`` wakes up late by up to a millisecond: the event loop rounds its
epoll timeout up to whole milliseconds. The lab promises its delays to within a
fraction of that, so a wait sleeps coarsely until shortly before its deadline, then
yields to the loop until the deadline (other callbacks keep running meanwhile).
"""

from __future__ import annotations

import asyncio

SPIN_S = 0.0015
"""How long before a deadline the coarse sleep ends."""


async def sleep_until(deadline: float) -> None:
    """Return at ``deadline`` (``loop.time()`` clock), never before, rarely 0.1 ms after."""
    loop = asyncio.get_running_loop()
    coarse = deadline - loop.time() - SPIN_S
    if coarse > 0:
        await asyncio.sleep(coarse)
    while loop.time() < deadline:
        await asyncio.sleep(0)
