"""Named dimensions: structural keys, hash-consed as the nodes are built.

A node's key is the number given to (its local part, its children's keys, how their
arrays and parameters map onto its own), so equal keys are equal DAGs up to the arrays'
identities and the parameters' values, and a repeated materialisation looks its program
up by the root's key with no walk (einfuse.named_api).  ``arrays`` are the DAG's arrays
in first use (children first, as named_program.structure numbers them), distinct by
identity; ``params`` its parameters' (text, value), distinct by text (so 2 is not 2.0).
Keys are never reused: when the table is full it is emptied, and a node built before
then only misses (its key then matches no new one)."""

from __future__ import annotations

from typing import Dict

_KEYS_KEPT = 1 << 16
keys: Dict[tuple, int] = {}       # signature -> key (read by frontends/named.py)
_next_key = [0]


def keyed(node, op, args, children) -> None:
    local = node.local
    if not children:
        if op == "read":
            node.arrays, node.params, sig = (args[0].array,), (), local
        elif op == "param":
            value = args[0]
            node.arrays, node.params, sig = (), ((value.hex() if isinstance(value, float)
                                                  else value, value),), local
        else:
            node.arrays, node.params, sig = (), (), local
    elif len(children) == 1 and op != "read":
        child = children[0]
        node.arrays, node.params, sig = child.arrays, child.params, (local, child.key)
    else:
        parts = [local]
        arrays, params = (), ()
        for child in children:
            parts.append(child.key)
            if child.arrays:
                arrays = _joined_arrays(arrays, child.arrays, parts)
            if child.params:
                if child.params is params:
                    parts.append(counting(len(params)))
                else:
                    params = _joined(params, child.params, parts, _text)
        if op == "read":
            arrays = _joined_arrays(arrays, (args[0].array,), parts)
        node.arrays, node.params, sig = arrays, params, tuple(parts)
    key = keys.get(sig)
    if key is None:
        if len(keys) >= _KEYS_KEPT:
            keys.clear()
        key = keys[sig] = _next_key[0]
        _next_key[0] += 1
    node.key = key


def _identity(value):
    return id(value)


def _joined_arrays(mine: tuple, theirs: tuple, parts: list) -> tuple:
    """``_joined`` by identity, without its dictionary for a few arrays."""
    if not mine:
        parts.append(None)
        return theirs
    if theirs is mine:          # one subexpression under both (as the general case says)
        parts.append(counting(len(mine)))
        return mine
    if len(mine) + len(theirs) > 8:
        return _joined(mine, theirs, parts, _identity)
    for v in theirs:
        for m in mine:
            if v is m:
                return _joined(mine, theirs, parts, _identity)
    parts.append(None)
    return mine + theirs


def _text(param):
    return param[0]


def counting(n: int) -> tuple:
    """(0, 1, ..., n - 1), one tuple per n: the part of a key saying that a child's
    arrays (or parameters) are all the node's already, in order."""
    found = _COUNTS.get(n)
    if found is None:
        found = _COUNTS[n] = tuple(range(n))
    return found


_COUNTS: Dict[int, tuple] = {}


def _joined(mine: tuple, theirs: tuple, parts: list, of) -> tuple:
    """``mine`` and then those of ``theirs`` not in it; ``parts`` (the key) records
    where each of ``theirs`` went: None when all are new (appended in order)."""
    if not mine:
        parts.append(None)
        return theirs
    seen = {of(v): n for n, v in enumerate(mine)}
    if not any(of(v) in seen for v in theirs):
        parts.append(None)
        return mine + theirs
    placed, grown = [], list(mine)
    for v in theirs:
        at = seen.get(of(v))
        if at is None:
            at = seen[of(v)] = len(grown)
            grown.append(v)
        placed.append(at)
    parts.append(tuple(placed))
    return tuple(grown)


