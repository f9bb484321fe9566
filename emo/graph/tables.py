"""Tables as dicts of equal-length numpy columns, and the few pandas operations the graph builders
need on them (drop_duplicates, merge, groupby numbering), giving pandas' rows in pandas' order
(tests/test_graph_asof.py checks them against pandas) without pandas' fixed cost per call."""

from __future__ import annotations

import numpy as np


def take(table: dict, at) -> dict:
    """The rows `at` (indices or a mask) of a table of equal-length columns."""
    return {c: v[at] for c, v in table.items()}


def new_group(*keys) -> np.ndarray:
    """Whether each row starts a run of equal keys (rows sorted by them)."""
    new = np.ones(len(keys[0]), bool)
    if len(new):
        same = np.ones(len(new) - 1, bool)
        for k in keys:
            same &= k[1:] == k[:-1]
        new[1:] = ~same
    return new


def codes(*cols) -> np.ndarray:
    """Per row, the rank of its key (the tuple of `cols`) among the distinct keys."""
    o = np.lexsort(cols[::-1])
    codes = np.empty(len(o), np.int64)
    codes[o] = np.cumsum(new_group(*(c[o] for c in cols))) - 1
    return codes


def first_of(*cols) -> np.ndarray:
    """The rows that are the first with their key, in order (drop_duplicates)."""
    o = np.lexsort(cols[::-1])  # (stable: the first of equal keys stays first)
    return np.sort(o[new_group(*(c[o] for c in cols))])


def merge(left: dict, right: dict, on: list[str]) -> dict:
    """Inner join on the columns `on`, as pd.merge gives it: each left row in order, with every
    right row of its key in right's order; the right table's other columns added."""
    nl = len(left[on[0]])
    code = codes(*(np.r_[np.asarray(left[c], np.int64), np.asarray(right[c], np.int64)] for c in on))
    lc, rc = code[:nl], code[nl:]
    k = int(code.max()) + 1 if len(code) else 0
    rord = np.argsort(rc, kind="stable")
    cnt = np.bincount(rc, minlength=k)
    starts = np.r_[0, np.cumsum(cnt)[:-1]]
    n = cnt[lc] if nl else np.zeros(0, np.int64)
    li = np.repeat(np.arange(nl), n)
    ri = rord[
        np.repeat(starts[lc] if nl else np.zeros(0, np.int64), n) + np.arange(len(li)) - np.repeat(np.cumsum(n) - n, n)
    ]
    out = take(left, li)
    out.update({c: v[ri] for c, v in right.items() if c not in on})
    return out


def group_numbers(*cols) -> np.ndarray:
    """Per row, its key's number in order of first appearance (groupby(sort=False).ngroup())."""
    code = codes(*cols)
    first = first_of(*cols)
    number = np.empty(len(first), np.int64)
    number[code[first]] = np.arange(len(first))
    return number[code]
