"""The `vllm` backend: vLLM's `RMSNormGated.forward_cuda`, forward only (docs/spec.md §6, docs/vllm.md).

forward_cuda is one call, `layernorm_guard.rmsnorm_fn(x, weight, None, z=z, **options)`, a Triton kernel (no
autograd), what `enforce_eager=True` runs. What runs is decided once (`plan`) and said in `source`: where vllm
imports, the real module under a vLLM config with our weight (without a GPU: CUDA_VISIBLE_DEVICES="" so vLLM keeps
Triton, and the interpreter); where it cannot import, `rmsnorm_fn` from vLLM's own files (`vllm_files`); else
nothing, with the reason. The first import happens in a CHILD process (`--probe DEVICE`) that also runs
forward_cuda on a tiny input, so a failing, crashing or hanging import is reported with vLLM's own error and
vLLM's import-time patches of torch stay out of the kit's process.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlnorm.inputs import make_case
from rlnorm.kit.backends import Backend, BackendUnavailable, Grads, check_inputs, describe_error, dist_version
from rlnorm.kit.backends import vllm_files as vf
from rlnorm.kit.backends.pins import Setting, kernel_name, patched
from rlnorm.kit.process import run_child
from rlnorm.options import OpOptions

__all__ = ["INSTALL_HINT", "VllmBackend", "answer_compute_units", "prepare_import", "probe", "reason_from_probe"]
__all__ += ["rmsnorm_call", "run_probe", "vllm_version"]

DIST = "vllm"
INSTALL_HINT = (
    "`bash .ci/install-vllm.sh` installs vllm==0.30.0 beside the installed torch where a package index is reachable; "
    "`python tools/vllm_sources.py` packs an installed vLLM's Python files into .whl/vllm-src.tar.gz for a machine "
    "without one"
)
_PROBE_MARK = "RLNORM_VLLM_PROBE "
_PROBE_TIMEOUT_S = 600.0  # importing vllm takes ~10-25 s on 2 cores; a hang must still end


def vllm_version() -> str | None:
    """The installed vllm distribution's version, or None when it is not installed."""
    version = dist_version(DIST)
    return None if version == "?" else version


def _device_type(device: str) -> str:
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError):
        return str(device)


# -- getting vLLM's own forward_cuda to run ---------------------------------------------------------------------
def prepare_import(device: str) -> None:
    """Before the first `import vllm`, with no GPU and a CPU device: CUDA_VISIBLE_DEVICES="" (vLLM then keeps
    Triton although no driver is active, triton_utils/importing.py); there is no GPU for it to hide."""
    if "vllm" not in sys.modules and _device_type(device) == "cpu" and not torch.cuda.is_available():
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def answer_compute_units() -> int | None:
    """Where vLLM's platform cannot count the device's compute units (NotImplementedError without a GPU), answer as
    its CPU platform does (torch's thread count). Returns the answer given, or None where vLLM answers itself."""
    from vllm.platforms import current_platform

    try:
        current_platform.num_compute_units(0)
        return None
    except NotImplementedError:
        current_platform.num_compute_units = vf.compute_units
        return vf.compute_units()


