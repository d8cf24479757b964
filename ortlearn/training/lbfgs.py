"""Full-batch L-BFGS on an ONNX loss graph (scipy drives, onnxruntime evaluates).

Each evaluation scipy asks for is ONE onnxruntime call on a gradient model
(:func:`ortlearn.autodiff.build_gradient`) returning the loss and every
gradient; the data are put on the device once. scipy works in float64, the
weights are cast to the graph's dtype for onnxruntime.

A sparse ``X`` (``scipy.sparse``) is never densified: every node reading it
must be a ``MatMul(X, W)`` with ``W`` trained; the graph gets the product as
an input instead, the host computes ``X @ W`` and adds ``X^T @ d(product)``
to ``W``'s gradient, both sparse products (time and memory in the
non-zeros; a densified block of rows would cost the dense size in time at
every evaluation).

The gradient graph's float initializers that are not trained (a data scale,
a penalty strength) are fed as data, and the session of a graph is kept
(:data:`_CACHE_SIZE` of them, for data up to :data:`_CACHE_MAX_DATA_BYTES`):
another fit of the same objective, on other rows or with another strength,
reuses it.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import scipy.optimize
from onnx import helper

from ..autodiff import build_gradient
from ..exceptions import ConvergenceError, ConvergenceWarning
from ..graph import class_label_marks, initializers_to_inputs, load_model, weights_to_inputs
from ..graph.cache import LRUCache, model_digest
from ..log import user_stacklevel, verbose_log
from .checks import (
    check_class_labels,
    check_input_names,
    check_loss_output,
    check_trainable,
    initial_values,
    memory_errors,
)
from .device import make_session, make_session_options, parse_device, single_thread_blas
from .layout import ort_elem_type
from .result import CALLBACK, CONVERGED, INTERRUPTED, MAX_ITER, STALLED, SolverResult
from .sparse import is_sparse, left_products

__all__ = ["loss_and_gradient", "minimize_lbfgs"]

#: scikit-learn's ``ftol`` for L-BFGS: a bit above float64's machine precision.
_FTOL = 64 * np.finfo(float).eps

#: Gradient sessions of the last graphs, by graph: a fit of the same objective
#: (the same family and shapes: a cross-validation fold, a grid point, a refit;
#: the weights and the untrained float initializers are inputs, so the data
#: size and the regularisation strengths do not enter the graph) skips the
#: gradient graph and the session, 9 to 22 ms of setup. Only for data of at
#: most ``_CACHE_MAX_DATA_BYTES``: where the setup matters, and a kept session
#: holds onnxruntime's arena, sized by the data's intermediates.
_CACHE_SIZE = 8
_CACHE_MAX_DATA_BYTES = 16 * 2**20
_SESSIONS = LRUCache(_CACHE_SIZE)


class _LossAndGradient:
    """``f(w) -> (loss, gradient)`` for scipy, one onnxruntime call each."""

    def __init__(self, session, weights: dict, arrays, input_names, device, sparse=None):
        self._device = parse_device(device)
        # (X as CSR, X^T as CSR, [(product input, weight), ...]) for a sparse X
        self._sparse = sparse
        self._session = session
        self._names = list(weights)
        self._shapes = [weights[n].shape for n in self._names]
        self._dtypes = [weights[n].dtype for n in self._names]
        self._sizes = [int(np.prod(s, dtype=np.int64)) for s in self._shapes]
        self._binding = self._session.io_binding()
        kind, index = self._device.ort_device_type, self._device.index
        # The data go to the device once, not once per evaluation.
        # (np.require keeps a 0-d array 0-d; np.ascontiguousarray makes it (1,))
        self._data = [ort.OrtValue.ortvalue_from_numpy(np.require(a, requirements="C"), kind,
                                                       index) for a in arrays]
        for name, value in zip(input_names, self._data):
            self._binding.bind_ortvalue_input(name, value)
        on_cpu = self._device.kind == "cpu" and sparse is None
        # On the CPU the weights are arrays of their own, bound once: an evaluation
        # casts scipy's vector into them, no allocation nor binding.
        self._weights = None
        if on_cpu:
            self._weights = [np.empty(s, d) for s, d in zip(self._shapes, self._dtypes)]
            for name, array in zip(self._names, self._weights):
                self._binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        # On the CPU onnxruntime writes the outputs of a static shape (the loss, the
        # weights' gradients) into arrays of their own: no allocation and copy of the
        # weights' size an evaluation; float64 gradients straight into the slices of
        # scipy's vector. It allocates the others (a sparse X's products).
        outputs = self._session.get_outputs()
        static = [self._device.kind == "cpu" and bool(ort_elem_type(o.type))
                  and all(isinstance(d, int) for d in o.shape) for o in outputs]
        grads = outputs[1:1 + len(self._names)]
        self._in_grad = on_cpu and all(static) and len(grads) == len(self._names) and all(
            ort_elem_type(o.type) == onnx.TensorProto.DOUBLE
            and int(np.prod(o.shape, dtype=np.int64)) == size
            for o, size in zip(grads, self._sizes))
        self._grad = np.empty(sum(self._sizes)) if self._in_grad else None
        bounds = np.cumsum([0, *self._sizes])
        self._outputs = []
        for i, output in enumerate(outputs):
            array = None
            if self._in_grad and 1 <= i <= len(self._names):
                array = self._grad[bounds[i - 1]:bounds[i]].reshape(output.shape)
            elif static[i]:
                array = np.empty(output.shape,
                                 helper.tensor_dtype_to_np_dtype(ort_elem_type(output.type)))
            if array is None:
                self._binding.bind_output(output.name, "cpu")
            else:
                self._binding.bind_ortvalue_output(output.name,
                                                   ort.OrtValue.ortvalue_from_numpy(array))
            self._outputs.append(array)
        self.n_calls = 0
        # lowest finite loss evaluated so far and its weights (name -> array in the
        # graph's dtype): what an interrupted run keeps
        self.best_loss, self.best_weights = np.inf, None

    def unflatten(self, flat: np.ndarray) -> dict:
        out, offset = {}, 0
        for name, shape, dtype, size in zip(self._names, self._shapes, self._dtypes,
                                            self._sizes):
            out[name] = flat[offset:offset + size].reshape(shape).astype(dtype)
            offset += size
        return out

    def _bind_weights(self, flat: np.ndarray) -> dict:
        """The weights ``flat`` bound as the graph's inputs; returns them by name."""
        if self._weights is not None:
            offset = 0
            for array, size in zip(self._weights, self._sizes):
                array.reshape(-1)[...] = flat[offset:offset + size]
                offset += size
            return dict(zip(self._names, self._weights))
        weights = self.unflatten(flat)
        for name, value in weights.items():
            self._binding.bind_cpu_input(name, value)
        if self._sparse is not None:
            X = self._sparse[0]
            for product, weight in self._sparse[2]:
                self._binding.bind_cpu_input(product, np.ascontiguousarray(
                    X @ weights[weight], dtype=X.dtype))
        return weights

    def _gradient(self, outputs) -> np.ndarray:
        """The gradients of ``outputs`` in one float64 vector (scipy's)."""
        if self._sparse is not None:
            # the products' gradients, after the weights', reach the weights through X^T
            Xt, products = self._sparse[1], self._sparse[2]
            outputs, extra = outputs[:1 + len(self._names)], outputs[1 + len(self._names):]
            outputs = [np.asarray(o) for o in outputs]
            for (_, weight), d_product in zip(products, extra):
                k = 1 + self._names.index(weight)
                outputs[k] = outputs[k] + Xt @ np.asarray(d_product)
        # written into one float64 vector: no cast nor concatenation of the weights' size
        grad, offset = np.empty(sum(self._sizes)), 0
        for g in outputs[1:1 + len(self._names)]:
            g = np.asarray(g)
            grad[offset:offset + g.size] = g.reshape(-1)
            offset += g.size
        return grad

    def __call__(self, flat: np.ndarray) -> tuple[float, np.ndarray]:
        weights = self._bind_weights(flat)
        with memory_errors("an L-BFGS evaluation", "L-BFGS evaluates every row at once: "
                           "train with a mini-batch solver ('adam', 'sgd') and a batch_size."):
            self._session.run_with_iobinding(self._binding)
        self.n_calls += 1
        outputs = self._outputs
        if self._in_grad:  # scipy keeps the vector it gets: a copy of the one bound
            grad = self._grad.copy()
        else:
            if any(array is None for array in outputs):
                values = self._binding.get_outputs()
                outputs = [values[i].numpy() if array is None else array
                           for i, array in enumerate(outputs)]
            grad = self._gradient(outputs)
        loss = float(outputs[0])
        if loss < self.best_loss and np.isfinite(grad).all():
            self.best_loss = loss
            if self._weights is None:  # arrays of this call's own
                self.best_weights = weights
            elif self.best_weights is None:
                self.best_weights = {n: w.copy() for n, w in weights.items()}
            else:  # the bound arrays change at the next call: a copy, into one buffer
                for name, w in weights.items():
                    np.copyto(self.best_weights[name], w)
        return loss, grad


