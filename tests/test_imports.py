"""The import graph of our modules (the top-level ones, lab/ and data/), lazy imports inside functions and imports by
name (importlib) included: no cycle, and the core's imports go one way, as README.md draws it: lab/ and the tools ->
train, generate, checkpoint -> model -> schemes -> positions -> scalings -> rope (spans beside them), with config,
files and runtime utilities any of them may use."""

import ast

from conftest import ROOT


def dotted(path):
    """lab/grid.py -> "lab.grid", lab/__init__.py -> "lab", train.py -> "train"."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {dotted(p): p for p in [*ROOT.glob("*.py"), *ROOT.glob("lab/*.py"), *ROOT.glob("data/*.py")]}
UTILITIES = {"config", "files", "runtime"}
BELOW = {  # what each core module may import besides UTILITIES (files: nothing of ours at all)
    "rope": set(),
    "scalings": {"rope"},
    "spans": set(),
    "positions": {"rope", "scalings"},  # scalings.py where a run names a scaling
    "schemes": {"positions", "rope"},
    "model": {"positions", "rope", "schemes", "spans"},  # schemes.py where a run names one of its schemes
    "hf": {"model", "positions", "rope", "scalings", "data.hub"},  # transformers interop, under --init_from
    "generate": {"model", "positions", "rope", "scalings", "spans"},
    "checkpoint": {"model"},
    "run_setup": {"checkpoint", "source", "model", "optim", "progress", "data.batches", "data.tokenizer"},
    "train": {"checkpoint", "run_setup", "model", "optim", "trackers", "data.batches", "data.loader", "data.tokenizer"},
}


def ours(name):
    """The longest of our modules that the dotted name is or lies in ("lab.grid.Grid" -> "lab.grid"), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def by_name(tree):
    """Our modules that a module importing by name (importlib.import_module) may reach: every string constant in its
    text that names one of them or something in one ("data.recall.RecallTask"), as a table of tasks does."""
    calls = any(isinstance(node, ast.Attribute) and node.attr == "import_module" for node in ast.walk(tree))
    strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    return {ours(s) for s in strings if "." in s or s in MODULES} if calls else set()


def imports(name):
    """Our modules that module name imports anywhere in its text, by a statement or by name."""
    tree = ast.parse(MODULES[name].read_text())
    found = by_name(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {ours(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{MODULES[name]}:{node.lineno}: a relative import"
            found |= {ours(f"{node.module}.{alias.name}") for alias in node.names}  # from lab import grid: lab.grid
    return found - {None, name}


def test_imports_by_name_are_seen():
    """The walk finds what importlib reaches: data/batches.py's tasks, by the names in its table."""
    assert "data.recall" in imports("data.batches")
    assert not by_name(ast.parse("x = 'model'"))  # a string alone is no import


def test_the_core_imports_only_what_lies_below_it():
    upward = {name: sorted(imports(name) - allowed - UTILITIES) for name, allowed in BELOW.items()}
    upward["files"] = sorted(imports("files"))
    assert not any(upward.values()), upward


def test_no_two_modules_import_each_other_even_lazily():
    graph = {name: imports(name) for name in MODULES}
    done, cycles = set(), []

    def visit(name, path):
        if name in path:
            cycles.append(path[path.index(name) :] + [name])
            return
        if name not in done:
            for other in sorted(graph[name]):
                visit(other, path + [name])
            done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert not cycles
