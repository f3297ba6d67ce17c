"""Markdown and fixed-width tables of benchmark documents (a run, a merge, two kernels compared).

Pure formatting: every number printed is already in the document. `*` marks a time taken while the GPU
queue ran dry, so it includes host overhead (docs/benchmarking.md).
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
        return e["status"], ""
    return f"{e['us']:.1f}{'*' if e.get('host_bound') else ''}", f"{_num(e['ratio'], '.2f')}x"


def format_markdown(shapes: Sequence[dict]) -> str:
    """One markdown table for all shapes (to paste into a note), then one footnote per distinct reason."""
    lines = [
        "| rows | D | backend | fwd us | fwd / add | fwd+bwd us | fwd+bwd / (8/3 add) | method | eager fwd us "
        "| eager fwd+bwd us |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    notes: dict[str, list[str]] = {}
    graph_adds: dict[str, float] = {}  # the graph-timed add per shape
    for sh in shapes:
        where = f"{sh['rows']}x{sh['d']}"
        for name in dict.fromkeys(e["name"] for e in sh["entries"]):
            by = {e["mode"]: e for e in sh["entries"] if e["name"] == name}
            f, fb = by.get("fwd"), by.get("fwd_bwd")
            methods = "/".join(dict.fromkeys(e["method"] for e in (f, fb) if e and e.get("method")))
            walls = [_num(e["wall_us"], ".1f") if e else "" for e in (f, fb)]
            lines.append(
                f"| {sh['rows']} | {sh['d']} | {name} | {' | '.join(_cell(f))} | {' | '.join(_cell(fb))} "
                f"| {methods} | {walls[0]} | {walls[1]} |"
            )
            for e in (f, fb):
                if e is None:
                    continue
                if e["status"] != "ok":
                    notes.setdefault(f"{name}: {e['status']}: {e['reason']}", []).append(f"{where} {e['mode']}")
                elif e.get("method") == "events" and sh.get("graph_tried"):
                    notes.setdefault(f"{name}: events, not graph: {e['method_reason']}", []).append(where)
                if name == "torch.add" and e.get("method") == "graph" and e["us"] is not None:
                    graph_adds[where] = e["us"]
        for mode, fp in (sh.get("fastest_peer") or {}).items():
            if fp and fp.get("rlnorm_over_fastest") is not None:
                w = fp.get("wall") or {}
                eager = (
                    ""
                    if w.get("rlnorm_over_fastest") is None
                    else (f"; eager {w['rlnorm_over_fastest']:.2f}x ({w['name']}, {w['us']:.1f} us)")
                )
                same = "" if fp["same_method"] else " (different clocks)"
                text = (
                    f"rows={sh['rows']} D={sh['d']} {mode}: rlnorm {fp['rlnorm_over_fastest']:.2f}x the fastest "
                    f"peer ({fp['name']}, {fp['us']:.1f} us, {fp['method']}){same}{eager}"
                )
                notes.setdefault(text, [])
    if any(e.get("host_bound") for sh in shapes for e in sh["entries"]):
        notes.setdefault("* the GPU queue ran dry while timing, so the time includes host overhead", [])
    if any(us < LAUNCH_BOUND_US for us in graph_adds.values()):
        notes[
            "graph: GPU time per call in a CUDA graph; an add under 10 us there is one launch, not a memory floor: "
            "read the fastest-peer lines (docs/benchmarking.md)"
        ] = []
    out = [f"- {m}" + (f" [{', '.join(dict.fromkeys(w))}]" if w else "") for m, w in notes.items()]
    return "\n".join([*lines, *(["", *out] if out else [])])


def format_footer(doc: dict) -> str:
    """One line: where and on what code a run (or a merge) was timed."""
    env = doc.get("environment") or {}
    libs = env.get("libraries") or {}
    commit = doc.get("commit") or "/".join(dict.fromkeys(str(s.get("commit")) for s in doc.get("sources", [])))
    dirty = " (dirty)" if doc.get("tracked_tree_dirty") else ""
    wall = f" | {doc['wall_time_s']} s" if doc.get("wall_time_s") is not None else ""
    return f"{env.get('gpu')} | torch {libs.get('torch')} | triton {libs.get('triton')} | commit {commit}{dirty}{wall}"


def _pair(e: dict | None) -> str:
    if not e or e.get("us") is None:
        return (e or {}).get("status", "-")
    ratio = f" ({e['ratio']:.3f}x)" if e.get("ratio") is not None else ""
    return f"{e['us']:.2f}{'*' if e.get('host_bound') else ''}{ratio}"


def _over(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def format_base(doc: dict) -> str:
    """Two trees' kernels per shape and mode: time (x its own run's add), and head / base of both."""
    base, head = doc["base"], doc["head"]
    dirty = " dirty" if head.get("tracked_tree_dirty") else ""
    lines = [
        f"base: {base['label']} (kernel of commit {str(base.get('commit'))[:12]})",
        f"head: {head['label']} (commit {str(head.get('commit'))[:12]}{dirty})",
        "",
        "| rows | D | mode | base us (x add) | head us (x add) | head / base us | head / base x add |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        b, h = r.get("base") or {}, r.get("head") or {}
        lines.append(
            f"| {r['rows']} | {r['d']} | {r['mode']} | {_pair(b)} | {_pair(h)} | {_over(h.get('us'), b.get('us'))} "
            f"| {_over(h.get('ratio'), b.get('ratio'))} |"
        )
    lines.append(
        "\n- < 1: the working tree's kernel is faster. Each tree ran in a process of its own, one after the other."
    )
    return "\n".join(lines)
