"""Pinned files of the RL stacks (SGLang, Megatron-core, TorchTitan, vLLM), run where the package cannot install.

One registry (`PINS`): for each stack the distribution and version pinned, the files taken from its wheel and the
modules stood in. Where the files are: $RLNORM_<KEY>_SOURCES (a folder or an archive), else the installed package
when its version is the pinned one (found without importing it), else `.whl/<key>-src.tar.gz`, which
`tools/stack_sources.py` packs from the installed package or the downloaded wheel. `load` executes files as modules
under the stack's own names, which exist only while they execute: nothing is left in sys.modules.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlnorm.kit.backends.vllm_files import LAYERNORM, NEEDED, private_names, read_function, unpack
from rlnorm.timing import describe_error

__all__ = ["PINS", "WHL", "Pin", "StackFiles", "find", "load", "load_file", "read_function"]

WHL = Path(__file__).resolve().parents[3] / ".whl"


@dataclass(frozen=True)
class Pin:
    """A stack at one version: what is read from its wheel, and which of its modules are stood in."""

    key: str  # names the archive (.whl/<key>-src.tar.gz) and the variable RLNORM_<KEY>_SOURCES
    dist: str  # the distribution on the package index
    version: str
    package: str  # the top-level import name
    files: tuple[str, ...]  # paths inside the wheel, relative to its root
    stood_in: Mapping[str, str] = field(default_factory=dict)  # module -> what stands in, for `source`
    archive_name: str = ""

    @property
    def archive(self) -> Path:
        return WHL / (self.archive_name or f"{self.key}-src.tar.gz")

    @property
    def env(self) -> str:
        return "RLNORM_" + "".join(c if c.isalnum() else "_" for c in self.key.upper()) + "_SOURCES"


_SGL = "sglang/kernels/ops/attention/fla/"
_MEG = "megatron/core/"
_VLLM_033_EXTRA = {"vllm.envs": "empty (only the warm-up reads it)"}
_VLLM_STOOD_IN = {
    "vllm.triton_utils": "triton",
    "vllm.platforms, vllm.utils.platform_utils": "num_compute_units: SMs, or torch's threads on a CPU",
}
PINS: dict[str, Pin] = {
    p.key: p
    for p in (
        Pin(
            "sglang",
            "sglang",
            "0.5.23",
            "sglang",
            (
                _SGL + "fused_norm_gate.py",
                _SGL + "layernorm_gated.py",
                "sglang/srt/utils/common.py",
                "sglang/srt/model_executor/cuda_graph_config.py",
                "sglang/srt/models/qwen3_next.py",
                "sglang/srt/models/qwen3_5.py",
            ),
            {
                "sglang.srt.utils": "cdiv, next_power_of_2, device_context from common.py; is_cpu/npu False",
                "sglang.kernels.jit.utils": "is_arch_support_pdl, get_jit_cuda_arch from the GPU's capability",
                "sglang.srt.batch_invariant_ops": "is_batch_invariant_mode_enabled: the row's mode",
                "sglang.srt.runtime_context": "get_exec: no config, so no tc_piecewise (0.5.23 rejects it)",
            },
        ),
        Pin(
            "megatron-core",
            "megatron-core",
            "0.19.2",
            "megatron",
            (
                _MEG + "ssm/gated_delta_net/common.py",
                _MEG + "transformer/custom_layers/batch_invariant_kernels.py",
                _MEG + "jit.py",
            ),
            {
                "megatron.core.jit": "jit_fuser = torch.compile, as jit.py sets it",
                "the GDN layer": "out_norm and act_fn = F.silu",
            },
        ),
        Pin("torchtitan", "torchtitan", "0.3.0", "torchtitan", ("torchtitan/models/qwen3_5/model.py",)),
        Pin(
            "vllm-0.33.0",
            "vllm",
            "0.33.0",
            "vllm",
            NEEDED,
            {**_VLLM_STOOD_IN, **_VLLM_033_EXTRA},
        ),
        Pin("vllm-0.30.0", "vllm", "0.30.0", "vllm", NEEDED, _VLLM_STOOD_IN, archive_name="vllm-src.tar.gz"),
    )
}
assert LAYERNORM in NEEDED


@dataclass(frozen=True)
class StackFiles:
    """Where a pin's files are: `root` holds the package folder."""

    pin: Pin
    root: Path
    origin: str

    def path(self, rel: str) -> Path:
        return self.root / rel

    def missing(self) -> list[str]:
        return [rel for rel in self.pin.files if not self.path(rel).is_file()]

    def line(self, rel: str, text: str) -> int:
        """The first line of file `rel` holding `text`, for a source string (0 if none)."""
        for i, ln in enumerate(self.path(rel).read_text(encoding="utf-8").splitlines(), 1):
            if text in ln:
                return i
        return 0


