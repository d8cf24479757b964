"""onnxcustom's ``onnxcustom.utils`` package: graph helpers used by its training scripts."""
