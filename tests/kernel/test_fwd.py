"""Forward kernel: explicit rounding, correct rounding, options, edge cases (CPU interpreter). Its batch
invariance: tests/kernel/test_bwd.py, with the backward's; its compiled layout: tests/kernel/test_bound.py."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from conftest import oracle
from kernel_helpers import BF16, DEFAULT, FP16, FP32, fwd, same

from rlnorm.inputs import UNDERFLOW_KINDS, make_case, make_underflow_case
from rlnorm.kernel._fwd import MAX_D
from rlnorm.kernel._rounding import round_fp32_to_out, round_fp64_to_out, widen_fast
from rlnorm.kernel.testing import plant
from rlnorm.numerics import round_once
from rlnorm.options import OpOptions


@triton.jit
def _convert_kernel(x_ptr, y_ptr, n, OP: tl.constexpr, INTERP: tl.constexpr, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x_ptr + offs, mask=m)
    if OP == "cast":
        out = v.to(y_ptr.dtype.element_ty)  # the interpreter truncates this one
    elif OP == "round32":
        out = round_fp32_to_out(v, y_ptr.dtype.element_ty)
    elif OP == "round64":
        out = round_fp64_to_out(v, y_ptr.dtype.element_ty)
    else:
        out = widen_fast(v, INTERP, ASM)
    tl.store(y_ptr + offs, out, mask=m)


def launch(op: str, v: torch.Tensor, dtype: torch.dtype, asm: bool = False) -> torch.Tensor:
    """`_convert_kernel`'s `op` over the 1-D `v`, into a new tensor of `dtype` on v's device."""
    y = torch.empty(v.shape, dtype=dtype, device=v.device)
    _convert_kernel[(triton.cdiv(v.numel(), 4096),)](v, y, v.numel(), OP=op, INTERP=not asm, ASM=asm, BLOCK=4096)
    return y


ON_THE_GPU = pytest.param(True, marks=pytest.mark.gpu(reason="the GPU's own path (inline PTX) runs on a GPU only"))


@pytest.mark.parametrize("on_gpu", [False, ON_THE_GPU])
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_widen_fast_is_exact_for_every_16_bit_pattern(dtype, on_gpu):
    # every bf16 / fp16 value (infinities, subnormals, signed zeros) widened to fp32 bit for bit as torch
    # does, NaN to NaN (payloads of signalling fp16 NaNs differ between conversions)
    dev = "cuda" if on_gpu else "cpu"
    v = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).to(dev)
    assert same(launch("widen", v, FP32, asm=on_gpu), v.float())


@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_round_fp32_matches_torch_round_to_nearest_even(dtype):
    g = torch.Generator().manual_seed(0)
    random_bits = torch.randint(-(2**31), 2**31 - 1, (60000,), generator=g, dtype=torch.int64).to(torch.int32)
    inf, nan = float("inf"), float("nan")
    specials = [0.0, -0.0, inf, -inf, nan, 65504.0, 65519.99, 65520.0, -65520.0, 2.0**-25, 2.0**-25 * 1.0000001]
    specials += [6e-8, 3.0e-5, 3.3e38, -3.39e38, 1e-40, -1e-45]
    ties = torch.randn(4000, generator=g).to(BF16).float().view(torch.int32) | 0x8000  # bf16 values' midpoints
    parts = [random_bits.view(FP32), torch.randn(20000, generator=g) * 1e-5, torch.randn(20000, generator=g) * 6e4]
    v = torch.cat([*parts, ties.view(FP32), torch.tensor(specials)])
    assert same(launch("round32", v, dtype), v.to(dtype))
    # the planted fault: a plain cast, which the interpreter rounds toward zero (to bf16; numpy rounds fp16)
    assert dtype == FP16 or not same(launch("cast", v, dtype), v.to(dtype))


def test_round_fp64_once_matches_numerics_round_once():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(40000, generator=g, dtype=torch.float64)
    v = v * torch.exp2(torch.randint(-40, 40, (40000,), generator=g).double())
    b = torch.randn(4000, generator=g).to(BF16).float()
    mid = (b.view(torch.int32) | 0x8000).view(FP32).double()  # exact bf16 midpoints
    # just above / below a midpoint by far less than an fp32 ulp: rounding through fp32 would err
    near_mid = torch.cat([mid * (1 + 2.0**-40), mid * (1 - 2.0**-40), mid])
    specials = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e300, -1e-300, 0.0, -0.0, 3.4e38])
    v = torch.cat([v, near_mid, specials, torch.randn(4000, generator=g, dtype=torch.float64) * 1e-39])
    for dtype in (BF16, FP16, FP32):
        assert same(launch("round64", v, dtype), round_once(v, dtype)), dtype
    # the planted fault: rounding through fp32 (twice) differs on the near-midpoint values
    assert not same(near_mid.float().to(BF16), round_once(near_mid, BF16))


def test_correctly_rounded_on_standard_data_and_the_error_bound_is_needed():
    case11 = make_case(1024, 128, seed=11)
    c = case11.rows(slice(96, 353))
    y, fast, flags = fwd(c.x, c.z, c.w, debug=True)
    assert same(y, oracle(c.x, c.z, c.w))
    assert not torch.isnan(fast).any()  # debug buffer fully written: every element went through the fast path
    assert 0 < flags.float().mean().item() < 0.01  # some elements near a midpoint took the exact path
    # row 350 has an element the fp32 path alone rounds wrongly on the CPU; the planted fault: no error bound,
    # so no element is ever sent to the exact path
    c = case11.rows(slice(344, 352))
    with plant(no_midpoint_test=True):
        assert not same(fwd(c.x, c.z, c.w), y[248:256])


OPTION_CASES = [  # (d, opts, has_z, x dtype, w dtype)
    (128, DEFAULT, True, BF16, FP32),
    (128, DEFAULT, True, BF16, FP16),
    (128, DEFAULT, False, BF16, BF16),
    (128, OpOptions(norm_before_gate=False), True, BF16, BF16),
    (128, OpOptions(activation="sigmoid"), True, BF16, BF16),
    (128, OpOptions(activation="swish", norm_before_gate=False), True, BF16, FP32),
    (128, OpOptions(activation="sigmoid", norm_before_gate=False), True, BF16, BF16),
    (128, OpOptions(group_size=32), True, BF16, BF16),
    (128, OpOptions(group_size=64, norm_before_gate=False), True, BF16, BF16),
    (128, OpOptions(group_size=16), False, BF16, BF16),
    (128, DEFAULT, True, FP16, FP16),
    (128, OpOptions(norm_before_gate=False), True, FP16, FP32),
    (128, DEFAULT, True, FP32, FP32),
    (128, OpOptions(group_size=32, activation="sigmoid"), True, FP32, BF16),
    (128, OpOptions(eps=1e-3), True, BF16, BF16),
    # widths not a power of two, and the limit (one past MAX_D is refused: tests/kernel/test_api.py)
    *[(d, DEFAULT, True, BF16, BF16) for d in (96, 160, 200, 1, 3, MAX_D)],
]


@pytest.mark.parametrize(("d", "opts", "has_z", "dtype", "wdtype"), OPTION_CASES)
def test_options_and_widths_match_fp64_rounded_once(d, opts, has_z, dtype, wdtype):
    c = make_case(33 if d < MAX_D else 2, d, seed=5, dtype=dtype, weight_dtype=wdtype)
    z = c.z if has_z else None
    assert same(fwd(c.x, z, c.w, opts), oracle(c.x, z, c.w, opts))


def test_special_values_take_the_exact_path_and_stay_in_their_row():
    c = make_case(24, 128, seed=9)
    x, z, w = c.x.clone(), c.z.clone(), c.w.clone()
    x[0] *= 1e37  # mean of squares beyond fp32: rstd below fp32's normal range
    x[1] *= 1e-38  # subnormal inputs
    z[2] = -100.0  # sigmoid underflows in fp32
    z[3, :5] = 3e38  # huge gate
    x[5, 3], x[9, 0], z[17, 100] = float("nan"), float("inf"), -float("inf")
    w[7] = 0.0
    clean = [i for i in range(24) if i not in (0, 1, 2, 3, 5, 9, 17)]
    ref = oracle(x, z, w)
    y = fwd(x, z, w)
    assert same(y, ref) and torch.isnan(y[5]).all()  # NaN poisons its row's rstd, and only its row
    assert same(y[clean], fwd(c.x, c.z, w)[clean])
    with plant(fwd={"NEAR_T": 200}):  # beside rows the per-element tier settles, these stay with the row path
        assert same(fwd(x, z, w), ref)


@pytest.mark.parametrize("on_gpu", [False, ON_THE_GPU])
@pytest.mark.parametrize("kind", UNDERFLOW_KINDS)
def test_an_underflowed_intermediate_sends_its_row_to_the_exact_path(kind, on_gpu):
    # x*w ~ 1e-40 under a gate ~ 1e30: with plain products the outputs came out far off, unflagged (the GPU's
    # products flush in mul.rn.ftz.f32; the interpreter emulates them)
    x, z, w, opts = make_underflow_case(kind, **({"rows": 64, "device": "cuda"} if on_gpu else {}))
    ref = oracle(x, z, w, opts)
    y, fast, _ = fwd(x, z, w, opts, debug=True)
    assert same(y, ref)
    assert on_gpu or (fast[:, 1:] == 0).all()  # flushed to zero: what the range test catches
    # the planted fault: plain products keep the subnormal, and nothing sends the row to the exact path
    with plant(plain_products=True):
        assert not same(fwd(x, z, w, opts), ref)
