"""The docstring fragments several estimators share, and the one way they are filled in.

A class's docstring holds placeholders ``{name}``; :func:`fill_doc` replaces them with the
fragments given, then with the shared ones of :data:`SHARED` (a fragment given may hold a
shared placeholder). Plain replacement, not ``str.format``: braces elsewhere in a docstring
(``{'auto', 'log'}``) stay as written.
"""

from __future__ import annotations

__all__ = ["SHARED", "fill_doc"]

#: numpydoc fragments every full-batch estimator's docstring has: ``{device}`` in
#: Parameters, ``{fitted}`` at the end of Attributes.
SHARED = {
    "device": """device : str, default='cpu'
        Where onnxruntime evaluates the objective and its gradient: ``'cpu'``,
        ``'cuda'``, ``'cuda:N'``.""",
    "fitted": """train_losses_ : list of float
        ``[loss_]``.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of str
        Names of the features seen during fit (when ``X`` has string column
        names).""",
}


def fill_doc(cls, **fragments):
    """Replace the ``{name}`` placeholders of ``cls.__doc__``; return ``cls``.

    Used as a class decorator (``@fill_doc``: the shared fragments only) or
    called with the class's own fragments, ``fill_doc(cls, common=...)``.
    """
    doc = cls.__doc__
    for name, text in {**fragments, **SHARED}.items():
        doc = doc.replace("{" + name + "}", text)
    cls.__doc__ = doc
    return cls
