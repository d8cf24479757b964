"""Tests of ortlearn.training.checkpoint: round trips, atomic writes, corrupt files, binding."""

import copy
import os
import pickle

import numpy as np
import onnx
import pytest
import safetensors.numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ortlearn.training import checkpoint as ckmod
from ortlearn.training.checkpoint import CheckpointState

DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_]
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------- helpers

def _same_value(a, b):
    """Exact equality of properties: same type; floats by repr (-0.0 is not 0.0, nan is nan)."""
    if type(a) is not type(b):
        return False
    return repr(a) == repr(b) if isinstance(a, float) else a == b


def _same_array(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_states_equal(a, b):
    assert a.trainable_names == b.trainable_names
    assert a.frozen_names == b.frozen_names
    for (name, pa), (name_b, pb) in zip(a.parameters, b.parameters):
        assert name == name_b
        assert (pa.dtype, pa.shape, pa.nominal, pa.requires_grad) == (
            pb.dtype, pb.shape, pb.nominal, pb.requires_grad)
        if not pa.nominal:
            assert _same_array(pa.data, pb.data), name
    assert a.properties.keys() == b.properties.keys()
    for name, value in a.properties:
        assert _same_value(value, b.properties[name]), name
    assert a.optimizer_step == b.optimizer_step
    assert _same_value(a.optimizer_learning_rate, b.optimizer_learning_rate)
    sa, sb = a.optimizer_state, b.optimizer_state
    assert list(sa) == list(sb)
    for param in sa:
        assert list(sa[param]) == list(sb[param])
        for name in sa[param]:
            assert _same_array(sa[param][name], sb[param][name])


def _special_values(dtype):
    """An array of ``dtype`` with the awkward values of that dtype."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        info = np.finfo(dtype)
        values = np.array([0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, info.max, info.min,
                           info.tiny, info.smallest_subnormal, 0.1], dtype=dtype)
        # a NaN with a payload and the sign bit set: must survive bit for bit
        bits = values.view(f"u{dtype.itemsize}")
        bits[5] |= np.array(1 << (8 * dtype.itemsize - 1), dtype=bits.dtype) | 3
        return values
    if dtype.kind == "b":
        return np.array([True, False, True])
    info = np.iinfo(dtype)
    return np.array([0, -1, 1, info.min, info.max], dtype=dtype)


def _full_state():
    state = CheckpointState.from_parameters(
        {"coef": np.arange(6, dtype=np.float32).reshape(3, 2), "intercept": np.float32(0.5)},
        {"shape_tensor": np.array([-1, 1], dtype=np.int64)},
        {"epoch": 7, "loss": 0.25, "name": "mlp"},
    )
    state.set_optimizer_state(
        {"coef": {"exp_avg": np.full((3, 2), 0.1, np.float32),
                  "exp_avg_sq": np.full((3, 2), 0.2, np.float32)},
         "intercept": {"exp_avg": np.float32(0.3), "exp_avg_sq": np.float32(0.4)}},
        step=12, learning_rate=1e-3)
    return state


@pytest.fixture(scope="module")
def valid_bytes():
    return _full_state().to_bytes(include_optimizer_state=True)


# ------------------------------------------------------------- round trips

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), None])
def test_round_trip_bit_for_bit(dtype, shape, tmp_path):
    special = _special_values(dtype)
    if shape is None:
        value = special
    elif shape == ():
        value = special[-1:].reshape(())  # 0-d array
    else:
        value = np.zeros(shape, dtype)  # no element at all
    state = CheckpointState.from_parameters({"p": value}, {"q": special[::-1]})
    path = tmp_path / "checkpoint"
    CheckpointState.save_checkpoint(state, path)
    loaded = CheckpointState.load_checkpoint(path)
    assert _same_array(loaded.parameters["p"].data, np.asarray(value))
    assert _same_array(loaded.parameters["q"].data, special[::-1])
    assert_states_equal(state, loaded)


def test_non_contiguous_and_big_endian_inputs_are_stored_by_value():
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    state = CheckpointState.from_parameters(
        {"t": base.T, "s": base[:, ::2], "be": base.astype(">f8")})
    loaded = CheckpointState.load_checkpoint(state.to_bytes())
    np.testing.assert_array_equal(loaded.parameters["t"].data, base.T)
    np.testing.assert_array_equal(loaded.parameters["s"].data, base[:, ::2])
    assert loaded.parameters["be"].dtype == np.float64
    np.testing.assert_array_equal(loaded.parameters["be"].data, base)


def test_round_trip_with_and_without_optimizer_state(tmp_path):
    state = _full_state()
    CheckpointState.save_checkpoint(state, tmp_path / "with", include_optimizer_state=True)
    CheckpointState.save_checkpoint(state, tmp_path / "without")
    with_optim = CheckpointState.load_checkpoint(tmp_path / "with")
    assert_states_equal(state, with_optim)
    assert with_optim.optimizer_step == 12 and with_optim.optimizer_learning_rate == 1e-3
    np.testing.assert_array_equal(with_optim.optimizer_state["coef"]["exp_avg_sq"],
                                  np.full((3, 2), 0.2, np.float32))
    without = CheckpointState.load_checkpoint(tmp_path / "without")
    assert without.optimizer_state == {} and without.optimizer_step is None
    assert without.optimizer_learning_rate is None
    assert os.path.getsize(tmp_path / "without") < os.path.getsize(tmp_path / "with")


def test_parameter_order_and_kind_round_trip():
    names = ["z", "a", "m/1", "é", ""]
    state = CheckpointState.from_parameters(
        {n: np.full(2, i, np.float32) for i, n in enumerate(names[:3])},
        {n: np.full(1, i, np.int64) for i, n in enumerate(names[3:])})
    loaded = CheckpointState.load_checkpoint(state.to_bytes())
    assert loaded.parameters.keys() == names
    assert loaded.trainable_names == names[:3] and loaded.frozen_names == names[3:]
    assert [p.requires_grad for p in loaded.parameters.values()] == [True] * 3 + [False] * 2


_names = st.text(min_size=1, max_size=8)
_properties = st.dictionaries(
    _names, st.one_of(st.integers(min_value=-(2 ** 130), max_value=2 ** 130),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10)),
    max_size=5)


@st.composite
def _parameter_sets(draw):
    names = draw(st.lists(_names, min_size=0, max_size=5, unique=True))
    arrays = {}
    for name in names:
        dtype = draw(st.sampled_from(DTYPES))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
        arrays[name] = draw(hnp.arrays(dtype, shape))
    n_trainable = draw(st.integers(0, len(names)))
    trainable = dict(list(arrays.items())[:n_trainable])
    frozen = dict(list(arrays.items())[n_trainable:])
    return trainable, frozen


@settings(max_examples=40, deadline=None)
@given(params=_parameter_sets(), properties=_properties, with_optim=st.booleans(),
       step=st.integers(0, 2 ** 40), lr=st.floats(0, float(np.finfo(np.float32).max)))
def test_round_trip_random_states(params, properties, with_optim, step, lr):
    trainable, frozen = params
    state = CheckpointState.from_parameters(trainable, frozen, properties)
    # moments are finite (NaN or infinite ones are refused: test_reliability_checkpoints)
    moments = {n: np.nan_to_num(a) if a.dtype.kind == "f" else a for n, a in trainable.items()}
    if with_optim:
        state.set_optimizer_state(
            {n: {"m": np.flip(a), "v": a} for n, a in moments.items()}, step, lr)
    loaded = CheckpointState.load_checkpoint(state.to_bytes(include_optimizer_state=True))
    assert_states_equal(state, loaded)
    assert _same_value(loaded.optimizer_learning_rate, lr if with_optim else None)


# -------------------------------------------------------------- properties

@pytest.mark.parametrize("value", [
    0, -1, 2 ** 63, -(2 ** 200), pytest.param(-(10 ** 5000), id='5000-digits'),
    0.1, -0.0, 5e-324, 1.7976931348623157e308,
    float("nan"), float("inf"), float("-inf"), "", "héllo ✓ 🙂", 'quote " \\ \x00 \n',
    "\ud800 lone surrogate"])
def test_property_values_round_trip_exactly(value):
    state = CheckpointState()
    state.properties["p"] = value
    loaded = CheckpointState.load_checkpoint(state.to_bytes())
    assert _same_value(loaded.properties["p"], value)


def test_properties_mapping_behaviour():
    state = CheckpointState()
    props = state.properties
    props["b"] = 1
    props["a"] = np.float32(0.5)  # numpy scalars become Python ones
    props["c"] = np.int64(3)
    assert type(props["a"]) is float and type(props["c"]) is int
    props["b"] = "replaced"
    assert dict(props) == {"b": "replaced", "a": 0.5, "c": 3}  # iteration yields pairs, as in ORT
    assert props.keys() == ["b", "a", "c"] and len(props) == 3 and "a" in props
    assert props.get("missing", 4) == 4
    del props["b"]
    assert "b" not in props
    with pytest.raises(KeyError, match="'b' not found"):
        props["b"]
    with pytest.raises(KeyError):
        del props["b"]
    loaded = CheckpointState.load_checkpoint(state.to_bytes())
    assert loaded.properties.items() == [("a", 0.5), ("c", 3)]


def test_property_bool_is_stored_as_int_as_onnxruntime_training_does():
    state = CheckpointState()
    state.properties["done"] = True
    state.properties["flag"] = np.bool_(False)
    loaded = CheckpointState.load_checkpoint(state.to_bytes())
    for props in (state.properties, loaded.properties):
        assert props.items() == [("done", 1), ("flag", 0)]
        assert type(props["done"]) is int and type(props["flag"]) is int


@pytest.mark.parametrize("value", [[1], None, b"x", 1j, np.array([1.0])])
def test_property_bad_type_is_type_error(value):
    state = CheckpointState()
    with pytest.raises(TypeError, match="'p'"):
        state.properties["p"] = value
    assert "p" not in state.properties


def test_property_name_must_be_str():
    with pytest.raises(TypeError, match="names are str"):
        CheckpointState().properties[1] = 2


# --------------------------------------------------------------- parameters

def test_parameter_access_and_setter():
    state = _full_state()
    params = state.parameters
    assert len(params) == 3 and "coef" in params and "nope" not in params
    assert [name for name, _ in params] == ["coef", "intercept", "shape_tensor"]
    p = params["coef"]
    assert p.name == "coef" and p.requires_grad and p.grad is None
    assert not params["shape_tensor"].requires_grad
    data = p.data
    data[:] = -1  # a copy: the state is unchanged
    np.testing.assert_array_equal(p.data, np.arange(6, dtype=np.float32).reshape(3, 2))
    new = np.ones((3, 2), np.float32)
    p.data = new
    new[:] = 5  # the state took a copy
    np.testing.assert_array_equal(params["coef"].data, np.ones((3, 2)))
    params["intercept"] = np.float32(2.0)
    assert params["intercept"].data == np.float32(2.0)
    params["coef"].data = np.zeros((3, 2), ">f4")  # byte order is not dtype
    assert "Parameter(name='coef'" in repr(params["coef"])
    with pytest.raises(KeyError, match="'missing' not found"):
        params["missing"]


@pytest.mark.parametrize("value, match", [
    (np.ones((2, 3), np.float32), r"shape \(3, 2\).*got float32 of shape \(2, 3\)"),
    (np.ones((3, 2), np.float64), "float32 of shape.*got float64"),
    (np.ones(6, np.float32), "shape"),
    (1.0, r"got float64 of shape \(\)"),
])
def test_parameter_setter_rejects_other_shape_or_dtype(value, match):
    state = _full_state()
    before = state.parameters["coef"].data
    with pytest.raises(ValueError, match=match):
        state.parameters["coef"].data = value
    np.testing.assert_array_equal(state.parameters["coef"].data, before)


def test_from_parameters_copies_inputs():
    w = np.ones(3)
    state = CheckpointState.from_parameters({"w": w})
    w[:] = 7
    np.testing.assert_array_equal(state.parameters["w"].data, np.ones(3))


@pytest.mark.parametrize("value", [np.ones(2, np.complex64), np.ones(2, np.uint8),
                                   np.array(["a"]), np.array([None]), np.ones(2, np.int16)])
def test_unsupported_dtype_is_type_error(value):
    with pytest.raises(TypeError, match="Parameter 'w' has dtype"):
        CheckpointState.from_parameters({"w": value})


def test_from_parameters_argument_errors():
    with pytest.raises(ValueError, match=r"both trainable and frozen: \['w'\]"):
        CheckpointState.from_parameters({"w": np.ones(1)}, {"w": np.ones(1)})
    with pytest.raises(TypeError, match="trainable must be a mapping, got list"):
        CheckpointState.from_parameters([np.ones(1)])
    with pytest.raises(TypeError, match="properties must be a mapping"):
        CheckpointState.from_parameters({}, properties=[("a", 1)])
    with pytest.raises(TypeError, match="names are str"):
        CheckpointState.from_parameters({0: np.ones(1)})


def test_set_optimizer_state_errors():
    state = _full_state()
    with pytest.raises(ValueError, match="'shape_tensor', which is not a trainable"):
        state.set_optimizer_state({"shape_tensor": {"m": np.ones(2)}}, 0, 0.1)
    with pytest.raises(ValueError, match="'ghost', which is not a trainable"):
        state.set_optimizer_state({"ghost": {"m": np.ones(2)}}, 0, 0.1)
    with pytest.raises(ValueError, match="step must be >= 0"):
        state.set_optimizer_state({}, -1, 0.1)
    with pytest.raises(TypeError):
        state.set_optimizer_state({}, 1.5, 0.1)
    assert state.optimizer_step == 12  # unchanged


def test_optimizer_state_is_a_copy():
    state = _full_state()
    state.optimizer_state["coef"]["exp_avg"][:] = 9
    np.testing.assert_array_equal(state.optimizer_state["coef"]["exp_avg"],
                                  np.full((3, 2), 0.1, np.float32))


def test_check_matches():
    state = _full_state()
    expected = {"coef": (np.float32, (3, 2)), "intercept": ("float32", ()),
                "shape_tensor": (np.int64, (2,))}
    state.check_matches(expected, trainable=["coef", "intercept"])
    state.check_matches({**expected, "coef": (np.float32, ("N", None))})
    state.check_matches({**expected, "coef": (np.float32, None)})
    bad = {"coef": (np.float64, (3, 2)), "intercept": (np.float32, (1,)),
           "other": (np.float32, (1,))}
    with pytest.raises(ValueError) as info:
        state.check_matches(bad)
    message = str(info.value)
    assert "missing parameters ['other']" in message
    assert "unexpected parameters ['shape_tensor']" in message
    assert "'coef' is float32 (3, 2) in the checkpoint, float64 (3, 2) in the model" in message
    assert "'intercept' is float32 () in the checkpoint, float32 (1,) in the model" in message
    with pytest.raises(ValueError, match="'intercept' is trainable in the checkpoint but not"):
        state.check_matches(expected, trainable=["coef"])
    with pytest.raises(ValueError, match="'shape_tensor' is frozen in the checkpoint but not"):
        state.check_matches(expected, trainable=["coef", "intercept", "shape_tensor"])


def test_pickle_and_deepcopy_go_through_the_safe_format():
    state = _full_state()
    for clone in (pickle.loads(pickle.dumps(state)), copy.deepcopy(state)):
        assert_states_equal(state, clone)
        clone.parameters["coef"].data = np.zeros((3, 2), np.float32)
        assert state.parameters["coef"].data[2, 1] == 5


# ------------------------------------------------------------------ nominal

def test_nominal_checkpoint_round_trip(tmp_path):
    full = _full_state()
    values = {n: p.data for n, p in full.parameters}
    state = CheckpointState.from_parameters(
        {"coef": values["coef"], "intercept": values["intercept"]},
        {"shape_tensor": values["shape_tensor"]}, {"epoch": 1}, nominal=True)
    assert state.is_nominal
    p = state.parameters["coef"]
    assert p.nominal and p.dtype == np.float32 and p.shape == (3, 2)
    with pytest.raises(ValueError, match=r"'coef' is nominal \(float32, shape \(3, 2\)\)"):
        p.data
    CheckpointState.save_checkpoint(state, tmp_path / "nominal")
    CheckpointState.save_checkpoint(full, tmp_path / "full")
    assert os.path.getsize(tmp_path / "nominal") < os.path.getsize(tmp_path / "full")
    loaded = CheckpointState.load_checkpoint(tmp_path / "nominal")
    assert_states_equal(state, loaded)
    assert all(p.nominal for _, p in loaded.parameters)
    # filling some parameters: the rest stays nominal through a save/load
    loaded.parameters["coef"].data = values["coef"]
    again = CheckpointState.load_checkpoint(loaded.to_bytes())
    assert not again.parameters["coef"].nominal and again.parameters["intercept"].nominal
    np.testing.assert_array_equal(again.parameters["coef"].data, values["coef"])
    with pytest.raises(ValueError, match="got float64"):
        again.parameters["intercept"].data = np.float64(1)
    again.parameters["intercept"].data = values["intercept"]
    again.parameters["shape_tensor"].data = values["shape_tensor"]
    assert not again.is_nominal
    for name, value in values.items():
        assert _same_array(again.parameters[name].data, value)


# ---------------------------------------------------------- paths and bytes

def test_load_from_str_path_pathlib_and_bytes_like(tmp_path, valid_bytes):
    path = tmp_path / "sub dir é" / "checkpoint"
    path.parent.mkdir()
    CheckpointState.save_checkpoint(_full_state(), str(path), include_optimizer_state=True)
    reference = _full_state()
    for source in (str(path), path, valid_bytes, bytearray(valid_bytes), memoryview(valid_bytes)):
        assert_states_equal(reference, CheckpointState.load_checkpoint(source))


def test_load_argument_errors(tmp_path):
    with pytest.raises(TypeError, match="path or bytes, got int"):
        CheckpointState.load_checkpoint(3)
    with pytest.raises(FileNotFoundError):
        CheckpointState.load_checkpoint(tmp_path / "absent")
    with pytest.raises(TypeError, match="CheckpointState, got dict"):
        CheckpointState.save_checkpoint({}, tmp_path / "x")
    with pytest.raises(TypeError, match="path, got int"):
        CheckpointState.save_checkpoint(CheckpointState(), 3)


# ---------------------------------------------------------------- atomicity

def _listing(directory):
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("failing", ["replace", "fsync", "write"])
@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_failed_save_keeps_previous_checkpoint(tmp_path, monkeypatch, failing, error):
    path = tmp_path / "checkpoint"
    CheckpointState.save_checkpoint(_full_state(), path, include_optimizer_state=True)
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise error

    if failing == "write":
        real_fdopen = os.fdopen

        class BrokenFile:
            def __init__(self, fd):
                self._file = real_fdopen(fd, "wb")

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self._file.close()

            write = staticmethod(fail)

        monkeypatch.setattr(ckmod.os, "fdopen", lambda fd, mode: BrokenFile(fd))
    else:
        monkeypatch.setattr(ckmod.os, failing, fail)
    other = CheckpointState.from_parameters({"w": np.zeros(1000)})
    with pytest.raises(type(error)):
        CheckpointState.save_checkpoint(other, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _listing(tmp_path) == ["checkpoint"]  # no temporary file left behind
    assert_states_equal(_full_state(), CheckpointState.load_checkpoint(path))


def test_temporary_file_is_in_the_target_directory(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((src, dst, _listing(tmp_path)))
        real_replace(src, dst)

    monkeypatch.setattr(ckmod.os, "replace", spy)
    CheckpointState.save_checkpoint(_full_state(), tmp_path / "checkpoint")
    (src, dst, listing), = seen
    assert os.path.dirname(src) == str(tmp_path) == os.path.dirname(dst)
    assert os.path.basename(src) in listing and os.path.basename(src).endswith(".tmp")
    assert _listing(tmp_path) == ["checkpoint"]


def test_save_replaces_a_symlink_and_never_writes_through_it(tmp_path):
    """A link in the destination may point anywhere (outside the directory the user named):
    the link is replaced by the file, its target is left as it was."""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "precious"
    target.write_bytes(b"keep me")
    inside = tmp_path / "inside"
    inside.mkdir()
    link = inside / "checkpoint"
    link.symlink_to(target)
    CheckpointState.save_checkpoint(_full_state(), link, include_optimizer_state=True)
    assert not link.is_symlink() and target.read_bytes() == b"keep me"
    assert_states_equal(_full_state(), CheckpointState.load_checkpoint(link))


def test_save_to_a_directory_is_a_clear_error(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        CheckpointState.save_checkpoint(_full_state(), tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CheckpointState.save_checkpoint(_full_state(), tmp_path / "absent" / "checkpoint")
    assert _listing(tmp_path) == []


def test_unwritable_directory_simulated(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint"
    CheckpointState.save_checkpoint(_full_state(), path)
    before = path.read_bytes()

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ckmod.os, "open", refuse)
    with pytest.raises(PermissionError, match="checkpoint.*is not writable"):
        CheckpointState.save_checkpoint(CheckpointState(), path)
    monkeypatch.undo()
    assert path.read_bytes() == before and _listing(tmp_path) == ["checkpoint"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root ignores directory permissions")
def test_unwritable_directory_real(tmp_path):
    path = tmp_path / "checkpoint"
    CheckpointState.save_checkpoint(_full_state(), path)
    before = path.read_bytes()
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="not writable"):
            CheckpointState.save_checkpoint(CheckpointState(), path)
    finally:
        tmp_path.chmod(0o700)
    assert path.read_bytes() == before


# ------------------------------------------------------------ corrupt files

def _onnx_bytes():
    graph = onnx.helper.make_graph([], "g", [], [])
    return onnx.helper.make_model(graph).SerializeToString()


@pytest.mark.parametrize("make, match", [
    (lambda b: b"", "too short"),
    (lambda b: b"\x00" * 7, "too short"),
    (lambda b: b[: len(b) // 2], "not a valid ortlearn checkpoint"),
    (lambda b: b[:-1], "not a valid ortlearn checkpoint"),
    (lambda b: b[:200], "longer than the file"),
    (lambda b: os.urandom(64), "not a valid ortlearn checkpoint"),
    (lambda b: _onnx_bytes(), "not a valid ortlearn checkpoint"),
    (lambda b: pickle.dumps({"a": np.ones(3)}), "not a valid ortlearn checkpoint"),
    (lambda b: safetensors.numpy.save({"w": np.ones(3)}), "no ortlearn header"),
    (lambda b: safetensors.numpy.save({"w": np.ones(3)}, {"ortlearn.checkpoint": "2"}),
     "format version '2'"),
    (lambda b: safetensors.numpy.save({}, {"ortlearn.checkpoint": "1", "ortlearn.header": "{}"}),
     "not a valid ortlearn checkpoint"),
    (lambda b: b.replace(b"exp_avg_sq", b"exp_avg_sp"), "not a valid ortlearn checkpoint"),
    (lambda b: b[:-4] + b"\x00\x00\x80\x7f", "checksum mismatch"),
    (lambda b: b.replace(b"\\\"0x7\\\"", b"\\\"0x8\\\""), "checksum mismatch"),
])
def test_corrupt_or_foreign_content_is_value_error(valid_bytes, make, match, tmp_path):
    data = make(valid_bytes)
    with pytest.raises(ValueError, match=match):
        CheckpointState.load_checkpoint(data)
    path = tmp_path / "file"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=f"'{path}' is not a valid ortlearn checkpoint"):
        CheckpointState.load_checkpoint(path)


def test_module_never_touches_pickle():
    assert "pickle" not in vars(ckmod)


def test_forged_header_with_valid_checksum_is_value_error():
    """A consistent checksum over a malformed header still gives only ValueError."""
    headers = ['{"trainable": "ab", "frozen": [], "tensors": {}, "properties": [], '
               '"optimizer": null}',
               '{"trainable": ["w"], "frozen": [], "tensors": {"w": {"dtype": "object", '
               '"shape": [1], "nominal": true}}, "properties": [], "optimizer": null}',
               '{"trainable": [], "frozen": [], "tensors": {}, "properties": [["a", "x", "1"]],'
               ' "optimizer": null}',
               '[' * 100000 + ']' * 100000]
    for header in headers:
        data = safetensors.numpy.save({}, {"ortlearn.checkpoint": "1", "ortlearn.header": header,
                                           "ortlearn.checksum": ckmod._checksum(header, {})})
        with pytest.raises(ValueError, match="not a valid ortlearn checkpoint"):
            CheckpointState.load_checkpoint(data)


def _loads_the_same_or_value_error(data):
    try:
        loaded = CheckpointState.load_checkpoint(data)
    except ValueError:
        return
    # only damage to meaningless bytes (header padding, JSON whitespace) may load
    assert_states_equal(_full_state(), loaded)


def test_every_single_bit_flip_and_truncation(valid_bytes):
    for position in range(len(valid_bytes) * 8):
        flipped = bytearray(valid_bytes)
        flipped[position // 8] ^= 1 << (position % 8)
        _loads_the_same_or_value_error(bytes(flipped))
    for size in range(len(valid_bytes)):
        with pytest.raises(ValueError):
            CheckpointState.load_checkpoint(valid_bytes[:size])


@FUZZ
@given(data=st.data())
def test_fuzz_overwritten_bytes_give_value_error_or_the_same_state(valid_bytes, data):
    damaged = bytearray(valid_bytes)
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(damaged) - 1))
        damaged[position] = data.draw(st.integers(0, 255))
    _loads_the_same_or_value_error(bytes(damaged))


@FUZZ
@given(blob=st.binary(max_size=300), keep=st.integers(0, 300))
def test_fuzz_random_bytes_give_value_error(valid_bytes, blob, keep):
    for data in (blob, valid_bytes[:keep] + blob, len(blob).to_bytes(8, "little") + blob):
        with pytest.raises(ValueError):
            CheckpointState.load_checkpoint(data)


# ------------------------------------------------------------------ binding

class FakeProvider:
    """Holds live values like a TrainingSession would (on its 'device')."""

    def __init__(self, state):
        self.values = {name: p.data + 1 for name, p in state.parameters if not p.nominal}
        self.grads = {name: np.full(p.shape, 0.5, p.dtype)
                      for name, p in state.parameters if p.requires_grad}
        self.optimizer = ({n: {"exp_avg": g * 3} for n, g in self.grads.items()}, 42, 0.125)
        self.writes = []

    def get_parameter(self, name):
        return self.values[name].copy()

    def set_parameter(self, name, value):
        self.writes.append(name)
        self.values[name] = value.copy()

    def get_gradient(self, name):
        return self.grads[name].copy()

    def export_optimizer_state(self):
        return self.optimizer


def test_binding_reads_and_writes_through_the_provider(tmp_path):
    state = _full_state()
    host_coef = state.parameters["coef"].data
    provider = FakeProvider(state)
    state._bind(provider)
    state._bind(provider)  # binding again to the same provider is harmless
    coef = state.parameters["coef"]
    np.testing.assert_array_equal(coef.data, host_coef + 1)
    np.testing.assert_array_equal(coef.grad, np.full((3, 2), 0.5, np.float32))
    assert state.parameters["shape_tensor"].grad is None  # frozen
    coef.data = np.full((3, 2), 9, np.float32)
    assert provider.writes == ["coef"]
    np.testing.assert_array_equal(provider.values["coef"], np.full((3, 2), 9))
    with pytest.raises(ValueError, match="got float64"):
        coef.data = np.zeros((3, 2))
    assert provider.writes == ["coef"]
    assert state.optimizer_step == 42 and state.optimizer_learning_rate == 0.125
    np.testing.assert_array_equal(state.optimizer_state["intercept"]["exp_avg"], np.float32(1.5))
    with pytest.raises(RuntimeError, match="bound to a training session"):
        state.set_optimizer_state({}, 0, 0.1)

    CheckpointState.save_checkpoint(state, tmp_path / "bound", include_optimizer_state=True)
    saved = CheckpointState.load_checkpoint(tmp_path / "bound")
    np.testing.assert_array_equal(saved.parameters["coef"].data, np.full((3, 2), 9))
    np.testing.assert_array_equal(saved.parameters["intercept"].data, np.float32(1.5))
    assert saved.optimizer_step == 42 and saved.optimizer_learning_rate == 0.125
    assert saved.properties["epoch"] == 7

    state._unbind()
    provider.values["coef"][:] = -3  # no longer read
    np.testing.assert_array_equal(state.parameters["coef"].data, np.full((3, 2), 9))
    assert state.parameters["coef"].grad is None
    assert state.optimizer_step == 42
    assert_states_equal(saved, state)
    state._unbind()  # unbinding twice is harmless


def test_bind_errors():
    state = _full_state()
    with pytest.raises(TypeError, match="lacks the _StateProvider methods"):
        state._bind(object())
    state._bind(FakeProvider(state))
    with pytest.raises(RuntimeError, match="already bound"):
        state._bind(FakeProvider(state))


def test_provider_returning_a_wrong_array_is_caught():
    state = _full_state()
    provider = FakeProvider(state)
    provider.values["coef"] = np.zeros((2, 3), np.float32)
    state._bind(provider)
    with pytest.raises(ValueError, match="training session's value of 'coef'"):
        state.parameters["coef"].data


def test_binding_a_nominal_state_fills_it_through_the_provider():
    full = _full_state()
    state = CheckpointState.from_parameters(
        {"coef": full.parameters["coef"].data}, {"k": np.ones(2)}, nominal=True)
    provider = FakeProvider(state)
    provider.optimizer = None  # a session without optimizer
    state._bind(provider)
    with pytest.raises(ValueError, match="nominal"):
        state.parameters["coef"].data
    state.parameters["coef"].data = np.full((3, 2), 4, np.float32)  # e.g. from_buffer
    assert provider.writes == ["coef"] and state.parameters["k"].nominal
    assert state.optimizer_state == {} and state.optimizer_step is None
    copy_of_bound = copy.deepcopy(state)
    state._unbind()
    for snapshot in (state, copy_of_bound):
        np.testing.assert_array_equal(snapshot.parameters["coef"].data, np.full((3, 2), 4))
        assert snapshot.parameters["k"].nominal and not snapshot._is_bound
