"""Every call ortlearn.convert makes into scikit-learn's private API, in one place.

:func:`ortlearn.convert.init_template` must start from the weights scikit-learn
itself would start ``fit`` from, with the same random draws. scikit-learn has no
public API for that, so these few calls reach into private methods and
attributes. Nothing else in :mod:`ortlearn.convert` touches a private name of
scikit-learn; when a scikit-learn release breaks one of them, this module is the
only one to change.

Checked on scikit-learn 1.9.1 (the version the test suite runs on): the MLP
steps below are those of ``BaseMultilayerPerceptron._fit`` in that version, and
``tests/convert/test_convert.py`` checks that the weights drawn here equal those
``MLPRegressor``/``MLPClassifier.fit`` starts from (one epoch with a learning
rate of 1e-300).

- ``BaseEstimator._validate_params()``: checks the constructor parameters
  (types, ranges) as ``fit`` does, so that a bad parameter fails the same way
  before any weight is made (linear models and MLPs).
- ``BaseMultilayerPerceptron._validate_input(X, y, incremental, reset)``: the
  MLP's own validation of ``X`` and ``y``; for a classifier it also fits the
  label binarizer (``_label_binarizer``, ``classes_``) and returns the one-hot
  targets whose width is the size of the output layer.
- ``BaseMultilayerPerceptron._random_state``: the ``RandomState`` ``fit``
  draws from; it is set from ``random_state`` exactly as ``_fit`` does, and the
  estimators of :mod:`ortlearn.estimators` read it back to keep drawing from the
  same stream (shuffling) after the weights are initialised.
- ``BaseMultilayerPerceptron._initialize(y, layer_units, dtype)``: draws the
  Glorot-uniform ``coefs_``/``intercepts_`` and sets the fitted attributes
  (``n_layers_``, ``out_activation_``, the solver state) as ``fit`` does.
- ``BaseMultilayerPerceptron._best_coefs``/``_best_intercepts``: the copies of
  the weights ``_initialize`` makes for sklearn's early stopping; they become
  the lists ``coefs_``/``intercepts_`` themselves (a copy of a wide model's
  weights, kept for the estimator's life, would serve nothing).
"""

from __future__ import annotations

from sklearn.utils import check_random_state

# the private methods an MLP must have for init_template to reproduce its initialisation
_MLP_HOOKS = ("_validate_params", "_validate_input", "_initialize")


def check_mlp_hooks(est) -> None:
    """RuntimeError unless ``est`` has the private methods :func:`mlp_initialize` needs."""
    for hook in _MLP_HOOKS:
        if not hasattr(est, hook):
            raise RuntimeError(
                f"This scikit-learn version has no {type(est).__name__}.{hook}: "
                "ortlearn cannot reproduce its weight initialisation."
            )


def validate_params(est) -> None:
    """``est._validate_params()``: the parameter checks ``fit`` starts with."""
    est._validate_params()


def mlp_validate_input(est, X, y):
    """``X, y`` validated by the MLP as a first, non-incremental ``fit`` does."""
    return est._validate_input(X, y, incremental=False, reset=True)


def mlp_initialize(est, y, layer_units: list[int], dtype) -> None:
    """Seed ``est._random_state`` from ``random_state`` and draw the initial weights."""
    est._random_state = check_random_state(est.random_state)
    est._initialize(y, layer_units, dtype)
    # _initialize also copies the weights for sklearn's early stopping, which
    # ortlearn's training does not use: the same lists instead, no copy the
    # size of the weights (the best weights are then the ones stored).
    est._best_coefs, est._best_intercepts = est.coefs_, est.intercepts_
