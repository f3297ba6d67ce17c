"""Planted faulty backends: each a correct gated RMSNorm (most build on `ExactReferenceBackend`, which passes every
check and gate) except for ONE broken guarantee, so every check and gate is shown to fail on its fault (each class
says which catches it). Loaded by import path (`tests.faults:BatchSizeDependentOutput`) from the checkout's root.
The output faults move outputs by one ulp outside the autograd graph: `fwd_differ`, never `rowgrad_differ`.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch
import triton
import triton.language as tl
from torch import Tensor

from rlnorm.kit.backends import ExactReferenceBackend, Grads
from rlnorm.kit.backends.pins import Setting, patched
from rlnorm.kit.checks.common import bits
from rlnorm.options import OpOptions


def bump_one_ulp(t: Tensor, mask: Tensor) -> Tensor:
    """Copy of `t` with the elements under `mask` moved one ulp away from zero (bit pattern + 1)."""
    return torch.where(mask, bits(t) + 1, bits(t)).view(t.dtype)


def batch_size_fault_mask(x: Tensor) -> Tensor:
    """Rows that `BatchSizeDependentOutput` moves by one ulp in this batch: as a kernel picking its tile by row count,
    one row is regime 0, more 1 + bit_length(rows) % 3, and the rows whose tag (two bits of x[r, 0]) equals it move."""
    rows = int(x.shape[0])
    regime = 0 if rows <= 1 else 1 + rows.bit_length() % 3
    return (bits(x[:, 0]).to(torch.int64) & 3) == regime


def position_fault_mask(rows: int, device: torch.device | str = "cpu") -> Tensor:
    """Rows [rows] that `PositionDependentOutput` moves by one ulp: every position r with r % 3 == 1."""
    return torch.arange(rows, device=device) % 3 == 1


class _OutputFault(ExactReferenceBackend):
    """Exact reference whose output is bumped by one ulp (column 0) on the rows `_mask` picks."""

    def _mask(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _perturb(self, y: Tensor, x: Tensor) -> Tensor:
        rows = self._mask(x).to(y.device)
        mask = torch.zeros(y.shape, dtype=torch.bool, device=y.device)
        mask[:, 0] = rows
        return bump_one_ulp(y, mask)

    def forward(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        return self._perturb(super().forward(x, z, w, opts), x)

    def forward_backward(self, x: Tensor, z: Tensor | None, w: Tensor, dy: Tensor, opts: OpOptions) -> Grads:
        g = super().forward_backward(x, z, w, dy, opts)
        g.y = self._perturb(g.y, x)
        return g


class BatchSizeDependentOutput(_OutputFault):
    """Output of some rows is one ulp off depending on the launch's row count: caught by all_rows,
    full_vs_sub_batches, batch_size_sweep and the forward gate."""

    key = "tests.faults:BatchSizeDependentOutput"
    source = "planted fault: output depends on batch size (row-count regimes)"

    def _mask(self, x: Tensor) -> Tensor:
        return batch_size_fault_mask(x)


class ForwardOnlyBatchSize(BatchSizeDependentOutput):
    """BatchSizeDependentOutput without a backward (as vLLM's forward_cuda): the forward checks still judge it."""

    key = "tests.faults:ForwardOnlyBatchSize"
    source = "planted fault: forward only, output depends on batch size"
    has_backward = False


class PositionDependentOutput(_OutputFault):
    """Output is one ulp off at positions r % 3 == 1 in the launch: caught as BatchSizeDependentOutput is."""

    key = "tests.faults:PositionDependentOutput"
    source = "planted fault: output depends on position in the batch (r % 3 == 1)"

    def _mask(self, x: Tensor) -> Tensor:
        return position_fault_mask(x.shape[0], x.device)


class NondeterministicDweight(ExactReferenceBackend):
    """dweight differs from one call to the next (call k moves column k % D by one ulp, a counter so that it always
    shows): caught by dweight_repeatable and the gradient gate."""

    key = "tests.faults:NondeterministicDweight"
    source = "planted fault: dweight differs run to run (call counter)"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _reduce_dweight(self, contributions: Tensor, dtype: torch.dtype) -> Tensor:
        dw = super()._reduce_dweight(contributions, dtype)
        mask = torch.zeros(dw.shape, dtype=torch.bool)
        mask[self.calls % dw.shape[0]] = True
        self.calls += 1
        return bump_one_ulp(dw, mask)


class OrderDependentDweight(ExactReferenceBackend):
    """dweight is a plain fp32 left fold over rows, as a serial kernel's: repeatable, but permuting rows moves bits
    (caught by the gradient gate's singleton_aggregate and permuted lines only; zero padding rows add exact zeros)."""

    key = "tests.faults:OrderDependentDweight"
    source = "planted fault: dweight is an fp32 left fold over rows (order-dependent)"

    def _reduce_dweight(self, contributions: Tensor, dtype: torch.dtype) -> Tensor:
        c = contributions.detach().cpu().numpy().astype(np.float32)
        if c.shape[0] == 0:
            return torch.zeros(c.shape[1], dtype=dtype)
        # ufunc.accumulate is a strict sequential fold (np.sum would be pairwise)
        folded = np.add.accumulate(c, axis=0, dtype=np.float32)[-1]
        return torch.from_numpy(folded.copy()).to(dtype)


class _PastRows(ExactReferenceBackend):
    """The exact reference until a batch (every forward and forward+backward) has more than `limit` rows; then the
    planted failure, as a kernel bug that shows only at some sizes does: the faults differ only in `_fail`."""

    limit = 50

    def _fail(self, rows: int) -> None:
        raise NotImplementedError

    def forward(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        if x.shape[0] > self.limit:
            self._fail(x.shape[0])
        return super().forward(x, z, w, opts)

    def forward_backward(self, x: Tensor, z: Tensor | None, w: Tensor, dy: Tensor, opts: OpOptions) -> Grads:
        if x.shape[0] > self.limit:
            self._fail(x.shape[0])
        return super().forward_backward(x, z, w, dy, opts)


class SegfaultPastRows(_PastRows):
    """Reads address 0 (SIGSEGV) on a batch of more than `limit` rows."""

    key = "tests.faults:SegfaultPastRows"
    source = "planted fault: segfaults past 50 rows"

    def _fail(self, rows: int) -> None:
        import ctypes

        sys.stderr.write(f"planted fault: reading address 0 on a batch of {rows} rows\n")
        sys.stderr.flush()
        ctypes.string_at(0)


class HangPastRows(_PastRows):
    """Sleeps for an hour on a batch of more than `limit` rows: only the run's time limit ends it."""

    key = "tests.faults:HangPastRows"
    source = "planted fault: hangs past 50 rows"

    def _fail(self, rows: int) -> None:
        # says where it hangs, so a test can tell the planted hang from a process still importing
        sys.stderr.write(f"planted fault: hanging on a batch of {rows} rows\n")
        sys.stderr.flush()
        time.sleep(3600.0)


class ExitPastRows(_PastRows):
    """Ends its process with `os._exit(3)` (no cleanup, no exception) on a batch of more than `limit` rows."""

    key = "tests.faults:ExitPastRows"
    source = "planted fault: exits with code 3 past 50 rows"

    def _fail(self, rows: int) -> None:
        os._exit(3)


class DeviceErrorPastRows(_PastRows):
    """On a CUDA device, a store 2^40 elements past its buffer (an illegal memory access, which leaves the
    process's CUDA context unusable) on a batch of more than `limit` rows; on the CPU, the exact reference."""

    key = "tests.faults:DeviceErrorPastRows"
    source = "planted fault: illegal memory access on the GPU past 50 rows"

    def _fail(self, rows: int) -> None:
        if not torch.cuda.is_available():
            return
        x = torch.zeros(rows, device="cuda")
        _store_far_away[(1,)](x, 1 << 40)
        torch.cuda.synchronize()


@triton.jit
def _store_far_away(ptr, offset):
    tl.store(ptr + offset, 1.0)  # an address no allocation holds: the kernel faults


@triton.jit
def _rows_per_program_kernel(X, Z, W, Y, n_rows, eps, D: tl.constexpr, ROWS: tl.constexpr, HALVES: tl.constexpr):
    """The gated norm, ROWS rows per program, each row reduced alone the same way whatever ROWS is; HALVES sums the
    squares in two halves, each rounded to the input's dtype: another order, other bits."""
    cols = tl.arange(0, D)
    for i in range(ROWS):
        row = tl.program_id(0) * ROWS + i
        if row < n_rows:
            x = tl.load(X + row * D + cols).to(tl.float32)
            z = tl.load(Z + row * D + cols).to(tl.float32)
            w = tl.load(W + cols).to(tl.float32)
            if HALVES:
                halves = tl.sum(tl.reshape(x * x, (2, D // 2)), axis=1)
                ss = tl.sum(halves.to(X.dtype.element_ty).to(tl.float32), axis=0)
            else:
                ss = tl.sum(x * x, axis=0)
            rstd = 1.0 / tl.sqrt(ss / D + eps)
            tl.store(Y + row * D + cols, (x * rstd * w * z * tl.sigmoid(z)).to(Y.dtype.element_ty))


class RowsPerProgramByRowCount(ExactReferenceBackend):
    """A Triton forward whose launch constexpr ROWS comes from the row count (1 up to `threshold` rows, 4 past
    it), as vLLM's ROWS_PER_BLOCK does; every row is computed the same way, so no row check can see the change:
    only the `launch` check can. `threshold=None`: ROWS is 1 at every size (the control)."""

    key = "rows_per_program_by_row_count"
    has_backward = False
    threshold: int | None = 4
    halves_from: int | None = None  # HALVES from this many rows on

    def supports(self, opts: OpOptions) -> tuple[bool, str]:
        ok = opts.group_size is None and opts.norm_before_gate and opts.activation in ("silu", "swish")
        return ok, "" if ok else "only the default options"

    def forward(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        assert z is not None
        x2, z2 = x.reshape(-1, x.shape[-1]).contiguous(), z.reshape(-1, x.shape[-1]).contiguous()
        y = torch.empty_like(x2)
        rows = x2.shape[0]
        per = 4 if self.threshold is not None and rows > self.threshold else 1
        halves = self.halves_from is not None and rows >= self.halves_from
        _rows_per_program_kernel[(triton.cdiv(rows, per),)](x2, z2, w, y, rows, opts.eps, D=x2.shape[1], ROWS=per,
                                                            HALVES=halves)  # fmt: skip
        return y.reshape(x.shape)


class OneRowPerProgram(RowsPerProgramByRowCount):
    """The control of `RowsPerProgramByRowCount`: ROWS is 1 at every row count."""

    key = "one_row_per_program"
    threshold = None


class RowCountOrder(OneRowPerProgram):
    """HALVES, chosen from the row count (on from `halves_from` rows), reduces a row in another order: every row
    check at sizes below `halves_from` passes it, and only the `configurations` check, running both values against
    each other, sees rows differ."""

    key = "tests.faults:RowCountOrder"
    source = "planted: a Triton gated RMSNorm whose reduction order follows the row count"
    halves_from = 1 << 20

    def configurations(self, opts: OpOptions, device: str, d: int) -> list[Setting]:
        kernel = "tests.faults._rows_per_program_kernel"
        return [Setting(kernel, "HALVES", str(h), lambda h=h: patched(self, "halves_from", 0 if h else None))
                for h in (0, 1)]  # fmt: skip
