"""rlnorm under kernel switches, timed beside plain rlnorm in the same run: `--variant fwd.NAME=VALUE`.

    --variant fwd.EXACT=0                     one variant: the forward's switch EXACT set to 0
    --variant fwd.EXACT=0 --variant bwd.STAGES=1            two variants, each its own table line
    --variant fwd.EXACT=0,bwd.STAGES=1        one variant with both switches

A variant's line is labelled `rlnorm[fwd.EXACT=0]`, so its ratio is to the same run's add as plain
rlnorm's is. The switches are the kernel's (`rlnorm.kernel.variant`, `FWD_SWITCHES`, `BWD_SWITCHES`),
imported only when a variant is used: a tree whose kernel has none says so instead of timing.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlnorm.kit.backends import Backend, Grads
from rlnorm.kit.backends.local import RlnormBackend
from rlnorm.options import OpOptions

PARTS = ("fwd", "bwd")


class VariantError(ValueError):
    """A --variant that cannot be used: bad syntax, an unknown switch, or no switches in this kernel."""


@dataclass(frozen=True)
class Variant:
    """Switches for the forward and the backward; `label` names the table line."""

    fwd: tuple[tuple[str, Any], ...] = ()
    bwd: tuple[tuple[str, Any], ...] = ()
    text: tuple[str, ...] = ()  # the settings as given, NAME=VALUE, in order: the label

    @property
    def label(self) -> str:
        return f"rlnorm[{','.join(self.text)}]"

    def switches(self) -> dict[str, dict[str, Any] | None]:
        """Keyword arguments for `rlnorm.kernel.variant`: a dict per part, None where none is set."""
        return {"fwd": dict(self.fwd) or None, "bwd": dict(self.bwd) or None}


def parse_value(text: str) -> Any:
    """An int (0x.. too), a float, true / false or none; anything else is a typo (`EXACT=O`) and raises."""
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for conv in (lambda v: int(v, 0), float):
        try:
            return conv(t)
        except ValueError:
            continue
    raise VariantError(f"--variant: value {text!r}: expected an integer, a number, true, false or none")


def parse_variant(spec: str) -> Variant:
    """One --variant: `part.NAME=VALUE` settings joined by commas, part fwd or bwd, each NAME once."""
    if not spec.strip():
        raise VariantError("--variant: expected fwd.NAME=VALUE or bwd.NAME=VALUE, got an empty string")
    parts: dict[str, dict[str, Any]] = {p: {} for p in PARTS}
    text = []
    for item in spec.split(","):
        item = item.strip()
        key, eq, value = item.partition("=")
        part, dot, name = key.strip().partition(".")
        if not eq or not dot or not value.strip():
            raise VariantError(f"--variant: {item!r}: expected fwd.NAME=VALUE or bwd.NAME=VALUE")
        if part not in PARTS:
            raise VariantError(f"--variant: {item!r}: the part must be fwd or bwd, got {part!r}")
        if not name.isidentifier():
            raise VariantError(f"--variant: {item!r}: {name!r} is not a switch name")
        if name in parts[part]:
            raise VariantError(f"--variant: {spec!r} sets {part}.{name} twice")
        parts[part][name] = parse_value(value)
        text.append(f"{part}.{name}={value.strip()}")
    return Variant(tuple(parts["fwd"].items()), tuple(parts["bwd"].items()), tuple(text))


def parse_variants(specs: Sequence[str] | None) -> list[Variant]:
    """Every --variant given, in order; the same variant twice is refused (two lines of one thing)."""
    out: list[Variant] = []
    for spec in specs or ():
        v = parse_variant(spec)
        if any(dict(v.fwd) == dict(o.fwd) and dict(v.bwd) == dict(o.bwd) for o in out):
            raise VariantError(f"--variant: {spec!r} is given twice")
        out.append(v)
    return out


def kernel_variant() -> Callable[..., contextlib.AbstractContextManager]:
    """`rlnorm.kernel.variant`, imported now (it may not exist in every tree: then VariantError says so)."""
    try:
        from rlnorm.kernel import variant
    except (ImportError, AttributeError) as exc:
        raise VariantError(
            f"--variant: this tree's kernel has no switches (rlnorm.kernel.variant: {type(exc).__name__}: {exc})"
        ) from exc
    return variant


def validate(variants: Sequence[Variant]) -> None:
    """Every switch named is one the kernel has (`FWD_SWITCHES` / `BWD_SWITCHES`, where it lists them):
    checked before any timing, so a typo costs nothing."""
    if not variants:
        return
    kernel_variant()
    kernel = importlib.import_module("rlnorm.kernel")
    for part in PARTS:
        known = getattr(kernel, f"{part.upper()}_SWITCHES", None)
        if known is None:
            continue  # the kernel's variant() still refuses an unknown name when the line is timed
        for v in variants:
            for name, _ in getattr(v, part):
                if name not in known:
                    raise VariantError(
                        f"--variant: {part}.{name} is not a switch of this kernel ({part}: {', '.join(sorted(known))})"
                    )


class VariantBackend(Backend):
    """A backend (rlnorm by default) under a variant's switches, as its own table line.

    The bench enters `context()` once around all of a line's calls (so entering it is never timed); a
    call made outside it enters the switches for that call, so no call ever runs without them.
    """

    def __init__(self, variant: Variant, base: Backend | None = None) -> None:
        super().__init__()
        self.variant = variant
        self.base = base if base is not None else RlnormBackend()
        self.key = variant.label
        self.source = f"{self.base.source} under {','.join(variant.text)}"
        self.has_backward = self.base.has_backward
        self._active = 0

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        with kernel_variant()(**self.variant.switches()):
            self._active += 1
            try:
                yield
            finally:
                self._active -= 1

    def _within(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if self._active else self.context()

    def _import_reason(self) -> str | None:
        try:
            kernel_variant()
        except VariantError as exc:
            return str(exc)
        return self.base._import_reason()

    def _probe(self, device: str) -> tuple[bool, str]:
        reason = self._import_reason()
        if reason:
            return False, reason
        with self._within():
            return super()._probe(device)

    def supports(self, opts: OpOptions) -> tuple[bool, str]:
        return self.base.supports(opts)

    def forward(self, x: Any, z: Any, w: Any, opts: OpOptions) -> Any:
        with self._within():
            return self.base.forward(x, z, w, opts)

    def forward_backward(self, x: Any, z: Any, w: Any, dy: Any, opts: OpOptions) -> Grads:
        with self._within():
            return self.base.forward_backward(x, z, w, dy, opts)


@contextlib.contextmanager
def launch_switches(part: str, switches: Mapping[str, Any] | None) -> Iterator[None]:
    """Kernel switches for launchers called directly (`rms_norm_gated_fwd` / `_bwd`), as the tools do."""
    if not switches:
        yield
        return
    with kernel_variant()(**{part: dict(switches)}):
        yield


def describe(variants: Sequence[Variant]) -> Mapping[str, dict]:
    """label -> the switches, for the run's JSON."""
    return {v.label: v.switches() for v in variants}
