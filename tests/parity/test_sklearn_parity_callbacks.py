"""Progress and logging as scikit-learn does them.

scikit-learn 1.9's callbacks (``sklearn.callback``) see one task per fit and
one subtask per epoch; ``verbose`` writes scikit-learn's lines through the
``ortlearn`` logger; warnings name the user's line.
"""

import re
import warnings

import numpy as np
import pytest
from counterparts import ortlearn_log
from sklearn.datasets import load_diabetes, load_digits
from sklearn.neural_network import MLPClassifier

import ortlearn
import ortlearn.log
from ortlearn.exceptions import ConvergenceWarning

callback = pytest.importorskip("sklearn.callback")


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X[:500] / 16.0, y[:500]


@pytest.fixture(scope="module")
def diabetes():
    X, y = load_diabetes(return_X_y=True, scaled=True)
    return X, (y - y.mean()) / y.std()


class Recorder:
    """A FitCallback that records the tasks it sees; optionally asks to stop."""

    def __init__(self, stop_after=None):
        self.events, self.stop_after = [], stop_after

    def setup(self, estimator, context):
        self.events.append(("setup", context.task_name))

    def on_fit_task_begin(self, estimator, context):
        self.events.append(("begin", context.task_name))

    def on_fit_task_end(self, estimator, context, *, fitted_estimator=None, X=None, y=None):
        score = None if fitted_estimator is None or context.task_name != "epoch" else (
            fitted_estimator.score(X, y))
        self.events.append(("end", context.task_name, score))
        epochs = sum(e[:2] == ("end", "epoch") for e in self.events)
        return self.stop_after is not None and epochs >= self.stop_after

    def teardown(self, estimator, context):
        self.events.append(("teardown", context.task_name))




