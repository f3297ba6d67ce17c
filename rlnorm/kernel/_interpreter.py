"""Whether this process runs Triton kernels in the interpreter, as a constexpr the kernels can read.

Triton 3.6's interpreter (the H200 image's) makes every assigned value a tensor of shape [1] and reads a
tensor loop bound as int() of that array, which numpy 2 refuses; 3.7's squeezes it first. Kernels whose
loop bounds are tensors (a program's tile count, a cold value's windows, a grid-stride loop) take constexpr
bounds or a while loop when this is set, with the same result. It is read from the environment at import,
as Triton reads it, and never follows the `_INTERPRET` switches that tests flip to plant native-cast
faults: only the loop form depends on it, never a rounding.
"""

from __future__ import annotations

import os

import triton.language as tl

INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")