def loss_and_gradient(loss_model, trainable, initial_weights, arrays, input_names=None,
                      device="cpu", loss_output="loss", session_options=None,
                      deterministic=False):
    """The loss and gradient evaluator of a graph on fixed data, for a host-side solver.

    What :func:`minimize_lbfgs` gives scipy, for the solvers that drive the
    iterations themselves (the proximal gradient of ``OrtLasso``): the
    gradient graph of :func:`ortlearn.autodiff.build_gradient`, the data put
    on the device once, one onnxruntime call per evaluation.

    Parameters
    ----------
    loss_model, trainable, initial_weights, arrays, input_names, device, \
loss_output, session_options, deterministic
        As in :func:`minimize_lbfgs`.

    Returns
    -------
    fun : callable
        ``fun(flat) -> (loss, gradient)`` on the float64 vector of the
        trainable weights, each flattened, one after the other (the gradient
        is laid out the same); ``fun.unflatten(flat)`` gives the dict of
        weights, name -> array in the graph's dtype.
    x0 : numpy.ndarray
        The initial weights, flattened.

    Raises
    ------
    ValueError
        Unknown weights or inputs, a missing loss output, a bad
        ``initial_weights``.
    ConvergenceError
        The run ended on a loss or weights that are not finite; the error's
        ``weights``, ``n_iter`` and ``loss`` are where it ended.
    """
    model = load_model(loss_model)
    check_loss_output(model, loss_output)
    trainable = check_trainable(model, trainable)
    input_names = list(check_input_names(model, input_names))
    arrays = list(arrays)
    check_class_labels(class_label_marks(model),
                       {n: a for n, a in zip(input_names, arrays) if not is_sparse(a)},
                       "the training data")
    sparse, wrt = None, list(trainable)
    sparse_inputs = [i for i, a in enumerate(arrays) if is_sparse(a)]
    if sparse_inputs:
        if len(sparse_inputs) > 1:
            raise ValueError("At most one sparse array is supported (the data X); densify "
                             "the others.")
        index = sparse_inputs[0]
        name, X = input_names.pop(index), arrays.pop(index)
        products, dtype = _products_as_inputs(model, name, trainable)
        X = X.tocsr().astype(dtype, copy=False)
        sparse = (X, X.T.tocsr(), products)
        wrt += [product for product, _ in products]
    # the untrained float initializers (a data scale, a penalty strength, costs)
    # are fed as data: the graph, and its cached session, do not depend on them
    frozen = [i.name for i in model.graph.initializer if i.name not in trainable
              and i.data_type in _FLOAT_TYPES]
    for name, value in initializers_to_inputs(model, frozen).items():
        input_names.append(name)
        arrays.append(value)
    weights = initial_values(model, trainable, initial_weights)
    weights_to_inputs(model, trainable)
    data_bytes = sum(a.nbytes for a in arrays) + (sparse[0].data.nbytes if sparse else 0)
    # the data inputs small enough for a transposed copy (_data_read_transposed)
    copyable = tuple(n for n, a in zip(input_names, arrays)
                     if np.ndim(a) == 2 and a.nbytes <= _TRANSPOSED_COPY_MAX_BYTES)
    key = None
    if session_options is None and data_bytes <= _CACHE_MAX_DATA_BYTES:
        key = (model_digest(model), tuple(wrt),
               loss_output, str(parse_device(device)), bool(deterministic), copyable)
    cached = None if key is None else _SESSIONS.get(key)
    if cached is None:
        grad_model = build_gradient(model, wrt=wrt, loss_output=loss_output)
        transposed = _data_read_transposed(
            grad_model, copyable, {n: w.shape for n, w in weights.items()})
        grad_model = _data_gradient_as_row_products(grad_model)
        if session_options is None and deterministic and parse_device(device).kind != "cpu":
            session_options = make_session_options(deterministic=True)
        cached = make_session(grad_model, parse_device(device), session_options), transposed
        if key is not None:
            _SESSIONS.put(key, cached)
    session, transposed = cached
    for i, name in enumerate(input_names):
        if name in transposed:
            input_names[i], arrays[i] = transposed[name], np.ascontiguousarray(arrays[i].T)
    fun = _LossAndGradient(session, weights, arrays, input_names, device, sparse=sparse)
    x0 = np.concatenate([w.astype(np.float64).ravel() for w in weights.values()])
    return fun, x0


