"""Every Python example of README.md and doc/ runs, and the Sphinx guide builds with -W.

Conventions (also stated in doc/index.rst):

- an example is a fenced ```` ```python ```` block (Markdown) or a ``.. code-block:: python``
  block (reST); a block whose first line starts with ``>>>`` runs as a doctest;
- the examples of one page run in order, in one namespace, in a fresh temporary working
  directory (examples may write files); pages do not share anything;
- a block that cannot run here starts with ``# doc: skip-test (reason)``; it is not run, and
  :func:`test_skipped_examples_are_reported` lists it.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import CHROMIUM_FLAGS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "doc"
SKIP_MARK = re.compile(r"^#\s*doc:\s*skip-test\s*\((?P<reason>[^)]+)\)")
# A generous ceiling per block, in CPU seconds of this process (all its threads): the
# examples are meant to take < 5 s; this catches a training run that silently became long,
# not a slow or shared machine (time spent waiting for a core does not count).
BLOCK_TIME_LIMIT_S = 30.0

_FENCE = re.compile(r"^(?P<indent> *)```+\s*(?:python|py|\{code-block\}\s+python)\s*$")
_RST = re.compile(r"^(?P<indent> *)\.\. (?:code-block|code|sourcecode)::\s+(?:python|py|pycon)\s*$")


@dataclass
class Example:
    path: Path
    line: int  # 1-based line of the block's first code line
    code: str

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        first = self.code.lstrip().splitlines()[0] if self.code.strip() else ""
        match = SKIP_MARK.match(first)
        return match.group("reason").strip() if match else None


def _markdown_blocks(path: Path, lines: list[str]) -> list[Example]:
    examples, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        i += 1
        if not match:
            continue
        start, body = i, []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        examples.append(Example(path, start + 1, textwrap.dedent("\n".join(body))))
    return examples


def _rst_blocks(path: Path, lines: list[str]) -> list[Example]:
    examples, i = [], 0
    while i < len(lines):
        match = _RST.match(lines[i])
        i += 1
        if not match:
            continue
        indent = len(match.group("indent"))
        # directive options (":linenos:") and the blank line before the body
        while i < len(lines) and (not lines[i].strip() or lines[i].strip().startswith(":")):
            i += 1
        start, body = i, []
        while i < len(lines) and (not lines[i].strip()
                                  or len(lines[i]) - len(lines[i].lstrip()) > indent):
            body.append(lines[i])
            i += 1
        examples.append(Example(path, start + 1, textwrap.dedent("\n".join(body)).strip("\n")))
    return examples


def extract_examples(path: Path) -> list[Example]:
    """The Python examples of one page, in page order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    parse = _rst_blocks if path.suffix == ".rst" else _markdown_blocks
    return parse(path, lines)


def doc_pages() -> list[Path]:
    pages = [ROOT / "README.md"]
    pages += sorted(p for p in DOC.rglob("*") if p.suffix in (".rst", ".md")
                    and not {"_build", "auto_examples"} & set(p.relative_to(DOC).parts))
    return pages


PAGES_WITH_EXAMPLES = [p for p in doc_pages() if extract_examples(p)]


def _run_doctest(example: Example, namespace: dict) -> None:
    test = doctest.DocTestParser().get_doctest(example.code, namespace, example.where,
                                               str(example.path), example.line - 1)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    output = []
    runner.run(test, out=output.append, clear_globs=False)
    if runner.failures:
        raise AssertionError("".join(output))


def _run(example: Example, namespace: dict) -> float:
    """Run the example; the CPU seconds it took."""
    start = time.process_time()
    if example.code.lstrip().startswith(">>>"):
        _run_doctest(example, namespace)
    else:
        # blank lines up to the block's first line keep tracebacks on the page's line numbers
        source = "\n" * (example.line - 1) + example.code
        exec(compile(source, str(example.path), "exec"), namespace)
    return time.process_time() - start


