"""The house's rule, checked: a package imports only the packages below it (docs/architecture.md
draws the same graph). Lazy imports inside functions count too: an arrow is an arrow."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "hiercoll"

# Each package (a subpackage, or a top-level module) and what it may import besides itself.
# Read bottom-up: the IR (schedule) and the cluster description (topology) know nothing above
# them; the simulator knows the IR and the topology; the planner may ask the simulator (the
# auto-picker); the backends (executor) know the IR and the kernels but no planner; the harness
# drives backends over planned cases; the CLI sits on top.
BASE = {"errors", "units", "files", "gcpause", "progress", "trusted_models"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "units": {"errors"},
    "files": set(),
    "gcpause": set(),
    "progress": set(),
    "trusted_models": set(),              # pydantic models from checked values (no validation)
    "collectives": {"errors", "gcpause", "trusted_models"},
    "topology": {"errors", "units"},
    "schedule": {"collectives", "errors"},
    "schedule_io": {"collectives", "errors", "schedule"},
    "schedule_arrays": {"schedule"},      # the IR's ops as arrays (the compiled simulator's input)
    "ll_protocol": {"schedule"},          # which plans the LL protocol runs (executor, simulator)
    "kernels": set(),
    "sim": BASE | {"collectives", "schedule", "schedule_arrays", "ll_protocol", "topology"},
    "planner": BASE | {"collectives", "schedule", "schedule_io", "schedule_arrays", "topology",
                       "sim", "ll_protocol"},
    "plan_file": BASE | {"collectives", "schedule", "schedule_io", "topology", "planner"},
    "executor": BASE | {"collectives", "schedule", "kernels", "sim", "ll_protocol"},
    "calibration": BASE | {"collectives", "schedule", "topology", "sim", "planner", "ll_protocol"},
    "workloads": BASE | {"collectives", "schedule", "topology", "sim", "planner"},
    "harness": BASE | {"collectives", "schedule", "topology", "planner", "plan_file", "executor",
                       "kernels"},
    "export": BASE | {"collectives", "schedule", "topology", "sim", "planner", "plan_file"},
    "cli": BASE | {"collectives", "schedule", "schedule_io", "topology", "sim", "planner",
                   "plan_file", "executor", "kernels", "harness", "calibration", "workloads", "export",
                   "torch"},
    "data": set(),
    "torch": BASE | {"collectives", "schedule", "schedule_io", "topology", "sim", "planner",
                     "plan_file", "executor", "kernels", "harness"},   # the communicator
}
FACADES = {"__init__", "__main__"}     # hiercoll/__init__.py re-exports the API; -m runs the CLI


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "hiercoll" and len(parts) > 1:
                found.add(parts[1])
    return found


def violations() -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        pkg = _package_of(path)
        if pkg in FACADES:
            continue
        assert pkg in ALLOWED, f"{path}: package {pkg!r} has no place in the house (ALLOWED)"
        for target in sorted(_imports(path) - {pkg} - ALLOWED[pkg]):
            out.append(f"{path.relative_to(ROOT.parent)}: {pkg} imports {target}")
    return out


def test_no_package_imports_one_it_may_not() -> None:
    assert violations() == []


def test_the_allowed_graph_has_no_cycle() -> None:
    """A layering, not a tangle: every allowed arrow points strictly down."""
    seen: dict[str, int] = {}

    def depth(pkg: str, trail: tuple[str, ...] = ()) -> int:
        assert pkg not in trail or pkg in ("schedule", "schedule_io"), f"cycle: {trail + (pkg,)}"
        if pkg in trail:
            return 0
        if pkg not in seen:
            seen[pkg] = 1 + max((depth(t, trail + (pkg,)) for t in ALLOWED[pkg]), default=0)
        return seen[pkg]

    for pkg in ALLOWED:
        depth(pkg)
    assert seen["cli"] > seen["harness"] > seen["executor"] > seen["schedule"]
    assert "planner" not in ALLOWED["executor"] and "sim" not in ALLOWED["schedule"]


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from hiercoll.cli.common import console\n")
    assert _imports(bad) == {"cli"}


# ---- no two modules import each other ---------------------------------------------------------
# none left (the last, topology fabric <-> model, went when the tier layout moved below both)
KNOWN_CIRCLES: set[tuple[str, str]] = set()


def _module_graph() -> dict[str, set[str]]:
    mods: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path

    def resolve(dotted: str) -> str | None:
        parts = dotted.split(".")
        return next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
                     if ".".join(parts[:i]) in mods), None)

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            out |= {r for t in targets if t.startswith("hiercoll") and (r := resolve(t))}
        graph[name] = out - {name}
    return graph


def test_no_two_modules_import_each_other() -> None:
    """An import circle between two modules (lazy or for types only) is a piece that belongs
    below both: move it down instead (issue 30 found seven)."""
    graph = _module_graph()
    circles = {tuple(sorted((a, b))) for a, outs in graph.items() for b in outs
               if a in graph.get(b, set()) and "hiercoll" not in (a, b)}   # the API facade
    assert circles - KNOWN_CIRCLES == set()
