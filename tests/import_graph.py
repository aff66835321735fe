"""One package's import graph read from its source (AST), for tests/test_architecture.py.

Every `import` and `from ... import` statement counts wherever it sits: at
module level, inside a function (the imports that hide cycles), under `if
TYPE_CHECKING:` (kept, and marked type-only). Relative imports resolve against
the importing module's package; `from pkg import mod` names the module `mod`
when `pkg/mod.py` (or `pkg/mod/`) exists, else `pkg` itself. The graph never
imports the code it reads, so it sees a broken package as it is.
"""

from __future__ import annotations

import ast
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """One imported module as one statement names it."""

    source: str
    """The importing module (dotted name)."""
    target: str
    """The imported module: one of the package's modules, or the dotted name as written for any other."""
    line: int
    internal: bool
    """The target is a module of the package."""
    names: tuple[str, ...] = ()
    """Names a `from` import takes from the target (submodules it names are imports of their own)."""
    bound: str | None = None
    """The local name bound to the target module itself (`from pkg import mod`, `import a.b as m`)."""
    type_only: bool = False
    """Under `if TYPE_CHECKING:`: a dependency of the types, not run."""

    def where(self) -> str:
        return f"line {self.line}{', type-only' if self.type_only else ''}"


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool
    lines: int
    tree: ast.Module


class ImportGraph:
    """The modules of the package under `root/<package>` and every import each one makes."""

    def __init__(self, root: Path, package: str) -> None:
        self.root = root
        self.package = package
        self.modules: dict[str, Module] = {}
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            text = path.read_text(encoding="utf-8")
            self.modules[name] = Module(name, path, is_package, len(text.splitlines()),
                                        ast.parse(text, filename=str(path)))
        self.imports: list[Import] = [i for m in self.modules.values() for i in self._imports_of(m)]

    # ------------------------------------------------------------------ reading

    def _imports_of(self, module: Module) -> Iterator[Import]:
        for node, type_only in _import_nodes(module.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = self._resolve(alias.name)
                    if target is None:
                        yield Import(module.name, alias.name, node.lineno, False, type_only=type_only)
                    elif target != module.name:
                        yield Import(module.name, target, node.lineno, True,
                                     bound=alias.asname if alias.asname and target == alias.name else None,
                                     type_only=type_only)
                continue
            base = self._absolute(module, node.level, node.module)
            if base is None:
                continue
            if not self._inside(base):
                yield Import(module.name, base, node.lineno, False,
                             tuple(a.name for a in node.names), type_only=type_only)
                continue
            names: list[str] = []
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in self.modules:
                    if submodule != module.name:
                        yield Import(module.name, submodule, node.lineno, True,
                                     bound=alias.asname or alias.name, type_only=type_only)
                else:
                    names.append(alias.name)
            target = self._resolve(base)
            if names and target is not None and target != module.name:
                yield Import(module.name, target, node.lineno, True, tuple(names), type_only=type_only)

    def _absolute(self, module: Module, level: int, name: str | None) -> str | None:
        """The absolute dotted name a (possibly relative) `from` import reads from."""
        if level == 0:
            return name
        package = module.name if module.is_package else module.name.rpartition(".")[0]
        for _ in range(level - 1):
            package = package.rpartition(".")[0]
        if not package:
            return None  # beyond the top-level package: Python raises ImportError
        return f"{package}.{name}" if name else package

    def _inside(self, name: str) -> bool:
        return name == self.package or name.startswith(self.package + ".")

    def _resolve(self, name: str) -> str | None:
        """The package's module a dotted name lands in (its longest known prefix); None outside it."""
        if not self._inside(name):
            return None
        while name not in self.modules and "." in name:
            name = name.rpartition(".")[0]
        return name if name in self.modules else None

    # ---------------------------------------------------------------- the graph

    def edges(self) -> dict[str, dict[str, list[Import]]]:
        """source -> target -> the statements importing it, for imports inside the package."""
        found: dict[str, dict[str, list[Import]]] = {m: defaultdict(list) for m in self.modules}
        for i in self.imports:
            if i.internal:
                found[i.source][i.target].append(i)
        return found

    def cycles(self) -> list[list[str]]:
        """Every set of modules that import each other in a circle (Tarjan's SCCs of 2 or more), sorted."""
        edges = self.edges()
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in sorted(edges[v]):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

        for v in sorted(edges):
            if v not in index:
                visit(v)
        return sorted(found)

    def reach(self, starts: Iterable[str], stop: Callable[[str], bool] = lambda _: False,
              ) -> dict[str, list[Import]]:
        """Every module `starts` reach by imports, with the shortest chain of imports to it (starts: []).

        Modules `stop` accepts are reached but not looked through: what lies behind them is theirs.
        """
        edges = self.edges()
        chains: dict[str, list[Import]] = {s: [] for s in starts}
        queue = deque(sorted(chains))
        while queue:
            v = queue.popleft()
            for w, statements in sorted(edges[v].items()):
                if w not in chains:
                    chains[w] = [*chains[v], statements[0]]
                    if not stop(w):
                        queue.append(w)
        return chains

    def under(self, package: str) -> list[str]:
        """`package` and every module below it."""
        return [m for m in self.modules if m == package or m.startswith(package + ".")]

    def private_uses(self, module: str) -> list[tuple[Import, str]]:
        """Private names (`_x`, not dunders) `module` takes from the package's other modules.

        Both `from m import _x` and `m._x` on a module bound by an import count.
        """
        found = [(i, n) for i in self.imports if i.source == module and i.internal
                 for n in i.names if _private(n)]
        bound = {i.bound: i for i in self.imports if i.source == module and i.internal and i.bound}
        for node in ast.walk(self.modules[module].tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name) \
                    and node.value.id in bound:
                i = bound[node.value.id]
                found.append((Import(module, i.target, node.lineno, True, (node.attr,)), node.attr))
        return sorted(found, key=lambda f: (f[0].line, f[1]))

    def relative(self, module: str) -> str:
        return self.modules[module].path.relative_to(self.root.parent).as_posix()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


ImportNode = ast.Import | ast.ImportFrom


def _import_nodes(node: ast.AST, type_only: bool = False) -> Iterator[tuple[ImportNode, bool]]:
    """Every import statement in `node`, and whether it sits under `if TYPE_CHECKING:`."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node, type_only
    elif isinstance(node, ast.If) and _is_type_checking(node.test):
        for child in node.body:
            yield from _import_nodes(child, True)
        for child in node.orelse:
            yield from _import_nodes(child, type_only)
    else:
        for child in ast.iter_child_nodes(node):
            yield from _import_nodes(child, type_only)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
