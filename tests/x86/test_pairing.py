"""tvm_ext.x86._pairing: which channels may share a vpmaddubsw pair, and an order pairing them all."""
import itertools

import numpy as np
import pytest

from tvm_ext.x86._pairing import compatible, fits_in_order, pair_order
from tvm_ext.x86.exact_dot import PAIR_LIMIT


def _compatible_by_definition(w):
    """Every kernel row, every pair of channels: same-sign magnitudes summed against the limit."""
    rows = np.moveaxis(w.astype(np.int64), 1, -1).reshape(-1, w.shape[1])
    n = w.shape[1]
    ok = np.zeros((n, n), bool)
    for i, j in itertools.permutations(range(n), 2):
        pos = np.clip(rows[:, i], 0, None) + np.clip(rows[:, j], 0, None)
        neg = np.clip(rows[:, i], None, 0) + np.clip(rows[:, j], None, 0)
        ok[i, j] = bool((pos <= PAIR_LIMIT).all() and (neg >= -PAIR_LIMIT).all())
    return ok


@pytest.mark.parametrize("seed", range(4))
def test_compatible_is_the_pair_limit(seed):
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (5, 12, 3, 3)).astype("int8")
    w[rng.random(w.shape) < 0.7] //= 4  # a mix of safe and unsafe pairs
    np.testing.assert_array_equal(compatible(w), _compatible_by_definition(w))


def test_compatible_edges():
    w = np.zeros((1, 4), "int8")
    w[0] = [64, 64, -64, -65]  # 128 fits, -129 does not; opposite signs always fit
    ok = compatible(w)
    assert ok[0, 1] and ok[0, 2] and ok[1, 3]
    assert not ok[2, 3]
    assert not ok[0, 0], "a channel is not its own partner"
    with pytest.raises(TypeError, match="int8"):
        compatible(w.astype("int16"))


def _has_perfect_matching(ok):
    n = ok.shape[0]

    def match(rest):
        if len(rest) < 2:
            return True
        first = rest[0]
        return any(ok[first, other] and match([v for v in rest[1:] if v != other]) for other in rest[1:])

    return match(list(range(n))) if n % 2 == 0 else any(
        _has_perfect_matching(np.delete(np.delete(ok, v, 0), v, 1)) for v in range(n))


@pytest.mark.parametrize("n", [2, 5, 6, 8, 10])
def test_pair_order_finds_an_order_whenever_one_exists(n):
    """Random graphs, sparse enough that the greedy start fails often (blossoms included), against an
    exhaustive search."""
    rng = np.random.default_rng(n)
    found = 0
    for _ in range(60):
        ok = rng.random((n, n)) < 0.3
        ok = ok | ok.T
        np.fill_diagonal(ok, False)
        order = pair_order(ok)
        if _has_perfect_matching(ok):
            assert order is not None
            assert sorted(order) == list(range(n))
            assert fits_in_order(ok, order)
            found += 1
        else:
            assert order is None
    assert found, "no case had an order: the test says nothing"


def test_pair_order_through_an_odd_cycle():
    """A triangle 0-1-2 with tails 2-3 and 0-4-5: the one perfect matching is 0-1, 2-3, 4-5."""
    ok = np.zeros((6, 6), bool)
    for a, b in [(0, 1), (1, 2), (2, 0), (2, 3), (0, 4), (4, 5)]:
        ok[a, b] = ok[b, a] = True
    np.testing.assert_array_equal(pair_order(ok), [0, 1, 2, 3, 4, 5])
    ok[4, 5] = ok[5, 4] = False
    assert pair_order(ok) is None


def test_pair_order_puts_pairs_by_their_first_channel():
    ok = np.zeros((4, 4), bool)
    for a, b in [(0, 2), (1, 3)]:
        ok[a, b] = ok[b, a] = True
    np.testing.assert_array_equal(pair_order(ok), [0, 2, 1, 3])
    assert not fits_in_order(ok)