_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                onnx.TensorProto.BFLOAT16)


#: Largest data input :func:`_data_read_transposed` copies (the copy lives as long as the fit).
_TRANSPOSED_COPY_MAX_BYTES = 2**30


def _data_read_transposed(grad_model, names, weight_shapes: dict) -> dict:
    """Make the graph read a data input ``X`` (N, F) as its transpose ``X^T`` (F, N), in place.

    For an ``X`` of ``names`` that the gradient graph reads only through
    ``MatMul(X, w)`` with a trained ``w`` of shape (F, 1) and through
    ``Transpose(X)`` (the ``X^T @ d`` of ``w``'s gradient): both products
    become row-vector products on the contiguous ``X^T``,
    ``(w^T X^T)^T`` and ``X^T d``, the reshapes of (1, F) and (1, N)
    vectors being free: faster than the column product ``X w`` and
    onnxruntime's transposed-left ``FusedMatMul`` for ``d^T X``, at the cost
    of one transposed copy of ``X`` for the fit (``doc/performance_notes.rst``, the
    section on W4's full-batch L-BFGS).

    Returns ``{X: name of the input now holding X^T}``.
    """
    graph = grad_model.graph
    taken = ({v for node in graph.node for v in [*node.input, *node.output]}
             | {i.name for i in graph.input} | {i.name for i in graph.initializer})
    consumers: dict = {}
    for node in graph.node:
        for value in set(node.input):
            consumers.setdefault(value, []).append(node)

    def fresh(stem):
        name, k = stem, 0
        while name in taken:
            k += 1
            name = f"{stem}_{k}"
        taken.add(name)
        return name

    def column(w):
        return len(weight_shapes.get(w, ())) == 2 and weight_shapes[w][1] == 1

    inputs = {i.name: i for i in graph.input}
    renamed, nodes = {}, list(graph.node)
    for name in names:
        if name not in inputs:  # a sparse X, fed as products
            continue
        uses = consumers.get(name, [])
        products = [n for n in uses if n.op_type == "MatMul" and list(n.input).count(name) == 1
                    and n.input[0] == name and column(n.input[1])]
        transposes = [n for n in uses if n.op_type == "Transpose" and
                      [list(a.ints) for a in n.attribute if a.name == "perm"] in ([], [[1, 0]])
                      and all(c.op_type == "MatMul" and c.input[0] == n.output[0]
                              and n.output[0] not in c.input[1:]
                              for c in consumers.get(n.output[0], []))]
        if not products or len(products) + len(transposes) != len(uses):
            continue
        new = renamed[name] = fresh(f"{name}_transposed")
        row, col = fresh(f"{name}_row_shape"), fresh(f"{name}_column_shape")
        graph.initializer.extend([onnx.numpy_helper.from_array(np.array([1, -1], np.int64), row),
                                  onnx.numpy_helper.from_array(np.array([-1, 1], np.int64), col)])
        replaced, moved = [], set()
        for node in nodes:
            if node in products:
                w_row, p_row = fresh(f"{node.input[1]}_row"), fresh(f"{node.output[0]}_row")
                replaced += [helper.make_node("Reshape", [node.input[1], row], [w_row]),
                             helper.make_node("MatMul", [w_row, new], [p_row])]
                out = node.output[0]
                bias = _bias_add(consumers.get(out, []), out, weight_shapes)
                if bias is not None:  # the intercept added to the (1, N) row: a fast broadcast
                    moved.add(id(bias))
                    out, b_row = bias.output[0], fresh(f"{bias.output[0]}_row")
                    replaced.append(helper.make_node("Add", [p_row, bias.input[1]], [b_row]))
                    p_row = b_row
                replaced.append(helper.make_node("Reshape", [p_row, col], [out]))
            elif id(node) in moved:
                continue
            elif node in transposes:
                for consumer in consumers.get(node.output[0], []):
                    consumer.input[0] = new
            else:
                replaced.append(node)
        nodes = replaced
        declared = inputs[name]
        dims = declared.type.tensor_type.shape.dim
        shape = [d.dim_param or d.dim_value or None for d in dims][::-1] if len(dims) == 2 else None
        graph.input.remove(declared)
        graph.input.append(helper.make_tensor_value_info(
            new, declared.type.tensor_type.elem_type, shape))
    del graph.node[:]
    graph.node.extend(nodes)
    return renamed


