"""The runtime's performance policy: from the size of a model and of its step, how its
session runs (threads, spinning workers, onnxruntime's memory pattern) and whether an epoch is
one ``Loop`` call. The thresholds were measured (``doc/performance_notes.rst``, "The runtime's
thresholds").
"""

from __future__ import annotations

import onnxruntime as ort

from .device import default_allow_spinning, make_session_options

#: On the CPU, a model of at least this many bytes of weights trains as a large
#: one: one call per batch instead of an epoch's ``Loop`` (whose body outputs
#: hold the weights and the optimizer's moments once more, and a step over that
#: many weights outlasts the call saved), a tensor per weight written in place
#: by the step (``build_fused_step(flat=False)``: no ping-pong pair, no copy of
#: the weights or the gradients), and a session without onnxruntime's memory
#: pattern: the pattern is one block per run for all the intermediates, laid
#: out with gaps, allocated on top of what the first run took, while the arena
#: reuses the blocks of the tensors freed during the step (the wide fit's step
#: alone: 71 MB against 43, for a largest set of 24 MB alive at once). Smaller
#: models keep the pattern, the Loop and the flat buffers: their steps are
#: mostly the cost per node and per call (``doc/performance_notes.rst``).
LARGE_MODEL_BYTES = 3 << 20


#: With ``epoch_loop='auto'`` on a GPU, an epoch is one ONNX ``Loop`` call when
#: a step computes at least this many multiply-adds (batch rows x weights);
#: a smaller step runs one call per batch.
LOOP_MIN_STEP_MACS = 1_000_000


#: On the CPU, a step of at least this many multiply-adds (batch rows x weights)
#: runs on the threads of :func:`resolve_num_threads` (without a setting or a
#: limit, onnxruntime's default: one per core) whose workers spin between
#: operators; a smaller step runs on one thread: waking a sleeping worker
#: costs more than a small operator, and spinning pays only when the matrix
#: products are large enough to share (``doc/performance_notes.rst``, "The runtime's thresholds").
PARALLEL_MIN_STEP_MACS = 1_000_000


def default_session_options(device, step_macs: int, deterministic: bool = False,
                            weight_bytes: int = 0) -> ort.SessionOptions:
    """The session options of a :class:`~ortlearn.training.TrainingEngine` given none.

    Parameters
    ----------
    device : Device
    step_macs : int
        Multiply-adds of one step: rows of a mini-batch times weights.
    deterministic : bool, default=False
        Deterministic kernels on a GPU (the CPU ignores it).
    weight_bytes : int, default=0
        Bytes of the weights trained.

    Returns
    -------
    onnxruntime.SessionOptions
        On a GPU, :func:`make_session_options`.
        On the CPU, one thread below ``PARALLEL_MIN_STEP_MACS``, else the
        default threads with spinning workers (``ORTLEARN_ALLOW_SPINNING``);
        without onnxruntime's memory pattern from ``LARGE_MODEL_BYTES`` of weights.
    """
    if device.kind != "cpu":
        return make_session_options(deterministic=deterministic)
    if step_macs < PARALLEL_MIN_STEP_MACS:
        so = make_session_options(1)
    else:
        so = make_session_options(allow_spinning=default_allow_spinning(True))
    if weight_bytes >= LARGE_MODEL_BYTES:
        so.enable_mem_pattern = False
    return so
