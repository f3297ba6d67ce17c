"""The forward's bits on a GPU, and a short timing of its variants against the same-run add.

    python tools/kernel_gpu_check.py [--rows 262144] [--skip accuracy|invariance|timing|bound ...]
                                     [--variant fwd.NAME=VALUE ...] [--out gpu_check.json]
                                     [--bound-elements 8388608]

1. accuracy: on the standard data (seed 11) for the default op, D = 256, the gate first, sigmoid, no gate
   and a wide z, each as one launch and as launches of `decode_rows` rows (one row per program): the fraction
   of outputs equal to the fp64 result rounded once, and, where the launcher gives them (its `debug`
   outputs), the fast path's worst error in fp32 ulps against the bound, and the fractions of elements,
   rows and programs that took the exact path.
2. invariance: sub-batches of 1, 7, 4097 and 65536 rows, and the rows permuted, against the full batch,
   bit for bit.
3. timing: the forward through the launcher and through the API, and rlnorm under each --variant
   (default `fwd.EXACT=0`, the fast path alone), against a same-run `torch.add`, by the bench's clocks
   (`rlnorm.timing`: CUDA graphs up to 4096 rows, events on a primed queue above). For the full table
   with the peers: `python -m benchmarks.run --variant ...`.
4. bound: per width 64..8192 (and group widths), option and input distribution, in both launch shapes (as in
   1.; the worst of the two, outputs counted in each), the fast path's worst error
   in fp32 ulps of its value against the fp64 result, beside the proven bound B and the threshold T
   (`rlnorm.kernel._bound`), the outputs that differ from the fp64 result rounded once, and the fractions
   flagged; written as bound_table.md and bound_table.csv beside --out (or into $OUT).
Without a GPU it runs on the CPU in the Triton interpreter (use a few rows): a check of the tool itself.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's package, from anywhere

import torch

import rlnorm
from benchmarks import runner, variants
from rlnorm.inputs import make_case
from rlnorm.kernel import _fwd as F
from rlnorm.kernel._bound import fast_error_ulps, near_threshold, ptx_sum_depth, sum_depth
from rlnorm.kernel.testing import plant
from rlnorm.numerics import round_once
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math
from rlnorm.timing import CpuClock, CudaClock, make_sets

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python tools/kernel_gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=262144, help="rows of the accuracy and invariance data")
    p.add_argument("--skip", nargs="*", default=[], choices=["accuracy", "invariance", "timing", "bound"])
    p.add_argument("--bound-elements", type=int, default=1 << 23, help="outputs per case of the bound section")
    p.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="fwd.NAME=VALUE",
        help="forward switches to time beside the shipped kernel (repeatable; default fwd.EXACT=0)",
    )
    p.add_argument("--timing-rows", type=int, nargs="+", default=None, help="default: --rows, 32, 512, 4096")
    p.add_argument(
        "--out",
        default=None,
        help="write the results as JSON here (default: $OUT/gpu_check.json where $OUT is set, else no file)",
    )
    return p


class Check:
    """Results by section, saved after each one; a section that raises is recorded and the next one runs."""

    def __init__(self, out: str | None) -> None:
        self.out = out
        self.res: dict[str, Any] = {"accuracy": [], "invariance": [], "timing": [], "bound": [], "errors": []}
        self.summary: list[str] = []

    def section(self, name: str, fn: Callable[[], None]) -> None:
        t0 = time.time()
        try:
            fn()
        except Exception:
            tb = traceback.format_exc()
            print(tb, flush=True)
            self.res["errors"].append({"section": name, "traceback": tb[-3000:]})
        print(f"[{name}: {time.time() - t0:.1f}s]", flush=True)
        if self.out:
            Path(self.out).parent.mkdir(parents=True, exist_ok=True)
            Path(self.out).write_text(json.dumps(self.res, indent=1))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.view(torch.int16) == b.view(torch.int16)) | (torch.isnan(a) & torch.isnan(b))


def fwd(x: torch.Tensor, z: torch.Tensor | None, w: torch.Tensor, opts: OpOptions, **kw: Any) -> Any:
    return F.rms_norm_gated_fwd(x, z, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, **kw)


# the launch shapes the launcher picks: the batch in one launch (the wide tile past `decode_rows` rows), and the same
# rows in consecutive launches of `decode_rows` rows (one row per program; one launch at widths that keep one shape)
LAUNCHES = ("wide", "decode")


def launch_rows(launch: str, group: int, rows: int) -> int:
    """The rows of each launch when `rows` rows at this group width run as `launch`."""
    return rows if launch == "wide" else F.decode_rows(group) or rows


def fwd_as(launch: str, x: torch.Tensor, z: torch.Tensor | None, w: torch.Tensor, opts: OpOptions, **kw: Any) -> Any:
    n = launch_rows(launch, opts.group_size or x.shape[1], x.shape[0])
    parts = [fwd(x[s : s + n], None if z is None else z[s : s + n], w, opts, **kw) for s in range(0, x.shape[0], n)]
    return tuple(torch.cat(p) for p in zip(*parts, strict=True)) if kw.get("debug") else torch.cat(parts)


def accuracy(ck: Check, rows: int) -> None:
    cases = [
        ("std", 128, OpOptions(), True, 1.0),
        ("std", 256, OpOptions(), True, 1.0),
        ("nbg_false", 128, OpOptions(norm_before_gate=False), True, 1.0),
        ("sigmoid", 128, OpOptions(activation="sigmoid"), True, 1.0),
        ("no_z", 128, OpOptions(), False, 1.0),
        ("wide_z8", 128, OpOptions(), True, 8.0),  # |z| up to ~40
    ]
    for (name, d, opts, has_z, zscale), launch in itertools.product(cases, LAUNCHES):
        c = make_case(rows, d, seed=11, device=DEV)
        z = (c.z.float() * zscale).to(c.z.dtype) if has_z else None
        y = fwd_as(launch, c.x, z, c.w, opts)
        ref64 = gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64)
        ref = round_once(ref64, torch.bfloat16)
        frac = same_bits(y, ref).double().mean().item()
        rec: dict[str, Any] = {"case": name, "d": d, "rows": rows, "launch": launch, "opts": opts.as_dict()}
        rec.update(has_z=has_z, correctly_rounded=frac, wrong=int((~same_bits(y, ref)).sum()))
        line = f"acc {name:<10} d={d} {launch:<6} correct={frac:.9f} wrong={rec['wrong']}"
        rec.update(_fast_path(c, z, y, opts, ref64, ref, rows, d, launch))
        line += (
            f" fast_alone={rec['fast_path_alone_correctly_rounded']:.6f} err_max={rec['fast_err_ulp32_max']:.2f}"
            f" bound_used={rec['bound_used_max']} rows_exact={rec['flag_rows']:.4f}"
            f" programs_exact={rec['flag_tiles']:.4f}"
        )
        ck.res["accuracy"].append(rec)
        print(json.dumps(rec), flush=True)
        ck.summary.append(line)


def _fast_path(
    c: Any, z: Any, y: Any, opts: OpOptions, ref64: Any, ref: Any, rows: int, d: int, launch: str
) -> dict[str, Any]:
    """The fast path's error against fp64 and how often the exact path ran (from the launcher's debug outputs)."""
    y_dbg, fast, flags = fwd_as(launch, c.x, z, c.w, opts, debug=True)
    _, e = torch.frexp(ref64)
    ulp32 = torch.ldexp(torch.ones_like(ref64), e - 24)  # |ref| in [2**(e-1), 2**e)
    ok = torch.isfinite(ref64) & (ref64 != 0) & (ref64.abs() > 1e-30)
    err = torch.where(ok, (fast.double() - ref64).abs() / ulp32, torch.zeros_like(ref64))
    bound = near_threshold(opts.group_size or d, z is not None, opts.norm_before_gate, opts.activation == "sigmoid")
    g = opts.group_size or d
    block_r = F.fwd_config(g, c.x.dtype, launch_rows(launch, g, rows))[0]
    row_flag = flags.bool().any(dim=1)
    n_blocks = (rows + block_r - 1) // block_r  # decode launches hold whole rows: no program spans two launches
    pad = n_blocks * block_r - rows
    tile_flag = torch.cat([row_flag, row_flag.new_zeros(pad)]).view(n_blocks, block_r).any(dim=1)
    return {
        "debug_equals_plain": bool(same_bits(y, y_dbg).all()),
        "fast_path_alone_correctly_rounded": same_bits(fast.to(torch.bfloat16), ref).double().mean().item(),
        "fast_err_ulp32_max": err.max().item(),
        "bound": bound,
        "bound_used_max": round(err.max().item() / bound, 3) if bound else None,  # < 1 is what the bound claims
        "flag_elems": flags.float().mean().item(),
        "flag_rows": row_flag.float().mean().item(),
        "flag_tiles": tile_flag.float().mean().item(),
        "block_r": block_r,
    }


# (D, group width or None): every width the kernel's layouts change at, groups, and a group that is not a power of two
BOUND_WIDTHS = [(64, None), (128, None), (256, None), (512, None), (1024, None), (2048, None), (4096, None)]
BOUND_WIDTHS += [(8192, None), (4096, 64), (4096, 256), (4096, 1024), (192, 96)]
BOUND_OPTIONS = {  # name: (options, has z); the default op at every width, the others where the depth changes most
    "silu": (OpOptions(), True),
    "sigmoid": (OpOptions(activation="sigmoid"), True),
    "gate_first": (OpOptions(norm_before_gate=False), True),
    "no_gate": (OpOptions(), False),
}
BOUND_ALL_OPTIONS_AT = (128, 1024, 8192)


def _bound_inputs(rows: int, d: int, dist: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, z, w (bf16) on the device: standard; per-row scales e**-6..e**6; heavy tails with |z| up to ~90."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = 2 * torch.randn(rows, d, generator=g, device=DEV)
    z = torch.randn(rows, d, generator=g, device=DEV)
    w = 1 + 0.1 * torch.randn(d, generator=g, device=DEV)
    if dist == "row_scales":
        x = x * torch.exp(12 * torch.rand(rows, 1, generator=g, device=DEV) - 6)
    elif dist == "heavy":  # Student-t-like tails in x, a wide gate (the exp split's second-order term grows)
        x = x / torch.rand(rows, d, generator=g, device=DEV).clamp_min(1e-3).sqrt()
        z = (z * 16).clamp(-90, 90)
    return x.bfloat16(), z.bfloat16(), w.bfloat16()


def _compiled_ptx() -> dict[int, str]:
    """The PTX of every variant of the forward kernel compiled in this process, by object id (none in the
    interpreter). Triton 3.6 and 3.7 both keep the kernels in the first slot of `device_caches`' entries."""
    out: dict[int, str] = {}
    for entry in getattr(F._rms_norm_gated_fwd_kernel, "device_caches", {}).values():
        for k in entry[0].values():
            ptx = getattr(k, "asm", {}).get("ptx")
            if ptx:
                out[id(k)] = ptx
    return out


