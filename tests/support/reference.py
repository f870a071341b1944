"""Independent references for float reductions: what the draft promises, computed here.

The block-scaled error bound (draft section "Block Scales"): for an element of block
b summed over c contributors, |decoded - exact| <= 2 c M_b / (2Q + 1) plus the final
rounding to the dtype, where M_b is the largest |x| any contributor has in the block
and Q = floor(min(2^(W-1) - 1, B) / N).  Blocks are counted from each chunk's start.
"""

from __future__ import annotations

import numpy as np

B = (1 << 60) - 1


def sum_limit(width_bits: int, world: int) -> int:
    return min((1 << (width_bits - 1)) - 1, B) // world


def block_maxima(arrays: list[np.ndarray], chunk_elements: int, block_elements: int) -> np.ndarray:
    """Per element: the largest |x| of any array in the element's block."""
    largest = np.max(np.abs(np.stack([np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays])), axis=0)
    out = np.empty_like(largest)
    for chunk in range(0, len(largest), chunk_elements):
        end = min(chunk + chunk_elements, len(largest))
        for start in range(chunk, end, block_elements):
            stop = min(start + block_elements, end)
            out[start:stop] = largest[start:stop].max()
    return out


SMALLEST_SUBNORMAL = {11: 2.0**-24, 8: 2.0**-133, 24: 2.0**-149, 53: 2.0**-1074}
"""The spacing of subnormals of float16, bfloat16, float32 and float64, by significand bits."""


def rounding(significand_bits: int, exact: np.ndarray) -> np.ndarray:
    """One rounding to a type with ``significand_bits`` (half an ulp, generously one, or
    the subnormal spacing), plus 2^-52 relative for integers that first round to binary64."""
    return np.abs(exact) * (2.0**-significand_bits + 2.0**-52) + SMALLEST_SUBNORMAL[significand_bits]


def block_scaled_tolerance(
    arrays: list[np.ndarray],
    chunk_elements: int,
    block_elements: int,
    width_bits: int,
    world: int,
    significand_bits: int,
    exact: np.ndarray,
    divisor: int = 1,
) -> np.ndarray:
    """The documented bound on |decoded - exact| per element (AVG: ``divisor`` = c)."""
    c = len(arrays)
    q = sum_limit(width_bits, world)
    conversion = 2 * c * block_maxima(arrays, chunk_elements, block_elements) / (2 * q + 1) / divisor
    return conversion + rounding(significand_bits, exact)
