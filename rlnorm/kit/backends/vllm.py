"""The `vllm` backend: vLLM's `RMSNormGated.forward_cuda`, one Triton call, forward only (docs/vllm.md). vllm is
first imported in a CHILD process, so a failing or hanging import is reported with vLLM's own error and its
import-time patches of torch stay out of the kit's process.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlnorm.inputs import make_case
from rlnorm.kit.backends import BackendUnavailable, describe_error, device_reason, dist_version
from rlnorm.kit.backends import stack_files as sf
from rlnorm.kit.backends.pins import Setting, kernel_name, patched
from rlnorm.kit.process import run_child
from rlnorm.options import OpOptions

GUARD = sf.VLLM_GUARD[-1].removesuffix(".py").replace("/", ".")  # layernorm_guard's module name
_PROBE_MARK = "RLNORM_VLLM_PROBE "
_PROBE_TIMEOUT_S = 600.0  # importing vllm takes ~10-25 s on 2 cores; a hang must still end


def vllm_version() -> str | None:
    return None if (version := dist_version("vllm")) == "?" else version


def prepare_import(device: str) -> None:
    """Without a GPU, CUDA_VISIBLE_DEVICES="" before the first `import vllm`: vLLM then keeps Triton although no
    driver is active (triton_utils/importing.py)."""
    if "vllm" not in sys.modules and torch.device(device).type == "cpu" and not torch.cuda.is_available():
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def answer_compute_units() -> int | None:
    """Where vLLM's platform cannot count compute units (no GPU), answer as its CPU platform does; None where it can."""
    from vllm.platforms import current_platform

    try:
        current_platform.num_compute_units(0)
        return None
    except NotImplementedError:
        current_platform.num_compute_units = compute_units
        return compute_units()


def compute_units(device_id: int | None = None) -> int:
    """vLLM's num_compute_units: the GPU's SM count, or, with no GPU, torch's thread count (platforms/cpu.py)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device_id).multi_processor_count
    return torch.get_num_threads()


def load_layernorm_guard(files: sf.StackFiles) -> types.ModuleType:
    """vLLM's layernorm_guard module from `files`, with only the pin's `stood_in` standing in."""
    import triton
    import triton.language as tl

    platform = types.SimpleNamespace(  # the part of current_platform the files use
        device_type="cuda" if torch.cuda.is_available() else "cpu",
        is_cuda_alike=torch.cuda.is_available,
        num_compute_units=lambda device_id=0: compute_units(device_id),
    )
    stand_ins = {
        "vllm.triton_utils": {"HAS_TRITON": True, "triton": triton, "tl": tl},
        "vllm.platforms": {"current_platform": platform},
        "vllm.utils.platform_utils": {"num_compute_units": functools.cache(compute_units)},
    }
    return sf.load(files, sf.VLLM_GUARD, stand_ins)[GUARD]


def rmsnorm_call(rmsnorm_fn: Any, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
    """The call `RMSNormGated.forward_cuda(x, z)` makes, for a module with weight w built with opts (bias None)."""
    return rmsnorm_fn(x, w, None, z=z, **opts.as_dict())


def build_module(w: Tensor, opts: OpOptions) -> Any:
    """vLLM's RMSNormGated holding `w` itself, built under a vLLM config (its CustomOp.__init__ reads one)."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNormGated

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device=w.device.type))):
        mod = RMSNormGated(w.shape[0], **opts.as_dict(), device=w.device, dtype=w.dtype)
    mod.weight = torch.nn.Parameter(w.detach(), requires_grad=False)  # our bits, no copy
    return mod


