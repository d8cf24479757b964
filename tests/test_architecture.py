"""The layering rules of ``DESIGN.md``, checked on the source.

- No module imports another ortlearn package's private (underscore) module or name.
- The floors: a package imports only from its own floor or below.
- A full-batch estimator's fit imports only what it runs (its cold start).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import ortlearn

ROOT = Path(ortlearn.__file__).parent

#: Floor of each package (top-level modules are packages of their own): a module
#: may import from its own floor or a lower one, never from a higher one.
FLOORS = {
    "exceptions": 0, "graph": 0, "log": 0, "lazy": 0,
    "autodiff": 1,
    "convert": 2, "loss": 2, "optim": 2, "fileio": 0, "web": 0,
    "training": 3,
    "artifacts": 4, "onnxblock": 4, "api": 4, "estimators": 4, "torch": 4, "compat": 4,
    "parallel": 4,
    "__main__": 5, "__init__": 5,
}


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield path, ("ortlearn",) + parts


def _package(dotted: tuple) -> str:
    """The package of a module: ``ortlearn.training.engine`` -> ``training``."""
    return dotted[1] if len(dotted) > 1 else "__init__"


def _imports(path: Path, module: tuple):
    """``(imported module, imported names)`` of every ``from ... import`` and ``import``."""
    is_package = path.name == "__init__.py"
    base = module if is_package else module[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[:len(base) - node.level + 1]
                target = anchor + tuple(node.module.split(".")) if node.module else anchor
            else:
                target = tuple((node.module or "").split("."))
            yield node.lineno, target, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, tuple(alias.name.split(".")), []


def _cross_package_imports():
    for path, module in _modules():
        for line, target, names in _imports(path, module):
            if target[0] != "ortlearn":
                continue
            # ``from ortlearn import training`` names a submodule
            if len(target) == 1:
                for name in names:
                    if (ROOT / name).is_dir() or (ROOT / f"{name}.py").is_file():
                        yield path, line, module, ("ortlearn", name), []
            else:
                yield path, line, module, target, names


def _where(path, line):
    return f"{path.relative_to(ROOT.parent)}:{line}"


def test_no_module_imports_another_packages_private_names():
    offences = []
    for path, line, module, target, names in _cross_package_imports():
        if _package(target) == _package(module):
            continue
        private_module = [p for p in target[1:] if p.startswith("_") and p != "__init__"]
        private_names = [n for n in names if n.startswith("_")]
        if private_module or private_names:
            offences.append(f"{_where(path, line)} imports "
                            f"{'.'.join(target)} {private_names or ''}".rstrip())
    assert not offences, "\n".join(offences)


def test_packages_import_only_their_floor_or_below():
    offences = []
    for path, line, module, target, _ in _cross_package_imports():
        mine, theirs = _package(module), _package(target)
        if mine == theirs or theirs == "__init__":
            continue
        assert mine in FLOORS and theirs in FLOORS, f"{mine} or {theirs} has no floor"
        if FLOORS[theirs] > FLOORS[mine]:
            offences.append(f"{_where(path, line)}: {mine} (floor {FLOORS[mine]}) imports "
                            f"{'.'.join(target)} (floor {FLOORS[theirs]})")
    assert not offences, "\n".join(offences)


def test_estimators_do_not_reach_into_autodiff():
    users = [_where(path, line) for path, line, module, target, _ in _cross_package_imports()
             if _package(module) == "estimators" and _package(target) == "autodiff"]
    assert not users


@pytest.mark.parametrize("package", ["graph", "autodiff"])
def test_the_lower_floors_import_nothing_above_them(package):
    above = {p for p, floor in FLOORS.items() if floor > FLOORS[package]}
    users = [f"{_where(path, line)} imports {'.'.join(target)}"
             for path, line, module, target, _ in _cross_package_imports()
             if _package(module) == package and _package(target) in above]
    assert not users, "\n".join(users)


def _module_graph(root: Path, package: str) -> dict:
    """``{module: modules it imports}`` within ``package`` (imports inside functions too),
    each import resolved to the module that defines it; a package's ``__init__`` is left
    out of its own modules' imports (importing a submodule runs it first)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = (package,) + path.relative_to(root).with_suffix("").parts
        modules[parts[:-1] if parts[-1] == "__init__" else parts] = path

    def resolve(target):
        while target and target not in modules:
            target = target[:-1]
        return target

    graph = {}
    for module, path in modules.items():
        dotted = module + (("__init__",) if path.name == "__init__.py" else ("",))
        graph[module] = set()
        for _, target, names in _imports(path, dotted[:-1] if not dotted[-1] else dotted):
            if target[0] != package:
                continue
            for found in [resolve(target + (n,)) for n in names] or [resolve(target)]:
                if found and found != module and module[:len(found)] != found:
                    graph[module].add(found)
    return graph


def _circles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                component.append(".".join(w))
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", ["ortlearn", "benchmarks"])
def test_no_import_circles(package):
    root = ROOT if package == "ortlearn" else ROOT.parent / "benchmarks"
    assert _circles(_module_graph(root, package)) == []


def test_circles_are_found():
    graph = {("a",): {("b",)}, ("b",): {("c",)}, ("c",): {("a",)}, ("d",): {("a",)}}
    assert _circles(graph) == [["a", "b", "c"]]


