"""Session 19: is the same-run add the streaming floor, and do cache hints move either kernel? (H200, timing + bits)

    python3 scripts/kernel_gpu_v36.py     ($OUT/fwd36.json)

Why: at D=128, 262144 rows the forward's fast path alone runs at the add's speed (1.01-1.02x), and the midpoint
test plus the tier add 2-3%. Issue 5 asks for <= 1.05x the add AND faster than torch.compile, whose kernel is
also at ~1.02-1.03x. Room can only come from moving the bytes faster than torch.add does. So, in CUDA graphs
against the same process's add:
- `tadd RxW`: a Triton add (x + z in fp32, rounded to bf16) of R rows x D columns per program on W warps, with
  and without streaming hints (`evict_first` loads, `.cs` stores): can any streaming kernel beat torch.add?
- rlnorm's forward (default and fast path alone) with the same hints, built from a patched copy of `_fwd.py`
  (`rlnorm/kernel/_fwd_v36_<tag>.py`, written here and removed after): every default variant's bits must equal
  the shipped kernel's on every buffer (a hint changes no arithmetic).
- torch.compile's forward (the kit's peer) and FLA fused_norm_gate's forward, in graphs too: their GPU time
  without the host (the bench times 262144 rows with primed events, where torch.compile ran queue-dry).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import triton
import triton.language as tl

from rlnorm.bench import make_sets
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.kit.backends import load_backend
from rlnorm.options import OpOptions
from scripts import kernel_gpu_v2 as V

OUT = os.environ.get("OUT", "/tmp")
ROUNDS = int(os.environ.get("V36_ROUNDS", "3"))
ARGS = (1e-6, None, True, "silu")
KDIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rlnorm", "kernel")


@triton.jit
def _tadd_kernel(x_ptr, z_ptr, y_ptr, n_rows, D: tl.constexpr, R: tl.constexpr, EV: tl.constexpr, CS: tl.constexpr):
    rows = (tl.program_id(0) * R + tl.arange(0, R)).to(tl.int64)  # [R]
    offs = rows[:, None] * D + tl.arange(0, D)[None, :]  # [R, D]
    m = rows[:, None] < n_rows
    a = tl.load(x_ptr + offs, mask=m, other=0.0, eviction_policy=EV)
    b = tl.load(z_ptr + offs, mask=m, other=0.0, eviction_policy=EV)
    tl.store(y_ptr + offs, (a.to(tl.float32) + b.to(tl.float32)).to(y_ptr.dtype.element_ty), mask=m, cache_modifier=CS)


def tadd(x: torch.Tensor, z: torch.Tensor, y: torch.Tensor, r: int, warps: int, ev: str, cs: str) -> None:
    rows, d = x.shape
    _tadd_kernel[(triton.cdiv(rows, r),)](x, z, y, rows, D=d, R=r, EV=ev, CS=cs, num_warps=warps)


def patched_fwd(tag: str, loads: str, stores: str):
    """A copy of `_fwd.py` whose tile loads and stores carry cache hints; the arithmetic is untouched."""
    with open(os.path.join(KDIR, "_fwd.py")) as f:
        src = f.read()
    a = src.index("def _load_chunks(")
    b = src.index("def _widen_chunks(")
    seg = src[a:b]
    if loads:
        seg = seg.replace("other=0.0)", f'other=0.0, eviction_policy="{loads}")')
        assert seg.count("eviction_policy") == 3, seg
    src = src[:a] + seg + src[b:]
    a = src.index("def _store_chunks(")
    b = src.index("def _fast_out(")
    seg = src[a:b]
    if stores:
        seg, n = re.subn(r"(tl\.store\([^\n]*)\)\n", rf'\1, cache_modifier="{stores}")\n', seg)
        assert n == 3, seg
    src = src[:a] + seg + src[b:]
    return load_fwd_copy(f"_fwd_v36_{tag}", src)


def load_fwd_copy(name: str, src: str):
    """`src` (a patched `_fwd.py`) written beside the kernel as `name`.py and imported; remove it with
    `remove_fwd_copy` (probes time such copies against the shipped kernel in one process)."""
    with open(os.path.join(KDIR, name + ".py"), "w") as f:
        f.write(src)
    return importlib.import_module(f"rlnorm.kernel.{name}")


def remove_fwd_copy(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(KDIR, name + ".py"))


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    mods = {"": None}
    opts = OpOptions()
    peers = {}
    for key in ("torch_compile", "fla_fused_norm_gate"):
        try:
            b = load_backend(key)
            ok, why = b.available("cuda")
            if ok:
                peers[key] = b
            else:
                print(f"{key}: unavailable: {why}")
        except Exception as exc:
            print(f"{key}: {exc!r}")
    res = []
    try:
        for tag, ld, st in (("L", "evict_first", ""), ("S", "", ".cs"), ("LS", "evict_first", ".cs")):
            mods[tag] = None  # removed in `finally` even if the patch below fails
            mods[tag] = patched_fwd(tag, ld, st)
        for d in (128, 256):
            sets = make_sets(262144, d, torch.bfloat16, "cuda")
            outs = [torch.empty_like(s[0]) for s in sets]
            pairs = list(zip(sets, outs, strict=True))
            refs = [rms_norm_gated_fwd(s[0], s[1], s[2], *ARGS) for s in sets]
            variants: list[tuple[str, object]] = []
            for r in (4, 8, 16, 32, 64):
                for per_thread in (16, 8):
                    w = r * d // (32 * per_thread)
                    if not 1 <= w <= 16:
                        continue
                    for hint, ev, cs in (("", "", ""), (" LS", "evict_first", ".cs"), (" S", "", ".cs")):
                        variants.append(
                            (
                                f"tadd {r}x{w}w{hint}",
                                lambda r=r, w=w, ev=ev, cs=cs, pairs=pairs: [
                                    tadd(s[0], s[1], o, r, w, ev, cs) for s, o in pairs
                                ],
                            )
                        )
            for tag, mod in mods.items():
                fwd = rms_norm_gated_fwd if mod is None else mod.rms_norm_gated_fwd
                for label, kw in (("", {}), (" exact0", {"_variant": {"EXACT": 0}})):
                    name = f"rlnorm{(' ' + tag) if tag else ''}{label}"
                    if not label:
                        same = all(
                            torch.equal(fwd(s[0], s[1], s[2], *ARGS), ref) for s, ref in zip(sets, refs, strict=True)
                        )
                        print(f"d={d} {name}: bits {'=' if same else 'DIFF'}", flush=True)
                    variants.append(
                        (name, lambda fwd=fwd, kw=kw, sets=sets: [fwd(s[0], s[1], s[2], *ARGS, **kw) for s in sets])
                    )
            for key, b in peers.items():
                variants.append((key, lambda b=b, sets=sets: [b.forward(s[0], s[1], s[2], opts) for s in sets]))
            for rnd in range(ROUNDS):
                add_us = V.graph_us(lambda pairs=pairs: [torch.add(s[0], s[1], out=o) for s, o in pairs], len(pairs))
                print(f"d={d} round {rnd} add {add_us:.2f} us", flush=True)
                for name, fn in variants:
                    try:
                        us = V.graph_us(fn, len(sets))
                    except Exception as exc:
                        print(f"d={d} {name}: {exc!r}"[:300], flush=True)
                        continue
                    res.append({"d": d, "round": rnd, "name": name, "us": us, "add_us": add_us})
                    print(f"d={d} round {rnd} {name:26s} {us:7.2f} us  {us / add_us:.3f}x add", flush=True)
                with open(os.path.join(OUT, "fwd36.json"), "w") as f:
                    json.dump(res, f, indent=1)
            del sets, outs, pairs, refs, variants
            torch.cuda.empty_cache()
    except Exception:
        traceback.print_exc()
    finally:
        for tag in mods:
            if tag:
                remove_fwd_copy(f"_fwd_v36_{tag}")


if __name__ == "__main__":
    main()
