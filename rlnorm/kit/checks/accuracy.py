"""How often the output is the correctly rounded value, the gradients' error against fp64, and the time against a
same-run `torch.add` moving as many bytes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rlnorm.kit.checks.common import Check, CheckOutcome, Trail, caught, check_int
from rlnorm.kit.results import Accuracy
from rlnorm.numerics import round_once, ulp_distance
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math
from rlnorm.timing import CpuClock, CudaClock

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend

ULP_HIST_MAX = 16  # fwd_ulp_hist buckets "0".."15", then "16+"
ABS_ERR_EDGES = [10.0 ** (k / 4) for k in range(-48, 9)]  # 1e-12 .. 1e2, four per decade


def _ulp_hist(ulp: Tensor) -> dict[str, int]:
    nan = ulp == torch.iinfo(torch.int64).max
    counts = torch.bincount(ulp[~nan].clamp(max=ULP_HIST_MAX), minlength=ULP_HIST_MAX + 1).tolist()
    hist = {str(i): int(counts[i]) for i in range(ULP_HIST_MAX)}
    return {**hist, f"{ULP_HIST_MAX}+": int(counts[ULP_HIST_MAX]), "nan": int(nan.sum())}


def _abs_err_hist(err: Tensor) -> dict[str, Any]:
    """Log-spaced histogram of |y - y64|; exact zeros, values below/above the edges and NaN counted apart."""
    edges = torch.tensor(ABS_ERR_EDGES, dtype=torch.float64, device=err.device)
    nan = err.isnan()
    zero = err[~nan] == 0
    pos = err[~nan][~zero]
    under, over = pos < edges[0], pos > edges[-1]
    inside = pos[~under & ~over]
    # bucket i holds edges[i] <= e < edges[i+1] (the top edge closes the last bucket)
    b = (torch.bucketize(inside, edges, right=True) - 1).clamp(0, len(ABS_ERR_EDGES) - 2)
    counts = torch.bincount(b, minlength=len(ABS_ERR_EDGES) - 1).tolist()
    sums = {"zero": zero, "under": under, "over": over, "nan": nan}
    return {"edges": ABS_ERR_EDGES, "counts": [int(c) for c in counts], **{k: int(v.sum()) for k, v in sums.items()}}


def accuracy_latency(
    backend: Backend,
    opts: OpOptions | None,
    device: str,
    *,
    accuracy_rows: int,
    accuracy_seed: int,
    timing: bool,
    timing_warmup: int,
    timing_iters: int,
    d: int,
    weight_dtype: str | torch.dtype,
    trail: Trail | None = None,
    progress: bool = True,
) -> CheckOutcome:
    """Accuracy against fp64 (rounded ONCE for correct rounding) and latency against the same-run
    `torch.add` roofline. Summary fields: docs/design.md "Fields shared by checks, artifact and plots"."""
    rows = check_int("accuracy_rows", accuracy_rows, 1)
    seed = check_int("accuracy_seed", accuracy_seed)
    warmup = check_int("timing_warmup", timing_warmup)
    iters = check_int("timing_iters", timing_iters, 1)
    if not isinstance(timing, bool):
        raise TypeError(f"timing: expected a bool, got {timing!r}")
    c = Check("accuracy_latency", backend, opts, device, d, weight_dtype, trail, progress)
    opts, dev, with_grad = c.opts, torch.device(device), c.with_grad
    s = Accuracy(rows=rows, device=str(dev), timed=False)
    with caught(s), c.bar(4) as bar:
        case = c.case(rows, seed)
        x, z, w, dy = case.x, case.z, case.w, case.dy
        # -- forward accuracy
        y = backend.forward(x, z, w, opts).detach()
        with torch.no_grad():
            y64 = gated_rmsnorm_math(x, z, w, opts, torch.float64)
            ulp = ulp_distance(y, round_once(y64, y.dtype))
            s.fwd_correctly_rounded = float((ulp == 0).double().mean())
            err = (y.double() - y64).abs()
            s.fwd_max_abs_err = float(err.max())  # NaN or inf: None in the artifact (to_json)
            s.fwd_ulp_hist = _ulp_hist(ulp)
            s.fwd_abs_err_hist = _abs_err_hist(err)
            del y64, ulp, err
        bar.update()
        # -- gradient accuracy against fp64 autograd
        if with_grad:
            g = backend.forward_backward(x, z, w, dy, opts)
            leaves = [t.double().requires_grad_() for t in (x, z, w)]
            with torch.enable_grad():
                gated_rmsnorm_math(*leaves, opts, torch.float64).backward(dy.double())
            s.grad_rel_err = {}
            for name, got, leaf in zip("xzw", (g.dx, g.dz, g.dw), leaves, strict=True):
                if got is None or leaf.grad is None:
                    s.grad_rel_err[name] = None
                    continue
                denom = float(leaf.grad.abs().max())
                num = float((got.detach().double() - leaf.grad).abs().max())
                s.grad_rel_err[name] = num / denom if denom > 0 else (0.0 if num == 0 else math.inf)
            del g, leaves
        bar.update()
        # -- latency
        if timing:
            moved = x.numel() * x.element_size()
            out = torch.empty_like(x)
            clock = CudaClock(str(dev)) if dev.type == "cuda" else CpuClock()  # primed CUDA events, or perf_counter
            add_t = clock.events(lambda: torch.add(x, z, out=out), iters, warmup)
            t = clock.events(lambda: backend.forward(x, z, w, opts), iters, warmup)
            s.roofline_add_us, s.fwd_us, s.fwd_us_p20, s.fwd_us_p80 = add_t.us, t.us, t.p20, t.p80
            s.fwd_gbps, s.fwd_roofline_ratio = 3 * moved / (t.us * 1e3), t.us / add_t.us
            host_bound = {"add": add_t.host_bound, "fwd": t.host_bound}
            bar.update()
            if with_grad:
                t = clock.events(lambda: backend.forward_backward(x, z, w, dy, opts), iters, warmup)
                s.fwd_bwd_us, s.fwd_bwd_us_p20, s.fwd_bwd_us_p80 = t.us, t.p20, t.p80
                s.fwd_bwd_gbps = 8 * moved / (t.us * 1e3)
                s.fwd_bwd_roofline_ratio = t.us / (8 / 3 * add_t.us)
                host_bound["fwd_bwd"] = t.host_bound
            s.host_bound = host_bound  # True: the GPU queue ran dry, the time includes host overhead
            s.timed = True
        bar.update(bar.total - bar.n)
    return c.outcome(s)