#: Modules above MAX_LINES, each with the one idea it holds.
LARGE_MODULES = {
    "training/session.py": "the TrainingSession class: the three artifacts run on bound state",
    "training/engine.py": "the TrainingEngine class: one fused training problem on bound "
                          "device buffers",
    "training/checkpoint.py": "the checkpoint state: parameters, properties, optimizer state, "
                              "and their file format (the safetensors codec: _safetensors.py)",
    "estimators/_base.py": "the mini-batch estimators' base class and its fit loop",
    "loss.py": "the loss table: one graph-writing entry per loss, with its formula",
}
MAX_LINES = 800


def test_a_large_module_holds_one_listed_idea():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for p in ROOT.rglob("*.py")}
    large = {name for name, n in sizes.items() if n > MAX_LINES}
    assert large <= set(LARGE_MODULES), sorted(large - set(LARGE_MODULES))
    # a listed module that shrank leaves the list
    assert set(LARGE_MODULES) <= large, sorted(set(LARGE_MODULES) - large)


def _imported_modules(path: Path, module: tuple) -> dict:
    """``{local name: ortlearn module}`` of the names ``path`` binds to ortlearn modules."""
    bound = {}
    for _, target, names in _imports(path, module):
        if target[0] != "ortlearn":
            continue
        for name in names:
            full = target + (name,)
            if (ROOT.joinpath(*full[1:]).is_dir()
                    or ROOT.joinpath(*full[1:-1], f"{full[-1]}.py").is_file()):
                bound[name] = full
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("ortlearn.") and alias.asname:
                    bound[alias.asname] = tuple(alias.name.split("."))
    return bound


def test_no_module_reads_another_packages_private_attributes():
    """``module._name`` of a module of another package is as private as importing it."""
    offences = []
    for path, module in _modules():
        bound = _imported_modules(path, module)
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and _package(bound[node.value.id]) != _package(module)):
                offences.append(f"{_where(path, node.lineno)}: {node.value.id}.{node.attr}")
    assert not offences, "\n".join(offences)


#: What a full-batch estimator's fit must not import: skl2onnx and the conversion (which
#: import much of scikit-learn), the mini-batch engine and the update rules.
_NOT_FOR_FULL_BATCH = ("skl2onnx", "ortlearn.convert.conversion", "ortlearn.training.engine",
                       "ortlearn.optim", "sklearn.neural_network", "sklearn.ensemble")


def test_full_batch_fits_import_only_what_they_run():
    """The packages import their public names when first used (``ortlearn.lazy``): the first
    fit of a full-batch estimator in a process pays for its solver's modules, not for
    skl2onnx's import and the mini-batch engine (what its cold start is made of)."""
    code = """
import sys
import numpy as np
from ortlearn.estimators import (OrtElasticNet, OrtHuberRegressor, OrtLasso, OrtLinearSVC,
    OrtLinearSVR, OrtLogisticRegression, OrtPoissonRegressor, OrtQuantileRegressor, OrtRidge)
X = np.random.default_rng(0).random((40, 3))
y = X @ [1.0, 2.0, 3.0] + 1.0
for est in (OrtRidge(), OrtLasso(alpha=0.01), OrtElasticNet(alpha=0.01), OrtHuberRegressor(),
            OrtPoissonRegressor(), OrtQuantileRegressor(), OrtLinearSVR()):
    est.fit(X, y)
OrtLinearSVC().fit(X, y > y.mean())
OrtLogisticRegression().fit(X, y > y.mean())
print(sorted(name for name in NAMES if name in sys.modules))
""".replace("NAMES", repr(_NOT_FOR_FULL_BATCH))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT.parent)
    assert out.stdout.split("\n")[-2] == "[]", out.stdout
    # the same names do come with a mini-batch estimator's conversion (the test can fail)
    code = code.replace("OrtLinearSVC().fit(X, y > y.mean())",
                        "from ortlearn.estimators import OrtMLPRegressor; "
                        "OrtMLPRegressor(max_iter=2).fit(X, y).to_onnx()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT.parent)
    assert out.stdout.split("\n")[-2] == repr(sorted(_NOT_FOR_FULL_BATCH)), out.stdout


def test_mini_batch_fits_convert_nothing():
    """The SGD estimators and the MLPs train and predict on their scores written from their
    formulas (``estimators/_scores.py``): no skl2onnx (its import is most of a first fit's
    time). ``to_onnx`` converts."""
    code = """
import sys
import numpy as np
from ortlearn.estimators import (OrtMLPClassifier, OrtMLPRegressor, OrtSGDClassifier,
                                 OrtSGDRegressor)
X = np.random.default_rng(0).random((40, 3))
y = X @ [1.0, 2.0, 3.0]
labels = np.arange(40) % 3
reg = OrtSGDRegressor(max_iter=2).fit(X, y)
clf = OrtSGDClassifier(max_iter=2, loss="log_loss").fit(X, labels)
reg.predict(X), clf.predict(X), clf.predict_proba(X), clf.decision_function(X)
clf.score(X, labels)
OrtMLPRegressor(max_iter=2).fit(X, y).predict(X)
mlp = OrtMLPClassifier(max_iter=2, solver="lbfgs").fit(X, labels)
mlp.predict(X), mlp.predict_proba(X), mlp.score(X, labels)
print("skl2onnx" in sys.modules)
clf.to_onnx()
print("skl2onnx" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT.parent)
    assert out.stdout.split() == ["False", "True"], out.stdout
