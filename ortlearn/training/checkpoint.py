"""Training state (parameters, optimizer state, properties) and its checkpoint file.

:class:`CheckpointState` has the names and behaviour of
``onnxruntime.training.api.CheckpointState``: ``load_checkpoint``,
``save_checkpoint``, ``parameters`` and ``properties``. It also offers what
ortlearn itself needs: :meth:`CheckpointState.from_parameters` (used by
``generate_artifacts``), nominal checkpoints, the optimizer state and
:meth:`CheckpointState.check_matches`.

File format (version 1)
-----------------------
A checkpoint is a `safetensors <https://github.com/huggingface/safetensors>`_
file: raw little-endian tensors behind a JSON header, never pickle. Tensors:

- ``param/<name>``: the value of each parameter that has data (a nominal
  parameter has none);
- ``optim/<name>/<state>``: the optimizer state tensors of trainable parameter
  ``<name>`` (e.g. ``exp_avg``), only when saved with
  ``include_optimizer_state=True``.

The safetensors ``__metadata__`` holds three strings:

- ``"ortlearn.checkpoint"``: the format version, ``"1"``;
- ``"ortlearn.header"``: a JSON object ``{"trainable": [names], "frozen":
  [names], "tensors": {name: {"dtype": "float32", "shape": [3, 1],
  "nominal": false}}, "properties": [[name, type, text], ...], "optimizer":
  null or {"step": int, "learning_rate": text, "states": {name: [state,
  ...]}}}``. Parameter and property order is kept. Property values are text
  tagged with their type so that they round-trip exactly: ``"int"`` in
  hexadecimal (no digit limit), ``"float"`` as ``repr`` (``nan``, ``inf``,
  ``-0.0`` included), ``"str"`` as is;
- ``"ortlearn.checksum"``: SHA-256 of the header and of every tensor (key,
  dtype, shape, bytes), so that a damaged file is refused instead of being
  loaded with wrong values.

Supported dtypes: float16, float32, float64, int32, int64, bool. The bytes
are those ``safetensors.numpy.save`` writes for the same tensors and metadata,
with the metadata keys sorted (:func:`_header`); the tensors are
streamed to the file one at a time and read back one at a time into their own
arrays, so that no copy of the whole file is held. A file is written
atomically: to a temporary file in the target directory, flushed and fsynced,
then renamed over the target with :func:`os.replace`
(:func:`ortlearn.fileio.atomic_write`).

Binding protocol (for ``TrainingSession``)
------------------------------------------
While a training session runs, the live values are on its device. The
session binds itself with ``state._bind(provider)``, where ``provider``
follows :class:`_StateProvider`; from then on ``Parameter.data``,
``Parameter.grad``, ``optimizer_state`` and ``save_checkpoint`` read through
the provider and the ``Parameter.data`` setter writes through it (a nominal
parameter counts as filled once written). ``state._unbind()`` copies the
provider's parameters and optimizer state back into the state, then detaches
it. Properties always live in the state itself.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import numbers
import operator
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import safetensors.numpy

from ..exceptions import (
    NominalCheckpointError,
    TrainingApiValueError,
    as_training_api_error,
)
from ..fileio import atomic_write
from ..graph import shape_matches
from ._safetensors import MAX_HEADER, is_panic, open_regular, read_file, read_metadata, write

__all__ = ["CheckpointState", "Parameter", "Parameters", "Properties"]

FORMAT_TAG = "ortlearn.checkpoint"
FORMAT_VERSION = "1"
_HEADER_KEY = "ortlearn.header"
_CHECKSUM_KEY = "ortlearn.checksum"

# Fixed by the file format (what version 1 may hold), not by what ONNX supports.
_INT64_MAX = np.iinfo(np.int64).max
_FLOAT32_MAX = float(np.finfo(np.float32).max)

_DTYPES = {
    np.dtype(t).name: np.dtype(t)
    for t in (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_)
}


@runtime_checkable
class _StateProvider(Protocol):
    """What a training session offers a bound :class:`CheckpointState`.

    Every array returned is a new host (numpy) array owned by the caller.
    """

    def get_parameter(self, name: str) -> np.ndarray:
        """Current value of parameter ``name`` (trainable or frozen)."""

    def set_parameter(self, name: str, value: np.ndarray) -> None:
        """Overwrite parameter ``name`` (``value`` has its dtype and shape)."""

    def get_gradient(self, name: str) -> np.ndarray | None:
        """Accumulated gradient of trainable parameter ``name``, None if none yet."""

    def export_optimizer_state(
        self,
    ) -> tuple[dict[str, dict[str, np.ndarray]], int, float] | None:
        """``(states, step, learning_rate)``, None without an optimizer.

        ``states`` maps a trainable parameter name to ``{state_name: array}``;
        ``step`` counts the updates made so far.
        """


@dataclass
class _Record:
    """One parameter; ``value`` is None for a nominal one (known by dtype/shape only)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    requires_grad: bool
    value: np.ndarray | None
    # True once data exists, on the host or, while bound, on the device.
    has_data: bool


