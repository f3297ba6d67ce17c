"""Seeded inputs of the check protocol (SPEC §4), identical on every device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# dy comes from a second generator so that changing the forward data never shifts the gradient
# stream; the offset keeps it clear of every case seed the protocol uses.
DY_SEED_OFFSET = 1_000_000


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
    """x = 2*randn, z = randn, then w = 1 + 0.1*randn from one generator; dy = randn from a second.

    Drawn in fp32 on the CPU and cast, so a GPU run sees bit-identical inputs to a CPU run.
    """
    if rows < 0:
        raise ValueError(f"rows: expected >= 0, got {rows}")
    if d <= 0:
        raise ValueError(f"d: expected > 0, got {d}")
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(rows, d, generator=g)
    z = torch.randn(rows, d, generator=g)
    w = 1 + 0.1 * torch.randn(d, generator=g)
    g_dy = torch.Generator().manual_seed(seed + DY_SEED_OFFSET)
    dy = torch.randn(rows, d, generator=g_dy)
    wd = weight_dtype or dtype
    return Case(x.to(dtype).to(device), z.to(dtype).to(device), w.to(wd).to(device), dy.to(dtype).to(device), seed)
