"""The `vllm` backend: vLLM's own `RMSNormGated.forward_cuda`, forward only (docs/spec.md §6).

What is called: `vllm.model_executor.layers.layernorm.RMSNormGated(D, eps, group_size,
norm_before_gate, dtype=w.dtype, activation)`, constructed under a current vLLM config (its
`CustomOp.__init__` reads `get_current_vllm_config()`), our weight swapped in as its `weight`
parameter, then `.forward_cuda(x, z)`: vLLM's copy of FLA's `layernorm_guard.rmsnorm_fn`, a
Triton kernel called directly (no autograd.Function: vLLM is inference-only, so no backward).

Why it often cannot run, and how this module says so exactly (`available`):
- vllm not installed, or its torch pin (0.30.0: `torch==2.13.0`) not met: read from package
  metadata, without importing vllm;
- importing vllm fails, crashes or hangs: the first import happens in a CHILD process
  (`python -m rlnorm.kit.backends.vllm --probe DEVICE`), which also keeps vLLM's import-time patches
  of torch (`vllm/env_override.py` patches torch._inductor and sets TORCHINDUCTOR_COMPILE_THREADS)
  out of the kit's process until vLLM is known to run;
- no GPU driver: `vllm/triton_utils/importing.py` counts active Triton drivers and, unless
  exactly one is active, sets HAS_TRITON = False, and `vllm.triton_utils.triton` becomes its
  `TritonPlaceholder` (no `next_power_of_2`, `jit` a no-op), so forward_cuda raises AttributeError;
- forward_cuda on a CPU tensor: the kernel is launched for CUDA.
The child really constructs the module and calls forward_cuda on a tiny input, so the reason
quotes the error vLLM itself raises.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import traceback
from typing import Any

import torch
from torch import Tensor

from rlnorm.kit.backends import Backend, BackendUnavailable, Grads
from rlnorm.options import OpOptions

__all__ = [
    "ALLOW_TORCH_MISMATCH_ENV",
    "VllmBackend",
    "probe",
    "reason_from_probe",
    "run_probe",
    "torch_pin_reason",
    "torch_requirement",
    "vllm_version",
]

DIST = "vllm"
ALLOW_TORCH_MISMATCH_ENV = "RLNORM_VLLM_ALLOW_TORCH_MISMATCH"
INSTALL_HINT = "bash .ci/install-vllm.sh installs vllm==0.30.0 beside the installed torch"
_PROBE_MARK = "RLNORM_VLLM_PROBE "
_PROBE_TIMEOUT_S = 600.0  # importing vllm takes ~25 s on 2 cores; a hang must still end


def vllm_version() -> str | None:
    """The installed vllm distribution's version, or None when it is not installed."""
    try:
        return importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_requirement() -> str | None:
    """vllm's own requirement on torch as its metadata states it (e.g. "torch==2.13.0"), or None."""
    try:
        reqs = importlib.metadata.requires(DIST) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for raw in reqs:
        head, _, marker = raw.partition(";")
        if "extra" in marker:
            continue
        m = re.fullmatch(r"\s*torch\s*(\(.*\)|[<>=!~].*)?", head, flags=re.IGNORECASE)
        if m:
            return "torch" + (m.group(1) or "").strip("() ").replace(" ", "")
    return None


def torch_pin_reason(torch_version: str, requirement: str | None, vllm_ver: str | None) -> str | None:
    """Why this torch does not meet vllm's torch requirement, or None when it does (or none is stated)."""
    if not requirement:
        return None
    spec = requirement[len("torch") :]
    if not spec:
        return None
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        ok = Version(torch_version) in SpecifierSet(spec)
    except Exception:  # no `packaging`, or an odd version string: compare the release by hand
        ok = not spec.startswith("==") or torch_version.split("+")[0] == spec[2:]
    if ok:
        return None
    return (
        f"vLLM {vllm_ver} pins {requirement} but torch {torch_version} is installed (vLLM's compiled "
        f"ops are built against the pinned torch; set {ALLOW_TORCH_MISMATCH_ENV}=1 to try it anyway)"
    )


def _last_line(exc: BaseException) -> str:
    """The traceback's last line, `Type: message`, as Python prints it."""
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1][:500]


def _device_type(device: str) -> str:
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError):
        return str(device)


