"""The JavaScript package's own tests, under node's test runner."""

from __future__ import annotations

import os
import subprocess
import sys


def test_javascript_unit_tests_pass(node, js_dir):
    """js/test/*.test.mjs under node's test runner (the checkpoint format, the float and JSON
    formatting Python's files use, the ONNX protobuf editing), their cross-checks against this
    Python included (ORTLEARN_PYTHON: without it they skip)."""
    result = subprocess.run([node, "--test", "test/"], cwd=js_dir, capture_output=True,
                            text=True, timeout=300,
                            env={**os.environ, "ORTLEARN_PYTHON": sys.executable})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "# skipped 0" in result.stdout and "# fail 0" in result.stdout, result.stdout[-2000:]
