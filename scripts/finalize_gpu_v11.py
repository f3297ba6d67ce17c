"""Session 5, call 1: the dweight finalize spread over SMs, in one pass (none of these choices changes a bit).

    git show c4ee8ed:rlnorm/kernel/_dweight.py > scripts/_old_dweight.py   # the two-pass finalize, untracked
    python3 scripts/finalize_gpu_v11.py   (one line per shape; $OUT/fin11.json)

1. The finalize alone (GPU time per call from CUDA-graph replays of 20 calls, `kernel_gpu_v2.graph_us`) on
   counters of 4096 x D random contributions with 1 / 2 / 4 / 8 copies: the two-pass kernel of c4ee8ed
   (128 columns, 4 warps: one SM) against the one-pass kernel at 128x4, 64x2, 32x1 and 16x1 columns x warps.
   Every variant's bf16 and fp32 results are compared with the two-pass kernel's first.
2. The backward launcher (zeroing, kernel, finalize) at 32 / 512 / 4096 rows with each finalize and one
   counter copy per 32 or 64 programs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.bench import make_sets
from rlnorm.kernel import _bwd as B
from rlnorm.kernel import _dweight
from scripts import kernel_gpu_v2 as V

OUT = os.environ.get("OUT", "/tmp")
ARGS = (1e-6, None, True, "silu")
RES: list[dict] = []
NEW_BLOCKS = ((128, 4), (64, 2), (32, 1), (16, 1))


def _old_module():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_old_dweight.py")
    spec = importlib.util.spec_from_file_location("_old_dweight", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def finalize_alone(old) -> None:
    for d in (128, 256):
        gen = torch.Generator(device="cuda").manual_seed(5)
        v = torch.randn(4096, d, device="cuda", generator=gen) * 1e-3
        for stripes in (1, 2, 4, 8):
            cnt = _dweight.column_counters(v, block_rows=2, tiles=8, stripes=stripes)
            want = {dt: old.finalize(cnt, dt) for dt in (torch.bfloat16, torch.float32)}
            variants = [("two-pass 128x4", lambda dt, cnt=cnt: old.finalize(cnt, dt))]
            variants += [
                (f"one-pass {b}x{w}", lambda dt, cnt=cnt, b=b, w=w: _dweight.finalize(cnt, dt, _block=(b, w)))
                for b, w in NEW_BLOCKS
            ]
            line = [f"finalize d={d} copies={stripes}"]
            for name, fn in variants:
                try:
                    ok = all(torch.equal(bits(fn(dt)), bits(want[dt])) for dt in want)
                    t = V.graph_us(lambda fn=fn: [fn(torch.bfloat16) for _ in range(20)], 20, reps=20)
                except Exception as exc:  # one variant failing never stops the sweep
                    line.append(f"{name} FAILED {type(exc).__name__}: {str(exc)[:80]}")
                    continue
                RES.append({"what": "finalize", "d": d, "stripes": stripes, "variant": name, "us": t, "same_bits": ok})
                line.append(f"{name} {t:5.2f}{'' if ok else ' DIFFER'}")
            print(" | ".join(line), flush=True)


def backward(old) -> None:
    new_finalize = _dweight.finalize
    pps_default = _dweight.PROGRAMS_PER_STRIPE
    for d in (128, 256):
        for rows in (32, 512, 4096):
            sets = make_sets(rows, d, torch.bfloat16, "cuda")[:20]
            x, z, w, dy = sets[0]
            _dweight.finalize = old.finalize
            want = B.rms_norm_gated_bwd(dy, x, z, w, *ARGS)
            line = [f"bwd d={d} rows={rows:<5}"]
            for fin_name, fin in [("two-pass", old.finalize)] + [
                (f"{b}x{w_}", lambda c, dt, b=b, w_=w_: new_finalize(c, dt, _block=(b, w_))) for b, w_ in NEW_BLOCKS[1:]
            ]:
                for pps in (32, 64):
                    _dweight.finalize = fin
                    _dweight.PROGRAMS_PER_STRIPE = pps
                    try:
                        got = B.rms_norm_gated_bwd(dy, x, z, w, *ARGS)
                        ok = all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want, strict=True))
                        calls = [(s[3], s[0], s[1], s[2]) for s in sets]
                        t = V.graph_us(lambda cs=calls: [B.rms_norm_gated_bwd(*c, *ARGS) for c in cs], 20, reps=20)
                    except Exception as exc:
                        line.append(f"{fin_name} pps{pps} FAILED {type(exc).__name__}")
                        continue
                    finally:
                        _dweight.finalize = new_finalize
                        _dweight.PROGRAMS_PER_STRIPE = pps_default
                    rec = {"what": "bwd", "d": d, "rows": rows, "finalize": fin_name, "pps": pps}
                    RES.append({**rec, "us": t, "same_bits": ok})
                    line.append(f"{fin_name} pps{pps} {t:5.2f}{'' if ok else ' DIFFER'}")
            print(" | ".join(line), flush=True)


def main() -> None:
    old = _old_module()
    finalize_alone(old)
    backward(old)
    with open(os.path.join(OUT, "fin11.json"), "w") as fh:
        json.dump(RES, fh, indent=1)


if __name__ == "__main__":
    main()
