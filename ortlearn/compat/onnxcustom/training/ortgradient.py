"""onnxcustom's ``OrtGradientForwardBackward``: forward and backward of a graph with no loss.

onnxcustom asked onnxruntime-training's ``TrainingAgent`` for the two halves;
here :func:`ortlearn.autodiff.build_forward_backward` writes them in standard
ONNX and two plain ``InferenceSession`` objects run them. The trained weights
become inputs that follow the graph's own inputs, so that the caller keeps
them (on the device) and feeds them at every call, as onnxcustom did.
"""

from __future__ import annotations

import logging

from onnx import TensorProto, numpy_helper

from ....autodiff import build_forward_backward
from ....graph import get_train_initializer, load_model, rename_value, weights_to_inputs
from ....training import make_session
from ._base_onnx_function import save_onnx_graphs
from ._functions import as_device, as_ort_value, run_ort_values

__all__ = ["OrtGradientForwardBackward", "OrtGradientForwardBackwardFunction"]

_FLOAT_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)


def _device_from_providers(providers, device_index):
    """The device onnxcustom's ``providers`` argument names."""
    if hasattr(providers, "type") and hasattr(providers, "index"):  # a torch.device
        index = providers.index if providers.index is not None else device_index
        return as_device("cpu" if providers.type == "cpu" else f"cuda:{index}")
    if providers is None or providers == "cpu":
        return as_device("cpu")
    if isinstance(providers, str):
        if providers in ("cuda", "gpu"):
            return as_device(f"cuda:{device_index}")
        return as_device(providers)
    names = [p[0] if isinstance(p, tuple) else p for p in providers]
    unknown = [n for n in names if n not in ("CPUExecutionProvider", "CUDAExecutionProvider")]
    if unknown:
        raise ValueError(f"Unexpected providers {unknown}: expected 'CPUExecutionProvider' or "
                         "'CUDAExecutionProvider'.")
    return as_device(f"cuda:{device_index}" if names and names[0] == "CUDAExecutionProvider"
                     else "cpu")


