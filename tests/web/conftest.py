"""What the tests of on-device training need: the js/ folder with its npm dependencies,
installed from its lockfile on first use (``npm ci``), so that the README's test command runs
them wherever Node.js is installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from runs import JS

from tests.conftest import require


@pytest.fixture(scope="session")
def js_dir(node):
    if not (JS / "node_modules" / "onnxruntime-node").is_dir():
        npm = require(shutil.which("npm"), "no npm on PATH to install js/'s dependencies")
        result = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                                cwd=JS, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"npm ci in js/ failed: {result.stderr[-3000:]}"
    return JS

