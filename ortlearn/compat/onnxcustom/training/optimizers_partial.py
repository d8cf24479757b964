"""onnxcustom's second training API: ``OrtGradientForwardBackwardOptimizer``.

It trains a graph that holds no loss: :class:`OrtGradientForwardBackward`
gives the forward and the backward, and three objects compute the rest on
the device, each with small ONNX functions: the loss and its gradient w.r.t.
the output (:mod:`.sgd_learning_loss`), the penalty (:mod:`.sgd_learning_penalty`)
and the weight update (:mod:`.sgd_learning_rate`).

One epoch, as onnxcustom ran it: ``ceil(n / batch_size)`` batches of
``batch_size`` consecutive rows starting at random rows
(:class:`~.data_loader.OrtDataLoader`); for each batch, the loss ``L`` (a sum
over the batch) plus the penalty, the gradients ``G`` of the weights, then for
each weight the penalty's update followed by the learning rate's
(``W <- W - eta / batch_size * G`` for SGD). The epoch's loss is the mean over
the batches of ``L / batch_size``; the learning rate moves to
``update_learning_rate(epoch)`` after each epoch.
"""

from __future__ import annotations

import inspect
import logging
import warnings

import numpy as np

from ....graph import get_train_initializer, onnx_to_np_dtype
from ..utils.onnx_helper import get_onnx_opset, replace_initializers_into_onnx
from ..utils.onnxruntime_helper import get_ort_device, ort_device_to_string, to_c_ort_value
from ._base_onnx_function import constructor_repr, save_onnx_graphs
from ._functions import OrtFunction, as_ort_value, to_numpy, zero_model
from .data_loader import OrtDataLoader
from .excs import ConvergenceError, ConvergenceWarning
from .ortgradient import OrtGradientForwardBackward
from .sgd_learning_loss import BaseLearningLoss
from .sgd_learning_penalty import BaseLearningPenalty
from .sgd_learning_rate import BaseLearningRate

__all__ = ["OrtGradientForwardBackwardOptimizer"]


