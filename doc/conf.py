"""Sphinx configuration of the ortlearn user guide and API reference.

Build (offline): ``python -m sphinx -W --keep-going -b html doc doc/_build/html``.
The ``doc`` extra of pyproject.toml installs what it needs.
"""

import os
import sys

from docutils import nodes
from docutils.parsers.rst import Directive

# The guide documents the checkout it lives in, installed or not.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
sys.path.insert(0, os.path.abspath(os.path.dirname(__file__)))  # gallery_order

import ortlearn  # noqa: E402

project = "ortlearn"
author = "the ortlearn developers"
copyright = "the ortlearn developers, MIT license"
version = release = ortlearn.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    # MathJax from the package's own copy: the guide renders formulas offline
    "sphinx-mathjax-offline",
    "numpydoc",
    # Markdown, for artifacts_format.md
    "myst_parser",
    "sphinx_copybutton",
    "sphinx_gallery.gen_gallery",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py",
                    "auto_examples/*.zip", "auto_examples/*.json", "auto_examples/*.md5"]

html_theme = "pydata_sphinx_theme"
html_title = f"ortlearn {release}"
html_static_path = ["_static"]
html_css_files = ["ortlearn.css"]
html_theme_options = {
    # the theme's defaults fetch nothing, but its icon links and version switcher would
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "navbar_align": "left",
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_show_sourcelink = False
# the prompt and continuation markers are not copied: a copied block pastes and runs
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True

# The example gallery: examples/plot_*.py run at build time, their output and figures
# rendered into doc/auto_examples/ (generated, ignored by git). A failing example fails the
# build, so the build is the examples' test.
sphinx_gallery_conf = {
    "examples_dirs": os.path.join(os.path.dirname(__file__), "..", "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    # by name, importable: Sphinx pickles its configuration
    "within_subsection_order": "gallery_order.ReadingOrder",
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
    "download_all_examples": False,
    "remove_config_comments": True,
    "show_memory": False,
    "show_signature": False,
    "matplotlib_animations": False,
    "capture_repr": ("_repr_html_", "__repr__"),
    "image_scrapers": ("matplotlib",),
}

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": False}
# numpydoc's member tables would need autosummary stubs; autodoc lists the members.
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
# '>>>' examples in docstrings are rendered, not run here: the doctests run in the test suite.


class GradientOperators(Directive):
    """``.. ortlearn-gradient-operators::``: the operators ortlearn differentiates.

    Read from ``ortlearn.autodiff.GRADIENT_RULES`` and ``NON_DIFFERENTIABLE_OPS``
    when the guide is built, so that the list never goes stale.
    """

    has_content = False

    def run(self):
        from ortlearn.autodiff import GRADIENT_RULES, NON_DIFFERENTIABLE_OPS

        def names(keys):
            return ", ".join(f"``{op}``" if not domain else f"``{domain}.{op}``"
                             for domain, op in sorted(keys, key=lambda k: (k[0], k[1])))

        text = (f"**With a gradient rule** ({len(GRADIENT_RULES)}): {names(GRADIENT_RULES)}.\n\n"
                f"**No gradient by nature** (their outputs carry none, a zero gradient, not an "
                f"error; {len(NON_DIFFERENTIABLE_OPS)}): {names(NON_DIFFERENTIABLE_OPS)}.\n")
        container = nodes.container()
        self.state.nested_parse(_string_list(text), self.content_offset, container)
        return container.children


def _string_list(text):
    from docutils.statemachine import StringList

    return StringList(text.splitlines(), source="ortlearn-gradient-operators")


def _skip_metadata_request_methods(app, what, name, obj, skip, options):
    """Skip scikit-learn's generated ``set_<method>_request`` methods.

    scikit-learn adds them to every estimator class; their docstrings point to
    scikit-learn's own glossary and labels, which this build does not have.
    """
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.add_directive("ortlearn-gradient-operators", GradientOperators)
    app.connect("autodoc-skip-member", _skip_metadata_request_methods)
    return {"parallel_read_safe": True}
