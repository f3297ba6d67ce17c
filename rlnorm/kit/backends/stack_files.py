"""The stacks' pinned files (vLLM 0.30.0 and 0.33.0, SGLang, Megatron-core, TorchTitan), run without importing them."""

from __future__ import annotations

import ast
import builtins
import dis
import hashlib
import importlib.util
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlnorm.kit.backends import Backend, BackendUnavailable, describe_error, dist_version
from rlnorm.options import OpOptions

WHL = Path(__file__).resolve().parents[3] / ".whl"
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Pin:
    """A stack at one version: what is read from its wheel, and which of its modules are stood in."""

    key: str  # names the archive and the variable RLNORM_<KEY>_SOURCES
    dist: str
    version: str
    files: tuple[str, ...]  # paths inside the wheel; the first names the package
    stood_in: Mapping[str, str] = field(default_factory=dict)  # module -> what stands in, for `source`
    empty: tuple[str, ...] = ()  # modules the files import but never read: an empty module stands in

    @property
    def package(self) -> str:
        return self.files[0].split("/", 1)[0]

    @property
    def archive(self) -> Path:
        return WHL / f"{self.key}-src.tar.gz"

    @property
    def env(self) -> str:
        return "RLNORM_" + "".join(c if c.isalnum() else "_" for c in self.key.upper()) + "_SOURCES"


_SGL = "sglang/kernels/ops/attention/fla/"
_MEG = "megatron/core/"
LAYERNORM = "vllm/model_executor/layers/layernorm.py"
BATCH_INVARIANT = "vllm/model_executor/determinism/batch_invariant.py"
# vLLM's layernorm_guard and the vLLM modules it imports, in import order
VLLM_GUARD = (
    "vllm/utils/math_utils.py",
    "vllm/model_executor/warmup/jit_warmup.py",
    "vllm/model_executor/warmup/jit_warmup_triton_helper.py",
    "vllm/third_party/flash_linear_attention/ops/utils.py",
    "vllm/third_party/flash_linear_attention/ops/layernorm_guard.py",
)
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
        Pin("torchtitan", "torchtitan", "0.3.0", ("torchtitan/models/qwen3_5/model.py",)),
        # the `vllm` rows' release (the one .ci/install-vllm.sh installs), and today's beside it
        Pin("vllm", "vllm", "0.30.0", (*VLLM_GUARD, LAYERNORM, BATCH_INVARIANT), _VLLM_STOOD_IN),
        Pin(
            "vllm-0.33.0",
            "vllm",
            "0.33.0",
            (*VLLM_GUARD, LAYERNORM, BATCH_INVARIANT),
            {**_VLLM_STOOD_IN, "vllm.envs": "an empty module (only the warm-up reads it)"},
            empty=("vllm.envs",),
        ),
    )
}


@dataclass(frozen=True)
class StackFiles:
    """Where a pin's files are: `root` holds the package folder; `origin` says where that came from."""

    pin: Pin
    root: Path
    origin: str

    def path(self, rel: str) -> Path:
        return self.root / rel


def installed(pin: Pin) -> Path | None:
    """The folder holding the installed package at the pinned version, found without importing it."""
    if dist_version(pin.dist) != pin.version:
        return None
    module = sys.modules.get(pin.package)
    spec = module.__spec__ if module is not None else importlib.util.find_spec(pin.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def unpack(archive: Path) -> Path:
    """An archive made by tools/stack_sources.py, unpacked once into the temp folder (named by its hash)."""
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    dest = Path(tempfile.gettempdir()) / f"rlnorm-src-{digest}"
    if dest.is_dir():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            # refused before extraction even where Python has no extraction filters
            outside = [m.name for m in tar.getmembers() if m.name.startswith("/") or ".." in Path(m.name).parts]
            if outside:
                raise ValueError(f"{archive}: members {outside} point outside the archive")
            tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        os.replace(tmp, dest)
    except OSError:
        if not dest.is_dir():  # another process unpacked the same archive first: use its copy
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone once moved into place
    return dest


def find(pin: Pin, given: str | Path | None = None) -> tuple[StackFiles | None, str]:
    """The pin's files, or None and where they were looked for: `given` (a folder or archive), $RLNORM_<KEY>_SOURCES,
    the installed package at the pinned version, then `.whl/<key>-src.tar.gz` (packed by `tools/stack_sources.py`)."""
    if given is None and os.environ.get(pin.env):
        given = os.environ[pin.env]
        named, origin = f"{pin.env}={given}", f"{given} ({pin.env})"
    else:
        named = origin = str(given)
    try:
        if given is not None:
            path = Path(given)
            if not path.exists():
                return None, f"{named} does not exist"
            return StackFiles(pin, unpack(path) if path.is_file() else path, origin), ""
        root = installed(pin)
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


def load(files: StackFiles, rels: tuple[str, ...] | list[str], stand_ins: Mapping[str, dict[str, Any]]) -> dict:
    """Execute the files `rels` (in import order) as the modules they are, beside a module per `stand_ins` name holding
    its attributes and an empty one per `pin.empty`: the modules by name, none left in sys.modules (restored after)."""
    missing = [rel for rel in rels if not files.path(rel).is_file()]
    if missing:
        raise FileNotFoundError(f"{files.pin.dist} files under {files.root} lack {missing}")
    package = files.pin.package
    ours: dict[str, types.ModuleType] = {}

    def install(name: str, module: types.ModuleType) -> None:
        ours[name] = sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent and parent not in ours:  # an empty package: nothing else of the stack loads from disk
            pkg = types.ModuleType(parent)
            pkg.__path__ = []
            install(parent, pkg)
        if parent:
            setattr(ours[parent], child, module)

    with _LOCK:
        saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == package}
        for k in saved:
            del sys.modules[k]
        try:
            for name, attrs in {**{name: {} for name in files.pin.empty}, **stand_ins}.items():
                install(name, types.ModuleType(name))
                ours[name].__dict__.update(attrs)
            for rel in rels:
                spec = importlib.util.spec_from_file_location(rel[:-3].replace("/", "."), files.path(rel))
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                install(spec.name, module)
                spec.loader.exec_module(module)
            return dict(ours)
        finally:
            for k in [k for k in sys.modules if k.split(".")[0] == package]:
                del sys.modules[k]
            sys.modules.update(saved)


