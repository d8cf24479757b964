"""The layering rules of ``DESIGN.md``, checked on the source.

- No module imports another ortlearn package's private (underscore) module or name.
- The floors: a package imports only from its own floor or below.
"""

import ast
from pathlib import Path

import pytest

import ortlearn

ROOT = Path(ortlearn.__file__).parent

#: Floor of each package (top-level modules are packages of their own): a module
#: may import from its own floor or a lower one, never from a higher one.
FLOORS = {
    "exceptions": 0, "graph": 0, "log": 0,
    "autodiff": 1,
    "convert": 2, "loss": 2, "optim": 2, "fileio": 0,
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
