r"""onnxcustom's import paths (``onnxcustom.training``, ``onnxcustom.utils``) on ortlearn's engine.

Migrate a script with one substitution of the package prefix::

    sed -i 's/\bonnxcustom\./ortlearn.compat.onnxcustom./g; s/^from onnxcustom import/from ortlearn.compat.onnxcustom import/' script.py
"""
