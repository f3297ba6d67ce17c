"""The package's layers hold: the kernel at the bottom, the shared yardsticks, the check kit, reports, and the
command lines on top. A module imports only from its own layer or below, no import cycle exists (function-level
imports count), no private name crosses a module boundary, and modules outside the kernel fit in a head.

The checker reads source files as text (AST), so it runs without importing anything, and each rule is proven
below on a small planted package that breaks it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from conftest import REPO_ROOT

# Bottom to top. A prefix names a module and everything below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kernel", ("rlnorm.options", "rlnorm.kernel")),
    ("yardsticks", ("rlnorm.checkout", "rlnorm.inputs", "rlnorm.reference", "rlnorm.numerics", "rlnorm.timing")),
    ("integrations", ("rlnorm.integrations",)),
    ("kit", ("rlnorm.kit",)),
    ("report", ("rlnorm.report",)),
    ("commands", ("rlnorm.cli", "rlnorm.__main__")),
)
# The package's own __init__ is its public face: it may re-export from any layer (lazily), and anything may read
# its __version__.
FACADE = "rlnorm"
MAX_LINES = 600
UNBOUNDED = ("rlnorm.kernel",)  # kernels keep a launch and its kernel together; their size is the kernel's


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    imports: list[tuple[str, int]] = field(default_factory=list)  # (target module, line)
    private: list[tuple[str, int]] = field(default_factory=list)  # (what, line): a private name taken across


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_of(mod: str, modules: dict[str, Module]) -> str:
    """The package a module sits in (itself, for a package's __init__)."""
    m = modules.get(mod)
    return mod if m is not None and m.path.name == "__init__.py" else mod.rpartition(".")[0]


def read_package(root: Path, package: str = "rlnorm") -> dict[str, Module]:
    """Every module of `package` under `root` with the package-internal imports it makes, at any depth."""
    paths = sorted((root / package).rglob("*.py"))
    modules = {
        module_name(p, root): Module(module_name(p, root), p, len(p.read_text(encoding="utf-8").splitlines()))
        for p in paths
    }
    for mod in modules.values():
        tree = ast.parse(mod.path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}  # local name -> module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == package or a.name.startswith(package + "."):
                        mod.imports.append((a.name, node.lineno))
                        aliases[a.asname or a.name] = a.name
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if not (node.module == package or node.module.startswith(package + ".")):
                    continue
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    if sub in modules:  # `from pkg import module`
                        mod.imports.append((sub, node.lineno))
                        aliases[a.asname or a.name] = sub
                    else:
                        mod.imports.append((node.module, node.lineno))
                        if _is_private(a.name) and node.module != mod.name:
                            mod.private.append((f"{node.module}.{a.name}", node.lineno))
        for node in ast.walk(tree):  # module._name, where module is an imported package module
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _is_private(node.attr):
                target = aliases.get(node.value.id)
                if target is not None and target != mod.name:
                    mod.private.append((f"{target}.{node.attr}", node.lineno))
        for target, line in mod.imports:  # a private module taken from outside its own package
            leaf = target.rpartition(".")[2]
            if _is_private(leaf) and _package_of(target, modules) != _package_of(mod.name, modules):
                mod.private.append((target, line))
    return modules


def layer_of(name: str, layers=LAYERS) -> int | None:
    for i, (_, prefixes) in enumerate(layers):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return i
    return None


def unlayered(modules: dict[str, Module], layers=LAYERS, facade: str = FACADE) -> list[str]:
    return sorted(n for n in modules if n != facade and layer_of(n, layers) is None)


def upward_imports(modules: dict[str, Module], layers=LAYERS, facade: str = FACADE) -> list[str]:
    """Imports from a higher layer than the importer's own."""
    bad = []
    for mod in modules.values():
        if mod.name == facade:
            continue
        own = layer_of(mod.name, layers)
        for target, line in mod.imports:
            if target == facade:
                continue
            their = layer_of(target, layers)
            if own is not None and their is not None and their > own:
                bad.append(f"{mod.name}:{line} imports {target} ({layers[their][0]} above {layers[own][0]})")
    return bad


def import_cycles(modules: dict[str, Module], facade: str = FACADE) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), the facade's lazy re-exports left out."""
    graph = {
        n: sorted({t for t, _ in m.imports if t in modules and t != n and t != facade}) for n, m in modules.items()
    }
    graph[facade] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_crossings(modules: dict[str, Module]) -> list[str]:
    return [f"{m.name}:{line} uses {what}" for m in modules.values() for what, line in m.private]


