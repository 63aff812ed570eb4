"""The package's import graph: no cycles between modules or between top-level folders, no private names across
modules, layers that only look down, lazy imports."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from dane.layout import scripts_in
import runs
from helpers import REPO

PACKAGES = ("dane", "baselines", "experiments", "synthetic", "paper_figs")
ABOVE_DANE = ("baselines", "experiments", "synthetic", "paper_figs", "scripts")
#: docs/extending.md's layers ("Layout") and docs/design.md's ("Layers"), from the bottom: each name a module or a
#: folder (a name stands for the modules under it; the longest that matches decides: ``dane.numerics.linalg`` sits
#: below the rest of ``dane.numerics``, ``dane.split.cut`` below the rest of ``dane.split``), and ``dane.__init__``
#: the package ``dane`` alone, not what lies under it.  A module imports only from its layer and those below, and
#: every module has a layer (`test_every_module_has_a_layer`).
LAYERS = (
    ("dane.__init__", "dane.layout", "dane.errors", "dane.checks", "dane.losses", "dane.seeds", "dane.work",
     "dane.numerics.linalg", "dane.records"),
    ("dane.comm", "dane.compress"),
    ("dane.data", "dane.problems", "dane.numerics", "dane.sampling", "dane.models", "dane.split.cut"),
    ("dane.algorithm", "dane.safeguard_rules", "dane.safeguard", "dane.dane", "baselines"),
    ("dane.run_config", "dane.loop", "dane.api", "dane.split"),
    ("experiments", "synthetic", "paper_figs", "scripts"),
)


@functools.cache
def modules(root: Path = REPO) -> dict[str, Path]:
    """Module name -> file of the `PACKAGES` under ``root``, found once per session (read, never changed)."""
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def repo_name(module: str) -> str:
    """``dane.baselines.x`` as the checkout names its file, ``baselines.x`` (the mapped parts: dane/layout.py)."""
    head, _, rest = module.partition(".")
    return rest if head == "dane" and rest.split(".")[0] in PACKAGES[1:] else module


@functools.cache
def parsed(text: str) -> ast.Module:
    """A module's tree, parsed once per text in the session (every check of this file walks the same files)."""
    return ast.parse(text)


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import statement in the file, function-level ones included."""
    out = []
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(parsed(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(repo_name(alias.name), []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = package[:len(package) - node.level + 1] if node.level else []
            module = repo_name(".".join(base + ([node.module] if node.module else [])))
            names = [alias.name for alias in node.names]
            # "from . import x" names a submodule: an edge to it
            out += [(f"{module}.{n}", []) for n in names if f"{module}.{n}" in known]
            out.append((module, [n for n in names if f"{module}.{n}" not in known]))
    return out


def graph() -> dict[str, set[str]]:
    """The checkout's module graph, a fresh copy of the one built once per session (`import_edges`)."""
    return {name: set(targets) for name, targets in import_edges().items()}


@functools.cache
def checkout_imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """`imports` of a module of the checkout (or of scripts/), read once per session."""
    return imports(name, path, modules())


@functools.cache
def import_edges() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for target, _ in checkout_imports(name, path):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def folders(edges: dict[str, set[str]], depth: int = 1) -> dict[str, set[str]]:
    """The graph between folders: a -> b when a module of a imports one of b.  ``depth`` 1: the top-level folders
    (``dane``, ``baselines``, ...); 2: ``dane``'s folders (``dane.loop``, ``dane.comm``, ...), each of its top-level
    modules a node of its own.

    Each folder can be free of module cycles while two folders import each other (a.x -> b.y, b.z -> a.w); then
    neither is below the other, and the layers of docs/extending.md's layout do not hold."""
    def node(module: str) -> str:
        return ".".join(module.split(".")[:depth])

    out: dict[str, set[str]] = {}
    for src, dsts in edges.items():
        top = node(src)
        out.setdefault(top, set()).update(node(d) for d in dsts if node(d) != top)
    for dsts in list(out.values()):
        for d in dsts:
            out.setdefault(d, set())
    return out


def layer(module: str, layers=LAYERS) -> int | None:
    """The layer (1 at the bottom) of ``module`` in ``layers``, by the longest name that is it or holds it
    (``pkg.__init__`` is the package ``pkg`` and holds nothing)."""
    found = [(len(name), number) for number, names in enumerate(layers, 1) for name in names
             if module == name or f"{module}.__init__" == name or module.startswith(name + ".")]
    return max(found)[1] if found else None