def probe(device: str) -> dict[str, Any]:
    """In the child: import vllm as the backend does and call forward_cuda on a tiny input; the stage reached."""
    out: dict[str, Any] = {"device": device, "stage": "import", "error": None}
    try:
        prepare_import(device)
        out |= {k.lower(): os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET")}
        import vllm
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON

        out["vllm_version"] = getattr(vllm, "__version__", None)
        out["platform"] = type(current_platform).__name__
        out["has_triton"] = bool(HAS_TRITON)
        if torch.device(device).type == "cpu":
            out["compute_units_answered"] = answer_compute_units()
        out["stage"] = "construct"
        case = make_case(3, 128, seed=0, device=device)
        mod = build_module(case.w, OpOptions())
        out["module"] = f"{type(mod).__module__}.{type(mod).__qualname__}"
        out["stage"] = "forward_cuda"
        with torch.no_grad():
            y = mod.forward_cuda(case.x, case.z)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        out["output_shape"] = list(y.shape)
        out["stage"] = "ok"
    except BaseException as exc:
        out["error"] = describe_error(exc)
    return out


def run_probe(device: str, timeout_s: float = _PROBE_TIMEOUT_S, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`probe(device)` in a child process (`env` laid over its environment); a crash or hang is described."""
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
    """Why vLLM's forward_cuda cannot run on p["device"], quoting vLLM's error; None if it ran."""
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


class VllmBackend(sf.ForwardOnlyRow):  # forward_cuda calls its Triton kernel without an autograd.Function
    """vLLM's `RMSNormGated.forward_cuda`, or its `rmsnorm_fn` from vLLM's files (`files`, or where vllm cannot
    import): a pinned stack's row whose files are the fallback, decided once (`plan`)."""

    key = "vllm"
    pin = sf.PINS["vllm"]
    imports = True  # False: the pin's files only, never the installed vllm (another release)
    what = "layernorm_guard.rmsnorm_fn as RMSNormGated.forward_cuda calls it"

    def __init__(self, files: str | Path | None = None) -> None:
        super().__init__(files)
        self.version = vllm_version() if self.imports else self.pin.version
        self.given = files is not None
        self.probe_env: dict[str, str] | None = None  # extra environment for the probe child (tests)
        self.last_probe: dict[str, Any] | None = None

    @property
    def source(self) -> str:  # type: ignore[override]
        if self.plan == "imported":
            interp = "" if torch.cuda.is_available() else ", under the Triton interpreter (CUDA_VISIBLE_DEVICES='')"
            text = f"vLLM {self.version} RMSNormGated.forward_cuda -> layernorm_guard.rmsnorm_fn, vllm imported"
            return text + interp + _PATH_NOTE
        if self.plan == "none":
            return f"vLLM {self.version or '(not installed)'} RMSNormGated.forward_cuda"
        where = f"{self.files.origin}; {self._why}"  # type: ignore[union-attr]
        text = f"vLLM {self.pin.version} {self.what}, from vLLM's own files{sf.interp()} ({where})" + _PATH_NOTE
        return text + "".join(f"; {name} stood in by {self.pin.stood_in[name]}" for name in self.pin.empty)

    @functools.cached_property
    def plan(self) -> str:  # "imported", "files" or "none" (StackRow's reasons say why); may start the probe child
        if self.given:
            self._why = "the files were given"
        elif not self.imports:
            self._why = "through torch.ops.vllm.fla_rms_norm_gated, vllm not imported"
        elif self.version is None:
            self._why = "vllm is not installed here"
        else:
            p = self._probe_child("cuda" if torch.cuda.is_available() else "cpu")  # what `device: auto` picks
            if p.get("stage") not in ("import", "child"):
                return "imported"
            self._why = f"vllm {self.version} is installed but `import vllm` fails here: {p.get('error')}"
        if self.files is None:
            if self.imports:  # StackRow's reason, after why the installed vllm cannot run
                self._where = f"{self._why}, and {self._where}"
            return "none"
        return "files"

    def _probe_child(self, device: str) -> dict[str, Any]:
        self.last_probe = self._memo(("probe", device), lambda: run_probe(device, env=self.probe_env))  # for the record
        return self.last_probe

    def _probe(self, device: str) -> tuple[bool, str]:
        if self.plan != "imported":  # the files, or nothing: nothing is imported, so the tiny run happens here
            return super()._probe(device)
        # a bad device is the caller's error, not vLLM's: say so before a child blames the import
        reason = device_reason(device) or reason_from_probe(self._probe_child(device), self.version)
        return (False, reason) if reason else (True, "")

    def _load(self) -> Any:
        return load_layernorm_guard(self.files)  # type: ignore[arg-type]

    def forward(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        if self.plan == "imported":  # "cuda" and "cuda:0" are one device: one probe child, not two
            ok, why = self.available(
                "cuda" if x.device.type == "cuda" and x.device.index in (None, 0) else str(x.device)
            )
            if not ok:
                raise BackendUnavailable(f"{self.key}: {why}")
        return super().forward(x, z, w, opts)

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        if self.plan != "imported":  # the files (none found: `loaded` says why)
            return rmsnorm_call(self.loaded().rmsnorm_fn, x, z, w.detach(), opts)
        return self._module(x, w, opts).forward_cuda(x, z)

    def _module(self, x: Tensor, w: Tensor, opts: OpOptions) -> Any:
        def build() -> Any:
            prepare_import(str(x.device))
            if x.device.type == "cpu":
                answer_compute_units()
            return build_module(w, opts)

        mod = self._memo((x.shape[-1], w.dtype, str(w.device), opts), build)
        mod.weight = torch.nn.Parameter(w.detach(), requires_grad=False)  # our bits, no copy
        return mod

    def configurations(self, opts: OpOptions, device: str, d: int) -> list[Setting]:
        """ROWS_PER_BLOCK, which `calc_rows_per_block` picks from the row count and the compute units: 1, 2, 4."""
        if self.plan == "none":
            return []
        if self.plan == "imported":
            prepare_import(device)
        guard = importlib.import_module(GUARD) if self.plan == "imported" else self.loaded()
        kernel = kernel_name(guard.layer_norm_fwd_kernel)

        def pin(n: int) -> Any:
            return patched(guard, "calc_rows_per_block", lambda rows, device, n=n: n)

        return [Setting(kernel, "ROWS_PER_BLOCK", str(n), lambda n=n: pin(n)) for n in (1, 2, 4)]

    def __repr__(self) -> str:  # never decides: reading `source` may start the probe child
        decided = self.source if "plan" in vars(self) else "(not decided yet)"
        return f"<{type(self).__name__} key={self.key!r} source={decided!r}>"


# what a deployment runs, and what VLLM_BATCH_INVARIANT does to it (docs/vllm.md)
_PATH_NOTE = (
    "; what enforce_eager=True runs; unchanged by VLLM_BATCH_INVARIANT=1, which vLLM refuses for Qwen3-Next "
    "(GDN_ATTN: v1/attention/selector.py)"
)


if __name__ == "__main__":  # the probe child: `--probe DEVICE`
    print(_PROBE_MARK + json.dumps(probe(sys.argv[2])), flush=True)