@dataclass
class _OptimizerSnapshot:
    states: dict[str, dict[str, np.ndarray]]
    step: int
    learning_rate: float


def _as_array(value, what: str) -> np.ndarray:
    """C-contiguous native-endian copy of ``value``; TypeError for other dtypes."""
    arr = np.asarray(value)
    dtype = _DTYPES.get(arr.dtype.name)  # the name ignores byte order
    if dtype is None:
        raise TypeError(
            f"{what} has dtype {arr.dtype}; checkpoints hold only "
            f"{', '.join(_DTYPES)}."
        )
    return np.array(arr, dtype=dtype, order="C", copy=True)


def _conform(record: _Record, value, what: str) -> np.ndarray:
    """``value`` as an array of the record's dtype and shape, else ValueError.

    The error is also a RuntimeError, as onnxruntime-training's.
    """
    arr = np.asarray(value)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.dtype != record.dtype or arr.shape != record.shape:
        raise TrainingApiValueError(
            f"{what} is {record.dtype} of shape {record.shape}; "
            f"got {arr.dtype} of shape {arr.shape}."
        )
    return np.array(arr, order="C", copy=True)


def _check_property(name, value) -> int | float | str:
    """Validate a property; numpy scalars become Python ones, bools ints."""
    if not isinstance(name, str):
        raise TypeError(f"Property names are str, got {type(name).__name__}: {name!r}.")
    # onnxruntime-training stores a bool as the int it is (True comes back as 1).
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return str(value)
    raise TypeError(
        f"Property {name!r}: only int, float and str values are supported, "
        f"got {type(value).__name__}."
    )


def _encode_property(name: str, value) -> list:
    if isinstance(value, int):
        return [name, "int", hex(value)]
    if isinstance(value, float):
        return [name, "float", repr(value)]
    return [name, "str", value]


def _decode_property(item) -> tuple[str, int | float | str]:
    if not (isinstance(item, list) and len(item) == 3 and all(isinstance(x, str) for x in item)):
        raise ValueError(f"malformed property entry {item!r}")
    name, kind, text = item
    if kind == "int":
        return name, int(text, 16)
    if kind == "float":
        return name, float(text)
    if kind == "str":
        return name, text
    raise ValueError(f"property {name!r} has unknown type {kind!r}")


def _checksum(header: str, tensors: Mapping[str, np.ndarray]) -> str:
    digest = hashlib.sha256(header.encode("utf-8"))
    for key in sorted(tensors):
        arr = tensors[key]
        digest.update(json.dumps([key, arr.dtype.name, list(arr.shape)]).encode("utf-8"))
        digest.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
    return digest.hexdigest()


class Parameter:
    """One model parameter of a :class:`CheckpointState`.

    Not created directly: ``state.parameters[name]`` returns one. It is a
    view on the state, so it always shows the current value (the training
    session's, while the state is bound to one).

    Attributes
    ----------
    name : str
    requires_grad : bool
        True for a trainable parameter, False for a frozen one.
    dtype : numpy.dtype
    shape : tuple of int
    nominal : bool
        True while the parameter is known by dtype and shape only.
    """

    def __init__(self, state: CheckpointState, name: str):
        self._state = state
        self._name = name

    @property
    def _record(self) -> _Record:
        return self._state._records[self._name]

    @property
    def name(self) -> str:
        return self._name

    @property
    def requires_grad(self) -> bool:
        return self._record.requires_grad

    @property
    def dtype(self) -> np.dtype:
        return self._record.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._record.shape

    @property
    def nominal(self) -> bool:
        return not self._record.has_data

    @property
    def data(self) -> np.ndarray:
        """A copy of the parameter's value.

        Raises
        ------
        ortlearn.exceptions.NominalCheckpointError
            If the parameter is nominal (it has no value yet); a
            ``RuntimeError`` and a ``ValueError``.
        """
        return self._state._read_parameter(self._name)

    @data.setter
    def data(self, value) -> None:
        """Overwrite the value; ``value`` must have the parameter's dtype and shape.

        A nominal parameter gets its value this way (an ortlearn addition:
        onnxruntime-training only fills a nominal state as a whole).

        Raises
        ------
        ortlearn.exceptions.TrainingApiValueError
            If the dtype or the shape differs (a ``RuntimeError`` and a
            ``ValueError``).
        """
        self._state._write_parameter(self._name, value)

    @property
    def grad(self) -> np.ndarray | None:
        """The accumulated gradient of a trainable parameter of a training session.

        As in onnxruntime-training: None for a frozen parameter or a state
        no session holds; an array of zeros once a session holds the state
        and before its first training step; the sum of the gradients of the
        training steps since the last reset afterwards (a ``lazy_reset_grad``
        takes effect at the next training step).

        Raises
        ------
        ortlearn.exceptions.NominalCheckpointError
            If the parameter is nominal.
        """
        if self.nominal:
            raise self._state._nominal_error(self._name)
        provider = self._state._provider
        if provider is None or not self.requires_grad:
            return None
        return provider.get_gradient(self._name)

    def __repr__(self) -> str:
        return (
            f"Parameter(name={self._name!r}, requires_grad={self.requires_grad}, "
            f"dtype={self.dtype}, shape={self.shape}"
            + (", nominal=True)" if self.nominal else ")")
        )


