"""``python -m benchmarks``: see :func:`benchmarks.run.main`."""

from benchmarks.run import main

raise SystemExit(main())
