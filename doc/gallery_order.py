"""The reading order of the example gallery: the estimators first, then the training API,
torch and Dask (sphinx-gallery's ``within_subsection_order``)."""

EXAMPLES = ("plot_mlp_digits.py", "plot_grid_search.py", "plot_sparse_text.py",
            "plot_speedup_rows.py", "plot_export_continue.py", "plot_finetune_cnn.py",
            "plot_dask_parallel.py")


class ReadingOrder:
    """Sort key of sphinx-gallery: an example's place in :data:`EXAMPLES` (others last)."""

    def __init__(self, src_dir):
        self.src_dir = src_dir

    def __call__(self, filename):
        return (EXAMPLES.index(filename) if filename in EXAMPLES else len(EXAMPLES), filename)

    def __repr__(self):
        return f"<{type(self).__name__}>"
