"""Tests of passes/_layout.py, the one parser of layout strings the passes share."""
from __future__ import annotations

import pytest

from tvm_ext.passes import _layout


def test_axes_of_plain_and_blocked_layouts():
    assert _layout.axes("NCHW") == [("N", 0), ("C", 0), ("H", 0), ("W", 0)]
    assert _layout.axes("NCHW16c") == [("N", 0), ("C", 0), ("H", 0), ("W", 0), ("C", 16)]
    assert _layout.axes("OIHW4i16o4i") == [("O", 0), ("I", 0), ("H", 0), ("W", 0), ("I", 4), ("O", 16), ("I", 4)]


@pytest.mark.parametrize("bad", ["NC-HW", "N16CHW", "NCHWc"])
def test_axes_rejects_what_is_not_a_layout(bad):
    with pytest.raises(ValueError, match=repr(bad)):
        _layout.axes(bad)


def test_primal_positions_skip_sub_axes():
    assert _layout.primal_positions("NCHW16c", "HW") == [2, 3]
    assert _layout.primal_positions("NHWC", "DHW") == [1, 2]
    assert _layout.primal_positions("NCDHW8c", "DHW") == [2, 3, 4]
    assert _layout.primal_positions("NC", "HW") == []


def test_primal_groups_order_sub_axes_outer_to_inner():
    assert _layout.primal_groups("OIHW4i16o4i", "OIHW") == [[0, 5], [1, 4, 6], [2], [3]]
    with pytest.raises(ValueError, match="exactly the axes"):
        _layout.primal_groups("NCHW", "OIHW")
