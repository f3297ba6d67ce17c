"""One GPU call's worth of forward-kernel checks and timings (H200; see docs/kernel-notes.md).

    python scripts/kernel_gpu_check.py [--quick] [--no-peers] [--configs 8x4 16x4 ...]

1. Accuracy on the standard data (262144 rows, seed 11): fraction correctly rounded, the fp32
   fast path's true worst error in fp32 ulps (sets the near-midpoint bound), and the fractions
   of elements / rows / programs that took the exact fp64 path.
2. Bitwise batch invariance on the GPU: sub-batches of 1, 7, 4097, 65536 rows and a permutation
   against the full batch.
3. Timings: torch.add (same run) vs the forward at launch-shape variants, with the exact path
   disabled (its cost), through the API, at decode sizes (the peers: `python -m rlnorm.bench`).
Writes $OUT/gpu_check.json (and bench.json); prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch

import rlnorm
from rlnorm.inputs import make_case
from rlnorm.kernel import _fwd as F
from rlnorm.numerics import round_once
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math
from rlnorm.timing import make_sets, rotating

OUT = os.environ.get("OUT", "/tmp/kernel_gpu_check")
gpu_timer = __import__("scripts.kernel_gpu_v2", fromlist=["gpu_timer"]).gpu_timer
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke test of the script itself
RES: dict = {"accuracy": [], "invariance": [], "timing": [], "errors": []}
SUMMARY: list[str] = []


def save() -> None:
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "gpu_check.json"), "w") as f:
        json.dump(RES, f, indent=1)


def section(fn):
    def wrapped(*a, **k):
        t0 = time.time()
        try:
            fn(*a, **k)
        except Exception:
            tb = traceback.format_exc()
            print(tb, flush=True)
            RES["errors"].append({"section": fn.__name__, "traceback": tb[-3000:]})
        print(f"[{fn.__name__}: {time.time() - t0:.1f}s]", flush=True)
        save()

    return wrapped


def same_bits(a, b):
    return (a.view(torch.int16) == b.view(torch.int16)) | (torch.isnan(a) & torch.isnan(b))


def fwd(x, z, w, opts, **kw):
    return F.rms_norm_gated_fwd(x, z, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, **kw)


@section
def accuracy(rows: int) -> None:
    cases = [
        ("std", 128, OpOptions(), True, 1.0),
        ("std", 256, OpOptions(), True, 1.0),
        ("nbg_false", 128, OpOptions(norm_before_gate=False), True, 1.0),
        ("sigmoid", 128, OpOptions(activation="sigmoid"), True, 1.0),
        ("no_z", 128, OpOptions(), False, 1.0),
        ("wide_z8", 128, OpOptions(), True, 8.0),  # |z| up to ~40: checks the |z| term of the bound
    ]
    for name, d, opts, has_z, zscale in cases:
        c = make_case(rows, d, seed=11, device=DEV)
        z = (c.z.float() * zscale).to(c.z.dtype) if has_z else None
        y = fwd(c.x, z, c.w, opts)
        y_dbg, fast, flags = fwd(c.x, z, c.w, opts, _debug=True)
        ref64 = gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64)
        ref = round_once(ref64, torch.bfloat16)
        frac = same_bits(y, ref).double().mean().item()
        fast_alone = same_bits(fast.to(torch.bfloat16), ref).double().mean().item()  # GPU cast is RNE
        _, e = torch.frexp(ref64)
        ulp32 = torch.ldexp(torch.ones_like(ref64), e - 24)  # |ref| in [2**(e-1), 2**e)
        ok = torch.isfinite(ref64) & (ref64 != 0) & (ref64.abs() > 1e-30)
        err = torch.where(ok, (fast.double() - ref64).abs() / ulp32, torch.zeros_like(ref64))
        if has_z and opts.norm_before_gate:
            t0, tz = F.NEAR_T0_GATED, 0
        elif has_z:
            t0, tz = F.NEAR_T0_GATED_PRE, 0
        else:
            t0, tz = F.NEAR_T0_PLAIN, 0
        az = z.float().abs().double() if has_z else torch.zeros_like(ref64)
        used = err / (t0 + tz * az)  # < 1 everywhere is what the bound claims
        block_r = F._fwd_config(opts.group_size or d, c.x.dtype)[0]
        row_flag = flags.bool().any(dim=1)
        n_blocks = (rows + block_r - 1) // block_r
        pad = n_blocks * block_r - rows
        tile_flag = torch.cat([row_flag, row_flag.new_zeros(pad)]).view(n_blocks, block_r).any(dim=1)
        rec = {
            "case": name,
            "d": d,
            "rows": rows,
            "opts": opts.as_dict(),
            "has_z": has_z,
            "correctly_rounded": frac,
            "wrong": int((~same_bits(y, ref)).sum()),
            "debug_equals_plain": bool(same_bits(y, y_dbg).all()),
            "fast_path_alone_correctly_rounded": fast_alone,
            "fast_err_ulp32_max": err.max().item(),
            "fast_err_ulp32_p999999": torch.quantile(err.flatten()[:16_000_000].float(), 0.999999).item(),
            "fast_err_minus_tz_absz_max": (err - tz * az).max().item(),
            "bound_t0_tz": [t0, tz],
            "bound_used_max": used.max().item(),
            "flag_elems": flags.float().mean().item(),
            "flag_rows": row_flag.float().mean().item(),
            "flag_tiles": tile_flag.float().mean().item(),
            "block_r": block_r,
        }
        RES["accuracy"].append(rec)
        print(json.dumps(rec), flush=True)
        SUMMARY.append(
            f"acc {name:<18} d={d} correct={frac:.8f} wrong={rec['wrong']} fast_alone={fast_alone:.6f} "
            f"err_max={rec['fast_err_ulp32_max']:.2f} err-tz|z|={rec['fast_err_minus_tz_absz_max']:.2f} "
            f"bound_used={rec['bound_used_max']:.3f} rows_exact={rec['flag_rows']:.4f} "
            f"tiles_exact={rec['flag_tiles']:.4f}"
        )
        del c, y, y_dbg, fast, flags, ref64, ref, err, used


@section
def invariance(rows: int) -> None:
    opts = OpOptions()
    for d in (128, 256):
        c = make_case(rows, d, seed=3, device=DEV)
        full = fwd(c.x, c.z, c.w, opts)
        for m, limit in ((1, 2048), (7, rows), (4097, rows), (65536, rows)):
            parts = [fwd(c.x[s : s + m], c.z[s : s + m], c.w, opts) for s in range(0, min(rows, limit), m)]
            got = torch.cat(parts)
            n = got.shape[0]
            diff = int((~same_bits(got, full[:n]).all(dim=1)).sum())
            RES["invariance"].append({"d": d, "sub": m, "rows_checked": n, "rows_differ": diff})
            SUMMARY.append(f"inv d={d} sub={m:<6} rows={n:<7} differ={diff}")
        perm = torch.randperm(rows, device=DEV)
        got = fwd(c.x[perm], c.z[perm], c.w, opts)
        diff = int((~same_bits(got, full[perm]).all(dim=1)).sum())
        RES["invariance"].append({"d": d, "sub": "perm", "rows_checked": rows, "rows_differ": diff})
        SUMMARY.append(f"inv d={d} permuted rows={rows} differ={diff}")


def _time(timer, fn) -> float:
    med, p20, p80 = timer(fn)
    return med, p20, p80


@section
def timing(configs: list[tuple[int, int]], big_rows: int) -> None:
    timer = gpu_timer(warmup_ms=25, rep_ms=120)
    for d in (128, 256):
        for rows in (big_rows, 32, 512, 4096):
            sets = make_sets(rows, d, torch.bfloat16, DEV)
            nxt = rotating([(st, torch.empty_like(st[0])) for st in sets])

            def add(nxt=nxt):
                (x, z, _, _), o = nxt()
                torch.add(x, z, out=o)

            add_t = _time(timer, add)
            RES["timing"].append({"d": d, "rows": rows, "name": "torch.add", "us": add_t})
            variants = [("default", {}), ("no_exact_path", {"_near": (-1.0, 0.0)}), ("bound8", {"_near": (8.0, 1.0)})]
            if rows == big_rows:
                for br, nw in configs:
                    variants.append((f"R{br}w{nw}", {"_config": (br, d, nw)}))
            for vname, kw in variants:

                def f(kw=kw, nxt=nxt):
                    (x, z, w, _), _ = nxt()
                    F.rms_norm_gated_fwd(x, z, w, 1e-6, None, True, "silu", **kw)

                t = _time(timer, f)
                RES["timing"].append({"d": d, "rows": rows, "name": vname, "us": t, "ratio": t[0] / add_t[0]})
                SUMMARY.append(
                    f"time d={d} rows={rows:<7} {vname:<14} {t[0]:8.1f} us (p20 {t[1]:.1f} p80 {t[2]:.1f})"
                    f"  add {add_t[0]:7.1f}  ratio {t[0] / add_t[0]:.3f}"
                )

            def api(nxt=nxt):
                (x, z, w, _), _ = nxt()
                with torch.no_grad():
                    rlnorm.rms_norm_gated(x, z, w)

            t = _time(timer, api)
            RES["timing"].append({"d": d, "rows": rows, "name": "api", "us": t, "ratio": t[0] / add_t[0]})
            SUMMARY.append(f"time d={d} rows={rows:<7} {'api':<14} {t[0]:8.1f} us  ratio {t[0] / add_t[0]:.3f}")
            del sets, nxt


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=262144)
    p.add_argument("--configs", nargs="*", default=["8x4", "32x4", "16x8", "32x8", "64x8"])
    p.add_argument("--skip", nargs="*", default=[])
    a = p.parse_args()
    configs = [tuple(int(v) for v in s.split("x")) for s in a.configs]
    RES["device"] = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    RES["versions"] = {"torch": torch.__version__, "triton": __import__("triton").__version__}
    print(RES["device"], RES["versions"], flush=True)
    if "accuracy" not in a.skip:
        accuracy(a.rows)
    if "invariance" not in a.skip:
        invariance(a.rows)
    if "timing" not in a.skip:
        timing(configs, a.rows)
    print("\n==== summary ====")
    print("\n".join(SUMMARY))
    if RES["errors"]:
        print("ERRORS in sections:", [e["section"] for e in RES["errors"]])


if __name__ == "__main__":
    main()
