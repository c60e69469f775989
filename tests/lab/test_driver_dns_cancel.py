"""A lab's DNS lookup cut short (Ctrl-C cancels it) leaves no unretrieved exception for
asyncio to print as a traceback when the shared future is collected."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace
from typing import Any

import pytest

from netdiag.lab.driver import Driver


def test_a_cancelled_lookup_prints_nothing() -> None:
    reported: list[dict[str, Any]] = []

    async def lookup(*_args: Any) -> list[str]:
        raise asyncio.CancelledError

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        fake: Any = SimpleNamespace(_dns_cache={}, lookup=lookup)
        with pytest.raises(asyncio.CancelledError):
            await Driver.resolve(fake, "api.example", "10.0.0.2", "udp", "ROC")
        assert fake._dns_cache == {}  # a later lookup tries again
        gc.collect()  # the future is gone: unretrieved, it would be reported now
        await asyncio.sleep(0)

    asyncio.run(main())
    assert not [c for c in reported if "never retrieved" in str(c.get("message"))], reported