def _bias_add(consumers, product: str, weight_shapes: dict):
    """``Add(product, b)``, ``product``'s only reader, with a trained ``b`` of one element; or None.

    onnxruntime broadcasts a (1,) tensor over a (N, 1) one much slower than
    over a (1, N) one.
    """
    if len(consumers) != 1:
        return None
    (node,) = consumers
    if (node.op_type == "Add" and list(node.input[:1]) == [product] and len(node.input) == 2
            and tuple(weight_shapes.get(node.input[1], (0,))) in ((1,), ())):
        return node
    return None


def _data_gradient_as_row_products(grad_model):
    """Rewrite each ``MatMul(Transpose(X), D)`` of a data input X as ``(D^T @ X)^T``, in place.

    The weight gradient of a first layer, ``X^T @ D`` with ``X`` (N, F) the
    data and ``D`` (N, k) the gradient of the layer's output: onnxruntime
    1.31's transposed-left product (FusedMatMul) is about 3 times slower on
    100 000 x 50 doubles than ``D^T @ X`` (14 ms against 4.4 ms for k = 1,
    14 against 9.4 for k = 5); transposing ``D`` and the (k, F) result costs
    ``N k + F k``. Same products, summed in another order.
    """
    graph = grad_model.graph
    inferred = onnx.shape_inference.infer_shapes(grad_model)
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in [*inferred.graph.value_info, *inferred.graph.input]
             if v.type.tensor_type.HasField("shape")}
    data = {i.name for i in graph.input} - {i.name for i in graph.initializer}
    transposes = {node.output[0]: node for node in graph.node
                  if node.op_type == "Transpose" and node.input[0] in data
                  and ranks.get(node.input[0]) == 2
                  and [list(a.ints) for a in node.attribute if a.name == "perm"] in ([], [[1, 0]])}
    nodes = []
    for node in graph.node:
        if (node.op_type == "MatMul" and node.input[0] in transposes
                and ranks.get(node.input[1]) == 2):
            X, D, out = transposes[node.input[0]].input[0], node.input[1], node.output[0]
            nodes += [helper.make_node("Transpose", [D], [out + "_rows"], perm=[1, 0]),
                      helper.make_node("MatMul", [out + "_rows", X], [out + "_product"]),
                      helper.make_node("Transpose", [out + "_product"], [out], perm=[1, 0])]
        else:
            nodes.append(node)
    used = {name for node in nodes for name in node.input} | {o.name for o in graph.output}
    nodes = [node for node in nodes if node.op_type != "Transpose"
             or node.output[0] not in transposes or node.output[0] in used]
    del graph.node[:]
    graph.node.extend(nodes)
    return grad_model