def _launch_depth(group: int, rows: int) -> int:
    """The summation depth the bound counts for the default launch of this many rows at this group width."""
    block_r, block_g, num_warps = F.fwd_config(group, torch.bfloat16, rows)
    split = F.default_split(block_g)
    return sum_depth(block_g, split, F.row_elements_per_thread(block_r, block_g, num_warps, split))


def bound(ck: Check, elements: int) -> None:
    """The fast path's worst error per width against the proven bound (docs/kernel.md §3)."""
    table: list[dict[str, Any]] = []
    for d, group in BOUND_WIDTHS:
        g, rows = group or d, max(1, elements // d)
        past = F.decode_rows(g) + 1  # the first row count of the wide tile
        if F.fwd_config(g, torch.bfloat16, rows) != F.fwd_config(g, torch.bfloat16, past):
            rows = past  # the one launch must take the wide tile
        for name, (base, has_z) in BOUND_OPTIONS.items():
            if name != "silu" and (d not in BOUND_ALL_OPTIONS_AT or group is not None):
                continue
            opts = OpOptions(**{**base.as_dict(), "group_size": group})
            b = fast_error_ulps(g, has_z, opts.norm_before_gate, opts.activation == "sigmoid")
            t = near_threshold(g, has_z, opts.norm_before_gate, opts.activation == "sigmoid")
            rec: dict[str, Any] = {"d": d, "group": group, "option": name, "bound": round(b, 2), "T": t}
            rec.update(outputs=0, wrong=0, err_max=0.0, err_dist="", flag_elems=0.0, flag_rows=0.0)
            seen = set(_compiled_ptx())
            depth = {_launch_depth(g, launch_rows(launch, g, rows)) for launch in LAUNCHES}
            for (i, dist), launch in itertools.product(enumerate(("standard", "row_scales", "heavy")), LAUNCHES):
                x, z, w = _bound_inputs(rows, d, dist, seed=1000 * d + 10 * (group or 0) + i)
                zz = z if has_z else None
                y, fast, flags = fwd_as(launch, x, zz, w, opts, debug=True)
                ref64 = gated_rmsnorm_math(x, zz, w, opts, torch.float64)
                fast64 = fast.double()
                # elements the range test lets through: |fast| in [2**-96, inf); the rest go exact by design
                ok = torch.isfinite(fast64) & (fast64.abs() >= 2.0**-96) & torch.isfinite(ref64)
                _, e = torch.frexp(fast64)
                err = torch.where(ok, (fast64 - ref64).abs() / torch.ldexp(torch.ones_like(fast64), e - 24), 0.0)
                worst = err.max().item()
                if worst >= rec["err_max"]:
                    rec.update(err_max=round(worst, 3), err_dist=dist)
                rec["outputs"] += y.numel()
                rec["wrong"] += int((~same_bits(y, round_once(ref64, torch.bfloat16))).sum())
                rec["flag_elems"] = max(rec["flag_elems"], flags.float().mean().item())
                rec["flag_rows"] = max(rec["flag_rows"], flags.bool().any(dim=1).float().mean().item())
                del x, z, w, y, fast, flags, ref64, fast64, err, ok, e
            rec["err_over_bound"] = round(rec["err_max"] / b, 3)
            # the depth B counts beside the one this Triton's PTX has (None: no new kernel, or interpreted)
            depths = {ptx_sum_depth(v) for k, v in _compiled_ptx().items() if k not in seen}
            # one depth for both launch shapes (else this reads as the pair, and the table shows it)
            rec.update(depth=depth.pop() if len(depth) == 1 else sorted(depth))
            rec.update(ptx_depth=max(depths, key=lambda v: v or 0) if depths else None)
            table.append(rec)
            ck.res["bound"].append(rec)
            print(json.dumps(rec), flush=True)
            ck.summary.append(
                f"bound d={d} group={group} {name:<10} err_max={rec['err_max']:.2f} ({rec['err_dist']}) "
                f"B={b:.2f} T={t} wrong={rec['wrong']} of {rec['outputs']} depth={rec['depth']} ptx={rec['ptx_depth']}"
            )
    _write_bound_table(table, ck.out)


def _write_bound_table(table: list[dict[str, Any]], out: str | None) -> None:
    """bound_table.md and bound_table.csv beside the JSON output (or nowhere without one)."""
    if not out:
        return
    folder = Path(out).parent
    folder.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    cols = ["d", "group", "option", "err_max", "err_dist", "bound", "T", "err_over_bound", "wrong", "outputs"]
    cols += ["flag_elems", "flag_rows", "depth", "ptx_depth"]
    lines = [",".join(cols)] + [",".join(str(r[c]) for c in cols) for r in table]
    (folder / "bound_table.csv").write_text("\n".join(lines) + "\n")
    md = [
        f"Worst fast-path error (fp32 ulps of the fast value, against fp64) and the proven bound B; {device}, "
        f"torch {torch.__version__}, triton {__import__('triton').__version__}; worst of three input distributions.",
        "",
        "| D | group | option | worst error | input | bound B | T | wrong / outputs | flagged elems | flagged rows "
        "| sum depth (PTX) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        md.append(
            f"| {r['d']} | {r['group'] or '-'} | {r['option']} | {r['err_max']:.2f} | {r['err_dist']} | "
            f"{r['bound']:.2f} | {r['T']} | {r['wrong']} / {r['outputs']:,} | {100 * r['flag_elems']:.3f}% | "
            f"{100 * r['flag_rows']:.2f}% | {r['depth']} ({r['ptx_depth'] if r['ptx_depth'] is not None else '-'}) |"
        )
    (folder / "bound_table.md").write_text("\n".join(md) + "\n")


def invariance(ck: Check, rows: int) -> None:
    opts = OpOptions()
    for d in (128, 256):
        c = make_case(rows, d, seed=3, device=DEV)
        full = fwd(c.x, c.z, c.w, opts)
        for m, limit in ((1, 2048), (7, rows), (4097, rows), (65536, rows)):
            parts = [fwd(c.x[s : s + m], c.z[s : s + m], c.w, opts) for s in range(0, min(rows, limit), m)]
            got = torch.cat(parts)
            n = got.shape[0]
            diff = int((~same_bits(got, full[:n]).all(dim=1)).sum())
            ck.res["invariance"].append({"d": d, "sub": m, "rows_checked": n, "rows_differ": diff})
            ck.summary.append(f"inv d={d} sub={m:<6} rows={n:<7} differ={diff}")
        perm = torch.randperm(rows, device=DEV)
        got = fwd(c.x[perm], c.z[perm], c.w, opts)
        diff = int((~same_bits(got, full[perm]).all(dim=1)).sum())
        ck.res["invariance"].append({"d": d, "sub": "perm", "rows_checked": rows, "rows_differ": diff})
        ck.summary.append(f"inv d={d} permuted rows={rows} differ={diff}")


def timing(ck: Check, rows_list: Sequence[int], wanted: Sequence[variants.Variant]) -> None:
    clock = CudaClock(DEV) if DEV == "cuda" else CpuClock()
    settings = runner.QUICK if DEV == "cuda" else runner.SMOKE
    opts = OpOptions()
    for d in (128, 256):
        for rows in rows_list:
            sets = make_sets(rows, d, torch.bfloat16, DEV)
            graph = clock.graphs and rows <= settings.graph_max_rows
            why = "" if graph else "rows above the graph limit, or no CUDA graphs here"

            def add(a: tuple) -> Any:
                return torch.add(a[0], a[1])

            add_t, add_m, _ = runner.time_gpu(add, sets, clock, settings, graph, why)

            def launch(a: tuple) -> Any:
                return fwd(a[0], a[1], a[2], opts)

            def api(a: tuple) -> Any:
                with torch.no_grad():
                    return rlnorm.rms_norm_gated(a[0], a[1], a[2])

            lines: list[tuple[str, Callable[[tuple], Any], Any]] = [("launcher", launch, None), ("api", api, None)]
            lines += [(v.label, api, v) for v in wanted]
            for name, step, v in lines:
                with plant(**(v.switches if v else {})):
                    t, m, _ = runner.time_gpu(step, sets, clock, settings, graph, why)
                ratio = t.us / add_t.us if m == add_m and add_t.us else None
                ck.res["timing"].append(
                    {"d": d, "rows": rows, "name": name, "clock": m, "us": [t.us, t.p20, t.p80], "add_us": add_t.us}
                    | {"ratio": ratio, "host_bound": t.host_bound}
                )
                star = "*" if t.host_bound else ""
                ck.summary.append(
                    f"time d={d} rows={rows:<7} {name:<22} {t.us:8.2f}{star} us (p20 {t.p20:.2f} p80 {t.p80:.2f}) "
                    f"{m:<6} add {add_t.us:7.2f}  ratio {'-' if ratio is None else f'{ratio:.3f}'}"
                )
            del sets


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        wanted = variants.parse_variants(a.variant if a.variant is not None else ["fwd.EXACT=0"])
    except variants.VariantError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    out = a.out or (os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT") else None)
    ck = Check(out)
    ck.res["device"] = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    ck.res["versions"] = {"torch": torch.__version__, "triton": __import__("triton").__version__}
    print(ck.res["device"], ck.res["versions"], flush=True)
    if "accuracy" not in a.skip:
        ck.section("accuracy", lambda: accuracy(ck, a.rows))
    if "invariance" not in a.skip:
        ck.section("invariance", lambda: invariance(ck, a.rows))
    if "bound" not in a.skip:
        ck.section("bound", lambda: bound(ck, a.bound_elements))
    if "timing" not in a.skip:
        ck.section("timing", lambda: timing(ck, a.timing_rows or [a.rows, 32, 512, 4096], wanted))
    print("\n==== summary ====")
    print("\n".join(ck.summary))
    if ck.res["errors"]:
        print("ERRORS in sections:", [e["section"] for e in ck.res["errors"]])
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
