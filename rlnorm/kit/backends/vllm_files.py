"""vLLM's own Python files, run where `import vllm` cannot (docs/vllm.md, "Where vLLM cannot import").

vLLM's extensions are built against one torch, but the ops checked here are Python and Triton: they run from vLLM's
files (installed, or packed by `tools/vllm_sources.py`) with only the helpers in `STOOD_IN` stood in, under `vllm.*`
names that exist only while the files execute, so a real `import vllm` later is unaffected.
"""

from __future__ import annotations

import ast
import builtins
import dis
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlnorm.timing import describe_error

__all__ = ["DEFAULT_ARCHIVE", "NEEDED", "SOURCES_ENV", "STOOD_IN", "VllmFiles", "compute_units", "find_files"]
__all__ += ["installed_root", "load_layernorm_guard", "read_function", "unpack"]

SOURCES_ENV = "RLNORM_VLLM_SOURCES"
# where tools/vllm_sources.py writes the archive (git-ignored)
DEFAULT_ARCHIVE = Path(__file__).resolve().parents[3] / ".whl" / "vllm-src.tar.gz"

LAYERNORM_GUARD = "vllm/third_party/flash_linear_attention/ops/layernorm_guard.py"
LAYERNORM = "vllm/model_executor/layers/layernorm.py"
BATCH_INVARIANT = "vllm/model_executor/determinism/batch_invariant.py"
# layernorm_guard and the vLLM modules it imports, in import order (module name, file)
_FROM_FILES = (
    ("vllm.utils.math_utils", "vllm/utils/math_utils.py"),
    ("vllm.model_executor.warmup.jit_warmup", "vllm/model_executor/warmup/jit_warmup.py"),
    ("vllm.model_executor.warmup.jit_warmup_triton_helper", "vllm/model_executor/warmup/jit_warmup_triton_helper.py"),
    ("vllm.third_party.flash_linear_attention.ops.utils", "vllm/third_party/flash_linear_attention/ops/utils.py"),
    ("vllm.third_party.flash_linear_attention.ops.layernorm_guard", LAYERNORM_GUARD),
)
# every file the vLLM backends read: what tools/vllm_sources.py packs by default
NEEDED = (*(f for _, f in _FROM_FILES), LAYERNORM, BATCH_INVARIANT)
# the vLLM modules that are NOT read from vLLM's files, and what stands in for each
STOOD_IN = {
    "vllm.triton_utils": "triton and triton.language themselves (HAS_TRITON = True)",
    "vllm.platforms": "current_platform: is_cuda_alike(), device_type, num_compute_units()",
    "vllm.utils.platform_utils": "num_compute_units(device_id), cached",
}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class VllmFiles:
    """Where vLLM's Python files are: `root` holds the `vllm/` package folder."""

    root: Path
    origin: str  # what a source string says about where they came from
    version: str | None

    def path(self, rel: str) -> Path:
        return self.root / rel

    def missing(self) -> list[str]:
        """The files the backends read that are not here."""
        return [rel for rel in NEEDED if not self.path(rel).is_file()]


