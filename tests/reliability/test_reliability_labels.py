"""Reliability: non-scalar losses and out-of-range class labels are refused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn import OrtGradientOptimizer, add_loss_output, artifacts


def _linear(n_out: int, loss_shape=None):
    """X (N, 2) @ W (2, n_out); with ``loss_shape``, a per-row squared error output 'loss'."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])
    w = numpy_helper.from_array(np.ones((2, n_out), np.float32), "W")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["out"])]
    inputs = [x]
    if loss_shape is None:
        outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", n_out])]
    else:
        inputs.append(helper.make_tensor_value_info("label", TensorProto.FLOAT, ["N", n_out]))
        nodes += [helper.make_node("Sub", ["out", "label"], ["d"]),
                  helper.make_node("Mul", ["d", "d"], ["loss"])]
        outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, loss_shape)]
    graph = helper.make_graph(nodes, "g", inputs, outputs, [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# ----------------------------------------------------------- non-scalar losses
@pytest.mark.parametrize("loss_shape", [["N", 1], ["N"], [4, 1]])
def test_gradient_optimizer_refuses_non_scalar_loss(loss_shape):
    rng = np.random.default_rng(0)
    X = rng.random((4, 2), dtype=np.float32)
    y = rng.random((4, 1), dtype=np.float32)
    est = OrtGradientOptimizer(_linear(1, loss_shape), max_iter=2)
    with pytest.raises(ValueError, match=r"'loss' must be a scalar.*ReduceMean"):
        est.fit(X, y)


def test_gradient_optimizer_accepts_one_element_loss():
    model = _linear(1, ["N", 1])
    mean = helper.make_node("ReduceMean", ["loss_rows"], ["loss"], keepdims=1)
    model.graph.node[-1].output[0] = "loss_rows"
    model.graph.node.append(mean)
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1
    rng = np.random.default_rng(0)
    X = rng.random((4, 2), dtype=np.float32)
    y = rng.random((4, 1), dtype=np.float32)
    OrtGradientOptimizer(model, max_iter=2).fit(X, y)


def test_generate_artifacts_refuses_non_scalar_first_output(tmp_path):
    with pytest.raises(ValueError, match=r"'out' must be a scalar.*\['N', 3\]"):
        artifacts.generate_artifacts(_linear(3), requires_grad=["W"], loss=None,
                                     optimizer=artifacts.OptimType.AdamW,
                                     artifact_directory=tmp_path)
    assert not any(tmp_path.iterdir())


# ------------------------------------------------ class labels out of range
def _logits_model(n_classes: int = 3):
    return _linear(n_classes)


def _X(n: int = 4):
    return np.random.default_rng(0).random((n, 2), dtype=np.float32)


BAD_LABELS = [(np.array([0, 1, 2, 3]), r"\[0, 3\): 3 "),
              (np.array([0, -1, 2, 1]), r"\[0, 3\): -1 "),
              (np.array([0, -4, 7, 1]), r"\[0, 3\): -4, 7 ")]


@pytest.mark.parametrize(("labels", "shown"), BAD_LABELS)
@pytest.mark.parametrize("solver", ["sgd", "lbfgs"])
def test_add_loss_output_cross_entropy_refuses_bad_labels(labels, shown, solver):
    from ortlearn import add_loss_output
    from ortlearn.optim import SGD
    from ortlearn.training.engine import TrainingEngine
    from ortlearn.training.lbfgs import minimize_lbfgs

    model = add_loss_output(_logits_model(), "cross_entropy")
    data = [_X(), labels.astype(np.int64)]
    with pytest.raises(ValueError, match=r"'label' of the training data .*" + shown):
        if solver == "sgd":
            OrtGradientOptimizer(model, max_iter=2).fit(*data)
        else:
            minimize_lbfgs(model, ["W"], None, data, max_iter=2)
    engine = TrainingEngine(model, ["W"], SGD())
    with pytest.raises(ValueError, match="outside"):
        engine.eval_loss(data)
    # labels in range still train
    OrtGradientOptimizer(model, max_iter=2).fit(_X(), np.array([0, 1, 2, 1]))


def _artifacts(tmp_path, loss):
    artifacts.generate_artifacts(_logits_model(), requires_grad=["W"], loss=loss,
                                 optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=tmp_path)
    from ortlearn import api
    state = api.CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = api.Module(tmp_path / "training_model.onnx", state,
                        tmp_path / "eval_model.onnx")
    return module


@pytest.mark.parametrize(("labels", "shown"), BAD_LABELS)
def test_loss_type_cross_entropy_module_refuses_bad_labels(tmp_path, labels, shown):
    module = _artifacts(tmp_path, artifacts.LossType.CrossEntropyLoss)
    with pytest.raises(ValueError, match=r"'labels' of train_step .*" + shown):
        module(_X(), labels.astype(np.int64))
    module.eval()
    with pytest.raises(ValueError, match=r"'labels' of eval_step .*" + shown):
        module(_X(), labels.astype(np.int64))
    module.train()
    assert np.isfinite(module(_X(), np.array([0, 1, 2, 1], np.int64)))


@pytest.mark.parametrize("labels", [[0, 1, 3, 1], [0, -1, 2, 1], [-3, 1, 2, 1]])
def test_training_session_checks_ortvalue_labels_in_the_graph(tmp_path, labels):
    """An OrtValue is not read back to the host: the graph fails the step, and the
    session turns that into a ValueError; nothing is accumulated."""
    import onnxruntime as ort

    module = _artifacts(tmp_path, artifacts.LossType.CrossEntropyLoss)
    good = ort.OrtValue.ortvalue_from_numpy(np.array([0, 1, 2, 1], np.int64))
    reference = module(_X(), good)
    bad = ort.OrtValue.ortvalue_from_numpy(np.array(labels, np.int64))
    with pytest.raises(ValueError, match=r"'labels' of train_step holds class labels outside "
                                         r"\[0, 3\).*OrtValue"):
        module(_X(), bad)
    module.eval()
    with pytest.raises(ValueError, match=r"'labels' of eval_step .*outside \[0, 3\)"):
        module(_X(), bad)
    module.train()
    np.testing.assert_array_equal(module(_X(), good), reference)


def test_onnxblock_cross_entropy_ignore_index(tmp_path):
    """ignore_index is allowed, other out-of-range values are not: on the host and in the graph."""
    import onnxruntime as ort

    from ortlearn import onnxblock

    class Block(onnxblock.Block):
        def __init__(self):
            self.loss = onnxblock.loss.CrossEntropyLoss(ignore_index=-100)

        def build(self, output_name):
            return self.loss(output_name)

    module = _artifacts(tmp_path, Block())
    ok, bad = np.array([0, -100, 2, 1], np.int64), np.array([0, -100, -1, 1], np.int64)
    assert np.isfinite(module(_X(), ok))
    assert np.isfinite(module(_X(), ort.OrtValue.ortvalue_from_numpy(ok)))
    with pytest.raises(ValueError, match=r"\[0, 3\) or the ignore_index -100: -1 "):
        module(_X(), bad)
    with pytest.raises(ValueError, match=r"\[0, 3\) and are not the ignore_index -100"):
        module(_X(), ort.OrtValue.ortvalue_from_numpy(bad))


def test_graph_guard_is_a_copy_with_the_same_values():
    from ortlearn.graph import CLASS_LABEL_GUARD, class_label_marks, guard_class_labels
    from ortlearn.training import make_session

    plain = _logits_model()
    assert guard_class_labels(plain) is plain
    model = add_loss_output(_logits_model(), score_name="cross_entropy")
    assert class_label_marks(model) == {"label": (3, None)}
    guarded = guard_class_labels(model)
    assert not any(n.name.startswith(CLASS_LABEL_GUARD) for n in model.graph.node)
    feeds = {"X": _X(), "label": np.array([0, 1, 2, 1], np.int64)}
    np.testing.assert_array_equal(make_session(guarded).run(None, feeds)[0],
                                  make_session(model).run(None, feeds)[0])
    with pytest.raises(Exception, match=CLASS_LABEL_GUARD.replace(".", r"\.") + "label"):
        make_session(guarded).run(None, {**feeds, "label": np.array([0, 1, 5, 1], np.int64)})


def test_check_label_values_non_integer_floats():
    from ortlearn.training.checks import check_label_values

    check_label_values(np.array([0.0, 1.0, 2.0]), 3)
    with pytest.raises(ValueError, match=r"outside \[0, 3\): 0.5 "):
        check_label_values(np.array([0.0, 0.5, 2.0]), 3)


@pytest.mark.parametrize("name", ["OrtMLPClassifier", "OrtLinearClassifier"])
def test_estimators_encode_labels(name):
    """The estimators encode labels as scikit-learn does: any integer (-1 included) is a
    class; non-integer floats and classes unseen by partial_fit are a ValueError."""
    import warnings

    import ortlearn

    cls = getattr(ortlearn, name)
    X = np.random.default_rng(0).random((8, 2), dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = cls(max_iter=2).fit(X, np.array([-1, 1, 2, 0, 1, 2, 0, 1]))
        assert list(est.classes_) == [-1, 0, 1, 2]
        with pytest.raises(ValueError, match="continuous"):
            cls(max_iter=2).fit(X, np.array([0.0, 0.5, 2, 0, 1, 2, 0, 1]))
        est = cls(max_iter=2)
        est.partial_fit(X, np.array([0, 1, 2, 0, 1, 2, 0, 1]), classes=[0, 1, 2])
        with pytest.raises(ValueError, match=r"\[5\]"):
            est.partial_fit(X, np.array([0, 1, 5, 0, 1, 2, 0, 1]))