def rmsnorm_call(rmsnorm_fn: Any, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
    """The call `RMSNormGated.forward_cuda(x, z)` makes, for a module with weight w built with opts (bias None)."""
    return rmsnorm_fn(x, w, None, z=z, **opts.as_dict())


def build_module(d: int, w: Tensor, opts: OpOptions) -> Any:
    """vLLM's RMSNormGated for width d and these options, under a vLLM config (its CustomOp.__init__ reads one)."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNormGated

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device=w.device.type))):
        return RMSNormGated(d, **opts.as_dict(), device=w.device, dtype=w.dtype)


def probe(device: str) -> dict[str, Any]:
    """In the child: import vllm as the backend does, build RMSNormGated, call forward_cuda on a tiny input.
    Returns the stage reached, vLLM's Triton decision and the error's last line, for `reason_from_probe`."""
    prepare_import(device)
    out: dict[str, Any] = {"device": device, "stage": "import", "error": None}
    out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    out["triton_interpret"] = os.environ.get("TRITON_INTERPRET")
    try:
        import vllm
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON

        out["vllm_version"] = getattr(vllm, "__version__", None)
        out["platform"] = type(current_platform).__name__
        out["has_triton"] = bool(HAS_TRITON)
        if _device_type(device) == "cpu":
            out["compute_units_answered"] = answer_compute_units()
        out["stage"] = "construct"
        case = make_case(3, 128, seed=0, device=device)
        mod = build_module(128, case.w, OpOptions())
        out["module"] = f"{type(mod).__module__}.{type(mod).__qualname__}"
        out["stage"] = "forward_cuda"
        mod.weight = torch.nn.Parameter(case.w, requires_grad=False)
        with torch.no_grad():
            y = mod.forward_cuda(case.x, case.z)
        if _device_type(device) == "cuda":
            torch.cuda.synchronize()
        out["output_shape"] = list(y.shape)
        out["stage"] = "ok"
    except BaseException as exc:
        out["error"] = describe_error(exc)
    return out


def run_probe(device: str, timeout_s: float = _PROBE_TIMEOUT_S, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`probe(device)` in a child process; a crash, hang or unreadable answer is described, never raised.
    `env` is laid over the child's environment (tests plant a vllm on its PYTHONPATH)."""
    ended = run_child(
        [sys.executable, "-m", "rlnorm.kit.backends.vllm", "--probe", device], timeout_s, env=env, stdout=True
    )
    if ended.timed_out:
        return {"device": device, "stage": "child", "error": f"the probe child did not finish in {timeout_s:.0f} s"}
    for line in reversed(ended.stdout.splitlines()):
        if line.startswith(_PROBE_MARK):
            return json.loads(line[len(_PROBE_MARK) :])
    last = ([ln for ln in ended.stderr_tail.splitlines() if ln.strip()] or ["(no stderr)"])[-1][:500]
    error = f"the probe child {ended.cause} before answering; last line: {last}"
    return {"device": device, "stage": "child", "error": error}


def reason_from_probe(p: dict[str, Any], vllm_ver: str | None) -> str | None:
    """Why the probe shows vLLM's forward_cuda cannot run on p["device"], quoting vLLM's error; None if it ran."""
    stage, err, device = p.get("stage"), p.get("error"), p.get("device")
    if stage == "ok":
        return None
    what = {
        "child": "probing vllm in a child process failed",
        "import": f"vllm {vllm_ver} is installed but importing its RMSNormGated fails",
        "construct": f"vLLM's RMSNormGated(128, ...) under VllmConfig(device_config=DeviceConfig({device!r})) fails",
    }.get(str(stage))
    if what:
        return f"{what}: {err}"
    # vLLM keeps Triton only where it counts exactly one active GPU driver (vllm/triton_utils/importing.py)
    off = "" if p.get("has_triton", True) else "vLLM disabled Triton (its TritonPlaceholder stands in); "
    return f"{off}RMSNormGated.forward_cuda(x, z) on {device} raises {err}"


@dataclass
class Plan:
    """What the backend runs on this machine: `mode` "imported", "files" or "none", and what its source says."""

    mode: str
    source: str
    reason: str = ""  # mode "none": why nothing can run
    files: vf.VllmFiles | None = None


class VllmBackend(Backend):
    """vLLM's `RMSNormGated.forward_cuda`, or its `rmsnorm_fn` from vLLM's files where vllm cannot import."""

    key = "vllm"
    has_backward = False

    def __init__(self, files: str | Path | None = None, probe_timeout_s: float = _PROBE_TIMEOUT_S) -> None:
        """files: run `rmsnorm_fn` from these vLLM files (a folder or archive) even where vllm imports."""
        super().__init__()
        self.version = vllm_version()
        self.files_given = files
        self.probe_timeout_s = probe_timeout_s
        self.probe_env: dict[str, str] | None = None  # extra environment for the probe child (tests)
        self.last_probe: dict[str, Any] | None = None  # what the child reported, for the record
        self._probes: dict[str, dict[str, Any]] = {}
        self._plan: Plan | None = None
        self._modules: dict[tuple, Any] = {}
        self._guard: Any = None

    # -- what runs here ---------------------------------------------------------------------------------------------
    @property
    def source(self) -> str:  # type: ignore[override]
        """Exactly what runs: decided on first read (it needs to know whether vllm imports here)."""
        return self.plan().source

    def plan(self) -> Plan:
        if self._plan is None:
            self._plan = self._decide()
        return self._plan

    def _decide(self) -> Plan:
        if self.files_given is not None:
            return self._files_plan(*vf.find_files(self.files_given), why="the files were given")
        if self.version is None:
            return self._files_plan(*vf.find_files(None), why="vllm is not installed here")
        device = "cuda" if torch.cuda.is_available() else "cpu"  # what `device: auto` picks
        p = self._probe_child(device)
        if p.get("stage") in ("import", "child"):
            why = f"vllm {self.version} is installed but `import vllm` fails here: {p.get('error')}"
            return self._files_plan(*vf.find_files(None), why=why)
        return Plan("imported", self._imported_source(p))

    def _imported_source(self, p: dict[str, Any]) -> str:
        text = f"vLLM {self.version} RMSNormGated.forward_cuda -> layernorm_guard.rmsnorm_fn, vllm imported"
        if _device_type(p["device"]) == "cpu":
            text += ", under the Triton interpreter (CUDA_VISIBLE_DEVICES='')"
        return text + _PATH_NOTE

    def _files_plan(self, files: vf.VllmFiles | None, where: str, why: str) -> Plan:
        if files is None:
            reason = f"{why}, and vLLM's Python files were not found ({where}): {INSTALL_HINT}"
            return Plan("none", f"vLLM {self.version or '(not installed)'} RMSNormGated.forward_cuda", reason=reason)
        interp = ", under the Triton interpreter" if not torch.cuda.is_available() else ""
        source = (
            f"vLLM {files.version or '?'} layernorm_guard.rmsnorm_fn as RMSNormGated.forward_cuda calls it, "
            f"from vLLM's own files{interp} ({files.origin}; {why})"
        )
        return Plan("files", source + _PATH_NOTE, files=files)

    def _probe_child(self, device: str) -> dict[str, Any]:
        if device not in self._probes:
            self._probes[device] = run_probe(device, timeout_s=self.probe_timeout_s, env=self.probe_env)
        self.last_probe = self._probes[device]
        return self.last_probe

    # -- Backend ----------------------------------------------------------------------------------------------------
    def _probe(self, device: str) -> tuple[bool, str]:
        plan = self.plan()
        if plan.mode == "none":
            return False, plan.reason
        if plan.mode == "imported":
            reason = reason_from_probe(self._probe_child(device), self.version)
            return (False, reason) if reason else (True, "")
        # files: nothing is imported, so the tiny run happens here
        origin = plan.files.origin if plan.files is not None else "?"
        what = f"vLLM's rmsnorm_fn from its files ({origin})"
        return self._tiny_run(device, lambda x, z, w, dy: self._run_files(x, z, w, OpOptions()), what)

    def forward(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        """vLLM's forward_cuda on our x, z and weight. Raises BackendUnavailable where it cannot run."""
        # "cuda" and "cuda:0" are one device: one probe child, not two
        ok, why = self.available("cuda" if x.device.type == "cuda" and x.device.index in (None, 0) else str(x.device))
        if not ok:
            raise BackendUnavailable(f"{self.key}: {why}")
        if not check_inputs(x, z, w, opts):  # no rows: vLLM is not called
            return torch.empty_like(x)
        if self.plan().mode == "files":
            return self._run_files(x, z, w, opts)
        return self._run_imported(x, z, w, opts)

    def _run_imported(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        key = (x.shape[-1], w.dtype, str(w.device), opts)
        mod = self._modules.get(key)
        if mod is None:
            prepare_import(str(x.device))
            if x.device.type == "cpu":
                answer_compute_units()
            mod = build_module(x.shape[-1], w, opts)
            self._modules[key] = mod
        mod.weight = torch.nn.Parameter(w.detach(), requires_grad=False)  # our bits, no copy
        with torch.no_grad():
            return mod.forward_cuda(x, z)

    def _run_files(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        if self._guard is None:
            files = self.plan().files
            assert files is not None
            self._guard = vf.load_layernorm_guard(files)
        with torch.no_grad():
            return rmsnorm_call(self._guard.rmsnorm_fn, x, z, w.detach(), opts)

    def _layernorm_guard(self, device: str) -> Any:
        """The layernorm_guard module the calls run: vLLM's own, or the one loaded from its files."""
        if self.plan().mode == "files":
            if self._guard is None:
                files = self.plan().files
                assert files is not None
                self._guard = vf.load_layernorm_guard(files)
            return self._guard
        prepare_import(device)
        return importlib.import_module(vf.LAYERNORM_GUARD.removesuffix(".py").replace("/", "."))

    def configurations(self, opts: OpOptions, device: str, d: int) -> list[Setting]:
        """ROWS_PER_BLOCK, which `calc_rows_per_block` picks from the row count and the compute units
        (min(next_power_of_2(cdiv(rows, 2 * units)), 4)): each of 1, 2, 4, forced through that function."""
        if self.plan().mode == "none":
            return []
        guard = self._layernorm_guard(device)
        kernel = kernel_name(guard.layer_norm_fwd_kernel)

        def pin(n: int) -> Any:
            return patched(guard, "calc_rows_per_block", lambda rows, device, n=n: n)

        return [Setting(kernel, "ROWS_PER_BLOCK", str(n), lambda n=n: pin(n)) for n in (1, 2, 4)]

    def forward_backward(self, x: Tensor, z: Tensor | None, w: Tensor, dy: Tensor, opts: OpOptions) -> Grads:
        raise BackendUnavailable(
            f"{self.key}: no backward: vLLM's RMSNormGated.forward_cuda calls its Triton kernel directly, "
            "without an autograd.Function (vLLM is inference-only)"
        )

    def __repr__(self) -> str:  # never decides: reading `source` may start the probe child
        decided = self._plan.source if self._plan is not None else "(not decided yet)"
        return f"<VllmBackend key={self.key!r} source={decided!r}>"


# what a deployment runs, and what VLLM_BATCH_INVARIANT does to it (docs/vllm.md)
_PATH_NOTE = (
    "; what enforce_eager=True runs; unchanged by VLLM_BATCH_INVARIANT=1, which vLLM refuses for Qwen3-Next "
    "(GDN_ATTN: v1/attention/selector.py)"
)


if __name__ == "__main__":  # the probe child: `--probe DEVICE`
    print(_PROBE_MARK + json.dumps(probe(sys.argv[2])), flush=True)
