"""Layer: pure CPU logic (the sources are read with `ast`; nothing of syncopate is imported).

The packages of `syncopate/` form layers, each importing only the ones below it
(docs/architecture.md, "Package map"): a package whose modules import each other in a circle has no
single place for its concern, and cannot be read, tested or imported apart. The unit is the
package: `syncopate.X` for a subpackage or a top-level module X, and `syncopate` for the package's
own `__init__`. Every import counts, wherever it stands: a module's top, inside a function (a lazy
import is still a dependency), under `TYPE_CHECKING`, and a module named in a string for
`importlib` (a lazy name table, a plug-in registry).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "syncopate"

_NAMED = re.compile(r"^syncopate(\.\w+)+(:\w+)?$")
"""A string that names a module for `importlib` (`syncopate.x.y`, or `syncopate.x.y:Name`)."""


def _package(module: str, root: Path) -> str:
    """The package a dotted module name belongs to: `syncopate` or `syncopate.X`."""
    parts = module.split(".")
    if len(parts) == 1:
        return "syncopate"
    head = parts[1]
    if (root / head).is_dir() or (root / f"{head}.py").exists():
        return f"syncopate.{head}"
    return "syncopate"  # an attribute of the package's __init__ (`from syncopate import __version__`)


def _logger_names(tree: ast.AST) -> set[int]:
    """The ids of string constants given to `getLogger`: a logger's name, not an import."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "getLogger":
                found.update(id(a) for a in node.args)
    return found


def _imported(path: Path, root: Path) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import in the file at `path`."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    here = parts[:-1] if parts[-1] == "__init__" else parts  # the module's dotted name
    package = here if parts[-1] == "__init__" else here[:-1]  # what a relative import starts from
    tree = ast.parse(path.read_text(), filename=str(path))
    loggers = _logger_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module == "syncopate":  # `from syncopate import x`: x a module or a name of __init__
                for alias in node.names:
                    yield f"syncopate.{alias.name}", node.lineno
            else:
                yield module, node.lineno
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _NAMED.match(node.value)
            and id(node) not in loggers
        ):
            yield node.value.partition(":")[0], node.lineno


def package_graph(root: Path = ROOT) -> dict[tuple[str, str], str]:
    """Edges between the packages under `root` (a `syncopate/` folder): (importer, imported) → the
    first place it happens, as `path:line`."""
    edges: dict[tuple[str, str], str] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        parts = rel.with_suffix("").parts
        source = "syncopate" if parts == ("syncopate", "__init__") else _package(".".join(parts), root)
        for module, line in _imported(path, root):
            if module != "syncopate" and not module.startswith("syncopate."):
                continue
            target = _package(module, root)
            if target != source:
                edges.setdefault((source, target), f"{rel.as_posix()}:{line}")
    return edges


def components(edges: dict[tuple[str, str], str]) -> list[list[str]]:
    """The strongly connected components of more than one package, each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())

    def reach(start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {n: reach(n) for n in graph}
    found: list[list[str]] = []
    placed: set[str] = set()
    for n in sorted(graph):
        if n in placed:
            continue
        component = sorted(m for m in reached[n] if n in reached[m])
        placed.update(component)
        if len(component) > 1:
            found.append(component)
    return found


def describe(component: list[str], edges: dict[tuple[str, str], str]) -> str:
    """The component's packages and each import between them, with one place it is made."""
    inside = sorted((a, b) for a, b in edges if a in component and b in component)
    lines = [f"import cycle between {', '.join(component)}:"]
    lines += [f"  {a} -> {b}  ({edges[a, b]})" for a, b in inside]
    return "\n".join(lines)


def test_the_packages_import_each_other_in_no_cycle():
    edges = package_graph()
    cycles = components(edges)
    assert not cycles, (
        "\n".join(describe(c, edges) for c in cycles)
        + "\nmove what is imported to the lower package (docs/architecture.md, Package map)"
    )


def test_the_runtime_imports_nothing_of_the_measurement():
    """A job imports the runtime (`kernels`) to call the ops; what checks and times them (`measure`:
    the references, the harness, the timing method, `bench`, `calibrate`) stands on the runtime and
    is never loaded by it. A runtime module that needs a measurement helper takes the helper down
    into the runtime."""
    edges = package_graph()
    assert ("syncopate.kernels", "syncopate.measure") not in edges, (
        f"the runtime imports the measurement package at "
        f"{edges.get(('syncopate.kernels', 'syncopate.measure'))}: move what it needs into "
        "syncopate/kernels/ (docs/architecture.md, Package map)"
    )
    assert ("syncopate.measure", "syncopate.kernels") in edges  # measurement runs the runtime's ops


def test_lazy_imports_are_seen():
    """The walk sees what a module imports only inside a function: the command line imports the
    measurement's `bench` and the dashboard on use, and the package's __init__ names its lazy
    attributes in a table."""
    edges = package_graph()
    assert ("syncopate.cli", "syncopate.measure") in edges
    assert ("syncopate.cli", "syncopate.dashboard") in edges
    assert ("syncopate", "syncopate.results_db") in edges


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "syncopate" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "syncopate"


def test_a_cycle_is_named_with_its_packages_and_an_import_of_each_edge(tmp_path):
    root = _write(
        tmp_path,
        {
            "__init__.py": "__version__ = '0'\n",
            "errors.py": "",
            "low/__init__.py": "from .rules import x\n",
            "low/rules.py": "def up():\n    from syncopate.high.things import y\n    return y\n",
            "high/__init__.py": "",
            "high/things.py": "from syncopate.low import rules\nfrom syncopate import errors, __version__\n",
            "mid.py": "import logging\nlog = logging.getLogger('syncopate.high')\n"
            "RUNNERS = {'a': 'syncopate.low.rules:Thing'}\n",
        },
    )
    edges = package_graph(root)
    assert edges == {
        ("syncopate.low", "syncopate.high"): "syncopate/low/rules.py:2",
        ("syncopate.high", "syncopate.low"): "syncopate/high/things.py:1",
        ("syncopate.high", "syncopate.errors"): "syncopate/high/things.py:2",
        ("syncopate.high", "syncopate"): "syncopate/high/things.py:2",
        ("syncopate.mid", "syncopate.low"): "syncopate/mid.py:3",
    }
    cycles = components(edges)
    assert cycles == [["syncopate.high", "syncopate.low"]]
    assert describe(cycles[0], edges) == (
        "import cycle between syncopate.high, syncopate.low:\n"
        "  syncopate.high -> syncopate.low  (syncopate/high/things.py:1)\n"
        "  syncopate.low -> syncopate.high  (syncopate/low/rules.py:2)"
    )


def test_a_layered_tree_has_no_cycle(tmp_path):
    root = _write(
        tmp_path,
        {
            "__init__.py": "def __getattr__(name):\n    from syncopate.high import things\n    return things\n",
            "low/__init__.py": "",
            "high/__init__.py": "",
            "high/things.py": "from ..low import *\n",
        },
    )
    edges = package_graph(root)
    assert set(edges) == {("syncopate", "syncopate.high"), ("syncopate.high", "syncopate.low")}
    assert components(edges) == []
