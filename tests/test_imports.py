"""The import graph of the top-level modules, lazy imports inside functions included: no cycle, and the core's
imports go one way, tools -> train -> checkpoint -> hf -> model -> positions -> rope (DESIGN.md)."""

import ast

from conftest import ROOT

MODULES = {p.stem: p for p in ROOT.glob("*.py")}
CORE = ("rope", "positions", "model", "hf", "checkpoint", "train")  # each may import only those before it


def imports(name):
    """The top-level modules of ours that module name imports anywhere in its text."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.partition(".")[0])
    return found & MODULES.keys() - {name}


def test_the_core_imports_only_what_lies_below_it():
    upward = {name: sorted(imports(name) & set(CORE[i + 1:])) for i, name in enumerate(CORE)}
    assert not any(upward.values()), upward


def test_no_two_modules_import_each_other_even_lazily():
    graph = {name: imports(name) for name in MODULES}
    done, cycles = set(), []

    def visit(name, path):
        if name in path:
            cycles.append(path[path.index(name):] + [name])
            return
        if name not in done:
            for other in sorted(graph[name]):
                visit(other, path + [name])
            done.add(name)
    for name in sorted(graph):
        visit(name, [])
    assert not cycles