def _products_as_inputs(model, name: str, trainable) -> tuple[list, np.dtype]:
    """Replace each ``MatMul(name, W)`` of ``model`` (in place) by an input holding its output.

    ``name`` may reach the MatMuls through a ``Cast`` (skl2onnx casts the
    input of a float64 loss). Returns ``[(product input, W), ...]`` and the
    dtype of the products; a ``ValueError`` when ``name`` reaches another
    node, or a ``W`` that is not trained.
    """
    graph = model.graph
    shapes = {init.name: list(init.dims) for init in graph.initializer}
    nodes, removed, elem = left_products(model, name, trainable)
    products = [(node.output[0], weight) for node, weight in nodes]
    kept = [node for node in graph.node if all(node is not r for r in removed)]
    del graph.node[:]
    graph.node.extend(kept)
    inputs = [i for i in graph.input if i.name != name]
    del graph.input[:]
    graph.input.extend(inputs)
    for product, weight in products:
        graph.input.append(helper.make_tensor_value_info(product, elem,
                                                         ["N", shapes[weight][1]]))
    return products, helper.tensor_dtype_to_np_dtype(elem)


def minimize_lbfgs(loss_model, trainable, initial_weights, arrays, input_names=None,
                   device="cpu", max_iter=100, tol=1e-4, verbose=0, loss_output="loss",
                   max_fun=15000, session_options=None, deterministic=False, bounds=None,
                   ftol=_FTOL, maxls=50, callback=None,
                   remedy="Scale the data or increase the regularisation."):
    """Minimise the graph's loss over the whole data set with scipy's L-BFGS-B.

    Same options as scikit-learn's ``LogisticRegression(solver='lbfgs')``
    (``maxiter``, ``maxls=50``, ``gtol=tol``, ``ftol=64 * eps``) and
    ``MLPRegressor(solver='lbfgs')`` (``maxfun``; with ``ftol`` and ``maxls``
    scipy's defaults, which the MLPs keep).

    Parameters
    ----------
    loss_model : onnx.ModelProto, bytes or path
        Graph with a scalar output ``loss_output``.
    trainable : list of str
        Float initializers to optimise.
    initial_weights : dict or None
        Starting values of some weights (name -> array); the others start
        from their initializers.
    arrays : list of numpy.ndarray
        The data, aligned with ``input_names``, of the inputs' dtypes. One
        of them may be a ``scipy.sparse`` matrix when the graph reads it
        only as the left factor of ``MatMul`` nodes with trained weights
        (the first layer): it is never densified (module docstring).
    input_names : list of str, default=None
        The data inputs (graph inputs that are not initializers) in the
        order of ``arrays``; None: graph order.
    device : str, default='cpu'
    max_iter : int, default=100
        Maximum number of L-BFGS iterations.
    tol : float, default=1e-4
        ``gtol``: stop when the largest gradient component is below it.
    verbose : int, default=0
        > 0 prints the loss after each iteration.
    loss_output : str, default='loss'
    max_fun : int, default=15000
        Maximum number of loss evaluations.
    session_options : onnxruntime.SessionOptions, default=None
        None: :func:`~ortlearn.training.make_session_options`.
    deterministic : bool, default=False
        With ``session_options=None``, deterministic kernels on a GPU (the
        CPU kernels are deterministic already).
    bounds : dict of str to (low, high), default=None
        Box constraints of L-BFGS-B per weight: ``low`` and ``high`` are
        scalars or arrays broadcastable to the weight's shape, None or
        ``+-inf`` for no bound (``HuberRegressor``'s scale, ``Ridge(positive=True)``).
        Weights not named are unbounded.
    ftol : float, default=64 * eps
        scipy's ``ftol`` (relative decrease of the loss); scikit-learn's
        ``HuberRegressor`` keeps scipy's default ``2.2e-9``.
    maxls : int, default=50
        Maximum line-search steps per iteration (scipy's default is 20).
    callback : callable, default=None
        ``callback(weights) -> bool`` after each iteration, with the
        iteration's weights (a dict as the returned one); True stops the
        run there (without a ``ConvergenceWarning``): scikit-learn's
        callbacks (``sklearn.callback``) of the estimators.
    remedy : str, default='Scale the data or increase the regularisation.'
        What the divergence error tells the user to do.

    Returns
    -------
    SolverResult
        ``weights``: the optimised weights by name, in the graph's dtype;
        ``n_iter``: the iterations scipy made (0 when it stopped before the
        first one); ``loss``: the loss at those weights; ``converged`` and
        ``status``: scipy's success, or ``'callback'``, ``'interrupted'``.

    Warns
    -----
    ConvergenceWarning
        Whenever scipy does not report success, as scikit-learn warns: the
        iteration or evaluation budget ran out (status 1) or the run stopped
        abnormally (status 2, e.g. no decrease found on badly scaled data);
        the message gives the status and scipy's message.
    UserWarning
        On KeyboardInterrupt: the weights of the lowest loss evaluated so far
        are returned (as scikit-learn's MLP keeps the weights reached).

    Raises
    ------
    ValueError
        Unknown weights or inputs, a missing loss output, a bad
        ``initial_weights``.
    ConvergenceError
        The run ended on a loss or weights that are not finite; the error's
        ``weights``, ``n_iter`` and ``loss`` are where it ended.
    """
    fun, x0 = loss_and_gradient(loss_model, trainable, initial_weights, arrays, input_names,
                                device=device, loss_output=loss_output,
                                session_options=session_options, deterministic=deterministic)
    options = {"maxiter": max_iter, "maxfun": max_fun, "maxls": maxls, "gtol": tol,
               "ftol": ftol}
    box = _flat_bounds(bounds, fun.unflatten(x0)) if bounds else None
    # scipy deprecates iprint: the callback counts iterations and prints the progress.
    progress = _Progress(fun, verbose, callback)
    try:
        # scipy's L-BFGS-B calls BLAS on (n_weights, 10) matrices at every iteration:
        # threads only cost there (the evaluations run in onnxruntime's own pool)
        with single_thread_blas():
            result = scipy.optimize.minimize(fun, x0, method="L-BFGS-B", jac=True,
                                             options=options, callback=progress, bounds=box)
    except KeyboardInterrupt:
        if fun.best_weights is None:
            raise
        warnings.warn("Training interrupted by user.", stacklevel=user_stacklevel())
        return _finite_or_raise(SolverResult(fun.best_weights, progress.iteration,
                                             fun.best_loss, False, INTERRUPTED), remedy)
    except StopIteration:  # scipy < 1.11 lets the callback's StopIteration through
        if progress.stopped is None:
            raise
    if progress.stopped is not None:  # a callback asked to stop: the weights of that iteration
        return _finite_or_raise(SolverResult(fun.unflatten(progress.stopped),
                                             progress.iteration, progress.loss, False,
                                             CALLBACK), remedy)
    _warn_unless_converged(result, max_iter, max_fun)
    # scipy's own count of the iterations it ran (0 when the first line search
    # failed), capped at max_iter as scikit-learn's _check_optimize_result does.
    status = CONVERGED if result.success else MAX_ITER if result.status == 1 else _message(
        result)
    success = bool(result.success)
    stalled = _stalled_at_start(result, x0, box, tol)
    if stalled is not None:
        success, status = False, STALLED
        warnings.warn(
            f"L-BFGS found no decrease from its starting point although the gradient is "
            f"not zero there (largest component {stalled:.3g}, tol={tol:g}): the data are "
            "probably badly scaled (the features' values far from 1); scale them (e.g. with "
            "sklearn.preprocessing.StandardScaler).", ConvergenceWarning,
            stacklevel=user_stacklevel())
    return _finite_or_raise(SolverResult(fun.unflatten(result.x),
                                         min(int(result.nit), max_iter), float(result.fun),
                                         success, status), remedy)


