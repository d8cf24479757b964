"""``export_web`` and ``python -m ortlearn export-web``: what they write, and their errors."""

from __future__ import annotations

import json
import pickle

import numpy as np
import onnx
import pytest
import scipy.sparse
from safetensors.numpy import load_file
from sklearn.datasets import load_diabetes, load_iris

from ortlearn import CheckpointState, OrtMLPClassifier, OrtMLPRegressor, OrtSGDClassifier
from ortlearn.__main__ import main
from ortlearn.training import cpu_fallbacks
from ortlearn.web import ORT_WEB_FILES, find_js_dir

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _iris():
    X, y = load_iris(return_X_y=True)
    return X.astype(np.float32), y


def test_the_directory_holds_what_the_page_loads(js_dir, tmp_path):
    X, y = _iris()
    est = OrtMLPClassifier(hidden_layer_sizes=(8,), max_iter=3, random_state=0).fit(X, y)
    page = est.export_web(tmp_path / "out", X[:100], y[:100], X[100:], y[100:], epochs=4)
    out = tmp_path / "out"
    assert page == out / "index.html" and page.is_file()
    for name in ["checkpoint", "training_model.onnx", "eval_model.onnx", "app.js",
                 "lib/index.js", "lib/training_session.js",
                 *[f"ort/{f}" for f in ORT_WEB_FILES]]:
        assert (out / name).is_file(), name
    # Adam in the flat layout: no sequence (onnxruntime's JS API feeds none), three vectors
    assert _optimizer_layout(out) == ("flat", ["params", "params.gradient", "params.exp_avg",
                                               "params.exp_avg_sq"])
    # the data as the training model reads it: float32 rows and class indices
    data = load_file(str(out / "data.safetensors"))
    assert data["X_train"].dtype == np.float32 and data["X_train"].shape == (100, 4)
    assert data["y_train"].dtype == np.int64
    np.testing.assert_array_equal(data["y_test"], np.searchsorted(est.classes_, y[100:]))
    task = json.loads((out / "task.json").read_text())
    assert task == {"estimator": "OrtMLPClassifier", "kind": "multiclass", "classes": [0, 1, 2],
                    "prediction": "raw_scores", "epochs": 4, "batch_size": 100,
                    "shuffle": True, "webgpu": True}
    # the fitted weights are the checkpoint's
    state = CheckpointState.load_checkpoint(str(out / "checkpoint"))
    np.testing.assert_array_equal(state.parameters["coefficient"].data, est.coefs_[0])


def test_a_regressor_and_an_sgd_classifier_export(js_dir, tmp_path):
    X, y = load_diabetes(return_X_y=True, scaled=True)
    reg = OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=2, random_state=0)
    reg.fit(X.astype(np.float32), y)
    reg.export_web(tmp_path / "reg", X, y)
    task = json.loads((tmp_path / "reg" / "task.json").read_text())
    assert task["kind"] == "regressor" and task["prediction"] == "variable"
    data = load_file(str(tmp_path / "reg" / "data.safetensors"))
    assert data["y_train"].shape == (len(y), 1) and "X_test" not in data
    Xi, yi = _iris()
    OrtSGDClassifier(max_iter=2, random_state=0).fit(Xi, yi).export_web(tmp_path / "sgd", Xi, yi)
    assert (tmp_path / "sgd" / "index.html").is_file()
    # scikit-learn's SGD update (its L1 part for the coefficients only) is not element by
    # element over every parameter: the tensor layout
    layout, inputs = _optimizer_layout(tmp_path / "sgd")
    assert layout == "tensors" and inputs[:2] == ["coef", "coef.gradient"]


def _doubles(path) -> list[str]:
    """The float64 values and casts to float64 of a model."""
    model = onnx.load(path)
    return ([i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.DOUBLE]
            + [n.name or n.op_type for n in model.graph.node
               if (n.op_type == "Cast" and n.attribute[0].i == onnx.TensorProto.DOUBLE) or any(
                   a.type == onnx.AttributeProto.TENSOR
                   and a.t.data_type == onnx.TensorProto.DOUBLE for a in n.attribute)])