def upward(edges: dict[str, set[str]], layers=LAYERS) -> list[tuple[str, int, str, int]]:
    """(module, its layer, module imported, that one's layer) for every import of a layer above."""
    return sorted((src, layer(src, layers), dst, layer(dst, layers)) for src, dsts in edges.items() for dst in dsts
                  if layer(src, layers) is not None and layer(dst, layers) is not None
                  and layer(dst, layers) > layer(src, layers))


def test_the_graph_finds_a_cycle_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_folder_graph_finds_a_cycle_the_module_graph_cannot_see():
    edges = {"a.x": {"b.y"}, "b.y": set(), "b.z": {"a.w"}, "a.w": set(), "c.v": {"a.x"}}
    assert cycles(edges) == []
    assert cycles(folders(edges)) == [["a", "b"]]


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_no_import_cycles_between_folders():
    edges = graph()
    circles = cycles(folders(edges))
    crossing = sorted((src, dst) for src, dsts in edges.items() for dst in dsts for circle in circles
                      if src.split(".")[0] in circle and dst.split(".")[0] in circle
                      and src.split(".")[0] != dst.split(".")[0])
    assert circles == [], f"folders that import each other: {circles}; the imports between them: {crossing}"


def test_no_import_cycles_between_the_folders_of_dane():
    """``dane.loop`` and ``dane.comm`` ... each below or above another, never both (the run's spec, reference and
    asynchronous kinds once sat beside ``dane.loop`` and imported from it while it imported them)."""
    edges = {src: {d for d in dsts if d.split(".")[0] == "dane"} for src, dsts in graph().items()
             if src.split(".")[0] == "dane"}
    assert cycles(folders(edges, depth=2)) == []


def test_dane_imports_nothing_from_the_layers_above_it():
    upward = sorted((src, dst) for src, dsts in graph().items() if src.split(".")[0] == "dane"
                    for dst in dsts if dst.split(".")[0] in ABOVE_DANE)
    assert upward == []


def test_the_layer_check_finds_an_import_from_above(tmp_path):
    """An import of a layer above, at a module's top or inside a function, is found; one of the same layer or below,
    or of a module no layer names, is not."""
    layers = (("low",), ("mid", "low.up"), ("top",))
    assert [layer(m, layers) for m in ("low", "low.x", "low.up", "low.up.y", "mid.z", "top", "lower", "other")] == [
        1, 1, 2, 2, 2, 3, None, None]
    assert [layer(m, (("pkg.__init__",), ("pkg.x",))) for m in ("pkg", "pkg.x", "pkg.y", "pkg.__init__")] == [
        1, 2, None, 1]  # the package alone, not what lies under it
    for name, text in {"low/__init__.py": "", "low/x.py": "def f():\n    from top import t\n",
                       "low/up.py": "import mid\n", "mid.py": "from low import x\nimport other\n",
                       "top.py": "", "other.py": "import top\n"}.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    known = {"low": tmp_path / "low/__init__.py", "low.x": tmp_path / "low/x.py", "low.up": tmp_path / "low/up.py",
             "mid": tmp_path / "mid.py", "top": tmp_path / "top.py", "other": tmp_path / "other.py"}
    edges = {name: {target for target, _ in imports(name, path, known)} for name, path in known.items()}
    assert upward(edges, layers) == [("low.x", 1, "top", 3)]


#: the pages that list the layers: (page, its section)
LAYER_PAGES = (("extending.md", "Layout"), ("design.md", "Layers"))


def layout_list(page: str = "extending.md", heading: str = "Layout") -> dict[int, list[str]]:
    """A page's numbered list of the layers (docs/extending.md's "Layout", docs/design.md's "Layers"): item number ->
    the paths it names (in backticks, with a / or a .py)."""
    section = (REPO / "docs" / page).read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |^$)", section, re.M | re.S)
    return {int(n): [p for p in re.findall(r"`([^`]+)`", body) if "/" in p or p.endswith(".py")] for n, body in items}


@pytest.mark.parametrize("page, heading", LAYER_PAGES, ids=[page for page, _ in LAYER_PAGES])
def test_the_layout_list_names_files_that_exist_each_in_its_layer(page, heading):
    """Every path the page's layers name exists (extending.md named ``api.py`` under dane/loop/ and ``results.py``
    among dane/numerics/), sits in the layer `LAYERS` gives it, and every name of `LAYERS` is on the page in its layer
    (design.md once put baselines/ and synthetic/ above all of dane/, so that a method could have imported the run)."""
    named = layout_list(page, heading)
    assert sorted(named) == list(range(1, len(LAYERS) + 1))
    assert [p for paths in named.values() for p in paths if not (REPO / p).exists()] == []
    module = {p: p.removesuffix("/").removesuffix(".py").replace("/", ".") for paths in named.values() for p in paths}
    assert [(p, n, layer(module[p])) for n, paths in named.items() for p in paths if layer(module[p]) != n] == []
    assert [(name, n) for n, names in enumerate(LAYERS, 1) for name in names
            if name not in {module[p] for p in named[n]}] == []