class Parameters:
    """The parameters of a :class:`CheckpointState`, by name.

    Trainable parameters come first, then frozen ones, each in their order.
    As in onnxruntime, iterating yields ``(name, Parameter)`` pairs; use
    :meth:`keys`, :meth:`values` or :meth:`items` for the usual mapping views.
    """

    def __init__(self, state: CheckpointState):
        self._state = state

    def __getitem__(self, name: str) -> Parameter:
        if name not in self:
            raise KeyError(f"Parameter {name!r} not found.")
        return Parameter(self._state, name)

    def __setitem__(self, name: str, value) -> None:
        self[name].data = value

    def __contains__(self, name) -> bool:
        return name in self._state._records

    def __len__(self) -> int:
        return len(self._state._records)

    def __iter__(self):
        return iter(self.items())

    def keys(self) -> list[str]:
        return list(self._state._records)

    def values(self) -> list[Parameter]:
        return [Parameter(self._state, name) for name in self._state._records]

    def items(self) -> list[tuple[str, Parameter]]:
        return [(name, Parameter(self._state, name)) for name in self._state._records]

    def __repr__(self) -> str:
        return f"Parameters({self.keys()!r})"


class Properties:
    """User properties of a :class:`CheckpointState`: name -> int, float or str.

    Saved and restored with the checkpoint, types and values exactly. As in
    onnxruntime, iterating yields ``(name, value)`` pairs, so
    ``dict(state.properties)`` works.
    """

    def __init__(self, values: dict):
        self._values = values

    def __getitem__(self, name: str) -> int | float | str:
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(f"Property {name!r} not found.") from None

    def __setitem__(self, name: str, value: float | str) -> None:
        """Add or update a property.

        Raises
        ------
        TypeError
            If ``name`` is not a str or ``value`` not an int, float or str
            (bool included: it would not come back as a bool).
        """
        self._values[name] = _check_property(name, value)

    def __delitem__(self, name: str) -> None:
        if name not in self._values:
            raise KeyError(f"Property {name!r} not found.")
        del self._values[name]

    def __contains__(self, name) -> bool:
        return name in self._values

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self):
        return iter(list(self._values.items()))

    def get(self, name: str, default=None):
        return self._values.get(name, default)

    def keys(self) -> list[str]:
        return list(self._values)

    def values(self) -> list:
        return list(self._values.values())

    def items(self) -> list[tuple[str, int | float | str]]:
        return list(self._values.items())

    def __repr__(self) -> str:
        return f"Properties({self._values!r})"


