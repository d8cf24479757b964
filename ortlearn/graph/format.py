"""Names and metadata keys of the training artifacts, read by their writers and readers alike.

``doc/artifacts_format.md`` describes the format: the training model's
gradient-accumulation inputs and outputs, its ``lazy_reset_grad`` flag, the
optimizer model's inputs, and the JSON each model carries in
``metadata_props``.
"""

#: ``metadata_props`` key of the training and eval models (user inputs and
#: outputs, trainable and frozen parameters).
TRAINING_METADATA_KEY = "ortlearn.training"
#: ``metadata_props`` key of the optimizer model (parameters, states, hyper-parameters).
OPTIMIZER_METADATA_KEY = "ortlearn.optimizer"
#: Suffix of the training model's input holding a parameter's accumulated gradient.
GRAD_BUFFER_SUFFIX = "_grad.accumulation.buffer"
#: Suffix of the training model's output holding a parameter's new accumulated gradient.
GRAD_OUTPUT_SUFFIX = "_grad.accumulation.out"
#: Boolean input of the training model: true ignores the accumulated gradients.
LAZY_RESET_GRAD = "lazy_reset_grad"
#: Inputs of the optimizer model: the learning rate and the 1-based step.
LEARNING_RATE = "learning_rate"
STEP = "step"
#: Tensor-sequence inputs of the optimizer model, as onnxruntime-training names
#: them: the parameters, their gradients and the optimizer states, in the
#: order of the trainable parameters.
PARAMS_SEQUENCE = "params"
GRADIENTS_SEQUENCE = "gradients"
FIRST_ORDER_MOMENTS = "first_order_moments"
SECOND_ORDER_MOMENTS = "second_order_moments"
#: First output of the optimizer model: a bool tensor of shape [1], true when
#: the parameters were updated.
UPDATED_FLAG = "updated_flag"
#: Learning rate of a fresh optimizer (onnxruntime-training's default).
DEFAULT_LEARNING_RATE = 1e-3
#: Suffixes of the optimizer model's names: ``p.gradient`` is read, ``p.updated``
#: and ``p.<state>.updated`` are written.
GRADIENT_SUFFIX = ".gradient"
UPDATED_SUFFIX = ".updated"
#: Key of the training metadata listing the frozen parameters each training step
#: updates (BatchNormalization's running statistics); the training model
#: writes the new value of each such ``p`` to its output ``p.updated``
#: (:data:`UPDATED_SUFFIX`).
UPDATED_FROZEN_KEY = "updated_frozen"
#: Key of the training metadata listing the graph inputs whose gradients the
#: training model outputs (``TrainingBlock.requires_grad`` on a graph input):
#: it reads ``x_grad.accumulation.buffer`` and writes ``x_grad.accumulation.out``
#: for each such ``x``, after those of the parameters.
INPUT_GRADIENTS_KEY = "input_gradients"
#: ``metadata_props`` key of a ``Gather`` node on an embedding table: the row
#: (an integer as text) that receives no gradient, as torch's
#: ``nn.Embedding(padding_idx=...)``. Set it with
#: :func:`ortlearn.autodiff.mark_padding_idx`.
PADDING_IDX_KEY = "ortlearn.padding_idx"
#: Prefix of the initializers that hold a hyper-parameter of a loss graph (a
#: penalty's strength): the training engine feeds them as inputs, so that fits
#: differing only in them share one compiled step (``training/cache.py``).
HYPER_PREFIX = "hyper."