def probe(device: str) -> dict[str, Any]:
    """Run in the child: import vllm, construct RMSNormGated under a vLLM config, call forward_cuda.

    Returns facts only (stage reached, vLLM's Triton decision, the error's last line); the parent
    turns them into a reason with `reason_from_probe`.
    """
    out: dict[str, Any] = {"device": device, "stage": "import", "error": None}
    out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    out["torch_cuda_available"] = torch.cuda.is_available()
    try:
        import vllm
        from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
        from vllm.model_executor.layers.layernorm import RMSNormGated
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
        from vllm.triton_utils import triton as vllm_triton
    except BaseException as exc:
        out["error"] = _last_line(exc)
        return out
    out["vllm_version"] = getattr(vllm, "__version__", None)
    out["platform"] = type(current_platform).__name__
    out["has_triton"] = bool(HAS_TRITON)
    out["triton_placeholder"] = type(vllm_triton).__name__ == "TritonPlaceholder"
    out["triton_installed"] = importlib.util.find_spec("triton") is not None
    out["active_drivers"] = None
    if out["triton_installed"]:
        try:  # the same count vllm/triton_utils/importing.py makes (the cpu backend excluded)
            from triton.backends import backends

            out["active_drivers"] = [
                name for name, b in backends.items() if name != "cpu" and b.driver and b.driver.is_active()
            ]
        except Exception as exc:
            out["active_drivers_error"] = _last_line(exc)
    out["stage"] = "construct"
    try:
        with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device=_device_type(device)))):
            mod = RMSNormGated(128, eps=1e-6, norm_before_gate=True, dtype=torch.float32, activation="silu")
        out["module"] = f"{type(mod).__module__}.{type(mod).__qualname__}"
    except BaseException as exc:
        out["error"] = _last_line(exc)
        return out
    out["stage"] = "inputs"
    try:
        gen = torch.Generator().manual_seed(0)
        x = (2 * torch.randn(3, 128, generator=gen)).to(torch.bfloat16).to(device)
        z = torch.randn(3, 128, generator=gen).to(torch.bfloat16).to(device)
        mod = mod.to(device)
    except BaseException as exc:
        out["error"] = _last_line(exc)
        return out
    out["stage"] = "forward_cuda"
    try:
        with torch.no_grad():
            y = mod.forward_cuda(x, z)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        out["output_shape"] = list(y.shape)
    except BaseException as exc:
        out["error"] = _last_line(exc)
        return out
    out["stage"] = "ok"
    return out