class OrtGradientForwardBackward:
    """Forward and backward of an ONNX graph w.r.t. its weights and float inputs.

    Parameters
    ----------
    onnx_model : onnx.ModelProto
        The function to train (no loss in it).
    weights_to_train : list of str, optional
        Initializers to train; default: every trainable float initializer
        (:func:`ortlearn.graph.get_train_initializer`). As in onnxcustom, the
        names must sort alphabetically in the order of the initializers
        (``onnx_rename_weights`` renames them so).
    input_names, output_names : list of str, optional
        Default: all of the graph's.
    class_name : str, optional
        Name of the class :attr:`cls_type_` created for this graph.
    sess_options : onnxruntime.SessionOptions, optional
    providers : str, list of str or torch.device, optional
        ``'cpu'`` (default), ``'cuda'`` or execution-provider names.
    provider_options, run_options, graph_builder_config
        Accepted for onnxcustom's signature; ``graph_builder_config`` (an
        onnxruntime-training object) must be None.
    device_index : int, default=0
        CUDA device id.
    enable_logging : bool, default=False
    debug : bool, default=False

    Attributes
    ----------
    cls_type_ : type
        Subclass of :class:`OrtGradientForwardBackwardFunction` holding the
        sessions; :meth:`new_instance` creates one.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import helper, numpy_helper, TensorProto
    >>> graph = helper.make_graph(
    ...     [helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
    ...     [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
    ...     [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])],
    ...     [numpy_helper.from_array(np.ones((2, 1), np.float32), "W")])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    >>> fb = OrtGradientForwardBackward(model)
    >>> fn = fb.new_instance()
    >>> X = np.array([[1.0, 2.0]], np.float32)
    >>> fn.forward([X, fb.get_initializer("W")], training=True)[0].numpy()
    array([[3.]], dtype=float32)
    >>> gx, gw = fn.backward([np.ones((1, 1), np.float32)])
    >>> gx.numpy(), gw.numpy().ravel()
    (array([[1., 1.]], dtype=float32), array([1., 2.], dtype=float32))
    """

    def __init__(self, onnx_model, weights_to_train=None, input_names=None, output_names=None,
                 class_name=None, sess_options=None, providers=None, provider_options=None,
                 run_options=None, graph_builder_config=None, device_index=0,
                 enable_logging=False, debug=False):
        if weights_to_train is None:
            weights_to_train = self._select_initializer_names(onnx_model)
            if not weights_to_train:
                raise ValueError(
                    "Unable to guess the weights to train: the model has no float initializer "
                    f"({[i.name for i in onnx_model.graph.initializer]}).")
        if graph_builder_config is not None:
            raise ValueError("graph_builder_config configures onnxruntime-training's graph "
                             "builder, which ortlearn does not use: leave it None.")
        self.onnx_model = onnx_model
        self.weights_to_train = list(weights_to_train)
        self.input_names = input_names
        self.output_names = output_names
        self.class_name = class_name or f"OrtGradientForwardBackwardFunction_{id(self)}"
        self.sess_options = sess_options
        self.providers = providers
        self.provider_options = provider_options
        self.run_options = run_options
        self.graph_builder_config = graph_builder_config
        self.device_index = device_index
        self.enable_logging = enable_logging
        self.debug = debug
        if self.input_names is None:
            self.input_names = [i.name for i in onnx_model.graph.input]
        if self.output_names is None:
            self.output_names = [o.name for o in onnx_model.graph.output]
        if len(set(self.weights_to_train)) != len(self.weights_to_train):
            raise ValueError(f"A weight appears twice in weights_to_train={self.weights_to_train}.")
        inits = {i.name for i in onnx_model.graph.initializer}
        missing = [w for w in self.weights_to_train if w not in inits]
        if missing:
            raise ValueError(f"Weights {missing} of weights_to_train are not initializers of the "
                             f"model; its initializers are {sorted(inits)}.")
        found = [i.name for i in onnx_model.graph.initializer if i.name in self.weights_to_train]
        if sorted(self.weights_to_train) != self.weights_to_train or found != self.weights_to_train:
            # onnxcustom's condition (onnxruntime-training's ordering), kept so
            # that scripts behave the same; ortlearn itself has no such need.
            raise ValueError(
                f"weights_to_train={self.weights_to_train} must be sorted alphabetically and "
                f"follow the order of the initializers ({found}). Call onnx_rename_weights "
                "on the model first.")
        self.device = _device_from_providers(providers, device_index)
        self._init_next()

    @staticmethod
    def _select_initializer_names(onnx_model):
        """The float initializers that can be trained."""
        return list(get_train_initializer(onnx_model))

    def _init_next(self):
        self._logger = logging.getLogger("onnxcustom") if self.enable_logging else None
        self.cls_type_ = type(self.class_name, (OrtGradientForwardBackwardFunction,),
                              self._create_onnx_graphs())

    def new_instance(self):
        """A new instance of :attr:`cls_type_` (its own forward/backward states)."""
        return self.cls_type_()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items()
                if not k.endswith("_") and k not in ("_logger", "run_options")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.run_options = None
        self._init_next()

    def __repr__(self):
        return f"{self.__class__.__name__}(...)"

    def save_onnx_graph(self, folder, prefix=None, suffix=None):
        """Save the graphs (the model, its forward and backward) in ``folder``."""
        attributes = {"onnx_model": self.onnx_model, "cls_type_": self.cls_type_}
        return save_onnx_graphs(self, attributes, folder, prefix, suffix)

    def get_initializer(self, name, exc=True):
        """The initializer ``name`` as a numpy array (None when absent and ``exc`` is False)."""
        for init in self.onnx_model.graph.initializer:
            if init.name == name:
                return numpy_helper.to_array(init)
        if exc:
            raise ValueError(f"Unable to find initializer {name!r} among "
                             f"{[i.name for i in self.onnx_model.graph.initializer]}.")
        return None

    def _create_onnx_graphs(self):
        model = load_model(self.onnx_model)
        weights_to_inputs(model, self.weights_to_train)
        # The weights follow the graph's inputs, in the order of weights_to_train.
        by_name = {i.name: i for i in model.graph.input}
        inputs = [by_name[n] for n in self.input_names] + [by_name[w] for w in
                                                           self.weights_to_train]
        del model.graph.input[:]
        model.graph.input.extend(inputs)
        grad_input_names = [i.name for i in inputs]
        float_inputs = [i.name for i in inputs[:len(self.input_names)]
                        if i.type.tensor_type.elem_type in _FLOAT_TYPES]
        wrt = float_inputs + self.weights_to_train
        fb = build_forward_backward(model, wrt)
        # The gradients are named <input>_grad as onnxruntime-training named them.
        backward = fb.backward
        used = {n for node in backward.graph.node for n in [*node.input, *node.output]}
        used |= {i.name for i in backward.graph.input}
        gradients = {}
        for name, grad in fb.gradients.items():
            target = f"{name}_grad"
            if target not in used:
                rename_value(backward, grad, target)
                used.add(target)
                grad = target
            gradients[name] = grad
        options = {"session_options": self.sess_options} if self.sess_options else {}
        if self._logger is not None:
            self._logger.info("[OrtGradientForwardBackward] weights_to_train=%r", wrt)
            self._logger.info("[OrtGradientForwardBackward] wrt=%r saved=%r", wrt, fb.saved)
        return {
            "__doc__": "Inherits from OrtGradientForwardBackwardFunction.",
            "__module__": OrtGradientForwardBackwardFunction.__module__,
            "_device": self.device,
            "_sess": make_session(backward, self.device, **options),
            "_sess_forward": make_session(fb.forward, self.device, **options),
            "_sess_eval": make_session(model, self.device, **options),
            "_run_options": self.run_options,
            "_logger": self._logger,
            "_debug": self.debug,
            "_input_names": list(self.input_names),
            "_output_names": list(self.output_names),
            "_grad_input_names": grad_input_names,
            "_bw_fetches_names": [gradients.get(n) for n in grad_input_names],
            "_weights_to_train": list(self.weights_to_train),
            "_fb": fb,
            "_trained_onnx": backward,
            "_forward_onnx": fb.forward,
            "_optimized_pre_grad_model": model,
        }