def oversized(modules: dict[str, Module], limit: int = MAX_LINES, unbounded=UNBOUNDED) -> list[str]:
    return [
        f"{m.name}: {m.lines} lines"
        for m in modules.values()
        if m.lines > limit and not any(m.name == u or m.name.startswith(u + ".") for u in unbounded)
    ]


# -- the repository ----------------------------------------------------------------------------------------------
MODULES = read_package(REPO_ROOT)


def test_every_module_belongs_to_a_layer():
    assert len(MODULES) > 30
    assert not unlayered(MODULES)


def test_no_module_imports_from_a_layer_above_its_own():
    assert not upward_imports(MODULES)


def test_there_is_no_import_cycle():
    assert not import_cycles(MODULES)


def test_no_private_name_crosses_a_module_boundary():
    assert not private_crossings(MODULES)


def test_modules_outside_the_kernel_fit_in_a_head():
    assert not oversized(MODULES)


def test_notebooks_only_call_into_the_package():
    """A notebook is a narrative of calls: a function or class defined in one is logic the package should hold."""
    for nb in sorted((REPO_ROOT / "notebooks").glob("*.py")):
        tree = ast.parse(nb.read_text(encoding="utf-8"))
        defined = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert not defined, f"{nb.name} defines {defined}"
        imported = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
            a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        }
        assert "rlnorm" in imported, nb.name


# -- each rule catches what it is there for -----------------------------------------------------------------------
def _planted(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    for rel, text in {"pkg/__init__.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return read_package(tmp_path, "pkg")


PLANTED_LAYERS = (("low", ("pkg.low",)), ("high", ("pkg.high",)))


def test_a_planted_upward_import_is_reported(tmp_path: Path):
    mods = _planted(tmp_path, {"pkg/low.py": "def f():\n    from pkg.high import g\n", "pkg/high.py": "g = 1\n"})
    assert upward_imports(mods, PLANTED_LAYERS, "pkg") == ["pkg.low:2 imports pkg.high (high above low)"]
    ok = _planted(tmp_path / "ok", {"pkg/low.py": "", "pkg/high.py": "from pkg.low import *\n"})
    assert upward_imports(ok, PLANTED_LAYERS, "pkg") == []


def test_a_planted_cycle_hidden_in_a_function_is_reported(tmp_path: Path):
    mods = _planted(
        tmp_path,
        {
            "pkg/a.py": "from pkg.b import x\ny = 1\n",
            "pkg/b.py": "x = 1\ndef f():\n    from pkg import c\n",
            "pkg/c.py": "def g():\n    import pkg.a\n",
        },
    )
    assert import_cycles(mods, "pkg") == [["pkg.a", "pkg.b", "pkg.c"]]


def test_a_planted_private_name_across_modules_is_reported(tmp_path: Path):
    mods = _planted(
        tmp_path,
        {
            "pkg/a.py": "_hidden = 1\n",
            "pkg/b.py": "from pkg.a import _hidden\nfrom pkg import a\nprint(a._hidden, a.__name__)\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/_impl.py": "x = 1\n",
            "pkg/sub/api.py": "from pkg.sub._impl import x\n",  # a private module inside its own package: fine
            "pkg/c.py": "from pkg.sub._impl import x\n",  # from outside it: not
        },
    )
    assert sorted(private_crossings(mods)) == [
        "pkg.b:1 uses pkg.a._hidden",
        "pkg.b:3 uses pkg.a._hidden",
        "pkg.c:1 uses pkg.sub._impl",
    ]


def test_a_planted_long_module_and_an_unlayered_one_are_reported(tmp_path: Path):
    mods = _planted(tmp_path, {"pkg/low.py": "x = 1\n" * 601, "pkg/stray.py": ""})
    assert oversized(mods, unbounded=()) == ["pkg.low: 601 lines"]
    assert oversized(mods, unbounded=("pkg.low",)) == []
    assert unlayered(mods, PLANTED_LAYERS, "pkg") == ["pkg.stray"]
