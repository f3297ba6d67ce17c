"""rlnorm under kernel switches, a table line of its own beside plain rlnorm: `--variant fwd.NAME=VALUE`.

    --variant fwd.EXACT=0                                 one variant
    --variant fwd.EXACT=0 --variant bwd.STAGES=1          two variants, a line each
    --variant fwd.EXACT=0,bwd.STAGES=1                    one variant with both switches

The switches are the kernel's test hook `rlnorm.kernel.testing.plant` (names: FWD_SWITCHES, BWD_SWITCHES);
a line is labelled `rlnorm[fwd.EXACT=0]`, and its ratio is to the same run's add as plain rlnorm's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlnorm.kit.backends import RlnormBackend


class VariantError(ValueError):
    """A --variant that cannot be used: bad syntax, an unknown switch or a bad value."""


@dataclass(frozen=True)
class Variant:
    switches: dict[str, dict[str, Any]]  # {"fwd": {...}, "bwd": {...}}, as `plant` takes them
    text: str  # the settings as given, the label's inside

    @property
    def label(self) -> str:
        return f"rlnorm[{self.text}]"


def parse_value(text: str) -> int:
    """An integer (0x.. too) or true / false; anything else is a typo (`EXACT=O`) and raises."""
    t = text.strip().lower()
    if t in ("true", "false"):
        return int(t == "true")
    try:
        return int(t, 0)
    except ValueError:
        raise VariantError(f"--variant: value {text!r}: expected an integer, true or false") from None


def parse_variant(spec: str) -> Variant:
    """One --variant: `part.NAME=VALUE` settings joined by commas, part fwd or bwd, each NAME once; the
    switches are checked by the kernel's hook before anything is timed."""
    switches: dict[str, dict[str, Any]] = {"fwd": {}, "bwd": {}}
    text = []
    for item in spec.split(","):
        key, eq, value = item.strip().partition("=")
        part, dot, name = key.strip().partition(".")
        if not eq or not dot or part not in switches or not name or not value.strip():
            raise VariantError(f"--variant: {item.strip()!r}: expected fwd.NAME=VALUE or bwd.NAME=VALUE")
        if name in switches[part]:
            raise VariantError(f"--variant: {spec!r} sets {part}.{name} twice")
        switches[part][name] = parse_value(value)
        text.append(f"{part}.{name}={value.strip()}")
    try:
        from rlnorm.kernel.testing import plant  # here: a --base run may time a kernel from before the hook

        with plant(**switches):  # the hook refuses an unknown switch or a bad value, listing the valid ones
            pass
    except (TypeError, ValueError) as exc:
        raise VariantError(f"--variant: {exc}") from exc
    return Variant(switches, ",".join(text))


def parse_variants(specs: Sequence[str] | None) -> list[Variant]:
    """Every --variant given, in order; the same variant twice is refused (two lines of one thing)."""
    out: list[Variant] = []
    for spec in specs or ():
        v = parse_variant(spec)
        if any(v.switches == o.switches for o in out):
            raise VariantError(f"--variant: {spec!r} is given twice")
        out.append(v)
    return out


class VariantBackend(RlnormBackend):
    """rlnorm under a variant's switches. The runner enters `context()` once around all of a line's timed
    calls, so entering the switches is never timed."""

    def __init__(self, variant: Variant) -> None:
        super().__init__()
        self.variant = variant
        self.key = variant.label
        self.source = f"{self.source} under {variant.text}"

    def context(self) -> contextlib.AbstractContextManager:
        from rlnorm.kernel.testing import plant

        return plant(**self.variant.switches)