def test_one_subtask_per_epoch_with_the_epochs_weights(digits):
    X, y = digits
    rec = Recorder()
    est = ortlearn.OrtMLPClassifier(hidden_layer_sizes=(16,), max_iter=4, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.set_callbacks(rec).fit(X, y)
    kinds = [e[:2] for e in rec.events]
    assert kinds == ([("setup", "fit"), ("begin", "fit")]
                     + [("begin", "epoch"), ("end", "epoch")] * 4
                     + [("end", "fit"), ("teardown", "fit")])
    scores = [e[2] for e in rec.events if e[:2] == ("end", "epoch")]
    # the fitted_estimator of the last epoch is the fitted model
    assert scores[-1] == est.score(X, y)
    assert not hasattr(est, "_callback_fit_ctx")  # torn down
    assert not hasattr(est, "_callback_task")  # no reference to the fit's data


def test_a_callback_can_stop_the_fit(diabetes):
    X, y = diabetes
    est = ortlearn.OrtLinearRegressor(max_iter=50, tol=None, random_state=0)
    est.set_callbacks(Recorder(stop_after=2)).fit(X, y)
    assert est.n_iter_ == 2


def test_partial_fit_and_lbfgs_tasks(diabetes):
    X, y = diabetes
    rec = Recorder()
    ortlearn.OrtLinearRegressor(random_state=0).set_callbacks(rec).partial_fit(X, y)
    assert [e[:2] for e in rec.events].count(("end", "epoch")) == 1
    rec = Recorder()
    ortlearn.OrtMLPRegressor(hidden_layer_sizes=(4,), solver="lbfgs", max_iter=20,
                             random_state=0).set_callbacks(rec).fit(X, y)
    assert [e[0] for e in rec.events] == ["setup", "begin", "end", "teardown"]


def test_progress_bar_shows_the_epochs(digits, capsys):
    pytest.importorskip("rich")
    X, y = digits
    est = ortlearn.OrtMLPClassifier(hidden_layer_sizes=(16,), max_iter=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.set_callbacks(callback.ProgressBar()).fit(X, y)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "OrtMLPClassifier - fit" in text and "100%" in text


def test_scoring_monitor_logs_a_score_per_epoch(digits):
    X, y = digits
    monitor = callback.ScoringMonitor(scoring="accuracy")
    est = ortlearn.OrtMLPClassifier(hidden_layer_sizes=(16,), max_iter=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.set_callbacks(monitor).fit(X, y)
    log = monitor.get_logs()
    epochs = [row for row in log.data if row["task_name"] == "epoch"]
    assert len(epochs) == 3
    # each epoch scored with that epoch's weights; the last ones are the fitted model's
    assert epochs[-1]["accuracy"] == est.score(X, y)
    assert log.estimator_name == "OrtMLPClassifier"


# ------------------------------------------------------------------ verbose


def test_mlp_verbose_lines_are_scikit_learns(digits, capsys):
    X, y = digits
    params = dict(hidden_layer_sizes=(16,), max_iter=3, random_state=0, verbose=1,
                  early_stopping=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        MLPClassifier(**params).fit(X, y)
        theirs = capsys.readouterr().out.splitlines()
        ortlearn.OrtMLPClassifier(**params).fit(X, y)
        ours = capsys.readouterr().out.splitlines()

    def shape(lines):  # the lines with their numbers replaced by a placeholder
        return [re.sub(r"-?\d+\.\d+|\d+", "N", line) for line in lines]

    assert shape(ours) == shape(theirs)
    assert ours[0].startswith("Iteration 1, loss = ")


def test_sgd_verbose_lines_are_scikit_learns(diabetes, capsys):
    X, y = diabetes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ortlearn.OrtLinearRegressor(max_iter=2, verbose=1, random_state=0).fit(X, y)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "-- Epoch 1"
    assert re.match(r"^Norm: \d+\.\d{2}, NNZs: \d+, Bias: -?\d+\.\d{6}, T: 442, "
                    r"Avg\. loss: \d+\.\d{6}, Objective: \d+\.\d{6}$", lines[1])
    assert re.match(r"^Total training time: \d+\.\d{2} seconds\.$", lines[2])
    assert lines[3] == "-- Epoch 2"


def test_verbose_goes_through_the_ortlearn_logger(diabetes, capsys):
    X, y = diabetes
    with ortlearn_log() as stream, warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ortlearn.OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=2, verbose=1,
                                 random_state=0).fit(X, y)
        ortlearn.OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=2, verbose=0,
                                 random_state=0).fit(X, y)
    assert capsys.readouterr().out == ""  # the default handler removed: nothing printed
    assert stream.getvalue().splitlines()[:2] == [
        line for line in stream.getvalue().splitlines() if line.startswith("Iteration")]
    assert stream.getvalue().count("Iteration") == 2  # verbose=0 logs nothing


def test_no_print_in_the_estimators_and_the_runtime():
    import pathlib

    root = pathlib.Path(ortlearn.__file__).parent
    offenders = [str(p) for sub in ("estimators", "training") for p in (root / sub).glob("*.py")
                 if re.search(r"^\s*print\(", p.read_text(), re.M)]
    assert offenders == []


# ----------------------------------------------------------------- warnings


def test_convergence_warnings_name_the_users_line(diabetes):
    X, y = diabetes
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ortlearn.OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=2, random_state=0).fit(X, y)
        ortlearn.OrtMLPRegressor(hidden_layer_sizes=(4,), solver="lbfgs", max_iter=2,
                                 random_state=0).fit(X, y)
        ortlearn.OrtLinearRegressor(batch_size=10_000, random_state=0).partial_fit(X, y)
    convergence = [x for x in w if issubclass(x.category, ConvergenceWarning)]
    assert len(convergence) == 2
    assert any("batch_size" in str(x.message) for x in w)
    assert {x.filename for x in w} == {__file__}, [(x.filename, str(x.message)) for x in w]


def test_warning_through_a_pipeline_names_the_users_line(diabetes):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = diabetes
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        make_pipeline(StandardScaler(), ortlearn.OrtLinearRegressor(
            max_iter=1, random_state=0)).fit(X, y)
    assert [x.filename for x in w if issubclass(x.category, ConvergenceWarning)] == [__file__]


def test_sparse_and_dense_fits_log_the_same(diabetes, capsys):
    sp = pytest.importorskip("scipy.sparse")
    X, y = diabetes
    outs = []
    for data in (X, sp.csr_matrix(X)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            ortlearn.OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=2, verbose=1,
                                     random_state=0).fit(data, y)
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and np.char.count(outs[0], "Iteration") == 2


# -------------------------------------------------------- day-one details

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cls", [ortlearn.OrtMLPRegressor, ortlearn.OrtLinearRegressor,
                                 ortlearn.OrtMLPClassifier, ortlearn.OrtLinearClassifier])
