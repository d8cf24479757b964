"""Compatibility faces: the import paths and semantics of the systems ortlearn replaces.

``ortlearn.compat.onnxcustom`` mirrors onnxcustom's modules, so that a script migrates by
renaming the package prefix (see the migration guide). The classes there run on ortlearn's
engine; where onnxcustom's semantics differ from ortlearn's native ones, the names under
``compat`` follow onnxcustom and the native names keep theirs.
"""