def _metadata_version(root: Path) -> str | None:
    """The `Version:` of a vllm-*.dist-info/METADATA beside the package, if any."""
    for meta in sorted(root.glob("vllm-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def unpack(archive: Path) -> Path:
    """An archive made by tools/vllm_sources.py, unpacked once into the temp folder (named by its hash)."""
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    dest = Path(tempfile.gettempdir()) / f"rlnorm-vllm-src-{digest}"
    if dest.is_dir():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # Python without extraction filters: refuse members that would land outside tmp
                for member in tar.getmembers():
                    if member.name.startswith("/") or ".." in Path(member.name).parts:
                        raise ValueError(f"{archive}: member {member.name!r} points outside the archive")
                tar.extractall(tmp)
        os.replace(tmp, dest)
    except OSError:
        if not dest.is_dir():  # another process unpacked the same archive first: use its copy
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _from_path(path: Path, origin: str) -> VllmFiles:
    root = unpack(path) if path.is_file() else path
    return VllmFiles(root=root, origin=origin, version=_metadata_version(root))


def installed_root() -> Path | None:
    """The folder holding the installed `vllm/` package, found without importing it; None if there is none."""
    module = sys.modules.get("vllm")
    spec = module.__spec__ if module is not None else importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def find_files(explicit: str | Path | None = None) -> tuple[VllmFiles | None, str]:
    """vLLM's files, and where they were looked for (the reason when none are found), in this order:

    1. `explicit`, else $RLNORM_VLLM_SOURCES: a folder holding `vllm/`, or an archive from tools/vllm_sources.py;
    2. the installed vllm package (found without importing it);
    3. the archive at `.whl/vllm-src.tar.gz` in this checkout.
    """
    given = explicit if explicit is not None else os.environ.get(SOURCES_ENV) or None
    try:
        if given is not None:
            path = Path(given)
            if not path.exists():
                return None, f"{SOURCES_ENV}={given} does not exist"
            return _from_path(path, f"{path} ({SOURCES_ENV})" if explicit is None else str(path)), ""
        root = installed_root()
        if root is not None:
            try:
                version: str | None = importlib.metadata.version("vllm")
            except importlib.metadata.PackageNotFoundError:
                version = _metadata_version(root)
            return VllmFiles(root=root, origin=f"the installed package ({root / 'vllm'})", version=version), ""
        if DEFAULT_ARCHIVE.is_file():
            return _from_path(DEFAULT_ARCHIVE, ".whl/vllm-src.tar.gz"), ""
    except Exception as exc:  # an archive that does not unpack: a reason, never a failed load
        return None, f"vLLM's files do not load: {describe_error(exc)}"
    return None, f"{SOURCES_ENV} is unset, vllm is not installed, and .whl/vllm-src.tar.gz does not exist"


# -- the stood-in runtime helpers --------------------------------------------------------------------------------
def compute_units(device_id: int | None = None) -> int:
    """What vLLM's platform answers for num_compute_units: the GPU's SM count (platforms/cuda.py), or, with no GPU,
    torch's thread count (platforms/cpu.py)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device_id).multi_processor_count
    return torch.get_num_threads()


def _stand_ins() -> dict[str, types.ModuleType]:
    import triton
    import triton.language as tl

    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.__dict__.update(HAS_TRITON=True, triton=triton, tl=tl)
    platforms = types.ModuleType("vllm.platforms")
    platform = types.SimpleNamespace(  # the part of vLLM's current_platform that layernorm_guard's imports use
        device_type="cuda" if torch.cuda.is_available() else "cpu",
        is_cuda_alike=torch.cuda.is_available,
        num_compute_units=lambda device_id=0: compute_units(device_id),
    )
    platforms.__dict__.update(current_platform=platform)
    platform_utils = types.ModuleType("vllm.utils.platform_utils")
    platform_utils.__dict__.update(num_compute_units=functools.cache(compute_units))
    return {"vllm.triton_utils": triton_utils, "vllm.platforms": platforms, "vllm.utils.platform_utils": platform_utils}


@contextmanager
def private_names(package: str) -> Iterator[dict[str, types.ModuleType]]:
    """`package` and its submodules in sys.modules are ours for the duration (one lock for every stack's files,
    so two loads never see each other's modules); whatever was there before comes back after."""
    with _LOCK:

        def mine(k: str) -> bool:
            return k == package or k.startswith(package + ".")

        saved = {k: v for k, v in sys.modules.items() if mine(k)}
        for k in saved:
            del sys.modules[k]
        ours: dict[str, types.ModuleType] = {}
        try:
            yield ours
        finally:
            for k in [k for k in sys.modules if mine(k)]:
                del sys.modules[k]
            sys.modules.update(saved)


def _package(name: str, ours: dict[str, types.ModuleType]) -> types.ModuleType:
    """An empty package module (no __init__ runs, nothing else loads from disk), linked to its parent."""
    if name in ours:
        return ours[name]
    pkg = types.ModuleType(name)
    pkg.__path__ = []  # a package, with nothing importable from disk beyond what is put here
    ours[name] = sys.modules[name] = pkg
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(_package(parent, ours), child, pkg)
    return pkg


def _install(name: str, module: types.ModuleType, ours: dict[str, types.ModuleType]) -> None:
    ours[name] = sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    setattr(_package(parent, ours), child, module)


def load_layernorm_guard(files: VllmFiles, extra: tuple[str, ...] = ()) -> types.ModuleType:
    """vLLM's layernorm_guard module, executed from `files` with only `STOOD_IN` standing in, and an empty module
    under each name in `extra` (a later release's imports that its forward never reads)."""
    missing = [rel for _, rel in _FROM_FILES if not files.path(rel).is_file()]
    if missing:
        raise FileNotFoundError(f"vLLM files under {files.root} lack {missing}")
    with private_names("vllm") as ours:
        for name, module in _stand_ins().items():
            _install(name, module, ours)
        for name in extra:
            _install(name, types.ModuleType(name), ours)
        for name, rel in _FROM_FILES:
            spec = importlib.util.spec_from_file_location(name, files.path(rel))
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            _install(name, module, ours)
            spec.loader.exec_module(module)
        return ours[_FROM_FILES[-1][0]]


# -- one function from a file ------------------------------------------------------------------------------------
def _find_def(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    body: list[ast.stmt] = tree.body
    *outer, name = qualname.split(".")
    for cls in outer:
        found = [n for n in body if isinstance(n, ast.ClassDef) and n.name == cls]
        if not found:
            raise LookupError(f"no class {cls!r} at the top of the file")
        body = found[0].body
    defs = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not defs:
        raise LookupError(f"no function {qualname!r}")
    return defs[-1]


def _global_reads(code: types.CodeType) -> set[str]:
    """Names a code object (and the code nested in it) reads as globals: what its namespace must define."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_reads(const)
    return names


def read_function(path: Path, qualname: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """`qualname` ("f" or "Class.method") from the file at `path`, executed from its own lines in `namespace`
    (file name and line numbers kept: Triton's JIT reads the source). A method's @staticmethod is dropped; NameError
    names any global the function reads that `namespace` lacks."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    node = _find_def(tree, qualname)
    if "." in qualname:
        static = [d for d in node.decorator_list if isinstance(d, ast.Name) and d.id == "staticmethod"]
        node.decorator_list = [d for d in node.decorator_list if d not in static]
    module = ast.Module(body=[node], type_ignores=[])
    code = compile(module, str(path), "exec")
    unknown = sorted(_global_reads(code) - set(namespace) - set(vars(builtins)))
    if unknown:
        raise NameError(f"{path.name}:{qualname} reads {unknown}, which the namespace given does not define")
    # the function's globals are a module of its own, importable by name: torch.compile looks a traced function's
    # module up in sys.modules to guard its globals
    tag = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:10]
    name = f"{__name__}.{path.stem}_{tag}"
    module = sys.modules.get(name) or types.ModuleType(name)
    module.__dict__.update(namespace, __file__=str(path), __builtins__=builtins)
    exec(code, module.__dict__)
    sys.modules[name] = module
    return module.__dict__[node.name]