class CheckpointState:
    """The state of a training: parameters, optimizer state and user properties.

    Same API as ``onnxruntime.training.api.CheckpointState``. Create one with
    :meth:`load_checkpoint` or :meth:`from_parameters`; ``CheckpointState()``
    is an empty state.

    Attributes
    ----------
    parameters : Parameters
        Name -> :class:`Parameter`, trainable first.
    properties : Properties
        Name -> int, float or str; saved with the checkpoint.

    Examples
    --------
    >>> import numpy as np
    >>> state = CheckpointState.from_parameters({"w": np.ones((2, 1), np.float32)})
    >>> state.properties["epoch"] = 3
    >>> restored = CheckpointState.load_checkpoint(state.to_bytes())
    >>> restored.parameters["w"].data.ravel().tolist(), restored.properties["epoch"]
    ([1.0, 1.0], 3)
    """

    def __init__(self):
        self._records: dict[str, _Record] = {}
        self._property_values: dict[str, int | float | str] = {}
        self._parameters = Parameters(self)
        self._properties = Properties(self._property_values)
        self._optimizer: _OptimizerSnapshot | None = None
        self._provider: _StateProvider | None = None

    # ------------------------------------------------------------ construction

    @classmethod
    def from_parameters(cls, trainable, frozen=None, properties=None, *, nominal=False):
        """Build a state from parameter values.

        Parameters
        ----------
        trainable : mapping of str to array-like
            Trainable parameters, in order.
        frozen : mapping of str to array-like, optional
            Parameters that are not trained, in order.
        properties : mapping of str to int, float or str, optional
        nominal : bool, default=False
            Keep only each parameter's dtype and shape (a nominal checkpoint):
            ``.data`` raises until the values are set, e.g. by
            ``TrainingSession.from_buffer``.

        Returns
        -------
        CheckpointState
            A state holding copies of the arrays.

        Raises
        ------
        TypeError
            On a non-str name or an unsupported dtype.
        ValueError
            If a name is both trainable and frozen.

        Examples
        --------
        >>> import numpy as np
        >>> state = CheckpointState.from_parameters(
        ...     {"coef": np.zeros((3, 1))}, {"shape": np.array([-1, 1])}, nominal=True)
        >>> state.parameters["coef"].nominal, state.parameters["shape"].requires_grad
        (True, False)
        """
        frozen = {} if frozen is None else frozen
        properties = {} if properties is None else properties
        for arg, what in ((trainable, "trainable"), (frozen, "frozen"),
                          (properties, "properties")):
            if not isinstance(arg, Mapping):
                raise TypeError(f"{what} must be a mapping, got {type(arg).__name__}.")
        both = [name for name in frozen if name in trainable]
        if both:
            raise ValueError(f"Parameters both trainable and frozen: {both}.")
        state = cls()
        for params, requires_grad in ((trainable, True), (frozen, False)):
            for name, value in params.items():
                if not isinstance(name, str):
                    raise TypeError(f"Parameter names are str, got {name!r}.")
                arr = _as_array(value, f"Parameter {name!r}")
                state._records[name] = _Record(
                    arr.dtype, arr.shape, requires_grad,
                    None if nominal else arr, has_data=not nominal,
                )
        for name, value in properties.items():
            state.properties[name] = value
        return state

    # -------------------------------------------------------------- accessors

    @property
    def parameters(self) -> Parameters:
        return self._parameters

    @property
    def properties(self) -> Properties:
        return self._properties

    @property
    def trainable_names(self) -> list[str]:
        """Names of the trainable parameters, in order."""
        return [n for n, r in self._records.items() if r.requires_grad]

    @property
    def frozen_names(self) -> list[str]:
        """Names of the frozen parameters, in order."""
        return [n for n, r in self._records.items() if not r.requires_grad]

    @property
    def is_nominal(self) -> bool:
        """True if any parameter has no data (a nominal checkpoint)."""
        return any(not r.has_data for r in self._records.values())

    @property
    def optimizer_state(self) -> dict[str, dict[str, np.ndarray]]:
        """Optimizer state tensors: ``{param: {state_name: array}}`` (copies), {} if none."""
        snapshot = self._current_optimizer()
        if snapshot is None:
            return {}
        return {p: {s: a.copy() for s, a in st.items()} for p, st in snapshot.states.items()}

    @property
    def optimizer_step(self) -> int | None:
        """Number of optimizer updates made so far, None without optimizer state."""
        snapshot = self._current_optimizer()
        return None if snapshot is None else snapshot.step

    @property
    def optimizer_learning_rate(self) -> float | None:
        """The optimizer's current learning rate, None without optimizer state."""
        snapshot = self._current_optimizer()
        return None if snapshot is None else snapshot.learning_rate

    def set_optimizer_state(self, states, step, learning_rate) -> None:
        """Replace the optimizer state (to resume a training).

        Parameters
        ----------
        states : mapping of str to mapping of str to array-like
            ``{trainable_param: {state_name: array}}``, e.g.
            ``{"w": {"exp_avg": ..., "exp_avg_sq": ...}}``.
        step : int
            Number of optimizer updates already made (>= 0).
        learning_rate : float

        Raises
        ------
        ValueError
            If a name is not a trainable parameter; if ``step`` is negative or
            beyond int64; if ``learning_rate`` is NaN, infinite, negative or
            beyond float32's range; if a floating state holds NaN or infinity.
        TypeError
            If ``learning_rate`` is not a real number.
        RuntimeError
            While bound to a training session (set it through the session).
        """
        if self._provider is not None:
            raise RuntimeError(
                "This state is bound to a training session; its optimizer state "
                "lives there."
            )
        self._optimizer = self._validated_optimizer(states, step, learning_rate)

    def _validated_optimizer(self, states, step, learning_rate,
                             check_values: bool = True) -> _OptimizerSnapshot:
        """The optimizer state as a snapshot; ValueError/TypeError if it is malformed.

        With ``check_values`` (a state set by the user or loaded from a file),
        also refuses values no training can resume from: a learning rate that
        is NaN, infinite, negative or beyond float32 (the optimizer graphs take
        it as float32), a step beyond int64 (its dtype there), non-finite
        moments. A training session's own state is taken as it is.
        """
        if not isinstance(states, Mapping):
            raise TypeError(f"states must be a mapping, got {type(states).__name__}.")
        step = operator.index(step)
        if step < 0:
            raise ValueError(f"step must be >= 0 (the number of updates made), got {step}.")
        if check_values:
            if step > _INT64_MAX:
                raise ValueError(
                    f"step must fit in int64 (<= {_INT64_MAX}), got {step}; the step counts "
                    "the optimizer updates made, give that number.")
            if not isinstance(learning_rate, numbers.Real):
                raise TypeError(f"learning_rate must be a real number, got "
                                f"{type(learning_rate).__name__}.")
            rate = float(learning_rate)
            # 0 is allowed: a schedule may have decayed the rate to 0 (the
            # session's set_learning_rate accepts it too).
            if not (math.isfinite(rate) and 0 <= rate <= _FLOAT32_MAX):
                raise ValueError(
                    f"learning_rate must be a finite number >= 0 that float32 can hold "
                    f"(<= {_FLOAT32_MAX:.4g}), got {learning_rate!r}; set the rate the "
                    "training should resume with.")
        clean = {}
        for param, param_states in states.items():
            record = self._records.get(param)
            if record is None or not record.requires_grad:
                raise ValueError(
                    f"Optimizer state for {param!r}, which is not a trainable parameter.")
            clean[param] = {}
            for state_name, value in param_states.items():
                if not isinstance(state_name, str) or not state_name:
                    raise ValueError(f"Bad optimizer state name {state_name!r} for {param!r}.")
                arr = _as_array(value, f"Optimizer state {state_name!r} of {param!r}")
                if (check_values and arr.dtype.kind == "f"
                        and not np.isfinite(arr).all()):
                    bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
                    raise ValueError(
                        f"Optimizer state {state_name!r} of {param!r} has {bad} NaN or "
                        "infinite value(s); a diverged state cannot be resumed: resume "
                        "from an earlier checkpoint or without the optimizer state.")
                clean[param][state_name] = arr
        return _OptimizerSnapshot(clean, step, float(learning_rate))

    def check_matches(self, expected, trainable=None) -> None:
        """Check that this state holds exactly the parameters a model expects.

        Parameters
        ----------
        expected : mapping of str to (dtype, shape)
            Every parameter of the model. A shape of None, or a dimension that
            is None or a str, matches anything.
        trainable : iterable of str, optional
            The parameters the model trains; if given, they must be the
            trainable parameters of the state.

        Raises
        ------
        ValueError
            Listing missing, unexpected and mismatched parameters.
        """
        problems = []
        missing = [name for name in expected if name not in self._records]
        extra = [name for name in self._records if name not in expected]
        if missing:
            problems.append(f"missing parameters {missing}")
        if extra:
            problems.append(f"unexpected parameters {extra}")
        for name, (dtype, shape) in expected.items():
            record = self._records.get(name)
            if record is None:
                continue
            if np.dtype(dtype) != record.dtype or not shape_matches(shape, record.shape):
                problems.append(
                    f"{name!r} is {record.dtype} {record.shape} in the checkpoint, "
                    f"{np.dtype(dtype)} {None if shape is None else tuple(shape)} in the model"
                )
        if trainable is not None:
            wanted = set(trainable)
            for name, record in self._records.items():
                if name in expected and record.requires_grad != (name in wanted):
                    kind = "trainable" if record.requires_grad else "frozen"
                    problems.append(f"{name!r} is {kind} in the checkpoint but not in the model")
        if problems:
            raise TrainingApiValueError(
                "The checkpoint does not match the model: " + "; ".join(problems) + ".")

    # --------------------------------------------------------- parameter I/O

    def _nominal_error(self, name: str) -> NominalCheckpointError:
        record = self._records[name]
        # onnxruntime-training's sentence first, then the remedy
        return NominalCheckpointError(
            "Cannot get parameter from a nominal state. Please load the parameter states "
            f"first: parameter {name!r} is nominal ({record.dtype}, shape {record.shape}), "
            "the checkpoint holds names and shapes, not values. Load the values: "
            "Module.copy_buffer_to_parameters(buffer, trainable_only=False) with a buffer "
            "of all the parameters, or a complete checkpoint (CheckpointState.load_checkpoint)."
        )

    def _read_parameter(self, name: str) -> np.ndarray:
        record = self._records[name]
        if not record.has_data:
            raise self._nominal_error(name)
        if self._provider is not None:
            return _conform(record, self._provider.get_parameter(name),
                            f"The training session's value of {name!r}")
        return record.value.copy()

    def _write_parameter(self, name: str, value) -> None:
        record = self._records[name]
        arr = _conform(record, value, f"Parameter {name!r}")
        if self._provider is not None:
            self._provider.set_parameter(name, arr)
        else:
            record.value = arr
        record.has_data = True

    def _current_optimizer(self) -> _OptimizerSnapshot | None:
        if self._provider is None:
            return self._optimizer
        exported = self._provider.export_optimizer_state()
        # The session's own values, as trained (a diverged state is still saved).
        return None if exported is None else self._validated_optimizer(
            *exported, check_values=False)

    # ---------------------------------------------------------------- binding

    def _bind(self, provider: _StateProvider) -> None:
        """Read and write parameters through ``provider`` (a training session)."""
        if not isinstance(provider, _StateProvider):
            raise TypeError(
                f"{type(provider).__name__} lacks the _StateProvider methods "
                "(get_parameter, set_parameter, get_gradient, export_optimizer_state)."
            )
        if self._provider is not provider:
            self._require_unbound()
        self._provider = provider

    def _require_unbound(self) -> None:
        """Refuse a second live session: it would train a diverging copy of the values."""
        if self._provider is not None:
            raise RuntimeError(
                "This CheckpointState is already bound to a live training session (an "
                "api.Module or a TrainingSession); two sessions on one state would train "
                "diverging copies of its parameters. Close the first one (module.close(), "
                "session.close(), or open it in a `with` block), or load a separate copy "
                "of the checkpoint for the second.")

    def _unbind(self) -> None:
        """Copy the provider's values back into the state, then detach it."""
        if self._provider is None:
            return
        values = {name: self._read_parameter(name)
                  for name, record in self._records.items() if record.has_data}
        optimizer = self._current_optimizer()
        self._provider = None
        for name, value in values.items():
            self._records[name].value = value
        if optimizer is not None:
            self._optimizer = optimizer

    @property
    def _is_bound(self) -> bool:
        return self._provider is not None

    # ---------------------------------------------------------- serialisation

    def to_bytes(self, include_optimizer_state: bool = False) -> bytes:
        """The checkpoint file's content (see the module docstring for the format).

        Parameters
        ----------
        include_optimizer_state : bool, default=False

        Returns
        -------
        bytes
            What :meth:`save_checkpoint` writes; :meth:`load_checkpoint` reads it.
        """
        buffer = io.BytesIO()
        self._writer(include_optimizer_state)(buffer)
        return buffer.getvalue()

    def _writer(self, include_optimizer_state: bool):
        """A function writing the checkpoint to a binary file, tensor by tensor.

        The tensors are gathered (the parameters of an unbound state without a
        copy) and checksummed first, so that the header can be written before
        them; no copy of the whole file is ever built.
        """
        tensors = {}
        specs = {}
        for name, record in self._records.items():
            specs[name] = {"dtype": record.dtype.name, "shape": list(record.shape),
                           "nominal": not record.has_data}
            if record.has_data:
                # unbound: the state's own array, only read (a copy would double the memory)
                tensors["param/" + name] = (record.value if self._provider is None
                                            else self._read_parameter(name))
        optimizer = None
        snapshot = self._current_optimizer() if include_optimizer_state else None
        if snapshot is not None:
            optimizer = {"step": snapshot.step, "learning_rate": repr(snapshot.learning_rate),
                         "states": {p: list(st) for p, st in snapshot.states.items()}}
            for param, param_states in snapshot.states.items():
                for state_name, arr in param_states.items():
                    key = f"optim/{param}/{state_name}"
                    if key in tensors:
                        raise ValueError(f"Optimizer state names collide on {key!r}.")
                    tensors[key] = arr
        header = json.dumps({
            "trainable": self.trainable_names,
            "frozen": self.frozen_names,
            "tensors": specs,
            "properties": [_encode_property(n, v) for n, v in self._property_values.items()],
            "optimizer": optimizer,
        })
        metadata = {FORMAT_TAG: FORMAT_VERSION, _HEADER_KEY: header,
                    _CHECKSUM_KEY: _checksum(header, tensors)}
        return lambda f: write(f, tensors, metadata)

    @classmethod
    def load_checkpoint(cls, checkpoint_uri_or_bytes) -> CheckpointState:
        """Load a checkpoint written by :meth:`save_checkpoint` (full or nominal).

        Parameters
        ----------
        checkpoint_uri_or_bytes : str, os.PathLike or bytes-like
            The file's path, or its content.

        Returns
        -------
        CheckpointState

        Raises
        ------
        ValueError
            If the content is not an ortlearn checkpoint, or is damaged; if the
            path is not a regular file (a FIFO, a device); if the header's length
            or a declared tensor size does not fit in the file (checked before
            the body is read). Nothing is ever unpickled.
        TypeError
            If the argument is neither a path nor bytes.
        OSError
            If the file cannot be read (e.g. FileNotFoundError).

        Notes
        -----
        The ValueError and the OSError are also RuntimeErrors
        (:class:`~ortlearn.exceptions.TrainingApiError`), the class
        onnxruntime-training raises for both.
        """
        source = checkpoint_uri_or_bytes
        if isinstance(source, (bytes, bytearray, memoryview)):
            return cls._from_bytes(bytes(source), "The bytes given are")
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            try:
                metadata, tensors = read_file(path)
            except OSError as exc:
                raise as_training_api_error(exc) from None
            except ValueError as exc:
                raise TrainingApiValueError(
                    f"{path!r} is not a valid ortlearn checkpoint: {exc}") from None
            try:
                return cls._build(metadata, tensors)
            except Exception as exc:  # untrusted input: a foreign or damaged file
                raise TrainingApiValueError(
                    f"{path!r} is not a valid ortlearn checkpoint: {exc}") from exc
        raise TypeError(
            f"Expected a path or bytes, got {type(source).__name__}."
        )

    @classmethod
    def save_checkpoint(cls, state, checkpoint_uri, include_optimizer_state=False) -> None:
        """Write ``state`` to ``checkpoint_uri``, atomically.

        The content is streamed, tensor by tensor, to a temporary file in the
        same directory (``.<name>.<12 hex digits>.tmp``), which is flushed,
        fsynced and renamed over the target: a failure leaves any previous
        checkpoint intact and no temporary file behind. Temporary files that
        an interrupted (killed) save to the same path left are removed.

        A nominal state (some parameter without a value) is saved as a nominal
        checkpoint, but never over a file that holds parameter values: that
        would drop trained values (onnxruntime-training would overwrite it).

        Parameters
        ----------
        state : CheckpointState
        checkpoint_uri : str or os.PathLike
            The file to write (its directory must exist).
        include_optimizer_state : bool, default=False
            Also save the optimizer state (to resume a training), if the state
            has one.

        Raises
        ------
        IsADirectoryError
            If ``checkpoint_uri`` is a directory.
        FileNotFoundError
            If its directory does not exist.
        PermissionError
            If its directory is not writable.
        ortlearn.exceptions.NominalCheckpointError
            If the state is nominal and ``checkpoint_uri`` is a checkpoint
            holding values.
        ValueError
            If the serialisation panics (a Rust ``PanicException``); the file
            already at ``checkpoint_uri`` is then unchanged.

        Notes
        -----
        These errors are also RuntimeErrors
        (:class:`~ortlearn.exceptions.TrainingApiError`), the class
        onnxruntime-training raises.
        """
        if not isinstance(state, CheckpointState):
            raise TypeError(f"Expected a CheckpointState, got {type(state).__name__}.")
        if not isinstance(checkpoint_uri, (str, os.PathLike)):
            raise TypeError(f"Expected a path, got {type(checkpoint_uri).__name__}.")
        path = os.fsdecode(os.fspath(checkpoint_uri))
        if state.is_nominal and _holds_values(path):
            missing = [n for n, r in state._records.items() if not r.has_data]
            raise NominalCheckpointError(
                f"Not saving a nominal state over {path!r}: that checkpoint holds parameter "
                f"values, this state has none for {missing}. Load the values first "
                "(Module.copy_buffer_to_parameters(buffer, trainable_only=False)), or save "
                "to another path."
            )
        try:
            atomic_write(path, state._writer(include_optimizer_state))
        except OSError as exc:
            raise as_training_api_error(exc) from None
        except BaseException as exc:
            if not is_panic(exc):
                raise
            # atomic_write has removed its temporary file: the old checkpoint is intact
            raise TrainingApiValueError(
                f"Cannot save the checkpoint to {path!r}: the serialisation failed ({exc}); "
                "the file already there, if any, is unchanged.") from exc

    @classmethod
    def _from_bytes(cls, data: bytes, source: str) -> CheckpointState:
        try:
            return cls._decode(data)
        except Exception as exc:  # untrusted input: any failure means a foreign or damaged file
            raise TrainingApiValueError(
                f"{source} not a valid ortlearn checkpoint: {exc}") from exc
        except BaseException as exc:
            # safetensors' PanicException (a Rust panic) derives from BaseException
            if not is_panic(exc):
                raise
            raise TrainingApiValueError(
                f"{source} not a valid ortlearn checkpoint: safetensors failed on it "
                f"({exc})") from exc

    @classmethod
    def _decode(cls, data: bytes) -> CheckpointState:
        return cls._build(read_metadata(data), safetensors.numpy.load(data))

    @classmethod
    def _build(cls, metadata: dict, tensors: dict) -> CheckpointState:
        """The state of a checkpoint's metadata and tensors (checked against its checksum)."""
        version = metadata.get(FORMAT_TAG)
        if version is None:
            raise ValueError("it has no ortlearn header")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"format version {version!r}, this ortlearn reads version {FORMAT_VERSION}"
            )
        header_text = metadata.get(_HEADER_KEY)
        header = json.loads(header_text)
        if _checksum(header_text, tensors) != metadata.get(_CHECKSUM_KEY):
            raise ValueError("checksum mismatch, the file is damaged")
        state = cls()
        trainable, frozen = _str_list(header["trainable"]), _str_list(header["frozen"])
        names = trainable + frozen
        if len(set(names)) != len(names) or set(names) != set(header["tensors"]):
            raise ValueError("inconsistent parameter names")
        trainable = set(trainable)
        for name in names:
            state._records[name] = _decode_record(
                header["tensors"][name], name in trainable, tensors.pop("param/" + name, None))
        for item in header["properties"]:
            name, value = _decode_property(item)
            state._property_values[name] = value
        if header["optimizer"] is not None:
            state._optimizer = _decode_optimizer(state, header["optimizer"], tensors)
        if tensors:
            raise ValueError(f"unexpected tensors {sorted(tensors)}")
        return state

    def __reduce__(self):
        # pickle/deepcopy through the safe format: the copy is unbound
        return (CheckpointState.load_checkpoint, (self.to_bytes(include_optimizer_state=True),))

    def __repr__(self) -> str:
        return (
            f"CheckpointState(trainable={self.trainable_names}, frozen={self.frozen_names}, "
            f"properties={self._properties.keys()}, nominal={self.is_nominal}, "
            f"bound={self._is_bound})"
        )


