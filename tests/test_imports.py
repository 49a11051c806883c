"""The import graph of our modules (the top-level ones, lab/ and data/), lazy imports inside functions included: no
cycle, and the core's imports go one way, as README.md draws it: lab/ and the tools -> train, generate, checkpoint
-> model -> positions -> rope (scalings, schemes and spans beside them), with config, files and runtime utilities
any of them may use."""

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
    "positions": {"rope"},  # scalings.py and schemes.py by name, where a run names them
    "schemes": {"positions", "rope"},
    "model": {"positions", "rope", "spans"},
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


def imports(name):
    """Our modules that module name imports anywhere in its text."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found |= {ours(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{MODULES[name]}:{node.lineno}: a relative import"
            found |= {ours(f"{node.module}.{alias.name}") for alias in node.names}  # from lab import grid: lab.grid
    return found - {None, name}


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
