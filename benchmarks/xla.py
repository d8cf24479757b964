"""JAX contenders: an MLP trained by Adam, a whole epoch as one jitted ``lax.scan``.

JAX (``jax``, ``optax``) is optional, as torch is: :func:`import_jax` returns None
when either is missing and the contenders are then left out with a printed note.

What :func:`train_mlp` reproduces of scikit-learn's (and ortlearn's) MLP fit, so
that the three start from the same weights and see the same batches:

* the initial weights: scikit-learn's Glorot draw, ``uniform(-b, b)`` with
  ``b = sqrt(6 / (fan_in + fan_out))`` (relu), coefficients then intercepts of
  each layer, from ``RandomState(random_state)`` (:func:`glorot_weights`);
* the batch order: that same generator then shuffles the row order again every
  epoch (``sample_idx = sample_idx[permutation]``), batches of ``batch_size``
  consecutive rows of it, the last one smaller (:func:`epoch_orders`);
* the loss: half the mean squared error (regression), the mean cross-entropy
  of a softmax (classification, one output per class), no L2 penalty;
* Adam: ``optax.adam(learning_rate, b1=0.9, b2=0.999, eps=1e-8)`` (scikit-learn
  folds the bias corrections into the rate; equal up to where ``eps`` sits).

What is timed: the epochs; an epoch is one call of a jitted function that
gathers the rows of each full batch from the training data (on the device
once) inside a ``lax.scan`` over the batches, then makes the step of the last,
smaller batch; the shuffle of the order on the host is timed as ortlearn's
is. The compilation is ``setup_s`` (the first call, in the warm-up run).

Threads: XLA reads ``XLA_FLAGS`` when its CPU backend starts (the first
computation): :func:`import_jax` sets ``--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1`` when one thread is asked for, and leaves
XLA's default (one thread per core) otherwise, which is the requested count
only when it equals the machine's cores (``threads_note`` says which).
"""

from __future__ import annotations

import importlib.util
import os
import time

import numpy as np

from benchmarks._harness import ADAM_LR, Contender, Options, Workload

ONE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def import_jax(threads: int):
    """``(jax, optax, threads_note)`` when both are installed, else ``(None, None, why)``."""
    missing = [m for m in ("jax", "optax") if importlib.util.find_spec(m) is None]
    if missing:
        return None, None, f"{' and '.join(missing)} not installed: the JAX contenders are skipped"
    if threads == 1 and "XLA_FLAGS" not in os.environ:
        os.environ["XLA_FLAGS"] = ONE_THREAD_FLAGS
    import jax
    import optax

    cores = os.cpu_count()
    if threads == 1:
        note = f"JAX: XLA_FLAGS={os.environ.get('XLA_FLAGS')!r}"
    elif threads == cores:
        note = f"JAX: XLA's default threads (one per core, {cores} = --threads)"
    else:
        note = (f"JAX: XLA's default threads (one per core, {cores}): XLA has no flag for "
                f"{threads} threads, the JAX figures use more threads than the others")
    return jax, optax, note


def glorot_weights(sizes, random_state: np.random.RandomState, dtype=np.float32) -> list:
    """scikit-learn's MLP initialisation (relu): ``[(coef, intercept), ...]`` per layer."""
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        coef = random_state.uniform(-bound, bound, (fan_in, fan_out))
        intercept = random_state.uniform(-bound, bound, fan_out)
        layers.append((coef.astype(dtype), intercept.astype(dtype)))
    return layers


def epoch_orders(n: int, random_state: np.random.RandomState):
    """The row order of each epoch as scikit-learn's MLP draws it (a generator)."""
    order = np.arange(n)
    while True:
        # sklearn.utils.shuffle(sample_idx): a shuffled arange indexes the last order
        perm = np.arange(n)
        random_state.shuffle(perm)
        order = order[perm]
        yield order