def _holds_values(path: str) -> bool:
    """True if ``path`` is an ortlearn checkpoint with at least one parameter value.

    Only the header is read. Anything else (no file, a foreign or damaged
    file) is False: those are overwritten as any file is.
    """
    try:
        with open_regular(path) as f:  # a FIFO at the path must not block the save
            size = int.from_bytes(f.read(8), "little")
            header = f.read(size) if 0 < size <= MAX_HEADER else b""
        metadata = read_metadata(size.to_bytes(8, "little") + header, layout=False)
        specs = json.loads(metadata[_HEADER_KEY])["tensors"]
        return any(not spec["nominal"] for spec in specs.values())
    except Exception:  # not a readable ortlearn checkpoint
        return False


def _str_list(value) -> list[str]:
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ValueError(f"expected a list of names, got {value!r}")
    return value


def _decode_record(spec: dict, requires_grad: bool, value: np.ndarray | None) -> _Record:
    dtype = _DTYPES[spec["dtype"]]
    shape = spec["shape"]
    if not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"bad shape {shape!r}")
    shape = tuple(shape)
    if spec["nominal"] is not (value is None):
        raise ValueError("nominal flags do not match the tensors")
    if value is not None and (value.dtype != dtype or value.shape != shape):
        raise ValueError("a tensor disagrees with its declared dtype or shape")
    return _Record(dtype, shape, requires_grad, value, has_data=value is not None)


def _decode_optimizer(state: CheckpointState, spec: dict, tensors: dict) -> _OptimizerSnapshot:
    if type(spec["step"]) is not int:
        raise ValueError("bad optimizer step")
    states = {param: {name: tensors.pop(f"optim/{param}/{name}") for name in _str_list(names)}
              for param, names in spec["states"].items()}
    return state._validated_optimizer(states, spec["step"], float(spec["learning_rate"]))


