"""The Examples sections of ortlearn's docstrings run and print what they say.

Every module of the package is imported and its doctests run (numpydoc's ``Examples``):
an example that no longer runs is a failing test, not a stale page of the API reference.
"""

import doctest
import importlib
import pkgutil

import pytest

import ortlearn

MODULES = sorted(m.name for m in pkgutil.walk_packages(ortlearn.__path__, "ortlearn."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    output = []
    for test in finder.find(module, name):
        if test.examples:
            runner.run(test, out=output.append)
    assert runner.failures == 0, "".join(output)


def test_examples_are_found():
    """The walk sees the subpackages' modules and the docstrings hold examples."""
    assert {"ortlearn.training.engine", "ortlearn.graph.model", "ortlearn.optim.schedules",
            "ortlearn.estimators._mlp"} <= set(MODULES)
    finder = doctest.DocTestFinder(exclude_empty=True)
    engine = importlib.import_module("ortlearn.training.engine")
    assert sum(len(t.examples) for t in finder.find(engine, engine.__name__)) >= 10