def _stalled_at_start(result, x0: np.ndarray, box, tol: float) -> float | None:
    """The largest projected gradient component when scipy reports success without moving
    from ``x0`` while that component exceeds ``tol``, else None.

    scipy's L-BFGS-B stops as converged when its first line search finds no
    decrease (the relative reduction of the loss, zero, is below ``ftol``): on
    features of values near 1e20 its first trial step overshoots by as much.
    """
    if not result.success or not np.array_equal(result.x, x0) or result.jac is None:
        return None
    gradient = np.array(result.jac, dtype=np.float64)
    if box is not None:  # at a bound, a component pointing outwards is not a descent
        low, high = box.lb, box.ub
        gradient[(result.x <= low) & (gradient > 0)] = 0.0
        gradient[(result.x >= high) & (gradient < 0)] = 0.0
    top = float(np.max(np.abs(gradient))) if gradient.size else 0.0
    return top if top > tol else None


def _finite_or_raise(result: SolverResult, remedy: str) -> SolverResult:
    """``result``, or the ConvergenceError of a run that diverged."""
    weights, n_iter, loss = result.weights, result.n_iter, result.loss
    if np.isfinite(loss) and all(np.isfinite(w).all() for w in weights.values()):
        return result
    error = ConvergenceError(
        f"L-BFGS diverged: the loss is {loss} (or a weight is not finite). {remedy}")
    error.weights, error.n_iter, error.loss = weights, n_iter, loss
    raise error