def test_every_module_has_a_layer():
    """Every module of ``dane/``, ``baselines/``, ``experiments/``, ``synthetic/``, ``paper_figs/`` and ``scripts/`` is
    in a layer of `LAYERS`, so the layer check reads all of them (``dane.algorithm``, ``dane.safeguard``,
    ``dane.models``, ``dane.split``, ``dane.compress``, the rest of ``dane.numerics`` and ``dane.records`` ... were in
    none, their imports unchecked)."""
    scripts = {f"scripts.{p.relative_to(REPO / 'scripts').with_suffix('')}".replace("/", ".")
               for p in (REPO / "scripts").rglob("*.py")}
    assert sorted(m for m in [*modules(), *scripts] if layer(m) is None) == []


def test_no_module_imports_from_a_layer_above_it():
    """docs/extending.md's layers (`LAYERS`): a problem does not call the run, an algorithm not the run loop."""
    assert upward(graph()) == []


def test_no_private_name_is_imported_from_another_module():
    known = modules()
    scripts = {f"scripts.{p.stem}": p for p in (REPO / "scripts").glob("*.py")}
    taken = sorted((name, target, n) for name, path in {**known, **scripts}.items()
                   for target, names in checkout_imports(name, path) for n in names
                   if n.startswith("_") and not n.startswith("__") and target.split(".")[0] in PACKAGES)
    assert taken == []