def test_the_page_trains_float32_models_in_webgpus_build(js_dir, tmp_path):
    """onnxruntime-web's WebGPU build has no float64 kernel: with float32 parameters the
    page's optimizer model computes its step scalars in float32, and the task says the
    WebGPU build can run the models; a float64 model keeps its float64 scalars and the
    WebAssembly build (the same steps as the Python TrainingSession's, tests/web)."""
    X, y = _iris()
    for dtype, webgpu in ((np.float32, True), (np.float64, False)):
        out = tmp_path / np.dtype(dtype).name
        est = OrtMLPClassifier(hidden_layer_sizes=(8,), max_iter=2, random_state=0)
        est.fit(X.astype(dtype), y).export_web(out, X, y)
        assert json.loads((out / "task.json").read_text())["webgpu"] is webgpu
        assert (_doubles(out / "optimizer_model.onnx") == []) is webgpu
        # the models hold no node the WebGPU build would run on the CPU (Sum, LogSoftmax,
        # Mod, Size, a column sum's ones): the GPU providers' rewrites
        fallbacks = {name: cpu_fallbacks(onnx.load(out / f"{name}_model.onnx"))
                     for name in ("training", "eval", "optimizer")}
        assert (not any(fallbacks.values())) is webgpu, fallbacks
        # the artifacts export_artifacts writes keep the optimizer's float64 scalars
        exported = tmp_path / f"artifacts_{np.dtype(dtype).name}"
        est.export_artifacts(exported)
        assert _doubles(exported / "optimizer_model.onnx")


def _optimizer_layout(directory):
    """The layout the optimizer model's metadata names, and its inputs after lr and step."""
    optimizer = onnx.load(directory / "optimizer_model.onnx")
    assert not any(i.type.HasField("sequence_type") for i in optimizer.graph.input)
    meta = json.loads({p.key: p.value for p in optimizer.metadata_props}["ortlearn.optimizer"])
    return meta["layout"], [i.name for i in optimizer.graph.input][2:]


def test_errors(js_dir, tmp_path):
    X, y = _iris()
    est = OrtMLPClassifier(hidden_layer_sizes=(4,), max_iter=2, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="X_test and y_test"):
        est.export_web(tmp_path / "a", X, y, X_test=X)
    with pytest.raises(ValueError, match="sparse.*toarray"):
        est.export_web(tmp_path / "b", scipy.sparse.csr_matrix(X), y)
    with pytest.raises(ValueError, match="epochs"):
        est.export_web(tmp_path / "c", X, y, epochs=0)
    with pytest.raises(ValueError, match="not in classes_"):
        est.export_web(tmp_path / "d", X, y + 5)
    assert not (tmp_path / "d").exists()  # refused before anything is written
    empty = tmp_path / "js"
    (empty / "src").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"npm ci"):
        est.export_web(tmp_path / "e", X, y, js_dir=empty)
    assert not (tmp_path / "e").exists()
    with pytest.raises(ValueError, match="npm ci"):
        find_js_dir(empty)


def test_command_line(js_dir, tmp_path, capsys):
    X, y = _iris()
    est = OrtMLPClassifier(hidden_layer_sizes=(4,), max_iter=2, random_state=0).fit(X, y)
    (tmp_path / "model.pkl").write_bytes(pickle.dumps(est))
    np.savez(tmp_path / "data.npz", X_train=X, y_train=y)
    assert main(["export-web", str(tmp_path / "out"), "--estimator", str(tmp_path / "model.pkl"),
                 "--data", str(tmp_path / "data.npz"), "--epochs", "2"]) == 0
    assert "python -m http.server -d" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "task.json").read_text())["epochs"] == 2
    # errors name the problem and exit with 2
    assert main(["export-web", str(tmp_path / "x"), "--estimator",
                 str(tmp_path / "model.pkl")]) == 2
    assert "--data" in capsys.readouterr().err
    np.savez(tmp_path / "bad.npz", X=X)
    assert main(["export-web", str(tmp_path / "x"), "--estimator", str(tmp_path / "model.pkl"),
                 "--data", str(tmp_path / "bad.npz")]) == 2
    assert "X_train" in capsys.readouterr().err
    (tmp_path / "other.pkl").write_bytes(pickle.dumps({"not": "an estimator"}))
    assert main(["export-web", str(tmp_path / "x"), "--estimator", str(tmp_path / "other.pkl"),
                 "--data", str(tmp_path / "data.npz")]) == 2
    assert "not an ortlearn mini-batch estimator" in capsys.readouterr().err