def _flat_bounds(bounds: dict, weights: dict) -> scipy.optimize.Bounds:
    """``{name: (low, high)}`` -> the bounds of the flattened weights, as arrays (scipy
    converts a list of pairs one pair at a time, in Python)."""
    unknown = sorted(set(bounds) - set(weights))
    if unknown:
        raise ValueError(f"bounds name unknown weight(s) {unknown}; trained weights: "
                         f"{sorted(weights)}.")
    lows, highs = [], []
    for name, value in weights.items():
        low, high = bounds.get(name, (None, None))
        low = -np.inf if low is None else low
        high = np.inf if high is None else high
        lows.append(np.broadcast_to(np.asarray(low, dtype=np.float64), value.shape).ravel())
        highs.append(np.broadcast_to(np.asarray(high, dtype=np.float64), value.shape).ravel())
    return scipy.optimize.Bounds(np.concatenate(lows), np.concatenate(highs))


def _message(result) -> str:
    """scipy's message of how the run ended."""
    message = result.message
    if isinstance(message, bytes):  # old scipy versions return bytes
        message = message.decode("latin1")
    return message.strip()


def _warn_unless_converged(result, max_iter: int, max_fun: int) -> None:
    """ConvergenceWarning for every status but 0 (success), as scikit-learn warns.

    Status 1 is the iteration or evaluation budget; 2 an abnormal stop (the
    line search found no decrease, e.g. on badly scaled data or a loss that
    is not finite); any other status (a newer scipy's) is reported the same way.
    """
    if result.status == 0:
        return
    message = _message(result)
    if result.status == 1:
        remedy = (f"the budget of max_iter={max_iter} iterations / max_fun={max_fun} "
                  "evaluations ran out: increase max_iter (or max_fun) or scale the data.")
    else:
        remedy = ("the optimisation stopped abnormally: scale the data (e.g. with "
                  "sklearn.preprocessing.StandardScaler) or increase the regularisation.")
    warnings.warn(f"L-BFGS failed to converge after {int(result.nit)} iteration(s) "
                  f"(status={result.status}, scipy: {message!r}): {remedy}",
                  ConvergenceWarning, stacklevel=user_stacklevel())


class _Progress:
    """scipy callback: counts the iterations, logs them with ``verbose``, calls ``callback``."""

    def __init__(self, fun: _LossAndGradient, verbose: int, callback=None):
        self.fun, self.verbose, self.callback, self.iteration = fun, verbose, callback, 0
        self.stopped, self.loss = None, None  # the weights (flat) and loss a callback stopped at

    def __call__(self, intermediate_result):
        self.iteration += 1
        if self.verbose > 0:
            verbose_log(f"L-BFGS iteration {self.iteration}: loss="
                        f"{intermediate_result.fun:.6g} ({self.fun.n_calls} evaluations)")
        if self.callback is not None:
            x = np.array(intermediate_result.x, copy=True)
            if self.callback(self.fun.unflatten(x)):
                self.stopped, self.loss = x, float(intermediate_result.fun)
                raise StopIteration  # scipy >= 1.11 ends the run there