class OrtGradientForwardBackwardFunction:
    """Forward and backward of one graph (subclassed by :class:`OrtGradientForwardBackward`).

    Attributes
    ----------
    states_ : list
        What each training forward keeps for its backward (a stack).
    saved_tensors_ : list or None
        The inputs of the last training forward.
    """

    def __init__(self):
        self.states_ = []
        self.saved_tensors_ = None

    @classmethod
    def save_onnx_graph(cls, folder, prefix=None, suffix=None):
        """Save this class's ONNX graphs in ``folder`` (``bytes``: return them serialized)."""
        return save_onnx_graphs(cls, dict(cls.__dict__), folder, prefix, suffix)

    def save_for_backward(self, inputs):
        """Keep ``inputs`` (a shallow copy of the list) for the backward."""
        self.saved_tensors_ = list(inputs)

    @property
    def saved_tensors(self):
        """The inputs kept by the last training forward."""
        if self.saved_tensors_ is None:
            raise RuntimeError("No tensors were saved with save_for_backward.")
        return self.saved_tensors_

    def forward(self, inputs, training=False, forward_outputs_cache=None):
        """Run the graph on ``inputs`` (the graph's inputs then the weights).

        Parameters
        ----------
        inputs : list of numpy.ndarray or OrtValue
            In :attr:`_grad_input_names` order.
        training : bool, default=False
            Keep what the backward needs (one backward per training forward).
        forward_outputs_cache
            Ignored (onnxcustom reused output buffers).

        Returns
        -------
        list of OrtValue
            The graph's outputs, on the device.
        """
        cls = self.__class__
        if len(inputs) != len(cls._grad_input_names):
            raise ValueError(f"Expected {len(cls._grad_input_names)} inputs "
                             f"{cls._grad_input_names}, got {len(inputs)}.")
        feeds = {name: as_ort_value(v, cls._device)
                 for name, v in zip(cls._grad_input_names, inputs)}
        if not training:
            return run_ort_values(cls._sess_eval, cls._output_names, feeds, cls._device)
        fb = cls._fb
        # a value the backward reads may be a graph output too (a classifier's Sigmoid or
        # Softmax): bound once, read by name
        names = list(dict.fromkeys([*fb.outputs, *fb.saved]))
        by_name = dict(zip(names, run_ort_values(cls._sess_forward, names, feeds,
                                                 cls._device)))
        saved = {name: by_name[name] for name in fb.saved}
        saved.update({name: feeds[name] for name in fb.reused_inputs})
        self.states_.append(saved)
        self.save_for_backward(inputs)
        return [by_name[name] for name in fb.outputs]

    def backward(self, grad_outputs, backward_outputs_cache=None):
        """Gradients of the inputs and weights given the gradients of the outputs.

        Parameters
        ----------
        grad_outputs : list of numpy.ndarray or OrtValue
            One per output of the graph, in order.
        backward_outputs_cache
            Ignored.

        Returns
        -------
        list of OrtValue or None
            One per input of :meth:`forward` (None for an input that has no
            gradient, such as an integer input).
        """
        cls = self.__class__
        if not self.states_:
            raise RuntimeError("backward() needs a forward(..., training=True) before it.")
        saved = self.states_.pop()
        fb = cls._fb
        if len(grad_outputs) != len(fb.outputs):
            raise ValueError(f"Expected {len(fb.outputs)} output gradients (for {fb.outputs}), "
                             f"got {len(grad_outputs)}.")
        feeds = dict(saved)
        for name, grad in zip(fb.outputs, grad_outputs):
            if name in fb.cotangents:
                feeds[fb.cotangents[name]] = as_ort_value(grad, cls._device)
        wanted = [g for g in cls._bw_fetches_names if g is not None]
        feeds = {i.name: feeds[i.name] for i in cls._sess.get_inputs()}
        grads = dict(zip(wanted, run_ort_values(cls._sess, wanted, feeds, cls._device)))
        return [None if g is None else grads[g] for g in cls._bw_fetches_names]

