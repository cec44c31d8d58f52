"""Imports point one way: the README's layers, read from the source (every import, at module level or in a
function) and checked here, so an import against the direction fails the suite."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("python_backend", "scheduler_sidecar", "export", "loadtest")

# lowest first; a unit imports only units of lower layers (and itself). The README's layout table says why.
LAYERS = (
    ("python_backend", "scheduler_sidecar", "scheduler_sidecar.errors"),  # the package's __init__ is empty
    ("scheduler_sidecar.core", "scheduler_sidecar.processes", "scheduler_sidecar.native"),
    ("scheduler_sidecar.sim", "scheduler_sidecar.live", "scheduler_sidecar.systems"),
    ("scheduler_sidecar.server", "export"),
    ("loadtest",),
    ("scheduler_sidecar.experiments",),
    ("scheduler_sidecar.cli",),
)
LEVEL = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
PAPERS = "scheduler_sidecar.systems."  # one package per paper under it; none imports another


def unit(module: str) -> str:
    """The layer unit a module belongs to: the longest unit that is it or a package above it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LEVEL:
            return ".".join(parts[:n])
    raise AssertionError(f"module {module} is in no layer; add its package to LAYERS")


def paper(module: str, root: Path = REPO_ROOT) -> str | None:
    """The paper package of a module under systems/, or None for the shared modules there."""
    first = module.removeprefix(PAPERS).split(".")[0] if module.startswith(PAPERS) else ""
    return first if first and (root / PAPERS.replace(".", "/") / first).is_dir() else None


def imports(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[tuple[str, str, int]]:
    """(importing module, imported project module, line) for every import of the project under ``root``."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    # "from package import module" imports the module: count the deeper name where it is one
                    names = [f"{node.module}.{a.name}" if (root / node.module.replace(".", "/") / a.name).exists()
                             or (root / f"{node.module.replace('.', '/')}/{a.name}.py").exists() else node.module
                             for a in node.names]
                else:
                    continue
                found += [(module, name, node.lineno) for name in names if name.split(".")[0] in packages]
    return found


def violations(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    bad = []
    for importer, imported, line in imports(root, packages):
        a, b = unit(importer), unit(imported)
        if a != b and LEVEL[b] >= LEVEL[a]:
            bad.append(f"{importer}:{line} imports {imported} ({b}, layer {LEVEL[b]}; {a} is layer {LEVEL[a]})")
        pa, pb = paper(importer, root), paper(imported, root)
        if pa and pb and pa != pb:
            bad.append(f"{importer}:{line} imports {imported}: one paper's system imports another's")
    return bad


def test_imports_point_one_way():
    assert violations(REPO_ROOT) == []


def test_an_import_inside_a_function_says_what_it_defers():
    """Imports sit at the top of a module, where they show its dependencies, unless one defers a heavy package
    (torch, gRPC, matplotlib, a solver: ``accscale --help`` must not pay for them); such an import says so."""
    silent = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            lines = path.read_text().splitlines()
            for fn in ast.walk(ast.parse("\n".join(lines))):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    silent += [f"{path.relative_to(REPO_ROOT)}:{node.lineno}" for node in ast.walk(fn)
                               if isinstance(node, (ast.Import, ast.ImportFrom))
                               and not any("#" in line for line in lines[node.lineno - 2:node.end_lineno])]
    assert silent == []


def test_an_upward_import_is_caught(tmp_path):
    for module, source in {"scheduler_sidecar/__init__.py": "",
                           "scheduler_sidecar/core/__init__.py": "",
                           "scheduler_sidecar/core/engine.py": "def f():\n    from scheduler_sidecar.server import x\n",
                           "scheduler_sidecar/server/__init__.py": "",
                           "scheduler_sidecar/live/__init__.py": "import scheduler_sidecar.core.engine\n"}.items():
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(source)
    found = violations(tmp_path, ("scheduler_sidecar",))
    assert found == ["scheduler_sidecar.core.engine:2 imports scheduler_sidecar.server "
                     "(scheduler_sidecar.server, layer 3; scheduler_sidecar.core is layer 1)"]


def test_a_system_that_imports_another_is_caught(tmp_path):
    for module, source in {"scheduler_sidecar/systems/__init__.py": "",
                           "scheduler_sidecar/systems/milp_solver.py": "",
                           "scheduler_sidecar/systems/loki/__init__.py": "",
                           "scheduler_sidecar/systems/loki/milp.py": "from scheduler_sidecar.systems import milp_solver\n",
                           "scheduler_sidecar/systems/proteus/__init__.py": "",
                           "scheduler_sidecar/systems/proteus/milp.py": "from scheduler_sidecar.systems.loki import milp\n"
                           }.items():
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(source)
    assert violations(tmp_path, ("scheduler_sidecar",)) == [
        "scheduler_sidecar.systems.proteus.milp:1 imports scheduler_sidecar.systems.loki.milp: one paper's system "
        "imports another's"]
