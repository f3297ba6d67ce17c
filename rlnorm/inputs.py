"""Seeded inputs of the check protocol (docs/spec.md §3), identical on every device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlnorm.options import OpOptions

# dy comes from a second generator so that changing the forward data never shifts the gradient
# stream; the offset keeps it clear of every case seed the protocol uses.
DY_SEED_OFFSET = 1_000_000
# the dtypes by the names records and parameters spell them with
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


def dtype_name(dtype: torch.dtype) -> str:
    if (name := str(dtype).removeprefix("torch.")) not in DTYPES:
        raise TypeError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype}")
    return name


def dtype_from_name(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


@dataclass
class Case:
    """One seeded case: x, z, dy of shape [rows, d]; w of shape [d]."""

    x: torch.Tensor
    z: torch.Tensor
    w: torch.Tensor
    dy: torch.Tensor
    seed: int

    def rows(self, index: torch.Tensor | slice | list[int]) -> Case:
        """The same case restricted to some rows (w is shared)."""
        return Case(self.x[index], self.z[index], self.w, self.dy[index], self.seed)

    def to(self, device: str | torch.device) -> Case:
        return Case(self.x.to(device), self.z.to(device), self.w.to(device), self.dy.to(device), self.seed)


def make_case(
    rows: int,
    d: int = 128,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> Case:
    """x = 2*randn, z = randn, then w = 1 + 0.1*randn from one generator; dy = randn from a second. Drawn in fp32
    on the CPU and cast, so a GPU run sees bit-identical inputs to a CPU run."""
    if rows < 0:
        raise ValueError(f"rows: expected >= 0, got {rows}")
    if d <= 0:
        raise ValueError(f"d: expected > 0, got {d}")
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(rows, d, generator=g)
    z = torch.randn(rows, d, generator=g)
    w = 1 + 0.1 * torch.randn(d, generator=g)
    dy = torch.randn(rows, d, generator=torch.Generator().manual_seed(seed + DY_SEED_OFFSET))
    wd = weight_dtype or dtype
    return Case(x.to(dtype).to(device), z.to(dtype).to(device), w.to(wd).to(device), dy.to(dtype).to(device), seed)


UNDERFLOW_KINDS = ("x*w", "x*w*rstd", "no gate", "gate first")


def make_underflow_case(
    kind: str, rows: int = 8, d: int = 128, seed: int = 0, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, OpOptions]:
    """bf16 (x, z, w, options) where one fp32 product of a fast path (x*w, x*w*rstd, x*silu(z)) is subnormal
    while y is an ordinary normal number: the lost bits lie far outside any error bound set on normal
    data, and a range test on y alone does not see them. Column 0 sets the row's rstd."""
    if kind not in UNDERFLOW_KINDS:
        raise ValueError(f"kind: expected one of {UNDERFLOW_KINDS}, got {kind!r}")
    if rows < 1 or d < 2:
        raise ValueError(f"rows, d: expected >= 1 and >= 2, got {rows}, {d}")
    g = torch.Generator().manual_seed(seed)

    def u() -> torch.Tensor:  # magnitudes in [1, 2), random signs
        sign = torch.where(torch.rand(rows, d, generator=g) < 0.5, -1.0, 1.0).double()
        return (1 + torch.rand(rows, d, generator=g, dtype=torch.float64)) * sign

    z: torch.Tensor | None
    if kind == "x*w":  # x*w ~ 2**-145, gate ~ 2**100
        x, w, z, opts = 2.0**-70 * u(), 2.0**-75 * u()[0], 2.0**100 * u().abs(), OpOptions()
        x[:, 0], w[0] = 1.0, 2.0**-70
    elif kind == "x*w*rstd":  # x*w ~ 2**-84 is normal; rstd ~ 2**-56 (a huge column 0) takes it to ~ 2**-140
        x, w, z, opts = 2.0**-42 * u(), 2.0**-42 * u()[0], 2.0**100 * u().abs(), OpOptions()
        x[:, 0], w[0], z[:, 0] = 2.0**60, 1.0, 1.0
    elif kind == "no gate":  # rstd ~ 2**48 from a tiny row and eps 1e-30; x*w ~ 2**-142
        x, w, z, opts = 2.0**-70 * u(), 2.0**-72 * u()[0], None, OpOptions(eps=1e-30)
        x[:, 0], w[0] = 2.0**-45, 1.0
    else:  # "gate first": x*silu(z) ~ 2**-144, weight ~ 2**100
        x, w, z = 2.0**-64 * u(), 2.0**100 * u()[0].abs(), 2.0**-79 * u().abs()
        x[:, 0], w[0], z[:, 0], opts = 1.0, 1.0, 1.0, OpOptions(norm_before_gate=False)

    x, z, w = (None if t is None else t.to(torch.bfloat16).to(device) for t in (x, z, w))
    return x, z, w, opts  # type: ignore[return-value]
