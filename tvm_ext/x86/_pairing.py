"""Which input channels may share a ``vpmaddubsw`` pair, and an order that pairs them all.

``vpmaddubsw`` multiplies uint8 data by int8 weights and adds each two neighbouring products in
int16, saturating. Channels ``i`` and ``j`` may be neighbours in a conv when no kernel row (output
channel and tap) has two same-sign weights there whose magnitudes sum above
:data:`~tvm_ext.x86.exact_dot.PAIR_LIMIT` (255 times that sum must fit int16); pairs of opposite
signs never saturate. :func:`compatible` is that relation over all channels; :func:`pair_order`
finds a perfect matching of it (Edmonds' blossom search, from a greedy start) and returns the order
that puts each matched pair side by side.

A leaf: numpy only.
"""
from __future__ import annotations

import numpy as np

from .exact_dot import PAIR_LIMIT

__all__ = ["compatible", "pair_order", "fits_in_order"]


def _same_sign_clash(mag: np.ndarray) -> np.ndarray:
    """``bad[i, j]``: some row ``r`` has ``mag[r, i] + mag[r, j] > PAIR_LIMIT`` (``mag`` >= 0, one
    sign's magnitudes). A clash needs one of the two above half the limit, so only those columns
    are scanned."""
    channels = mag.shape[1]
    bad = np.zeros((channels, channels), dtype=bool)
    half = PAIR_LIMIT // 2
    for i in np.flatnonzero((mag > half).any(axis=0)):
        rows = mag[:, i] > half
        bad[i] = (mag[rows] > (PAIR_LIMIT - mag[rows, i])[:, None]).any(axis=0)
    return bad | bad.T


def compatible(weight) -> np.ndarray:
    """``ok[i, j]``: input channels ``i`` and ``j`` of the int8 conv kernel ``weight`` (``O, I, ...``)
    can be a ``vpmaddubsw`` pair whatever the uint8 data."""
    w = np.asarray(weight)
    if w.dtype != np.int8 or w.ndim < 2:
        raise TypeError(f"compatible: expected an int8 kernel (O, I, ...), got {w.dtype} of shape {w.shape}")
    rows = np.moveaxis(w, 1, -1).reshape(-1, w.shape[1]).astype(np.int32)
    ok = ~(_same_sign_clash(np.clip(rows, 0, None)) | _same_sign_clash(np.clip(-rows, 0, None)))
    np.fill_diagonal(ok, False)
    return ok


def fits_in_order(ok: np.ndarray, order=None) -> bool:
    """True when every pair ``(order[2p], order[2p + 1])`` is allowed by ``ok`` (the natural order by
    default; an odd last channel pairs with padding, always allowed)."""
    order = np.arange(ok.shape[0]) if order is None else np.asarray(order)
    even = order[: len(order) // 2 * 2]
    return bool(ok[even[0::2], even[1::2]].all())


def _greedy(adj: list) -> np.ndarray:
    """A maximal matching, the channels with the fewest partners matched first."""
    mate = np.full(len(adj), -1)
    for v in sorted(range(len(adj)), key=lambda u: len(adj[u])):
        if mate[v] < 0:
            free = [u for u in adj[v] if mate[u] < 0]
            if free:
                u = min(free, key=lambda x: len(adj[x]))
                mate[v], mate[u] = u, v
    return mate


def _augment(adj: list, mate: np.ndarray, root: int) -> bool:
    """Grow ``mate`` by one augmenting path from the free vertex ``root`` (Edmonds: odd cycles
    shrunk to their base); False when there is none."""
    n = len(adj)
    parent = np.full(n, -1)
    base = np.arange(n)
    used = np.zeros(n, dtype=bool)
    used[root] = True
    queue = [root]

    def lca(a, b):
        seen = np.zeros(n, dtype=bool)
        while True:
            a = base[a]
            seen[a] = True
            if mate[a] < 0:
                break
            a = parent[mate[a]]
        while True:
            b = base[b]
            if seen[b]:
                return b
            b = parent[mate[b]]

    def mark(v, b, child, blossom):
        while base[v] != b:
            blossom[base[v]] = blossom[base[mate[v]]] = True
            parent[v] = child
            child = mate[v]
            v = parent[mate[v]]

    head = 0
    while head < len(queue):
        v = queue[head]
        head += 1
        for u in adj[v]:
            if base[v] == base[u] or mate[v] == u:
                continue
            if u == root or (mate[u] >= 0 and parent[mate[u]] >= 0):
                b = lca(v, u)
                blossom = np.zeros(n, dtype=bool)
                mark(v, b, u, blossom)
                mark(u, b, v, blossom)
                for i in range(n):
                    if blossom[base[i]]:
                        base[i] = b
                        if not used[i]:
                            used[i] = True
                            queue.append(i)
            elif parent[u] < 0:
                parent[u] = v
                if mate[u] < 0:
                    while u >= 0:  # flip the path's edges
                        pv = parent[u]
                        nxt = mate[pv]
                        mate[u], mate[pv] = pv, u
                        u = nxt
                    return True
                used[mate[u]] = True
                queue.append(mate[u])
    return False


def pair_order(ok: np.ndarray):
    """An order of the channels in which each pair ``(2p, 2p + 1)`` is allowed by ``ok`` (symmetric,
    boolean), or None when no perfect matching exists. An odd count leaves one channel last."""
    n = ok.shape[0]
    adj = [list(np.flatnonzero(ok[v])) for v in range(n)]
    mate = _greedy(adj)
    for v in range(n):
        if mate[v] < 0:
            _augment(adj, mate, v)
    unmatched = np.flatnonzero(mate < 0)
    if len(unmatched) > n % 2:
        return None
    order = [x for v in range(n) if mate[v] > v for x in (v, mate[v])]
    return np.asarray(order + list(unmatched), dtype=np.int64)
