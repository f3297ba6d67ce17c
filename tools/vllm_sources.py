"""Pack the installed vLLM's Python files for a machine where vllm is not installed, or does not import.

    python tools/vllm_sources.py [--out .whl/vllm-src.tar.gz] [--all]

The `vllm` and `vllm_native*` backends run vLLM's own files where `import vllm` cannot
(rlnorm/kit/backends/vllm_files.py): this writes those files, with the package's METADATA (its version), into one
archive, read from the vllm installed beside this Python without importing it. By default only the files the
backends read (`vllm_files.NEEDED`: vLLM 0.30.0's 156 KB, 39 KB packed); with --all every .py file of the package
(42 MB, 8.5 MB packed). Compiled extensions are never packed. The archive is byte-for-byte the same for the same
files (sorted, no timestamps or owners), so the backends unpack it once per content.

`.whl/` is git-ignored: copy it to the GPU machine with the checkout, where the backends find
`.whl/vllm-src.tar.gz` by themselves, or point RLNORM_VLLM_SOURCES at the archive.
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlnorm, not another one installed

from rlnorm.kit.backends import vllm_files  # noqa: E402


def installed_root() -> Path:
    root = vllm_files.installed_root()
    if root is None:
        raise SystemExit("vllm is not installed in this Python (bash .ci/install-vllm.sh installs it)")
    return root


def members(root: Path, everything: bool) -> list[str]:
    """The archive's files, relative to root: the package's .py files (all, or the ones the backends read) and its
    dist-info METADATA."""
    if everything:
        files = sorted(p.relative_to(root).as_posix() for p in (root / "vllm").rglob("*.py"))
    else:
        files = sorted(vllm_files.NEEDED)
        missing = [f for f in files if not (root / f).is_file()]
        if missing:
            raise SystemExit(f"the installed vllm at {root / 'vllm'} lacks {missing}: not the version the kit reads")
    metadata = sorted(p.relative_to(root).as_posix() for p in root.glob("vllm-*.dist-info/METADATA"))
    if not metadata:
        raise SystemExit(f"no vllm-*.dist-info/METADATA beside {root / 'vllm'}: the version could not be stated")
    return files + metadata


def pack(root: Path, names: list[str], out: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            data = (root / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(buf.getvalue())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/vllm_sources.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=vllm_files.DEFAULT_ARCHIVE, help="archive to write")
    ap.add_argument("--all", action="store_true", help="every .py file of the package, not only the ones read")
    args = ap.parse_args(argv)
    root = installed_root()
    names = members(root, args.all)
    pack(root, names, args.out)
    files, _ = vllm_files.find_files(args.out)
    assert files is not None
    missing = files.missing()
    if missing:
        raise SystemExit(f"{args.out}: the archive lacks {missing}")
    size = args.out.stat().st_size
    print(f"vllm_sources: vLLM {files.version}, {len(names)} files from {root / 'vllm'} -> {args.out} ({size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