def test_to_onnx_has_nothing_unused(cls, digits, capfd):
    import onnxruntime as ort

    X, y = digits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = cls(max_iter=1, random_state=0).fit(X, y.astype(float)
                                                    if "Regressor" in cls.__name__ else y)
    onx = model.to_onnx()
    read = {i for node in onx.graph.node for i in node.input} | {o.name for o in onx.graph.output}
    assert [i.name for i in onx.graph.initializer if i.name not in read] == []
    assert [n.output[0] for n in onx.graph.node if n.op_type == "Constant"
            and n.output[0] not in read] == []
    capfd.readouterr()
    ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    assert "not used by any node" not in capfd.readouterr().err


def test_inference_export_error_lists_what_can_be_exported(digits, tmp_path):
    from ortlearn import api

    X, y = digits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = ortlearn.OrtMLPClassifier(hidden_layer_sizes=(8,), max_iter=1).fit(X, y)
    est.export_artifacts(tmp_path)
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = api.Module(str(tmp_path / "training_model.onnx"), state,
                        str(tmp_path / "eval_model.onnx"))
    with pytest.raises(ValueError, match=r"not values of the eval model.*'raw_scores'"):
        module.export_model_for_inferencing(str(tmp_path / "inference.onnx"), ["proba"])
    module.export_model_for_inferencing(str(tmp_path / "inference.onnx"), ["raw_scores"])


def test_benchmarks_run_from_any_directory_and_describe_the_workloads(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(REPO))  # as installed: the package, not the cwd
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, check=True).stdout
    for key in ("W1  linear regression by SGD", "W4  binary logistic regression",
                "W9  W6's CNN in ortlearn.torch.ORTModule"):
        assert key in out
    # installed with ortlearn, so that no PYTHONPATH is needed
    assert '"benchmarks*"' in (REPO / "pyproject.toml").read_text()


def test_readme_and_quickstart_give_the_same_commands():
    def commands(path):
        return {line.strip() for line in path.read_text().splitlines()
                if line.strip().startswith(("pip install", "python -m sphinx"))}

    readme = commands(REPO / "README.md")
    quickstart = commands(REPO / "doc" / "quickstart.rst")
    assert quickstart <= readme | {"python -m sphinx -W --keep-going -b html doc doc/_build/html"}
    assert "python -m sphinx -W --keep-going -b html doc doc/_build/html" in (
        REPO / "README.md").read_text()
    assert len([c for c in quickstart if c.startswith("pip install")]) == 2


@pytest.mark.parametrize("name", ["OrtSGDRegressor", "OrtMLPRegressor"])
def test_a_callback_raising_in_partial_fit_leaves_the_model_as_before(diabetes, name):
    """Weights, optimizer state, t_ and the curves all stay as before the failed call (t_
    used to advance, shifting the 'invscaling' rates of the calls after it)."""
    X, y = diabetes

    class RaisesOnce(Recorder):
        raised = False

        def on_fit_task_end(self, estimator, context, **kwargs):
            if context.task_name == "epoch" and not self.raised:
                self.raised = True
                raise RuntimeError("a callback failed")
            return super().on_fit_task_end(estimator, context, **kwargs)

    params = {"random_state": 0}
    reference = getattr(ortlearn, name)(**params).partial_fit(X, y).partial_fit(X, y)
    est = getattr(ortlearn, name)(**params).partial_fit(X, y)
    before = (est.coef_ if hasattr(est, "coef_") else est.coefs_[0]).copy()
    t, curve = est.t_, list(est.loss_curve_)
    est.set_callbacks(RaisesOnce())
    with pytest.raises(RuntimeError, match="a callback failed"):
        est.partial_fit(X, y)
    after = est.coef_ if hasattr(est, "coef_") else est.coefs_[0]
    np.testing.assert_array_equal(after, before)
    assert est.t_ == t and est.loss_curve_ == curve and est.n_iter_ == 1
    est.partial_fit(X, y)  # the callback lets it through now: as if the failure never was
    got = est.coef_ if hasattr(est, "coef_") else est.coefs_[0]
    ref = reference.coef_ if hasattr(reference, "coef_") else reference.coefs_[0]
    np.testing.assert_array_equal(got, ref)
    assert est.t_ == reference.t_
