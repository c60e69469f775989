"""Structure-aware mutation for targets whose input is a document (``diff``).

Byte mutations of a JSON report almost always give invalid JSON (an input error) or
change one number for another; what breaks a reader of the document is a value of the
wrong type where a list or table was expected. :func:`mutate_json` parses the input,
replaces, deletes or duplicates one node (any depth) with a value of another type,
and writes it back; input that is not JSON gets libFuzzer's byte mutation.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

ODD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 1 << 63, -(1 << 70), 1e308, -1e-308, 0.5, "", "x", "C1",
    "9" * 40, "\u202e\x1b[31m", [], [None], [1, "a"], {}, {"": None}, {"id": 1},
)


def _nodes(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths (tuples of keys and indexes) of every node below ``doc``."""
    out = [path]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.extend(_nodes(v, (*path, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:64]):
            out.extend(_nodes(v, (*path, i)))
    return out


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def mutate_json(data: bytes, max_size: int, seed: int,
                fallback: Callable[[bytes, int], bytes] | None = None) -> bytes:
    """One structural mutation of the JSON document ``data`` (see the module docstring)."""
    rng = random.Random(seed)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        if fallback is not None:
            return fallback(data, max_size)
        return data
    paths = _nodes(doc)
    for _ in range(rng.choice((1, 1, 2, 3))):
        path = rng.choice(paths)
        op = rng.randrange(5)
        if not path or op <= 1:  # replace a node with an odd value
            value = rng.choice(ODD_VALUES)
            if not path:
                doc = value
                break
            _at(doc, path[:-1])[path[-1]] = value
        elif op == 2:  # delete it
            parent = _at(doc, path[:-1])
            del parent[path[-1]]
        elif op == 3:  # put a copy of it somewhere else too
            value = json.loads(json.dumps(_at(doc, path)))
            target = _at(doc, rng.choice(paths)[:-1] or ())
            if isinstance(target, list):
                target.append(value)
            elif isinstance(target, dict):
                target[rng.choice(list(target) or ["k"])] = value
        else:  # wrap it in a list
            _at(doc, path[:-1])[path[-1]] = [_at(doc, path)]
        paths = _nodes(doc)
    out = json.dumps(doc).encode()
    return out if len(out) <= max_size else data


MUTATORS: dict[str, Callable[..., bytes]] = {"diff": mutate_json}
"""Target name -> custom mutator, for ``fuzz/run.py``."""
