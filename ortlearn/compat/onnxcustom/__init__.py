r"""onnxcustom's import paths (``onnxcustom.training``, ``onnxcustom.utils``) on ortlearn's engine.

Migrate a script with one substitution of the package prefix (GNU sed; running it twice
changes nothing more)::

    sed -i 's/\(^\|[^.[:alnum:]_]\)onnxcustom\./\1ortlearn.compat.onnxcustom./g; s/^\(\s*\)from onnxcustom import/\1from ortlearn.compat.onnxcustom import/' script.py

``doc/migration_onnxcustom.rst`` lists, for each onnxcustom name, where it
lives and what remains different.
"""  # noqa: E501

#: onnxcustom's ``__max_supported_opset__``: the opset its examples convert to.
__max_supported_opset__ = 15