@pytest.fixture
def isolated_gradient_rules():
    """Examples may register gradient rules: restore the registry afterwards."""
    from ortlearn.autodiff import GRADIENT_RULES, NON_DIFFERENTIABLE_OPS

    rules, non_diff = dict(GRADIENT_RULES), set(NON_DIFFERENTIABLE_OPS)
    yield
    GRADIENT_RULES.clear()
    GRADIENT_RULES.update(rules)
    NON_DIFFERENTIABLE_OPS.clear()
    NON_DIFFERENTIABLE_OPS.update(non_diff)


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page, tmp_path, monkeypatch, isolated_gradient_rules):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace = {"__name__": "__doc_example__"}
    for example in extract_examples(page):
        if example.skip_reason:
            continue
        try:
            elapsed = _run(example, namespace)
        except Exception:
            pytest.fail(f"example at {example.where} failed:\n{traceback.format_exc()}",
                        pytrace=False)
        assert elapsed < BLOCK_TIME_LIMIT_S, (
            f"example at {example.where} took {elapsed:.1f} CPU s; examples must stay quick")


def test_examples_are_found():
    """The extractors see the README's example and those of every guide page."""
    readme = extract_examples(ROOT / "README.md")
    assert readme and "OrtMLPRegressor" in readme[0].code
    assert readme[0].line == 1 + (ROOT / "README.md").read_text().splitlines().index(
        readme[0].code.splitlines()[0])
    for name in ("quickstart.rst", "training_api.rst", "custom_losses.rst", "gradients.rst"):
        assert extract_examples(DOC / name), name


def test_extractors_on_synthetic_pages(tmp_path):
    rst = tmp_path / "p.rst"
    rst.write_text("Title\n=====\n\n.. code-block:: python\n\n   x = 1\n\n   y = x + 1\n\n"
                   "Text.\n\n.. code-block:: bash\n\n   ls\n\n"
                   ".. code-block:: python\n\n   # doc: skip-test (needs CUDA)\n   z = 3\n")
    md = tmp_path / "p.md"
    md.write_text("# T\n\n```python\na = 1\n```\n\n```bash\nls\n```\n\n"
                  "```python\n>>> 1 + 1\n2\n```\n")
    rst_examples = extract_examples(rst)
    assert [(e.line, e.code) for e in rst_examples] == [
        (6, "x = 1\n\ny = x + 1"), (18, "# doc: skip-test (needs CUDA)\nz = 3")]
    assert [e.skip_reason for e in rst_examples] == [None, "needs CUDA"]
    md_examples = extract_examples(md)
    assert [(e.line, e.code) for e in md_examples] == [(4, "a = 1"), (12, ">>> 1 + 1\n2")]
    namespace = {}
    _run(md_examples[1], namespace)
    bad = md_examples[1].__class__(md, 12, ">>> 1 + 1\n3")
    with pytest.raises(AssertionError):
        _run(bad, namespace)


def test_skipped_examples_are_reported():
    skipped = [f"{e.where} ({e.skip_reason})" for p in doc_pages()
               for e in extract_examples(p) if e.skip_reason]
    if skipped:
        pytest.skip(f"{len(skipped)} example(s) marked not to run here: " + "; ".join(skipped))


_DOC_MODULES = ("sphinx", "numpydoc", "myst_parser", "sphinx_gallery", "sphinx_copybutton",
                "pydata_sphinx_theme")
#: the packages whose ``__all__`` the API reference documents, name by name
PUBLIC_MODULES = ("ortlearn", "ortlearn.estimators", "ortlearn.api", "ortlearn.artifacts",
                  "ortlearn.onnxblock", "ortlearn.onnxblock.loss", "ortlearn.onnxblock.optim",
                  "ortlearn.optim", "ortlearn.optim.schedules", "ortlearn.training",
                  "ortlearn.autodiff", "ortlearn.convert", "ortlearn.loss", "ortlearn.graph",
                  "ortlearn.exceptions", "ortlearn.torch", "ortlearn.parallel")
#: what a reader opens first: a page of formulas, the gallery's first figure, the results
RENDERED_PAGES = ("gradients.html", "auto_examples/plot_mlp_digits.html", "benchmarks.html")