#: private names of other libraries' objects the package uses: a torch sparse tensor's ``_nnz``, a namedtuple's
#: ``_replace``, ``_asdict``, ``_fields`` and ``_make``, a Hydra config's ``_target_``
FOREIGN_PRIVATE = frozenset({"_nnz", "_replace", "_asdict", "_fields", "_make", "_target_"})
#: libraries whose private functions the package calls by their module (``torch._foreach_add_``)
FOREIGN_ROOTS = frozenset({"torch"})


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_in(node: ast.ClassDef) -> set[str]:
    """The names a class's body defines: its methods, inner classes and class attributes."""
    names = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        targets = item.targets if isinstance(item, ast.Assign) else [item.target] \
            if isinstance(item, ast.AnnAssign) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def own_private(tree: ast.Module) -> set[str]:
    """The private attributes a module defines: set on ``self`` or ``cls``, or named in a class's body."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) \
                and node.value.id in ("self", "cls"):
            own.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            own.update(defined_in(node))
    return {name for name in own if private(name)}


def on_super(node: ast.Attribute) -> bool:
    """Whether ``node`` is ``super()._name``."""
    return isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id == "super"


def private_attributes(path: Path) -> list[tuple[int, str]]:
    """(line, ``X._name``) for each private attribute, read or set, that is another module's private part: of an
    object X other than ``self`` or ``cls`` that the module does not define itself (`own_private`); of ``self`` or
    ``cls`` that it neither sets nor defines (a base class's elsewhere); ``super()._name`` that no other class of the
    module defines, even where this class overrides it.  A hook that a subclass in another module calls is public,
    named as a hook in its base's docstring (`dane.comm.base.Communicator.count_allreduce`)."""
    tree = parsed(path.read_text())
    own, found = own_private(tree), set()
    classes = [(node.lineno, node.end_lineno, defined_in(node)) for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef)]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not private(node.attr) or node.attr in FOREIGN_PRIVATE:
            continue
        if on_super(node):  # defined by another class of this module (the innermost around it is its own)?
            here = max((c for c in classes if c[0] <= node.lineno <= c[1]), key=lambda c: c[0], default=None)
            if not any(node.attr in c[2] for c in classes if c is not here):
                found.add((node.lineno, ast.unparse(node)))
            continue
        if node.attr in own:
            continue
        root = node.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in FOREIGN_ROOTS:
            continue
        found.add((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_private_attribute_check_finds_another_modules_private_part(tmp_path):
    """Another object's private part, and a base class's private hook from another module called by a subclass
    (``self._count_allreduce`` and ``super()._counted`` once, in the simulators and the parameter server)."""
    path = tmp_path / "m.py"
    path.write_text("class A:\n    _kept = 1\n    def __init__(self):\n        self._own = 0\n"
                    "    def f(self, other, comm):\n        other._own, other._kept = self._own, torch._foreach_add\n"
                    "        comm._allreduce_mean = self._x\n        return comm._inner(), t._nnz(), cls._y\n")
    assert private_attributes(path) == [(7, "comm._allreduce_mean"), (7, "self._x"), (8, "cls._y"), (8, "comm._inner")]
    path.write_text("class Sub(Base):\n    def _counted(self):\n        return super()._counted(), self._count(1)\n"
                    "class Local:\n    def _saved(self):\n        return self._counted()\n"
                    "class Child(Local):\n    def _saved(self):\n        return super()._saved(), super()._hook()\n")
    assert private_attributes(path) == [(3, "self._count"), (3, "super()._counted"), (9, "super()._hook")]


def test_no_private_attribute_of_another_module_is_used():
    """Outside tests/, no module reaches into another's private part through an object (``comm._allreduce_mean``) or
    calls a private hook a base class in another module defines (``self._check_path``, ``super()._counted``): what
    it needs is a public name or hook there (`dane.comm.base.Communicator.allreduce_timer`)."""
    scripts = {f"scripts.{p.stem}": p for p in (REPO / "scripts").rglob("*.py")}
    used = sorted((name, line, text) for name, path in {**modules(), **scripts}.items()
                  for line, text in private_attributes(path))
    assert used == []


@pytest.mark.parametrize("step", [0, 1], ids=["import dane", "import dane.loop.launch"])
def test_imports_are_lazy(step, fresh):
    """A run imports what it uses: scikit-learn, scipy.optimize, matplotlib and Hydra are not paid for at import.
    The statements are the first steps of the session's fresh interpreter (`runs.FRESH_IMPORTS`)."""
    statement, absent, _ = runs.FRESH_IMPORTS[step]
    assert statement == ("import dane", "import dane.loop.launch")[step]
    assert set(absent) >= ({"sklearn", "scipy.optimize", "matplotlib", "hydra"} | ({"omegaconf"} if step == 0 else set()))
    loaded = set(fresh["imports"][step])
    assert sorted(m for m in absent if m in loaded) == []


def test_a_commands_help_imports_no_torch(fresh):
    """``dane --help``, ``dane train --help`` (Hydra's page: the config composed), ``simulate``, ``figures``, ``bench``,
    ``calibrate`` and every figure's ``dane figures NAME --help`` print their help without torch, run in turn in a fork
    of the session's fresh interpreter after ``import dane`` (`runs.FRESH_FORKS`); ``bench --help`` lists the
    benchmarks and exits 2.  Each command's row says whether torch was loaded after it: the first that loads it fails
    by name."""
    (statement, absent), = runs.FRESH_FORKS
    assert "runs.helps()" in statement and absent == ("torch",)
    helps = runs.helps()
    figures = scripts_in("paper_figs")
    assert helps == (("--help",), ("train", "--help"), ("simulate", "--help"), ("figures", "--help"),
                     ("bench", "--help"), ("calibrate", "--help"), *(("figures", name, "--help") for name in figures))
    assert {"compressed", "fednl_bits", "local_work", "newton_family", "target_table", "make_all"} <= set(figures)
    answer = fresh["forks"][0]
    assert "error" not in answer, answer.get("error")
    said = {" ".join(argv): row for argv, row in zip(helps, answer["value"], strict=True)}
    first = next((command for command, (_, loaded) in said.items() if loaded), None)
    assert first is None  # the first command whose help loaded torch
    assert {command: status for command, (status, _) in said.items()} == \
        {" ".join(argv): 2 if argv == ("bench", "--help") else 0 for argv in helps}
    # the commands ran as __main__ (runpy), which sys.modules keeps no name of: what they imported is there
    assert {"hydra", "omegaconf", "dane.experiments.train", "dane.paper_figs.common"} <= set(answer["modules"])
    assert "torch" not in answer["modules"]


def test_numba_is_imported_through_jit_alone():
    """A kernel module takes numba from `dane.numerics.jit`, whose listener keeps its compiles and cache loads off a
    simulated worker's clock (`dane.comm.meters.start_up`); one that imported numba itself would charge them."""
    known = modules()
    direct = sorted(name for name, path in known.items() for target, _ in checkout_imports(name, path)
                    if target.split(".")[0] == "numba" and name != "dane.numerics.jit")
    assert direct == []
