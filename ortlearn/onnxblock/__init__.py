"""Build ONNX models by stacking blocks: the API of ``onnxruntime.training.onnxblock``.

Everything is written in standard ONNX operators, so the models run in the
ordinary ``onnxruntime``. ``from onnxruntime.training import onnxblock``
becomes ``from ortlearn import onnxblock``.

Examples
--------
>>> from ortlearn import onnxblock
>>> sorted(n for n in onnxblock.__all__ if n[0].isupper())
['Block', 'ForwardBlock', 'TrainingBlock']
"""

from . import blocks, loss, optim
from .blocks import Block
from .checkpoint_utils import load_checkpoint_to_model, save_checkpoint
from .model_accessor import base, custom_op_library, empty_base
from .onnxblock import ForwardBlock, TrainingBlock

__all__ = ["Block", "ForwardBlock", "TrainingBlock", "base", "blocks", "custom_op_library",
           "empty_base", "load_checkpoint_to_model", "loss", "optim", "save_checkpoint"]