class JaxMLP:
    """An MLP's epoch compiled once by XLA for a data set and a batch size.

    Parameters
    ----------
    jax, optax : modules
    X : ndarray of shape (n, d), float32
    y : ndarray of shape (n,)
        Targets (regression) or class indices (classification).
    hidden : tuple of int
    batch : int
    classifier : bool
    learning_rate : float

    Examples
    --------
    >>> jax, optax, _ = import_jax(2)  # doctest: +SKIP
    """

    def __init__(self, jax, optax, X, y, hidden, batch, classifier, learning_rate):
        jnp = jax.numpy
        self.jax, self.n, self.batch = jax, len(X), batch
        self.classifier = classifier
        n_out = int(y.max()) + 1 if classifier else 1
        self.sizes = (X.shape[1], *hidden, n_out)
        self.X = jax.device_put(np.ascontiguousarray(X, dtype=np.float32))
        self.y = jax.device_put(y.astype(np.int32) if classifier
                                else y.astype(np.float32).reshape(-1, 1))
        self.optimizer = optax.adam(learning_rate, b1=0.9, b2=0.999, eps=1e-8)
        full, rest = divmod(self.n, batch)

        def forward(params, x):
            for coef, intercept in params[:-1]:
                x = jax.nn.relu(x @ coef + intercept)
            coef, intercept = params[-1]
            return x @ coef + intercept

        def loss(params, x, target):
            out = forward(params, x)
            if classifier:
                return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(out), target[:, None],
                                                     axis=1))
            return 0.5 * jnp.mean((out - target) ** 2)

        def step(carry, idx):
            params, state = carry
            value, grads = jax.value_and_grad(loss)(params, self.X[idx], self.y[idx])
            updates, state = self.optimizer.update(grads, state, params)
            return (optax.apply_updates(params, updates), state), value * idx.shape[0]

        def epoch(params, state, order):
            carry, sums = jax.lax.scan(step, (params, state),
                                       order[:full * batch].reshape(full, batch))
            total = jnp.sum(sums)
            if rest:
                carry, last = step(carry, order[full * batch:])
                total = total + last
            return carry[0], carry[1], total / self.n

        self._epoch = jax.jit(epoch)
        self._forward = jax.jit(forward)

    def fit(self, random_state: int, epochs: int) -> dict:
        """Train ``epochs`` epochs from ``random_state``'s weights and order; time them."""
        jax = self.jax
        rs = np.random.RandomState(random_state)
        start = time.perf_counter()
        params = [tuple(jax.device_put(a) for a in layer)
                  for layer in glorot_weights(self.sizes, rs)]
        state = self.optimizer.init(params)
        orders = epoch_orders(self.n, rs)
        setup = time.perf_counter() - start
        start = time.perf_counter()
        losses = []
        for _ in range(epochs):
            params, state, loss = self._epoch(params, state, next(orders).astype(np.int32))
            losses.append(loss)
        params = jax.block_until_ready(params)
        seconds = time.perf_counter() - start
        self.params = params
        return {"time": seconds / epochs, "total_s": seconds, "setup_s": setup,
                "epochs": epochs, "final_loss": float(losses[-1])}

    def predict(self, X) -> np.ndarray:
        out = np.asarray(self._forward(self.params, np.asarray(X, dtype=np.float32)))
        return out.argmax(axis=1) if self.classifier else out.ravel()


def jax_mlp_contender(opts, X, y, hidden, epochs, batch, classifier, quality, learning_rate):
    """The ``jax_adam`` contender of W2/W3 (``quality(predict) -> dict``), or None without JAX."""
    if opts.jax is None:
        return None
    held = {}

    def jax_adam(seed, warmup):
        if "model" not in held:
            start = time.perf_counter()
            held["model"] = JaxMLP(opts.jax, opts.optax, X, y, hidden, batch, classifier,
                                   learning_rate)
            held["model"].fit(seed, 1)  # compiles
            held["compile_s"] = time.perf_counter() - start
        model = held["model"]
        out = model.fit(seed, 1 if warmup else epochs)
        return {**out, "compile_s": held["compile_s"], **quality(model.predict)}

    return Contender("jax_adam", "jax", jax_adam,
                     "one jitted lax.scan per epoch, optax.adam, sklearn's Glorot init and "
                     "batch order (same random_state)")


def add_jax(w: Workload, opts: Options, X, y, hidden, epochs, batch, classifier, quality,
             rtol: float) -> None:
    """W2/W3's JAX contender (when installed) and the ratios to JAX and torch.compile."""
    contender = jax_mlp_contender(opts, X, y, hidden, epochs, batch, classifier, quality,
                                  ADAM_LR)
    if contender is not None:
        w.contenders.append(contender)
        w.pairs.append(("ortlearn_adam", "jax_adam"))
        # same weights, order and optimizer as ortlearn: the same model within float noise
        w.same_quality.append(("jax_adam", "ortlearn_adam", rtol))
    if opts.torch is not None:
        w.pairs.append(("ortlearn_adam", "torch_compile_adam"))
