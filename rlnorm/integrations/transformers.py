"""rlnorm's kernel in a transformers (or FLA) model: `apply_rlnorm(model)` swaps every gated RMSNorm it knows.

Each known module (recognised by class and defining module, nothing imported) becomes an rlnorm module holding the
*same* weight Parameter and the module's own options, never a library's default (docs/integrations.md). rlnorm rounds
once where transformers rounds three times in bf16 (a third of outputs move 1-2 ulp): patch from the start.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rlnorm.kernel.api import RMSNormGated
from rlnorm.options import ACTIVATIONS

__all__ = ["KNOWN", "QWEN3_NEXT_CLASSES", "GatedNormOptions", "Replaced", "Replacements", "UnsupportedGatedNorm"]
__all__ += ["RlnormFlaFusedRMSNormGated", "RlnormFlaRMSNormGated", "RlnormQwen3NextRMSNormGated"]
__all__ += ["apply_rlnorm", "apply_rlnorm_to_qwen3_next"]


class UnsupportedGatedNorm(ValueError):
    """A gated norm rlnorm cannot stand in for with the same meaning (the message names module and option)."""


@dataclass(frozen=True)
class GatedNormOptions:
    hidden_size: int
    eps: float
    group_size: int | None
    norm_before_gate: bool
    activation: str
    weight: nn.Parameter | None  # None: a weight-less module (FLA's elementwise_affine=False)


# -- the replacements ---------------------------------------------------------------------------------------------
class _Replacement(RMSNormGated):
    """rlnorm's module holding the replaced module's weight Parameter itself."""

    source = ""  # the class it replaces, for messages

    def __init__(self, o: GatedNormOptions, where: str = "") -> None:
        opts = {"eps": o.eps, "group_size": o.group_size, "norm_before_gate": o.norm_before_gate}
        affine = {} if o.weight is not None else {"elementwise_affine": False}
        super().__init__(o.hidden_size, **opts, activation=o.activation, **affine)
        if o.weight is not None:
            self.weight = o.weight
        self.where = where  # its name in the model it was put into, for messages


def _option(name: str) -> property:  # an attribute of the replaced class, read off the options
    return property(lambda self: getattr(self.opts, name))


class RlnormQwen3NextRMSNormGated(_Replacement):
    """Stands in for transformers' Qwen3NextRMSNormGated (and its Qwen3.5 copies)."""

    source = "Qwen3NextRMSNormGated"
    variance_epsilon = _option("eps")
    activation = _option("activation")

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(hidden_states, gate)


class RlnormFlaRMSNormGated(_Replacement):
    """Stands in for FLA's layernorm_gated.RMSNormGated (whose defaults are eps 1e-5 and the gate first)."""

    source = "FLA RMSNormGated"
    bias = None
    eps = _option("eps")
    group_size = _option("group_size")
    norm_before_gate = _option("norm_before_gate")


class RlnormFlaFusedRMSNormGated(_Replacement):
    """Stands in for FLA's FusedRMSNormGated; its residual/prenorm form (a residual added inside the kernel) raises."""

    source = "FLA FusedRMSNormGated"
    bias = None
    eps = _option("eps")
    activation = _option("activation")

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        g: torch.Tensor,
        residual: torch.Tensor | None = None,
        prenorm: bool = False,
        residual_in_fp32: bool = False,
    ) -> torch.Tensor:
        if residual is not None or prenorm:
            option = "residual" if residual is not None else "prenorm=True"
            raise UnsupportedGatedNorm(
                f"{self.where or 'module'} (rlnorm in place of {self.source}): {option} cannot be honoured: rlnorm "
                "normalises x as given; add the residual to x before the call"
            )
        return super().forward(x, g)


# -- reading the replaced module ----------------------------------------------------------------------------------
def _refuse(where: str, source: str, option: str, why: str) -> UnsupportedGatedNorm:
    return UnsupportedGatedNorm(f"{where} ({source}): {option} cannot be honoured: {why}")


def _weight(mod: nn.Module, where: str, source: str, required: bool = False) -> nn.Parameter | None:
    w = getattr(mod, "weight", None)
    if w is None and required:
        raise _refuse(where, source, "weight=None", f"{source}'s gated norm always multiplies by its weight")
    if w is not None and (not isinstance(w, nn.Parameter) or w.dim() != 1):
        raise _refuse(where, source, "weight", f"expected a 1-d nn.Parameter, got {type(w).__name__} {tuple(w.shape)}")
    return w


