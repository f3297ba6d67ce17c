"""Markdown and fixed-width tables of bench results: one run, a merge of runs, or two trees compared.

Pure formatting: every number printed here is already in the document (`rlnorm.bench.runner.run`,
`rlnorm.bench.merge.merge`, `rlnorm.bench.base.compare`). `*` marks a time taken while the GPU queue ran
dry, so it includes host overhead (docs/benchmarking.md).
"""

from __future__ import annotations

from collections.abc import Sequence

LAUNCH_BOUND_US = 10.0  # a graph-timed add shorter than this is a launch, not a memory floor (H200: ~1-3 us)


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _cell(e: dict | None) -> tuple[str, str]:
    if e is None:
        return "", ""
    if e["us"] is None:
        return f"{e['status']}", ""
    star = "*" if e.get("host_bound") else ""
    return f"{e['us']:.1f}{star}", f"{_num(e['ratio'], '.2f')}x"


def format_markdown(shapes: Sequence[dict]) -> str:
    """One markdown table for all shapes (paste into a closing note), then footnotes with every reason."""
    lines = [
        "| rows | D | backend | fwd us | fwd / add | fwd+bwd us | fwd+bwd / (8/3 add) | method | eager fwd us "
        "| eager fwd+bwd us |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    notes: dict[str, list[str]] = {}  # one line per distinct message, with where it applies

    def note(msg: str, where: str) -> None:
        notes.setdefault(msg, []).append(where)

    for sh in shapes:
        names: list[str] = []
        for e in sh["entries"]:
            if e["name"] not in names:
                names.append(e["name"])
        for name in names:
            by = {e["mode"]: e for e in sh["entries"] if e["name"] == name}
            f, fb = by.get("fwd"), by.get("fwd_bwd")
            fus, fr = _cell(f)
            bus, br = _cell(fb) if name != "torch.add" else ("", "")
            methods = "/".join(dict.fromkeys(e["method"] for e in (f, fb) if e and e.get("method")))
            wf = _num(f["wall_us"], ".1f") if f else ""
            wb = _num(fb["wall_us"], ".1f") if fb else ""
            lines.append(
                f"| {sh['rows']} | {sh['d']} | {name} | {fus} | {fr} | {bus} | {br} | {methods} | {wf} | {wb} |"
            )
            for e in (f, fb):
                if e is None:
                    continue
                where = f"{sh['rows']}x{sh['d']} {e['mode']}"
                if e["status"] != "ok":
                    note(f"{name}: {e['status']}: {e['reason']}", where)
                elif e.get("method") == "events" and sh.get("graph_tried"):
                    note(f"{name}: events, not graph: {e['method_reason']}", where)
                if e.get("host_bound"):
                    note(f"{name}: * the GPU queue ran dry while timing, so the time includes host overhead", where)
        for mode, fp in (sh.get("fastest_peer") or {}).items():
            if fp and fp.get("rlnorm_over_fastest") is not None:
                same = "" if fp["same_method"] else " (different clocks)"
                w = fp.get("wall") or {}
                eager = (
                    f"; eager {w['rlnorm_over_fastest']:.2f}x ({w['name']}, {w['us']:.1f} us)"
                    if w.get("rlnorm_over_fastest") is not None
                    else ""
                )
                note(
                    f"rows={sh['rows']} D={sh['d']} {mode}: rlnorm {fp['rlnorm_over_fastest']:.2f}x the fastest peer "
                    f"({fp['name']}, {fp['us']:.1f} us, {fp['method']}){same}{eager}",
                    "",
                )
    everywhere = sorted({f"{sh['rows']}x{sh['d']} {m}" for sh in shapes for m in ("fwd", "fwd_bwd")})

    def places(w: list[str]) -> str:
        if not any(w):
            return ""
        return " [every shape]" if sorted(set(w)) == everywhere else f" [{', '.join(w)}]"

    # the add's graph-timed entry per shape (a run's or a merge's): a graph times large shapes too
    # (--graph-max-rows), and only a short add is a launch rather than a memory floor
    graph_add = {
        f"{sh['rows']}x{sh['d']}": e["us"]
        for sh in shapes
        for e in sh["entries"]
        if e["name"] == "torch.add" and e.get("method") == "graph" and e["us"] is not None
    }
    if graph_add:
        small = [k for k, us in graph_add.items() if us < LAUNCH_BOUND_US]
        large = [k for k, us in graph_add.items() if us >= LAUNCH_BOUND_US]
        if small:
            note(
                f"graph rows, add under {LAUNCH_BOUND_US:g} us ({', '.join(small)}): GPU time per call inside a "
                "CUDA graph; there the add is launch-bound (~1-3 us), so x add ratios compare with one launch, "
                "not a memory floor: read the fastest-peer lines.",
                "",
            )
        if large:
            note(
                f"graph rows, add of {LAUNCH_BOUND_US:g} us or more ({', '.join(large)}): GPU time per call "
                "inside a CUDA graph, with no host time in it; the add there is the memory floor.",
                "",
            )
        note("Eager columns: back-to-back Python calls, host overhead included.", "")
    out = ["", *(f"- {m}{places(w)}" for m, w in notes.items())]
    return "\n".join(lines + (out if notes else []))


def format_table(shape: dict) -> str:
    """A fixed-width table of one shape (the progress print): GPU time, ratio, method, wall."""
    add_bits = ", ".join(f"{m} {t['us']:.2f}" for m, t in shape["add"].items())
    head = f"rows={shape['rows']} D={shape['d']} {shape['dtype']}: torch.add us ({add_bits})"
    lines = [
        head,
        f"{'backend':<22} {'mode':<8} {'us':>9} {'p20':>9} {'p80':>9} {'x floor':>8} {'GB/s':>7} "
        f"{'method':<7} {'wall us':>9}",
    ]
    for e in shape["entries"]:
        if e["us"] is None:
            lines.append(f"{e['name']:<22} {e['mode']:<8} {e['status']}: {e['reason'][:200]}")
            continue
        times = f"{e['us']:>9.2f} {e['us_p20']:>9.2f} {e['us_p80']:>9.2f}"
        hb = "*" if e.get("host_bound") else " "
        lines.append(
            f"{e['name']:<22} {e['mode']:<8} {times} {_num(e['ratio'], '.3f'):>8} {_num(e['gbps'], '.0f'):>7} "
            f"{e['method'] + hb:<7} {_num(e['wall_us'], '.1f'):>9}"
        )
    return "\n".join(lines)


def format_footer(doc: dict) -> str:
    """One line: where and on what code a run (or a merge) was timed."""
    env = doc.get("environment") or {}
    libs = env.get("libraries") or {}
    commit = doc.get("commit")
    if commit is None and doc.get("sources"):
        commit = "/".join(dict.fromkeys(str(s.get("commit")) for s in doc["sources"]))
    dirty = " (dirty)" if doc.get("tracked_tree_dirty") else ""
    wall = f" | {doc['wall_time_s']} s" if doc.get("wall_time_s") is not None else ""
    return f"{env.get('gpu')} | torch {libs.get('torch')} | triton {libs.get('triton')} | commit {commit}{dirty}{wall}"


def _pair(e: dict | None) -> str:
    if e is None:
        return "-"
    if e.get("us") is None:
        return e.get("status", "-")
    star = "*" if e.get("host_bound") else ""
    ratio = f" ({e['ratio']:.3f}x)" if e.get("ratio") is not None else ""
    return f"{e['us']:.2f}{star}{ratio}"


def _over(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.3f}"


def format_base(doc: dict) -> str:
    """The kernel of two trees side by side per shape and mode: time (x its own run's add), and head / base
    both of the times and of the ratios (the ratio cancels a process that ran slow throughout)."""
    base, head = doc["base"], doc["head"]
    dirty = " dirty" if head.get("tracked_tree_dirty") else ""
    lines = [
        f"base: {base['label']} (kernel of commit {str(base.get('commit'))[:12]})",
        f"head: {head['label']} (commit {str(head.get('commit'))[:12]}{dirty})",
        "",
        "| rows | D | mode | clock | base us (x add) | head us (x add) | head / base us | head / base x add |",
        "|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        b, h = r.get("base"), r.get("head")
        clock = "/".join(dict.fromkeys(e["method"] for e in (b, h) if e and e.get("method")))
        lines.append(
            f"| {r['rows']} | {r['d']} | {r['mode']} | {clock or '-'} | {_pair(b)} | {_pair(h)} "
            f"| {_over((h or {}).get('us'), (b or {}).get('us'))} "
            f"| {_over((h or {}).get('ratio'), (b or {}).get('ratio'))} |"
        )
    lines.append("")
    lines.append(
        "- < 1: the working tree's kernel is faster. Each tree ran in a process of its own, one after the other."
    )
    if any(e and e.get("host_bound") for r in doc["rows"] for e in (r.get("base"), r.get("head"))):
        lines.append("- * the GPU queue ran dry while timing, so the time includes host overhead")
    return "\n".join(lines)
