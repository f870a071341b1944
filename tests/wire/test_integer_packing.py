"""The integer helpers every chunk goes through: extremes, widths and packing.

:func:`extremes` reads short arrays as Python integers and longer ones with numpy's
reductions; both must give the same Python integers, at every width and on both
sides of :data:`SMALL_EXTREMES`, or a chunk's width (and so its bytes and its
tag) would depend on its length.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cco.wire.packing import SMALL_EXTREMES, WIDTHS, extremes, minimal_width, narrow, unpack


@st.composite
def signed_arrays(draw: st.DrawFn) -> np.ndarray:
    width = draw(st.sampled_from(WIDTHS))
    bits = 8 * width - 1
    length = draw(st.sampled_from([0, 1, 2, SMALL_EXTREMES - 1, SMALL_EXTREMES, SMALL_EXTREMES + 1, 200]))
    values = draw(st.lists(st.integers(-(1 << bits), (1 << bits) - 1), min_size=length, max_size=length))
    return np.array(values, dtype=f"<i{width}")


@given(signed_arrays())
def test_extremes_are_the_python_min_and_max_at_every_length(values: np.ndarray) -> None:
    lo, hi = extremes(values)
    listed = [int(v) for v in values]
    assert (lo, hi) == ((min(listed), max(listed)) if listed else (0, 0))
    assert type(lo) is int and type(hi) is int


@given(signed_arrays())
def test_a_chunk_packs_at_its_minimal_width_and_unpacks_to_itself(values: np.ndarray) -> None:
    width = minimal_width(*extremes(values))
    assert width <= values.dtype.itemsize
    packed = narrow(values.astype(np.int64), width).tobytes()
    assert len(packed) == width * len(values)
    assert unpack(packed, width).tolist() == values.tolist()
