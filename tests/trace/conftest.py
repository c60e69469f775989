"""Fixtures of the traceroute tests: the namespace chain of ``netns_chain.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from netns_chain import Chain, build_chain, netns_usable


@pytest.fixture(scope="session")
def netns_ok() -> None:
    why = netns_usable()
    if why is not None:
        pytest.skip(why)


@pytest.fixture(scope="module")
def chain(netns_ok: None) -> Iterator[Chain]:
    """The chain without injected delay, shared by a module's tests."""
    c = build_chain()
    try:
        yield c
    finally:
        c.destroy()


@pytest.fixture
def make_chain(netns_ok: None) -> Iterator[Callable[..., Chain]]:
    """Build chains with options inside a test; all destroyed at its end."""
    made: list[Chain] = []

    def make(**kw: Any) -> Chain:
        c = build_chain(**kw)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.destroy()
