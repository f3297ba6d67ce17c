"""Options of the gated RMSNorm op, validated once so every backend sees the same meaning."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ACTIVATIONS = {"silu": "silu", "swish": "silu", "sigmoid": "sigmoid"}


@dataclass(frozen=True)
class OpOptions:
    """The op's knobs (docs/spec.md §1). `activation` is stored normalised ("swish" -> "silu"); eps >= 0."""

    eps: float = 1e-6
    group_size: int | None = None
    norm_before_gate: bool = True
    activation: str = "silu"

    def __post_init__(self) -> None:
        # eps = 0 is allowed (FLA's tests use it): a row of all zeros then has rstd = inf
        if not isinstance(self.eps, (int, float)) or isinstance(self.eps, bool) or not self.eps >= 0:
            raise ValueError(f"eps: expected a non-negative float, got {self.eps!r}")
        if not (self.group_size is None or (type(self.group_size) is int and self.group_size > 0)):  # a bool is no size
            raise ValueError(f"group_size: expected None or a positive int, got {self.group_size!r}")
        if not isinstance(self.norm_before_gate, bool):
            raise TypeError(f"norm_before_gate: expected a bool, got {self.norm_before_gate!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        object.__setattr__(self, "eps", float(self.eps))
        object.__setattr__(self, "activation", ACTIVATIONS[self.activation])

    def check_width(self, d: int) -> None:
        """Raise if group_size does not divide the row width d."""
        if self.group_size is not None and d % self.group_size != 0:
            raise ValueError(f"group_size: {self.group_size} does not divide the last dimension {d}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