class OrtGradientForwardBackwardOptimizer:
    """Stochastic gradient descent on an ONNX graph with no loss in it.

    Parameters
    ----------
    model_onnx : onnx.ModelProto
        The graph to train (a prediction function).
    weights_to_train : list of str, optional
        Initializers to train; default: the trainable float initializers
        (:func:`ortlearn.graph.get_train_initializer`).
    loss_output_name : str, default='loss'
        Kept for onnxcustom's signature (the graph holds no loss).
    max_iter : int, default=100
        Number of epochs.
    training_optimizer_name : str, default='SGDOptimizer'
        The only one implemented (as in onnxcustom).
    batch_size : int, default=10
    learning_rate : BaseLearningRate, float or str, default='SGD'
        See :meth:`BaseLearningRate.select`; a float is the ``eta0`` of
        :class:`LearningRateSGD` (``'invscaling'``).
    device : str or OrtDevice, default='cpu'
    warm_start : bool, default=False
        False: every ``fit`` starts from weights drawn from numpy's global
        standard normal generator (``numpy.random.seed`` makes it
        repeatable). True: every ``fit`` starts from the graph's
        initializers. That is what onnxcustom did, although its
        documentation promised to continue the previous fit; to continue,
        train ``get_trained_onnx()``. The velocities start at zero.
    verbose : int, default=0
        Show a progress bar when > 0 (if tqdm is installed), with the loss
        when > 1.
    validation_every : float or int, default=0.1
        Evaluate on ``X_val`` every ``validation_every`` epochs; below 1, a
        fraction of ``max_iter``.
    learning_loss : BaseLearningLoss or str, default='square_error'
        See :meth:`BaseLearningLoss.select`.
    enable_logging : bool, default=False
        Log the steps to the ``'onnxcustom'`` logger.
    weight_name : str, optional
        Set when the training uses sample weights (kept for onnxcustom's
        signature; ``fit(sample_weight=...)`` is what matters).
    learning_penalty : BaseLearningPenalty, str or None, default=None
        See :meth:`BaseLearningPenalty.select`.
    exc : bool, default=True
        Raise :class:`ConvergenceError` when a loss becomes NaN or infinite;
        otherwise warn (:class:`ConvergenceWarning`) and go on.

    Attributes
    ----------
    train_losses_ : list of float
        Loss of each epoch (kept up to the divergence when one is raised).
    validation_losses_ : list of float or None
    train_session_ : OrtGradientForwardBackward
    train_function_ : OrtGradientForwardBackwardFunction
    trained_coef_ : dict
        ``{weight name: OrtValue}``.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LinearRegression
    >>> from skl2onnx import to_onnx
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(100, 2).astype(np.float32)
    >>> y = (X @ [1.0, -2.0] + 0.5).astype(np.float32)
    >>> onx = to_onnx(LinearRegression().fit(X, y), X, black_op={'LinearRegressor'})
    >>> np.random.seed(0)
    >>> opt = OrtGradientForwardBackwardOptimizer(onx, max_iter=30, learning_rate=0.1)
    >>> opt = opt.fit(X, y)
    >>> bool(opt.train_losses_[-1] < 1e-3 * opt.train_losses_[0])
    True
    """

    def __init__(self, model_onnx, weights_to_train=None, loss_output_name="loss", max_iter=100,
                 training_optimizer_name="SGDOptimizer", batch_size=10, learning_rate="SGD",
                 device="cpu", warm_start=False, verbose=0, validation_every=0.1,
                 learning_loss="square_error", enable_logging=False, weight_name=None,
                 learning_penalty=None, exc=True):
        if weights_to_train is None:
            weights_to_train = list(get_train_initializer(model_onnx))
        self.model_onnx = model_onnx
        self.learning_rate = BaseLearningRate.select(learning_rate)
        self._set_device(device)
        self.batch_size = batch_size
        # kept as given: scikit-learn's clone checks the constructor stored its arguments
        self.weights_to_train = weights_to_train
        self.loss_output_name = loss_output_name
        self.training_optimizer_name = training_optimizer_name
        self.verbose = verbose
        self.max_iter = max_iter
        self.warm_start = warm_start
        self.learning_loss = BaseLearningLoss.select(learning_loss)
        self.learning_penalty = BaseLearningPenalty.select(learning_penalty)
        self.enable_logging = enable_logging
        self.weight_name = weight_name
        self.exc = exc
        # At least 1 (onnxcustom divided by zero for max_iter * validation_every < 1).
        self.validation_every = (max(1, int(self.max_iter * validation_every))
                                 if validation_every < 1 else validation_every)
        self.build_onnx_function()

    # parameters, as onnxcustom's BaseEstimator

    @classmethod
    def _get_param_names(cls):
        params = inspect.signature(cls.__init__).parameters.values()
        return [(p.name, p.default) for p in params if p.name != "self"]

    def _set_device(self, device) -> None:
        """``device`` (an OrtDevice) and, for get_params, the string it was given as (the same
        object: scikit-learn's clone checks it)."""
        self.device = get_ort_device(device)
        self._device_name = device if isinstance(device, str) else ort_device_to_string(
            self.device)

    def get_params(self, deep=False):
        """The constructor's parameters (``device`` as a string)."""
        res = {name: getattr(self, name) for name, _ in self._get_param_names()}
        res["device"] = self._device_name
        return res

    def set_params(self, **params):
        """Set parameters and rebuild the functions; return self."""
        for k, v in params.items():
            if k == "device":
                self._set_device(v)
            else:
                setattr(self, k, v)
        self.build_onnx_function()
        return self

    def __sklearn_tags__(self):
        """scikit-learn's tags (its searches ask for them): supervised, not a classifier."""
        from sklearn.utils import Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=True))

    def __repr__(self):
        return constructor_repr(self, {"device": self._device_name})

    def save_onnx_graph(self, folder, prefix=None, suffix=None):
        """Save every ONNX graph the training runs in ``folder``, or return them
        serialized when ``folder`` is ``bytes`` (a nested dict by attribute)."""
        return save_onnx_graphs(self, self.__dict__, folder, prefix, suffix)

    @property
    def needs_grad(self):
        """Whether the update keeps a velocity per weight."""
        return self.learning_rate.needs_grad

    def build_onnx_function(self):
        """Build the loss, penalty and update functions on the device."""
        opset = get_onnx_opset(self.model_onnx)
        n = len(self.weights_to_train)
        self.learning_loss.build_onnx_function(opset, self.device, self.weight_name)
        self.learning_rate.build_onnx_function(opset, self.device, n)
        self.learning_penalty.build_onnx_function(opset, self.device, n)
        self.zero_onnx_ = zero_model(np.float32)
        self.zero_sess_ = OrtFunction(self.zero_onnx_, self.device)
        self._logger = logging.getLogger("onnxcustom") if self.enable_logging else None

    # state

    @staticmethod
    def _get_att_state(kind):
        if kind == "weight":
            return "train_state_"
        if kind == "grad":
            return "train_grad_state_"
        raise ValueError(f"Unexpected kind={kind!r}: expected 'weight' or 'grad'.")

    def _stored_state(self, kind="weight") -> list:
        """The state as training holds it (public OrtValues)."""
        att = self._get_att_state(kind)
        if not hasattr(self, att):
            raise AttributeError("Method fit must be called before.")
        return getattr(self, att)

    def get_full_state(self, kind="weight"):
        """The values fed to the graph: None for its inputs, then the weights (C
        OrtValues, as onnxcustom's); ``kind='grad'`` for the velocities, a list of kinds
        for several."""
        if isinstance(kind, list):
            return [self.get_full_state(kind=k) for k in kind]
        return [to_c_ort_value(v) for v in self._stored_state(kind)]

    def get_state(self, kind="weight"):
        """The trained weights (C OrtValues), in ``weights_to_train`` order."""
        value = self.get_full_state(kind)
        return value[len(value) - len(self.weights_to_train):]

    @property
    def trained_coef_(self):
        """``{weight name: C OrtValue}``."""
        return dict(zip(self.weights_to_train, self.get_state()))

    def get_trained_onnx(self, model=None):
        """The graph (``model`` or the trained one) with the trained weights as initializers."""
        state = {name: to_numpy(v) for name, v in self.trained_coef_.items()}
        return replace_initializers_into_onnx(model or self.model_onnx, state)

    def set_state(self, state, check_trained=True, kind="weight", zero=False):
        """Replace the state (``[None for inputs..., weights...]``; numpy arrays or OrtValues).

        ``zero=True`` stores zeros of the same shapes (fresh velocities).
        """
        if check_trained and not hasattr(self, "train_session_"):
            raise AttributeError("Method fit must be called before.")
        values = []
        for i, v in enumerate(state):
            if v is None:
                values.append(None)
                continue
            if not isinstance(v, np.ndarray):
                v = to_numpy(v) if zero else as_ort_value(v, self.device)
            if isinstance(v, np.ndarray):
                v = as_ort_value(np.zeros_like(v) if zero else np.ascontiguousarray(v),
                                 self.device)
            values.append(v)
            if not hasattr(v, "element_type"):
                raise TypeError(f"Unexpected type {type(v)!r} for state {i}.")
        setattr(self, self._get_att_state(kind), values)

    def __getstate__(self):
        state = {k: v for k, v in self.__dict__.items() if not k.endswith("_")
                 and k != "_logger"}
        state["device"] = ort_device_to_string(self.device)
        for att in ("train_state_", "train_grad_state_"):
            if hasattr(self, att):
                state[att[:-1]] = [None if v is None else to_numpy(v) for v in getattr(self, att)]
        if hasattr(self, "train_losses_"):
            state["train_losses"] = self.train_losses_
        return state

    def __setstate__(self, state):
        popped = {k: state.pop(k) for k in ("train_state", "train_grad_state", "train_losses")
                  if k in state}
        self.__dict__.update(state)
        self._set_device(self.device)
        if "train_state" in popped:
            self.set_state(popped["train_state"], check_trained=False, kind="weight")
        if "train_grad_state" in popped:
            self.set_state(popped["train_grad_state"], check_trained=False, kind="grad")
        if "train_losses" in popped:
            self.train_losses_ = popped["train_losses"]
        self.build_onnx_function()

    # training

    def fit(self, X, y, sample_weight=None, X_val=None, y_val=None):
        """Train the weights for ``max_iter`` epochs.

        Parameters
        ----------
        X : numpy.ndarray
        y : numpy.ndarray
            Same dtype as the output (int64 labels for NegLogLearningLoss).
        sample_weight : numpy.ndarray, optional
        X_val, y_val : numpy.ndarray, optional
            Evaluated every :attr:`validation_every` epochs
            (:attr:`validation_losses_`).

        Returns
        -------
        self
        """
        if self.training_optimizer_name != "SGDOptimizer":
            raise NotImplementedError(
                f"Only the SGDOptimizer is implemented, not {self.training_optimizer_name!r}.")
        logger = self._logger
        self.train_session_ = OrtGradientForwardBackward(
            self.model_onnx, weights_to_train=self.weights_to_train,
            providers=ort_device_to_string(self.device),
            device_index=self.device.device_id(), enable_logging=self.enable_logging)
        self.train_function_ = self.train_session_.new_instance()
        self.input_names_ = self.train_session_.cls_type_._grad_input_names
        self.output_names_ = self.train_session_.cls_type_._bw_fetches_names
        n_weights = len(self.weights_to_train)

        # As onnxcustom's code did (its documentation said otherwise): every fit
        # starts from the graph's initializers, or from random weights.
        self.set_state([self.train_session_.get_initializer(name, exc=False)
                        for name in self.input_names_])
        if not self.warm_start:
            # onnxcustom draws new weights from numpy's global generator at every fit.
            new_state = []
            for v in self._stored_state():
                if v is None:
                    new_state.append(None)
                    continue
                dtype = onnx_to_np_dtype(v.element_type())
                shape = v.shape()
                new_state.append(np.random.randn(*shape).astype(dtype) if len(shape) > 0
                                 else np.random.randn(1).astype(dtype))
            self.set_state(new_state)
        if self.needs_grad:
            self.set_state(self._stored_state(), kind="grad", zero=True)
        if logger is not None:
            logger.info("[OrtGradientForwardBackwardOptimizer.fit] input_names=%r "
                        "weights_to_train=%r warm_start=%r", self.input_names_,
                        self.weights_to_train, self.warm_start)

        data_loader = OrtDataLoader(X, y, sample_weight, batch_size=self.batch_size,
                                    device=self.device)
        data_loader_val = (None if X_val is None else OrtDataLoader(
            X_val, y_val, batch_size=X_val.shape[0], device=self.device, random_iter=False))

        self.learning_rate.init_learning_rate()
        loop = range(self.max_iter)
        if self.verbose > 0:
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm is optional: no progress bar then
                tqdm = None
            if tqdm is not None:
                loop = tqdm(loop)
        self.train_losses_ = []
        val_losses = []
        for it in loop:
            loss = self._iteration(data_loader, n_weights)
            lr = self.learning_rate.update_learning_rate(it).value
            if self.verbose > 1 and hasattr(loop, "set_description"):
                loop.set_description(f"loss={loss:1.3g} lr={lr:1.3g}")
            if logger is not None:
                logger.info("[OrtGradientForwardBackwardOptimizer.fit] lr value=%r", lr)
            self.train_losses_.append(loss)
            if data_loader_val is not None and (it + 1) % self.validation_every == 0:
                val_losses.append(self._evaluation(data_loader_val))
        self.validation_losses_ = None if data_loader_val is None else val_losses
        return self

    def _diverged(self, message, past):
        past = [float(v) for v in past[-5:]]
        text = (f"Loss is nan or infinite, learning_rate={self.learning_rate!r}, the gradient "
                f"descent has failed (past losses={past}).") if message is None else message
        if self.exc:
            raise ConvergenceError(text)
        warnings.warn(text, ConvergenceWarning, stacklevel=3)

    def _iteration(self, data_loader, n_weights):
        state = self._stored_state()
        velocity = self._stored_state("grad") if self.needs_grad else None
        n = len(state) - n_weights
        bs = data_loader.batch_size
        device = self.device
        losses = []
        logger = self._logger
        if logger is not None:  # onnxcustom's lines, on its logger
            logger.debug("[OrtGradientForwardBackwardOptimizer._iteration] "
                         "iteration begin learning_rate=%r", self.learning_rate)
        for ib, batch in enumerate(data_loader.iter_ortvalue()):
            if logger is not None:
                logger.debug("[OrtGradientForwardBackwardOptimizer._iteration] batch %d", ib)
            ortx, orty = batch[0], batch[1]
            ortw = batch[2] if len(batch) == 3 else None
            state[0] = ortx
            prediction = self.train_function_.forward(state, training=True)
            loss, loss_gradient = self.learning_loss.loss_gradient(
                device, orty, prediction[0], weight=ortw)
            loss = self.learning_penalty.penalty_loss(device, loss, *state[n:])
            cpu_loss = to_numpy(loss)
            if not np.isfinite(cpu_loss).all():
                self._diverged(None, losses)
                cpu_loss = np.full_like(cpu_loss, np.nan)
            # The outputs after the first one receive no gradient from the loss.
            grads = [loss_gradient] + [
                np.zeros(p.shape(), dtype=onnx_to_np_dtype(p.element_type()))
                for p in prediction[1:]]
            gradient = self.train_function_.backward(grads)
            for i in range(n, len(state)):
                state[i] = self.learning_penalty.update_weights(i - n, device, state[i])
                if velocity is None:
                    state[i] = self.learning_rate.update_weights(
                        i - n, device, state[i], gradient[i], bs)
                else:
                    state[i], velocity[i] = self.learning_rate.update_weights(
                        i - n, device, state[i], gradient[i], bs, velocity[i])
            losses.append(float(cpu_loss.ravel()[0]) / bs)
        state[0] = None
        return float(np.array(losses).mean())

    def _evaluation(self, data_loader):
        state = list(self._stored_state())
        losses = []
        for batch in data_loader.iter_ortvalue():
            state[0] = batch[0]
            prediction = self.train_function_.forward(state, training=False)
            loss, _ = self.learning_loss.loss_gradient(self.device, batch[1], prediction[0])
            cpu_loss = to_numpy(loss)
            if not np.isfinite(cpu_loss).all():
                self._diverged(f"Loss is nan or infinite, the evaluation has failed "
                               f"(past losses={losses[-5:]}).", losses)
                cpu_loss = np.full_like(cpu_loss, np.nan)
            losses.append(float(cpu_loss.ravel()[0]))
        return float(np.array(losses).sum() / len(data_loader))

    def losses(self, X, y, sample_weight=None):
        """The loss term of each row (see :meth:`BaseLearningLoss.loss_scores`)."""
        data_loader = OrtDataLoader(X, y, sample_weight, batch_size=X.shape[0],
                                    device=self.device, random_iter=False)
        state = list(self._stored_state())
        batch = next(iter(data_loader.iter_ortvalue()))
        state[0] = batch[0]
        prediction = self.train_function_.forward(state, training=False)
        weight = batch[2] if len(batch) == 3 else None
        score = self.learning_loss.loss_scores(self.device, batch[1], prediction[0], weight)
        return to_numpy(score).ravel().astype(X.dtype)

    def score(self, X, y, sample_weight=None):
        """Minus the mean of :meth:`losses` (higher is better)."""
        return -self.losses(X, y, sample_weight=sample_weight).sum() / X.shape[0]
