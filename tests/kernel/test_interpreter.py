"""The kernels under Triton 3.6's interpreter (the GPU image's), emulated on the installed Triton."""

from __future__ import annotations

import pytest
import torch
import triton.language as tl
from triton.runtime import interpreter

import rlnorm.kernel._fwd
from rlnorm.inputs import make_case
from rlnorm.kernel import _interpreter
from rlnorm.kernel._bwd import rms_norm_gated_bwd, workspace_numel
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.kernel.testing import plant


@pytest.fixture
def interpreter_36(monkeypatch: pytest.MonkeyPatch) -> None:
    """3.6's `__index__` on the installed interpreter: int() of the [1]-shaped array that every assigned value
    becomes, which numpy 2 refuses (3.7 squeezes it first). A tensor loop bound then fails as on the image."""
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patched)


def test_no_kernel_loop_takes_a_tensor_bound_in_the_interpreter(
    interpreter_36: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every kernel loop with a runtime bound: the forward zeroing the backward's workspace, the backward over
    # several tiles per program (the last program short), and its cold values' windows (rows scaled far apart)
    assert _interpreter.INTERPRETED
    c = make_case(7, 128, seed=12)
    ws = torch.ones(workspace_numel(7, 128, None), dtype=torch.int64)
    y = rms_norm_gated_fwd(c.x, c.z, c.w, 1e-6, None, True, "silu", zero=ws)
    assert not ws.any() and y.shape == c.x.shape
    dy = (c.dy.float() * torch.exp2(torch.arange(7).float() * 36 - 125)[:, None]).bfloat16()
    for cfg in ({"TILES": 3}, {"TILES": 3, "COLD_MODE": 0}):  # 4 tiles of 2 rows: programs of 3 and 1
        with plant(bwd=cfg):
            dx, dz, dw = rms_norm_gated_bwd(dy, c.x, c.z, c.w.float(), 1e-6, None, True, "silu")
        assert dx.shape == c.x.shape and dz.shape == c.z.shape and dw.shape == (128,)
    # the planted fault: with the loop form of a GPU compile, the forward's zeroing loop takes a tensor bound
    monkeypatch.setattr(rlnorm.kernel._fwd, "INTERPRETED", tl.constexpr(False))
    with pytest.raises(Exception, match="only 0-dimensional arrays"):
        rms_norm_gated_fwd(c.x, c.z, c.w, 1e-6, None, True, "silu", zero=ws)