def _activation(name: object, where: str, source: str) -> str:
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise _refuse(where, source, f"activation={name!r}", f"rlnorm gates with one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


# GatedNormOptions(hidden_size, eps, group_size, norm_before_gate, activation, weight) of each known class
def _read_transformers(mod: nn.Module, where: str, source: str) -> GatedNormOptions:
    w = _weight(mod, where, source, required=True)  # its forward normalises, scales, then gates
    return GatedNormOptions(w.shape[0], mod.variance_epsilon, None, True, _activation(mod.activation, where, source), w)


def _no_bias(mod: nn.Module, where: str, source: str) -> None:
    if getattr(mod, "bias", None) is not None:
        raise _refuse(where, source, "bias", "rlnorm's norm has no bias")


def _read_fla_rmsnorm_gated(mod: nn.Module, where: str, source: str) -> GatedNormOptions:
    _no_bias(mod, where, source)  # layernorm_gated gates with silu only
    w = _weight(mod, where, source, required=True)
    return GatedNormOptions(w.shape[0], mod.eps, mod.group_size, mod.norm_before_gate, "silu", w)


def _read_fla_fused(mod: nn.Module, where: str, source: str) -> GatedNormOptions:
    _no_bias(mod, where, source)  # fused_norm_gate normalises, scales, then gates
    activation = _activation(mod.activation, where, source)
    return GatedNormOptions(mod.hidden_size, mod.eps, None, True, activation, _weight(mod, where, source))


@dataclass(frozen=True)
class _Kind:
    source: str
    read: Callable[[nn.Module, str, str], GatedNormOptions]
    replacement: type[_Replacement]


_TRANSFORMERS = _Kind("transformers {}", _read_transformers, RlnormQwen3NextRMSNormGated)
# (defining module, class name) -> how to replace it. Qwen3.5's gated norms are copies of Qwen3-Next's.
KNOWN: dict[tuple[str, str], _Kind] = {
    ("transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextRMSNormGated"): _TRANSFORMERS,
    ("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5RMSNormGated"): _TRANSFORMERS,
    ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeRMSNormGated"): _TRANSFORMERS,
    ("fla.modules.layernorm_gated", "RMSNormGated"): _Kind("FLA {}", _read_fla_rmsnorm_gated, RlnormFlaRMSNormGated),
    ("fla.modules.fused_norm_gate", "FusedRMSNormGated"): _Kind("FLA {}", _read_fla_fused, RlnormFlaFusedRMSNormGated),
}


def _known_base(mod: nn.Module, names: Collection[str] | None) -> type | None:
    for cls in type(mod).__mro__:
        if (cls.__module__, cls.__qualname__) in KNOWN and (names is None or cls.__qualname__ in names):
            return cls
    return None


def _build(mod: nn.Module, base: type, where: str) -> _Replacement:
    kind = KNOWN[(base.__module__, base.__qualname__)]
    source = kind.source.format(base.__qualname__)
    if type(mod).forward is not base.forward:
        option = f"{type(mod).__qualname__}.forward"
        raise _refuse(where, source, option, "it overrides the forward rlnorm stands in for")
    # what swapping would silently drop: a forward replaced on the instance, hooks
    kinds = ("forward", "forward_pre", "backward", "backward_pre")
    hooks = [f"{k}_hooks" for k in kinds if getattr(mod, f"_{k}_hooks", None)]
    if "forward" in vars(mod):
        why = "its forward was replaced on the instance (accelerate's hooks, another kernel library)"
        raise _refuse(where, source, "the module itself", why)
    if hooks:
        why = f"it has {', '.join(hooks)} (FSDP, DDP or a user's): apply rlnorm before them"
        raise _refuse(where, source, "the module itself", why)
    o = kind.read(mod, where, source)
    try:
        rep = kind.replacement(o, where)
    except (ValueError, TypeError) as exc:  # rlnorm's own validation names the option (eps, group_size, width)
        raise UnsupportedGatedNorm(f"{where} ({source}): rlnorm cannot honour it: {exc}") from exc
    rep.source = source
    return rep


# -- applying and undoing -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Replaced:
    name: str  # qualified name in the model, e.g. "model.layers.0.linear_attn.norm"
    source: str  # what was there, e.g. "transformers Qwen3NextRMSNormGated"
    original: nn.Module
    replacement: nn.Module


class Replacements(tuple[Replaced, ...]):
    """What `apply_rlnorm` swapped, in model order; `undo()` (or leaving `with`) swaps it back. `skipped`: (name,
    reason) of modules left in place under strict=False."""

    model: nn.Module
    skipped: tuple[tuple[str, str], ...]
    undone: bool

    def __new__(cls, model: nn.Module, items: Sequence[Replaced], skipped: Sequence[tuple[str, str]] = ()):
        self = super().__new__(cls, items)
        self.model, self.skipped, self.undone = model, tuple(skipped), False
        return self

    @property
    def names(self) -> list[str]:
        return [r.name for r in self]

    def __repr__(self) -> str:
        state = ", undone" if self.undone else ""
        return f"<Replacements: {len(self)} module(s){state}, {len(self.skipped)} skipped: {self.names}>"

    def undo(self) -> None:
        """Put every original back, with the weight trained since; changes nothing if another module took a place."""
        if self.undone:
            return
        places = []
        for item in self:
            parent_name, _, attr = item.name.rpartition(".")
            parent = self.model.get_submodule(parent_name)
            now = getattr(parent, attr, None)
            if now is not item.replacement:
                raise RuntimeError(
                    f"{item.name}: holds {type(now).__name__}, not the rlnorm module apply_rlnorm put there; "
                    "nothing was undone"
                )
            places.append((parent, attr, item))
        for parent, attr, item in reversed(places):
            w = getattr(item.replacement, "weight", None)
            if w is not None and getattr(item.original, "weight", None) is not w:
                item.original.weight = w  # reassigned meanwhile (load_state_dict(assign=True)): keep the new one
            setattr(parent, attr, item.original)
        self.undone = True

    def __enter__(self) -> Replacements:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def apply_rlnorm(model: nn.Module, *, only: Collection[str] | None = None, strict: bool = True) -> Replacements:
    """Swap every gated norm of `model` that rlnorm knows (`KNOWN`) for an rlnorm module, in place.

    only: class names to replace. strict: a module rlnorm cannot stand in for raises UnsupportedGatedNorm and nothing
    is swapped; strict=False leaves it, listed in `skipped`. Call it before wrapping the model (a hook is refused).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if _known_base(model, only) is not None:
        raise ValueError(f"model: is itself a {type(model).__qualname__}; pass the model that holds it")
    # one replacement per module (a module shared by two parents stays shared), or why it was refused
    built: dict[int, _Replacement | str] = {}
    items: list[Replaced] = []
    skipped: list[tuple[str, str]] = []
    for parent_name, parent in model.named_modules(remove_duplicate=False):
        for attr, child in parent.named_children():
            base = _known_base(child, only)
            if base is None:
                continue
            where = f"{parent_name}.{attr}" if parent_name else attr
            if id(child) not in built:
                try:
                    built[id(child)] = _build(child, base, where)
                except UnsupportedGatedNorm as exc:
                    if strict:
                        raise
                    built[id(child)] = str(exc)
            rep = built[id(child)]
            if isinstance(rep, str):
                skipped.append((where, rep))
            else:
                items.append(Replaced(where, rep.source, child, rep))
    for item in items:  # every module was accepted: now swap, so a refusal never leaves a half-patched model
        parent_name, _, attr = item.name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, item.replacement)
    return Replacements(model, items, skipped)


QWEN3_NEXT_CLASSES = ("Qwen3NextRMSNormGated",)


def apply_rlnorm_to_qwen3_next(model: nn.Module, *, strict: bool = True) -> Replacements:
    """`apply_rlnorm` for a transformers Qwen3-Next model (its Gated DeltaNet layers' `norm`)."""
    done = apply_rlnorm(model, only=QWEN3_NEXT_CLASSES, strict=strict)
    if not done and not done.skipped:
        raise ValueError(f"model: {type(model).__qualname__} holds no Qwen3NextRMSNormGated (not a Qwen3-Next model?)")
    return done
