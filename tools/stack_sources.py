"""Pack the pinned stacks' files (rlnorm/kit/backends/stack_files.py, PINS) into .whl/<key>-src.tar.gz.

    python tools/stack_sources.py [--wheels DIR] [--out DIR] [KEY ...]

For each pin: from the installed package when it is the pinned version, else from its wheel in DIR, else from the
wheel `pip download --no-deps --only-binary=:all: --python-version 3.12 DIST==VERSION` fetches (pip's cache is
used). Only the pinned files and the dist-info METADATA are packed, sorted, without timestamps or owners, so the
archive is byte-for-byte the same for the same files. `.whl/` is git-ignored: carry it to a machine without a
package index (the GPU image), where the rows find the archives by themselves (vLLM 0.30.0's, key `vllm`, is
`.whl/vllm-src.tar.gz`: the `vllm` rows run it where vllm cannot import).
"""

from __future__ import annotations

import argparse
import gzip
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlnorm, not another one installed

from rlnorm.kit.backends import stack_files as sf  # noqa: E402


def pack(root: Path, names: list[str], out: Path) -> None:
    """The files `names` under `root` into the archive `out`: sorted, no timestamps or owners."""
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


def _stem(pin: sf.Pin) -> str:
    """The start of the pin's wheel and dist-info names (`megatron_core-0.19.2`)."""
    return f"{pin.dist.replace('-', '_')}-{pin.version}"


def _wheel(pin: sf.Pin, wheels: Path | None, tmp: Path) -> Path:
    if wheels is not None and (found := sorted(wheels.glob(_stem(pin) + "-*.whl"))):
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version"]
    cmd += ["3.12", f"{pin.dist}=={pin.version}", "-d", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(tmp.glob(_stem(pin) + "-*.whl"))
    if proc.returncode != 0 or not found:
        raise SystemExit(f"stack_sources: `{' '.join(cmd)}` failed: {proc.stderr.strip()[-500:]}")
    return found[0]


def build(pin: sf.Pin, wheels: Path | None, out: Path) -> str:
    """Write the pin's files and its METADATA to the archive `out`; returns where they came from."""
    names = [*sorted(pin.files), f"{_stem(pin)}.dist-info/METADATA"]
    installed = sf.installed(pin)
    with tempfile.TemporaryDirectory() as tmp:
        if installed is not None:
            root, origin = installed, f"the installed {pin.dist} ({installed})"
        else:
            whl = _wheel(pin, wheels, Path(tmp))
            root, origin = Path(tmp) / "unpacked", whl.name
            with zipfile.ZipFile(whl) as z:
                for name in [n for n in names if n in z.namelist()]:
                    (root / name).parent.mkdir(parents=True, exist_ok=True)
                    (root / name).write_bytes(z.read(name))
        missing = [n for n in names if not (root / n).is_file()]
        if missing:
            raise SystemExit(f"stack_sources: {origin} lacks {missing}: not the version pinned")
        pack(root, names, out)
    return origin


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/stack_sources.py", description=__doc__.splitlines()[0])
    ap.add_argument("keys", nargs="*", help=f"pins to pack (default all: {', '.join(sf.PINS)})")
    ap.add_argument("--wheels", type=Path, help="a folder of downloaded wheels to read before asking pip")
    ap.add_argument("--out", type=Path, default=sf.WHL, help="folder to write the archives to")
    args = ap.parse_args(argv)
    unknown = [k for k in args.keys if k not in sf.PINS]
    if unknown:
        ap.error(f"keys: expected some of {sorted(sf.PINS)}, got {unknown}")
    for key in args.keys or list(sf.PINS):
        pin = sf.PINS[key]
        out = args.out / pin.archive.name
        origin = build(pin, args.wheels, out)
        print(f"stack_sources: {pin.dist} {pin.version}, {len(pin.files)} files from {origin} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