def load_file(files: StackFiles, rel: str) -> types.ModuleType:
    """One self-contained file of the pin as a module under a private name that stays importable (torch.compile
    looks a traced function's module up in sys.modules)."""
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


def _global_reads(code: types.CodeType) -> set[str]:
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_reads(const)
    return names


def read_function(path: Path, qualname: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """`qualname` ("f" or "Class.method") executed from its own lines in `namespace` (file and line numbers kept:
    Triton's JIT reads the source), @staticmethod dropped; NameError names any global `namespace` lacks."""
    body: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body
    *outer, name = qualname.split(".")
    for cls in outer:
        found = [n for n in body if isinstance(n, ast.ClassDef) and n.name == cls]
        if not found:
            raise LookupError(f"no class {cls!r} at the top of the file")
        body = found[0].body
    defs = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not defs:
        raise LookupError(f"no function {qualname!r}")
    node = defs[-1]
    node.decorator_list = [d for d in node.decorator_list if not (outer and ast.unparse(d) == "staticmethod")]
    code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
    unknown = sorted(_global_reads(code) - set(namespace) - set(vars(builtins)))
    if unknown:
        raise NameError(f"{path.name}:{qualname} reads {unknown}, which the namespace given does not define")
    # its globals are a module of its own, importable by name, for torch.compile's guards
    tag = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:10]
    module_name = f"{__name__}.{path.stem}_{tag}"
    module = sys.modules.get(module_name) or types.ModuleType(module_name)
    module.__dict__.update(namespace, __file__=str(path), __builtins__=builtins)
    exec(code, module.__dict__)
    sys.modules[module_name] = module
    return module.__dict__[node.name]


def interp() -> str:
    """What a row's `source` adds where its Triton kernels run interpreted (no GPU)."""
    return "" if torch.cuda.is_available() else ", under the Triton interpreter"


class StackRow(Backend):
    """A row from a pinned stack's files (`files`: a folder or archive in their place), read once by `_load`."""

    pin: Pin
    what: str  # what runs, for `source`

    def __init__(self, files: str | Path | None = None) -> None:
        super().__init__()
        self.files, self._where = find(self.pin, files)

    @property
    def source(self) -> str:  # type: ignore[override]
        return self.describe(self.files.origin if self.files is not None else "files not found")

    def describe(self, where: str) -> str:
        stood = "; ".join(f"{k}: {v}" for k, v in self.pin.stood_in.items()) or "nothing"
        return f"{self.pin.dist} {self.pin.version} {self.what} ({where}; stood in: {stood})"

    def loaded(self) -> Any:
        if self.files is None:
            raise BackendUnavailable(f"{self.key}: {self._where}")
        return self._memo("loaded", self._load)

    def _import_reason(self) -> str | None:
        if self.files is None:
            return self._where
        try:
            self.loaded()
        except Exception as exc:
            pinned = f"{self.pin.dist} {self.pin.version}"
            return f"{pinned}'s files under {self.files.root} do not load: {describe_error(exc)}"
        return None


class ForwardOnlyRow(StackRow):
    """A row of a stack that samples, never trains: no backward, and its kernel never launched on no rows."""

    has_backward = False

    def forward(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        if x.dim() < 1 or w.dim() != 1 or w.shape[0] != x.shape[-1]:
            raise ValueError(f"w: expected shape [{x.shape[-1] if x.dim() else '?'}], got {tuple(w.shape)}")
        if z is not None and z.shape != x.shape:
            raise ValueError(f"z: expected the shape of x {tuple(x.shape)}, got {tuple(z.shape)}")
        opts.check_width(x.shape[-1])
        if x.numel() == 0:
            return torch.empty_like(x)
        return super().forward(x, z, w, opts)
