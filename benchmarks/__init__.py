"""Benchmarks: ortlearn against scikit-learn and PyTorch, measured in one process run.

Run ``python -m benchmarks --help`` (or ``python benchmarks/run.py``). The runner
lives in :mod:`benchmarks.run`, the workloads in :mod:`benchmarks.workloads`, the
thread and environment handling in :mod:`benchmarks._env` and the table, JSON and
chart output in :mod:`benchmarks.report`. Beside the runner: whole fits, searches and
cold starts against scikit-learn (``python -m benchmarks.endtoend``), the scaling
table (``python -m benchmarks.scaling``), profiles (``python -m benchmarks.profile``)
and the GPU check (``python benchmarks/gpu.py``).
"""