def _installed(pin: Pin) -> Path | None:
    """The folder holding the installed package when it is the pinned version, found without importing it."""
    try:
        if importlib.metadata.version(pin.dist) != pin.version:
            return None
    except importlib.metadata.PackageNotFoundError:
        return None
    module = sys.modules.get(pin.package)
    spec = module.__spec__ if module is not None else importlib.util.find_spec(pin.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def find(pin: Pin) -> tuple[StackFiles | None, str]:
    """The pin's files and where they came from, or None and where they were looked for."""
    given = os.environ.get(pin.env) or None
    try:
        if given is not None:
            path = Path(given)
            if not path.exists():
                return None, f"{pin.env}={given} does not exist"
            return StackFiles(pin, unpack(path) if path.is_file() else path, f"{path} ({pin.env})"), ""
        root = _installed(pin)
        if root is not None:
            return StackFiles(pin, root, f"the installed package ({root / pin.package})"), ""
        if pin.archive.is_file():
            return StackFiles(pin, unpack(pin.archive), f".whl/{pin.archive.name}"), ""
    except Exception as exc:  # an archive that does not unpack: a reason, never a failed load
        return None, f"{pin.dist} {pin.version}'s files do not load: {describe_error(exc)}"
    return None, (
        f"{pin.dist} {pin.version}'s files were not found ({pin.env} unset, {pin.dist}=={pin.version} not installed, "
        f"no .whl/{pin.archive.name}): `python tools/stack_sources.py` fetches them"
    )


def _install(name: str, module: types.ModuleType, ours: dict[str, types.ModuleType]) -> None:
    ours[name] = sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if not parent:
        return
    if parent not in ours:  # an empty package: nothing else of the stack loads from disk
        pkg = types.ModuleType(parent)
        pkg.__path__ = []
        _install(parent, pkg, ours)
    setattr(ours[parent], child, module)


def load(
    files: StackFiles, modules: list[tuple[str, str]], stand_ins: Mapping[str, types.ModuleType]
) -> dict[str, types.ModuleType]:
    """Execute `modules` ((name, file) in import order) from the pin's files, with `stand_ins` under their names.
    Returns the modules by name; none of them stays in sys.modules."""
    missing = [rel for _, rel in modules if not files.path(rel).is_file()]
    if missing:
        raise FileNotFoundError(f"{files.pin.dist} files under {files.root} lack {missing}")
    with private_names(files.pin.package) as ours:
        for name, module in stand_ins.items():
            _install(name, module, ours)
        for name, rel in modules:
            spec = importlib.util.spec_from_file_location(name, files.path(rel))
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            _install(name, module, ours)
            spec.loader.exec_module(module)
        return dict(ours)


def load_file(files: StackFiles, rel: str) -> types.ModuleType:
    """One whole file of the pin, needing nothing of its package, executed as a module under a private name that
    stays importable (torch.compile looks a traced function's module up in sys.modules)."""
    name = f"{__name__}.{files.pin.key.replace('-', '_').replace('.', '_')}.{Path(rel).stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, files.path(rel))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
