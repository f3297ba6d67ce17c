"""rlnorm's kernel in a transformers (or FLA) model: `apply_rlnorm(model)` swaps every gated RMSNorm it knows.

Each known module (recognised by class and defining module, nothing imported) becomes an rlnorm module holding the
*same* weight Parameter and the module's own options, never a library's default (docs/integrations.md). rlnorm rounds
once where transformers rounds three times in bf16 (a third of outputs move 1-2 ulp): patch from the start.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlnorm.kernel.api import RMSNormGated


class UnsupportedGatedNorm(ValueError):
    """A gated norm rlnorm cannot stand in for with the same meaning (the message names module and option)."""


# -- the replacements ---------------------------------------------------------------------------------------------
class _Replacement(RMSNormGated):
    """rlnorm's module holding the replaced module's weight Parameter itself. `names`: the replaced class's attribute
    for each option it has, read off it and kept under that name (the others are rlnorm's defaults there too)."""

    library: str  # whose classes it replaces, for messages
    names: dict[str, str]
    weightless: bool  # the replaced class may hold no weight (FLA's elementwise_affine=False)
    bias = None  # FLA's modules read it; rlnorm's norm has none

    def __init_subclass__(cls, library: str, names: dict[str, str], weightless: bool = False) -> None:
        super().__init_subclass__()
        cls.library, cls.names, cls.weightless = library, names, weightless
        for attr, option in names.items():
            setattr(cls, attr, property(lambda self, option=option: getattr(self.opts, option)))

    def __init__(self, hidden_size: int, weight: nn.Parameter | None, where: str, source: str, **opts: Any) -> None:
        super().__init__(hidden_size, **opts, elementwise_affine=weight is not None)
        if weight is not None:
            self.weight = weight
        self.where, self.source = where, source  # its name in the model, and the class it replaced


class RlnormQwen3NextRMSNormGated(
    _Replacement, library="transformers", names={"variance_epsilon": "eps", "activation": "activation"}
):
    """Stands in for transformers' Qwen3NextRMSNormGated (and its Qwen3.5 copies)."""

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(hidden_states, gate)


class RlnormFlaRMSNormGated(
    _Replacement,
    library="FLA",
    names={"eps": "eps", "group_size": "group_size", "norm_before_gate": "norm_before_gate"},
):
    """Stands in for FLA's layernorm_gated.RMSNormGated (whose defaults are eps 1e-5 and the gate first)."""


class RlnormFlaFusedRMSNormGated(
    _Replacement, library="FLA", names={"eps": "eps", "activation": "activation"}, weightless=True
):
    """Stands in for FLA's FusedRMSNormGated; its residual/prenorm form (a residual added inside the kernel) raises."""

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
                f"{self.where} (rlnorm in place of {self.source}): {option} cannot be honoured: rlnorm "
                "normalises x as given; add the residual to x before the call"
            )
        return super().forward(x, g)


# (defining module, class name) -> its replacement. Qwen3.5's gated norms are copies of Qwen3-Next's.
KNOWN: dict[tuple[str, str], type[_Replacement]] = {
    ("transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextRMSNormGated"): RlnormQwen3NextRMSNormGated,
    ("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5RMSNormGated"): RlnormQwen3NextRMSNormGated,
    ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeRMSNormGated"): RlnormQwen3NextRMSNormGated,
    ("fla.modules.layernorm_gated", "RMSNormGated"): RlnormFlaRMSNormGated,
    ("fla.modules.fused_norm_gate", "FusedRMSNormGated"): RlnormFlaFusedRMSNormGated,
}


def _known_base(mod: nn.Module, names: Collection[str] | None) -> type | None:
    known = (c for c in type(mod).__mro__ if (c.__module__, c.__qualname__) in KNOWN)
    return next((c for c in known if names is None or c.__qualname__ in names), None)


def _build(mod: nn.Module, base: type, where: str) -> _Replacement:
    replacement = KNOWN[(base.__module__, base.__qualname__)]
    source = f"{replacement.library} {base.__qualname__}"

    def refuse(option: str, why: str) -> UnsupportedGatedNorm:
        return UnsupportedGatedNorm(f"{where} ({source}): {option} cannot be honoured: {why}")

    if type(mod).forward is not base.forward:
        raise refuse(f"{type(mod).__qualname__}.forward", "it overrides the forward rlnorm stands in for")
    # what swapping would silently drop: a forward replaced on the instance, hooks
    if "forward" in vars(mod):
        why = "its forward was replaced on the instance (accelerate's hooks, another kernel library)"
        raise refuse("the module itself", why)
    kinds = ("forward", "forward_pre", "backward", "backward_pre")
    if hooks := [f"{k}_hooks" for k in kinds if getattr(mod, f"_{k}_hooks", None)]:
        why = f"it has {', '.join(hooks)} (FSDP, DDP or a user's): apply rlnorm before them"
        raise refuse("the module itself", why)
    if getattr(mod, "bias", None) is not None:
        raise refuse("bias", "rlnorm's norm has no bias")
    w = getattr(mod, "weight", None)
    if w is None and not replacement.weightless:
        raise refuse("weight=None", f"{source}'s gated norm always multiplies by its weight")
    if w is not None and (not isinstance(w, nn.Parameter) or w.dim() != 1):
        raise refuse("weight", f"expected a 1-d nn.Parameter, got {type(w).__name__} {tuple(w.shape)}")
    opts = {option: getattr(mod, attr) for attr, option in replacement.names.items()}
    try:
        return replacement(mod.hidden_size if w is None else w.shape[0], w, where, source, **opts)
    except (ValueError, TypeError) as exc:  # rlnorm's own validation names the option it refuses
        raise UnsupportedGatedNorm(f"{where} ({source}): rlnorm cannot honour it: {exc}") from exc


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
        for item in self:
            parent_name, _, attr = item.name.rpartition(".")
            now = getattr(self.model.get_submodule(parent_name), attr, None)
            if now is not item.replacement:
                raise RuntimeError(
                    f"{item.name}: holds {type(now).__name__}, not the rlnorm module apply_rlnorm put there; "
                    "nothing was undone"
                )
        for item in reversed(self):
            w = getattr(item.replacement, "weight", None)
            if w is not None and getattr(item.original, "weight", None) is not w:
                item.original.weight = w  # reassigned meanwhile (load_state_dict(assign=True)): keep the new one
            self.model.set_submodule(item.name, item.original)
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
    for where, child in model.named_modules(remove_duplicate=False):  # the model itself is not known: checked above
        if (base := _known_base(child, only)) is None:
            continue
        if id(child) not in built:
            try:
                built[id(child)] = _build(child, base, where)
            except UnsupportedGatedNorm as exc:
                if strict:
                    raise
                built[id(child)] = str(exc)
        if isinstance(rep := built[id(child)], str):
            skipped.append((where, rep))
        else:
            items.append(Replaced(where, rep.source, child, rep))
    for item in items:  # every module was accepted: now swap, so a refusal never leaves a half-patched model
        model.set_submodule(item.name, item.replacement)
    return Replacements(model, items, skipped)


def apply_rlnorm_to_qwen3_next(model: nn.Module, *, strict: bool = True) -> Replacements:
    """`apply_rlnorm` for a transformers Qwen3-Next model (its Gated DeltaNet layers' `norm`)."""
    done = apply_rlnorm(model, only=["Qwen3NextRMSNormGated"], strict=strict)
    if not done and not done.skipped:
        raise ValueError(f"model: {type(model).__qualname__} holds no Qwen3NextRMSNormGated (not a Qwen3-Next model?)")
    return done
