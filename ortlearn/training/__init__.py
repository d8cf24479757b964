"""The training runtime: one engine under every face of ortlearn.

- :class:`TrainingEngine`: a loss graph fused with its gradients and the
  optimizer update, one onnxruntime call per mini-batch or per epoch, the
  weights, optimizer state and data resident on the device (what the
  estimators run); its graphs come from :mod:`~ortlearn.training.fused`.
- :func:`minimize_lbfgs`: full-batch L-BFGS, scipy driving, onnxruntime
  evaluating the loss and its gradients (:func:`loss_and_gradient`, the
  evaluator alone, for solvers driven on the host);
  :func:`minimize_fista`: proximal gradient with restart (the L1 models);
  :func:`minimize_coordinate_descent`: scikit-learn's elastic net sweeps on a Gram matrix;
  :func:`minimize_squared_margin`: Newton's method on the linear SVMs' squared margins;
  :mod:`~ortlearn.training.svm_dual` (liblinear's duals) and
  :mod:`~ortlearn.training.quantile` (the pinball linear program by smoothing);
  every solver returns a :class:`SolverResult`.
- :class:`TrainingSession`: runs the training, eval and optimizer models of
  ``ortlearn.artifacts.generate_artifacts`` (what ``ortlearn.api`` runs).
- :class:`CheckpointState`: parameters, optimizer state and properties,
  saved as safetensors.
- :class:`Batches`: the mini-batches of an epoch.
- Devices (:func:`parse_device`, :func:`cuda_available`; WebGPU's plugin
  provider in :mod:`~ortlearn.training.webgpu`), the session
  options of the runtime (:func:`make_session_options`) and its thread policy
  (:func:`resolve_num_threads`); its performance policy, from the size of a
  model and of its step (:mod:`~ortlearn.training.policy`:
  :func:`default_session_options`).

The engine and the session keep their device buffers in one implementation
(``ortlearn/training/_buffers.py``); the argument checks they share are in
:mod:`~ortlearn.training.checks`.
"""

from ..lazy import lazy_exports

# public name -> the module defining it: imported when first used (a fit of a full-batch
# estimator needs its solver, not the engine and the sessions of the others)
_LAZY = {
    "device_value": "._buffers", "host_copy": "._buffers",
    "Batches": ".batches",
    "CheckpointState": ".checkpoint",
    "conform_state": ".checks",
    "Device": ".device", "cuda_available": ".device", "make_session": ".device",
    "make_session_options": ".device", "parse_device": ".device",
    "resolve_num_threads": ".device",
    "TrainingEngine": ".engine",
    "gram_largest_eigenvalue": ".fista", "largest_eigenvalue": ".fista",
    "minimize_fista": ".fista",
    "minimize_coordinate_descent": ".coordinate_descent",
    "loss_and_gradient": ".lbfgs", "minimize_lbfgs": ".lbfgs",
    "minimize_squared_margin": ".newton",
    "default_session_options": ".policy",
    "Fallback": ".placement", "cpu_fallbacks": ".placement",
    "SolverResult": ".result",
    "TrainingSession": ".session",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "Batches",
    "CheckpointState",
    "Device",
    "Fallback",
    "SolverResult",
    "TrainingEngine",
    "TrainingSession",
    "conform_state",
    "cpu_fallbacks",
    "cuda_available",
    "default_session_options",
    "device_value",
    "host_copy",
    "gram_largest_eigenvalue",
    "largest_eigenvalue",
    "loss_and_gradient",
    "make_session",
    "make_session_options",
    "minimize_coordinate_descent",
    "minimize_fista",
    "minimize_squared_margin",
    "minimize_lbfgs",
    "parse_device",
    "resolve_num_threads",
]
