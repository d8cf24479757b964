"""``ForwardBlock`` and ``TrainingBlock``: blocks that build whole models."""

from __future__ import annotations

from abc import abstractmethod

import onnx

from . import _graph_utils, _training_graph, model_accessor
from .blocks import Block

__all__ = ["ForwardBlock", "TrainingBlock"]


def _output_names(output) -> list[str]:
    names = [output] if isinstance(output, str) else list(output)
    if not names or not all(isinstance(n, str) for n in names):
        raise TypeError("build() must return an output name or a sequence of names, "
                        f"got {output!r}.")
    return names


def _built(value, what: str = "the model"):
    """``value``, or the RuntimeError of a block not called yet (None): onnxruntime-training's
    sentence, then the remedy."""
    if value is None:
        raise RuntimeError(f"Please build the training model first before trying to retrieve "
                           f"{what}. Call the block inside `with onnxblock.base(model):` "
                           "first.")
    return value


class ForwardBlock(Block):
    """Base class of the blocks that build a forward-only model.

    ``build`` returns the name(s) of the graph output(s); calling the block
    makes them the outputs of the model of the enclosing ``base`` context.

    Examples
    --------
    >>> from ortlearn import onnxblock
    >>> class MyForwardBlock(onnxblock.ForwardBlock):
    ...     def __init__(self):
    ...         self.loss = onnxblock.loss.CrossEntropyLoss()
    ...
    ...     def build(self, loss_input_name):
    ...         return self.loss(loss_input_name)
    """

    _model = None

    @abstractmethod
    def build(self, *args, **kwargs):
        """Stack blocks on the inputs; return the name(s) of the graph output(s)."""

    def __call__(self, *args, **kwargs):
        """Run :meth:`build` and make its result the outputs of the model."""
        model = model_accessor.current_model()
        self.base = model
        first_node = len(model.graph.node)
        output = self.build(*args, **kwargs)
        _graph_utils.register_graph_outputs(model, _output_names(output), first_node)
        self._model = onnx.shape_inference.infer_shapes(model)
        return output

    def to_model_proto(self) -> onnx.ModelProto:
        """The forward model.

        Raises
        ------
        RuntimeError
            If the block has not been called yet.
        """
        return _built(self._model)


class TrainingBlock(Block):
    """Base class of the blocks that build a training model (forward, loss and gradients).

    ``build`` returns the name of the loss (or a sequence whose first name is
    the loss and whose others are more outputs). Calling the block:

    - makes them the graph outputs;
    - turns the initializers passed to :meth:`requires_grad` into graph inputs
      (trainable, then frozen ones);
    - appends the gradients of the loss w.r.t. the trainable parameters with
      ``ortlearn.autodiff`` and their accumulation
      ``Where(lazy_reset_grad, grad, buffer + grad)``;
    - for a graph input passed to :meth:`requires_grad`, the same: the
      training model reads ``<input>_grad.accumulation.buffer`` and outputs
      ``<input>_grad.accumulation.out``, as onnxruntime-training's does.

    The models follow ``doc/artifacts_format.md``.

    Examples
    --------
    >>> from ortlearn import onnxblock
    >>> class MyTrainingBlock(onnxblock.TrainingBlock):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.loss = onnxblock.loss.MSELoss()
    ...
    ...     def build(self, output_name):
    ...         return self.loss(output_name)
    >>> block = MyTrainingBlock()
    >>> block.requires_grad("weight")
    >>> # with onnxblock.base(model): block("output")
    >>> # training_model, eval_model = block.to_model_proto()
    """

    _parameters = None
    _training_model = None
    _eval_model = None

    def __init__(self):
        self._grad_flags = {}

    def _flags(self) -> dict:
        # Created on first use: subclasses need not call super().__init__().
        if "_grad_flags" not in self.__dict__:
            self._grad_flags = {}
        return self._grad_flags

    @abstractmethod
    def build(self, *args, **kwargs):
        """Stack blocks on the inputs; return the loss name (first) and more outputs."""

    def requires_grad(self, argument_name: str, value: bool = True) -> None:
        """Mark an initializer or a graph input as trainable (``value=True``) or frozen.

        Nothing requires a gradient unless marked here. Trainable parameters
        get gradients, frozen ones do not; both become graph inputs, in the
        order they were first marked. Initializers never marked stay
        initializers of the models. A graph input marked True gets its
        gradient as an output of the training model (``<input>_grad.accumulation.out``);
        it is no parameter (not in :meth:`parameters`, nor in a checkpoint).

        Parameters
        ----------
        argument_name : str
            Name of an initializer or a graph input of the base model.
        value : bool, default=True
        """
        flags = self._flags()
        flags.pop(argument_name, None)
        flags[argument_name] = bool(value)

    def _names(self, trainable: bool) -> list[str]:
        return [n for n, v in self._flags().items() if v is trainable]

    def parameters(self):
        """Trainable and frozen parameters, as found when the block was called.

        Returns
        -------
        trainable_params : list of onnx.TensorProto
        frozen_params : list of onnx.TensorProto

        Raises
        ------
        RuntimeError
            If the block has not been called yet.
        """
        return _built(self._parameters, "the parameters")

    def to_model_proto(self):
        """The training and eval models.

        Returns
        -------
        training_model : onnx.ModelProto
        eval_model : onnx.ModelProto

        Raises
        ------
        RuntimeError
            If the block has not been called yet.
        """
        _built(self._training_model)
        return self._training_model, self._eval_model

    def __call__(self, *args, **kwargs):
        """Run :meth:`build`, then build the training and eval models on its outputs."""
        model = model_accessor.current_model()
        self.base = model
        first_node = len(model.graph.node)
        output = self.build(*args, **kwargs)
        _graph_utils.register_graph_outputs(model, _output_names(output), first_node)
        initializers = {i.name for i in model.graph.initializer}
        inputs = [i.name for i in model.graph.input if i.name not in initializers]
        trainable = [n for n in self._names(True) if n not in inputs]
        input_grads = [n for n in inputs if n in self._names(True)]
        self._training_model, self._eval_model, self._parameters = (
            _training_graph.build_training_and_eval(model, trainable, self._names(False),
                                                    input_grads))
        model.CopyFrom(self._training_model)
        return output