def _sphinx_missing() -> str | None:
    for module in _DOC_MODULES:
        if importlib.util.find_spec(module) is None:
            return module
    return None


@pytest.fixture(scope="module")
def built_guide(tmp_path_factory):
    """The guide built with -W from a copy of doc/ and examples/ (the gallery writes its
    pages beside its sources): the build's result and the HTML folder."""
    missing = _sphinx_missing()
    if missing is not None:
        pytest.skip(f"the doc extra is not installed ({missing} is missing): "
                    "pip install -e '.[doc]'")
    root = tmp_path_factory.mktemp("guide")
    shutil.copytree(DOC, root / "doc", ignore=shutil.ignore_patterns("_build", "auto_examples"))
    shutil.copytree(ROOT / "examples", root / "examples")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(root / "doctrees"), str(root / "doc"), str(root / "html")],
        capture_output=True, text=True, timeout=900, cwd=root,
        env={**os.environ, "MPLBACKEND": "Agg"})
    return result, root / "html"


def test_sphinx_build_has_no_warning(built_guide):
    result, html = built_guide
    assert result.returncode == 0, result.stderr[-6000:]
    assert (html / "index.html").exists()
    examples = sorted(p.stem for p in (ROOT / "examples").glob("plot_*.py"))
    assert examples, "the gallery has no example"
    for name in examples:  # every example ran and drew at least one figure
        assert (html / "auto_examples" / f"{name}.html").exists(), name
        assert list((html / "_images").glob(f"sphx_glr_{name}_*.png")), name


def test_api_reference_documents_every_public_name(built_guide):
    from sphinx.util.inventory import InventoryFile

    result, html = built_guide
    assert result.returncode == 0, result.stderr[-6000:]
    inventory = InventoryFile.loads((html / "objects.inv").read_bytes(), uri="")
    by_type = getattr(inventory, "data", inventory)  # Sphinx 8.2+ wraps the mapping
    documented = {name.rsplit(".", 1)[-1] for names in by_type.values() for name in names}
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        missing += [f"{module_name}.{name}" for name in module.__all__
                    if not inspect.ismodule(getattr(module, name)) and name not in documented]
    assert not missing, f"public names without an entry in doc/api/: {missing}"


def test_rendered_pages_show_formulas_and_images(built_guide, chromium, tmp_path):
    """Three pages opened in headless Chromium, offline: MathJax typeset every formula (no raw
    TeX left in the visible text) and every image loaded."""
    playwright = pytest.importorskip("playwright.sync_api", reason="the test extra's playwright")
    result, html = built_guide
    assert result.returncode == 0, result.stderr[-6000:]
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        # nothing but the files of the build: a request elsewhere is a page that needs a network
        outside = []
        page.on("request", lambda r: None if r.url.startswith("file://") or r.url.startswith(
            "data:") else outside.append(r.url))
        for name in RENDERED_PAGES:
            page.goto((html / name).as_uri())
            page.wait_for_load_state("load")
            formulas = page.evaluate("""async () => {
                if (!document.querySelector('script[src*="mathjax"]')) return 0;
                await new Promise(r => { const t = () => (window.MathJax && MathJax.startup &&
                    MathJax.startup.promise) ? r() : setTimeout(t, 50); t(); });
                await MathJax.startup.promise;
                return document.querySelectorAll('mjx-container').length; }""")
            text = page.evaluate("document.body.innerText")
            images = page.evaluate("""() => Array.from(document.images).map(
                i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0])""")
            page.screenshot(path=str(tmp_path / f"{Path(name).stem}.png"))
            assert "\\(" not in text and "\\[" not in text, f"{name}: raw TeX on the page"
            assert [src for src, ok in images if not ok] == [], f"{name}: images not loaded"
            if name == "gradients.html":
                assert formulas > 0, "the formulas of gradients.rst were not typeset"
            else:
                assert images, f"{name} shows no image"
        browser.close()
    assert outside == [], f"the pages requested the network: {outside[:5]}"