def run_probe(device: str, timeout_s: float = _PROBE_TIMEOUT_S, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`probe(device)` in a child process; a crash, hang or unreadable answer is described, never raised."""
    child_env = {**os.environ, **(env or {})}
    cmd = [sys.executable, "-m", "rlnorm.kit.backends.vllm", "--probe", device]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=child_env)
    except subprocess.TimeoutExpired:
        return {"device": device, "stage": "child", "error": f"the probe child did not finish in {timeout_s:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_PROBE_MARK):
            return json.loads(line[len(_PROBE_MARK) :])
    tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    last = tail[-1][:500] if tail else "(no stderr)"
    how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited {proc.returncode}"
    return {"device": device, "stage": "child", "error": f"the probe child {how} before answering; last line: {last}"}


def reason_from_probe(p: dict[str, Any], vllm_ver: str | None) -> str | None:
    """The exact reason the probe shows vLLM's forward_cuda cannot run on p["device"], or None if it ran."""
    stage, err, device = p.get("stage"), p.get("error"), p.get("device")
    if stage == "ok":
        return None
    if stage == "child":
        return f"probing vllm in a child process failed: {err}"
    if stage == "import":
        return f"vllm {vllm_ver} is installed but importing its RMSNormGated fails: {err}"
    if stage == "construct":
        return f"vLLM's RMSNormGated(128, ...) under VllmConfig(device_config=DeviceConfig({device!r})) fails: {err}"
    parts: list[str] = []
    if not p.get("has_triton", True):
        if not p.get("triton_installed"):
            parts.append(
                "vLLM found no Triton (find_spec('triton') is None), "
                "so vllm.triton_utils.triton is its TritonPlaceholder"
            )
        else:
            drivers = p.get("active_drivers")
            count = "an unknown number of" if drivers is None else str(len(drivers))
            named = f" {drivers}" if drivers else ""
            parts.append(
                f"no GPU driver: vLLM disabled Triton (vllm/triton_utils/importing.py found {count} active Triton "
                f"GPU driver(s){named}, expected exactly 1; torch.cuda.is_available()={p.get('torch_cuda_available')}"
                "), so vllm.triton_utils.triton is its TritonPlaceholder"
            )
    elif p.get("cuda_visible_devices") == "" and not p.get("active_drivers"):
        parts.append(
            "CUDA_VISIBLE_DEVICES is empty, so vLLM kept Triton with no active driver (its distributed-init leniency)"
        )
    if _device_type(str(device)) != "cuda":
        parts.append(f"forward_cuda launches a CUDA Triton kernel and device {device!r} is not CUDA")
    if stage == "inputs":
        parts.append(f"the probe's tensors cannot be placed on {device}: {err}")
    else:
        parts.append(f"RMSNormGated.forward_cuda(x, z) on {device} raises {err}")
    return "; ".join(parts)


class VllmBackend(Backend):
    """vLLM's `RMSNormGated.forward_cuda`: forward only; `available` says exactly why it cannot run."""

    key = "vllm"
    has_backward = False

    def __init__(self, allow_torch_mismatch: bool | None = None, probe_timeout_s: float = _PROBE_TIMEOUT_S) -> None:
        super().__init__()
        self.version = vllm_version()
        self.source = f"vLLM {self.version or '(not installed)'} RMSNormGated.forward_cuda"
        if allow_torch_mismatch is None:
            allow_torch_mismatch = os.environ.get(ALLOW_TORCH_MISMATCH_ENV, "") == "1"
        self.allow_torch_mismatch = allow_torch_mismatch
        self.probe_timeout_s = probe_timeout_s
        self.probe_env: dict[str, str] | None = None  # extra environment for the probe child (tests)
        self.last_probe: dict[str, Any] | None = None  # what the child reported, for the record
        self._modules: dict[tuple, Any] = {}

    def _static_reason(self) -> str | None:
        """Reasons read off package metadata, without importing vllm."""
        if self.version is None:
            return f"vllm is not installed ({INSTALL_HINT})"
        if not self.allow_torch_mismatch:
            return torch_pin_reason(torch.__version__, torch_requirement(), self.version)
        return None

    def _probe(self, device: str) -> tuple[bool, str]:
        reason = self._static_reason()
        if reason:
            return False, reason
        self.last_probe = run_probe(device, timeout_s=self.probe_timeout_s, env=self.probe_env)
        reason = reason_from_probe(self.last_probe, self.version)
        return (False, reason) if reason else (True, "")

    def supports(self, opts: OpOptions) -> tuple[bool, str]:
        # vLLM 0.30.0 RMSNormGated takes group_size, norm_before_gate and activation in
        # {"swish", "silu", "sigmoid"} (layernorm_fwd_kernel's ACTIVATION branches): every
        # OpOptions value maps onto it; group_size must divide D, checked per call.
        return True, ""

    def _module(self, d: int, w: Tensor, opts: OpOptions) -> Any:
        key = (d, w.dtype, str(w.device), opts)
        mod = self._modules.get(key)
        if mod is None:
            from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
            from vllm.model_executor.layers.layernorm import RMSNormGated

            config = VllmConfig(device_config=DeviceConfig(device=w.device.type))
            with set_current_vllm_config(config):
                mod = RMSNormGated(
                    d,
                    eps=opts.eps,
                    group_size=opts.group_size,
                    norm_before_gate=opts.norm_before_gate,
                    device=w.device,
                    dtype=w.dtype,
                    activation=opts.activation,
                )
            self._modules[key] = mod
        return mod

    def _probed_name(self, device: torch.device) -> str:
        """The device name already probed that means this tensor's device ("cuda" for cuda:0), so a
        run that probed "cuda" does not pay a second ~25 s probe for tensors on "cuda:0"."""
        name = str(device)
        cache = self.__dict__.get("_available_cache", {})
        if name not in cache and device.type == "cuda" and device.index in (None, 0):
            for alias in ("cuda", "cuda:0"):
                if alias in cache:
                    return alias
        return name

    def forward(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        """vLLM's forward_cuda on our x, z and weight. Raises BackendUnavailable where it cannot run."""
        ok, why = self.available(self._probed_name(x.device))
        if not ok:
            raise BackendUnavailable(f"{self.key}: {why}")
        if x.dim() < 1 or w.dim() != 1 or w.shape[0] != x.shape[-1]:
            raise ValueError(f"w: expected shape [{x.shape[-1] if x.dim() else '?'}], got {tuple(w.shape)}")
        if z is not None and z.shape != x.shape:
            raise ValueError(f"z: expected the shape of x {tuple(x.shape)}, got {tuple(z.shape)}")
        opts.check_width(x.shape[-1])
        if x.numel() == 0:  # no rows: nothing to compute, vLLM is not called
            return torch.empty_like(x)
        mod = self._module(x.shape[-1], w, opts)
        mod.weight = torch.nn.Parameter(w.detach(), requires_grad=False)  # our bits, no copy
        with torch.no_grad():
            return mod.forward_cuda(x, z)

    def forward_backward(self, x: Tensor, z: Tensor | None, w: Tensor, dy: Tensor, opts: OpOptions) -> Grads:
        raise BackendUnavailable(
            f"{self.key}: no backward: vLLM's RMSNormGated.forward_cuda calls its Triton kernel directly, "
            "without an autograd.Function (vLLM is inference-only)"
        )


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--probe":
        print("usage: python -m rlnorm.kit.backends.vllm --probe DEVICE", file=sys.stderr)
        return 2
    result = probe(argv[1])
    sys.stdout.flush()
    print(_PROBE_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
