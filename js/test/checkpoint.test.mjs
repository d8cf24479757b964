import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { CheckpointState, checkpointChecksum } from '../src/checkpoint.js';
import { parseSafetensors, serializeSafetensors } from '../src/safetensors.js';
import { python, runPython } from '../testing/python.mjs';

function build() {
  const state = CheckpointState.fromParameters(
    {
      'param/W é': { dtype: 'float32', shape: [3, 1], data: new Float32Array([1, -2, 3.5]) },
      b: { dtype: 'float64', shape: [1], data: new Float64Array([0.125]) },
    },
    {
      steps: { dtype: 'int64', shape: [2], data: new BigInt64Array([1n, -2n]) },
      flag: { dtype: 'bool', shape: [], data: new Uint8Array([1]) },
      half: { dtype: 'float16', shape: [1], data: new Uint16Array([0x3c00]) },
      idx: { dtype: 'int32', shape: [2, 0], data: new Int32Array(0) },
    },
    { epoch: 3, big: -(2n ** 70n), rate: 1e-5, third: 0.1, nan: NaN, negzero: -0.0, inf: Infinity, name: 'ü\n"😀', yes: true },
  );
  state.addProperty('three', 3, 'float');
  state.setOptimizerState({
    'param/W é': { exp_avg: new Float32Array([0.5, 0, -1]), exp_avg_sq: new Float32Array(3) },
    b: { exp_avg: { dtype: 'float64', shape: [1], data: new Float64Array([2]) } },
  }, 7, 0.001);
  return state;
}

test('a checkpoint built and saved by JS loads again identically', async () => {
  const state = build();
  const bytes = await state.saveCheckpoint();
  const back = await CheckpointState.loadCheckpoint(bytes);
  assert.deepEqual(back.trainableNames, ['param/W é', 'b']);
  assert.deepEqual(back.frozenNames, ['steps', 'flag', 'half', 'idx']);
  for (const [name, p] of state.parameters) {
    const q = back.parameters.get(name);
    assert.equal(q.dtype, p.dtype);
    assert.deepEqual(q.shape, p.shape);
    assert.equal(q.requiresGrad, p.requiresGrad);
    assert.deepEqual(q.data, p.data);
  }
  assert.deepEqual([...back.properties], [
    ['epoch', 3n], ['big', -(2n ** 70n)], ['rate', 1e-5], ['third', 0.1], ['nan', NaN],
    ['negzero', -0], ['inf', Infinity], ['name', 'ü\n"😀'], ['yes', 1n], ['three', 3]]);
  assert.ok(Object.is(back.getProperty('negzero'), -0));
  assert.equal(back.optimizerState.step, 7);
  assert.equal(back.optimizerState.learningRate, 0.001);
  assert.deepEqual([...back.optimizerState.states.get('param/W é').keys()], ['exp_avg', 'exp_avg_sq']);
  assert.deepEqual(back.optimizerState.states.get('b').get('exp_avg').data, new Float64Array([2]));
  // saved again unchanged: the same bytes
  assert.deepEqual(await back.saveCheckpoint(), bytes);
  // without the optimizer state
  const plain = await CheckpointState.loadCheckpoint(await back.saveCheckpoint(false));
  assert.equal(plain.optimizerState, null);
});

test('the header is Python json.dumps text, property values tagged', async () => {
  const { metadata } = parseSafetensors(await build().saveCheckpoint());
  const header = metadata.get('ortlearn.header');
  assert.ok(header.startsWith('{"trainable": ["param/W \\u00e9", "b"], "frozen": ["steps", "flag", "half", "idx"], "tensors": {"param/W \\u00e9": {"dtype": "float32", "shape": [3, 1], "nominal": false}'));
  assert.ok(header.includes('["epoch", "int", "0x3"], ["big", "int", "-0x400000000000000000"], ["rate", "float", "1e-05"], ["third", "float", "0.1"], ["nan", "float", "nan"], ["negzero", "float", "-0.0"], ["inf", "float", "inf"], ["name", "str", "\\u00fc\\n\\"\\ud83d\\ude00"], ["yes", "int", "0x1"], ["three", "float", "3.0"]'));
  assert.ok(header.endsWith('"optimizer": {"step": 7, "learning_rate": "0.001", "states": {"param/W \\u00e9": ["exp_avg", "exp_avg_sq"], "b": ["exp_avg"]}}}'));
  assert.deepEqual([...metadata.keys()], ['ortlearn.checkpoint', 'ortlearn.checksum', 'ortlearn.header']);
  assert.match(metadata.get('ortlearn.checksum'), /^[0-9a-f]{64}$/);
});

test('the checksum covers the header and every tensor: a flipped byte is refused', async () => {
  const bytes = await build().saveCheckpoint();
  await CheckpointState.loadCheckpoint(bytes); // intact
  // a byte of tensor data (the last byte of the file)
  const data = bytes.slice();
  data[data.length - 1] ^= 0x01;
  await assert.rejects(CheckpointState.loadCheckpoint(data), /checksum mismatch, the file is damaged/);
  // a byte of the header text (a digit of a shape inside ortlearn.header: 3 -> 2)
  const text = new TextDecoder().decode(bytes);
  const at = text.indexOf('[3, 1], \\"nominal');
  const header = bytes.slice();
  header[at + 1] = '2'.charCodeAt(0);
  await assert.rejects(CheckpointState.loadCheckpoint(header), /checksum mismatch/);
  // the checksum itself
  const sum = bytes.slice();
  const s = text.indexOf('"ortlearn.checksum":"') + 21;
  sum[s] = sum[s] === 0x30 ? 0x31 : 0x30;
  await assert.rejects(CheckpointState.loadCheckpoint(sum), /checksum mismatch/);
});

test('foreign and inconsistent files are refused with a reason', async () => {
  await assert.rejects(CheckpointState.loadCheckpoint(new Uint8Array(3)), /not a valid ortlearn checkpoint: 3 bytes/);
  const plain = serializeSafetensors({ a: { dtype: 'float32', shape: [1], data: new Float32Array(1) } });
  await assert.rejects(CheckpointState.loadCheckpoint(plain), /no ortlearn header/);
  const v2 = serializeSafetensors({}, { 'ortlearn.checkpoint': '2' });
  await assert.rejects(CheckpointState.loadCheckpoint(v2), /format version "2"/);
  // a consistent checksum over an inconsistent header
  const header = '{"trainable": ["a"], "frozen": [], "tensors": {"a": {"dtype": "float32", "shape": [2], "nominal": false}}, "properties": [], "optimizer": null}';
  const tensors = new Map([['param/a', { dtype: 'float32', shape: [3], data: new Float32Array(3) }]]);
  const bad = serializeSafetensors(tensors, {
    'ortlearn.checkpoint': '1', 'ortlearn.header': header,
    'ortlearn.checksum': await checkpointChecksum(header, tensors),
  });
  await assert.rejects(CheckpointState.loadCheckpoint(bad), /disagrees with its declared dtype or shape/);
  await assert.rejects(CheckpointState.loadCheckpoint('text'), TypeError);
});

test('a nominal checkpoint keeps dtypes and shapes only', async () => {
  const state = CheckpointState.fromParameters(
    { w: { dtype: 'float32', shape: [2, 2], data: new Float32Array(4) } }, {}, {}, { nominal: true });
  assert.equal(state.isNominal, true);
  const back = await CheckpointState.loadCheckpoint(await state.saveCheckpoint());
  const w = back.parameters.get('w');
  assert.equal(w.nominal, true);
  assert.equal(w.data, null);
  assert.deepEqual(w.shape, [2, 2]);
});

test('properties: types, errors, kinds', () => {
  const state = new CheckpointState();
  state.addProperty('i', 5);
  state.addProperty('f', 5, 'float');
  state.addProperty('b', false);
  state.addProperty('s', 'x');
  assert.equal(state.getProperty('i'), 5n);
  assert.equal(state.getProperty('f'), 5);
  assert.equal(state.getProperty('b'), 0n);
  assert.throws(() => state.getProperty('missing'), /not found/);
  assert.throws(() => state.addProperty('o', {}), TypeError);
  assert.throws(() => state.addProperty('i2', 1.5, 'int'), TypeError);
  assert.throws(() => state.addProperty(3, 1), TypeError);
});

test('optimizer state and parameters are validated', () => {
  const state = CheckpointState.fromParameters({ w: { dtype: 'float32', shape: [2], data: new Float32Array(2) } },
    { f: { dtype: 'float32', shape: [1], data: new Float32Array(1) } });
  assert.throws(() => state.setOptimizerState({ f: { m: new Float32Array(1) } }, 0, 0.1), /not a trainable parameter/);
  assert.throws(() => state.setOptimizerState({ w: { m: new Float32Array([NaN, 0]) } }, 0, 0.1), /NaN or infinite/);
  assert.throws(() => state.setOptimizerState({}, -1, 0.1), /step must be >= 0/);
  assert.throws(() => state.setOptimizerState({}, 2n ** 63n, 0.1), /int64/);
  assert.throws(() => state.setOptimizerState({}, 0, -1), /learning_rate/);
  assert.throws(() => state.setOptimizerState({}, 0, 1e39), /learning_rate/);
  assert.throws(() => CheckpointState.fromParameters({ w: { dtype: 'uint8', shape: [1], data: new Uint8Array(1) } }), /checkpoints hold only/);
  assert.throws(() => CheckpointState.fromParameters({ w: { data: new Float32Array(2), shape: [3] } }), /holds 2/);
});

test('Python checkpoints: loaded and saved by JS byte for byte, and the reverse',
  { skip: !python && 'ORTLEARN_PYTHON is not set' }, async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ortlearn-ckpt-'));
    try {
      const pyFile = path.join(dir, 'py.ckpt');
      runPython(`
import sys, numpy as np
from ortlearn import CheckpointState
state = CheckpointState.from_parameters(
    {"W \\u00e9\\U0001f600": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "b": np.array([0.1])},
    {"2": np.array([1, -2], np.int64), "mask": np.array([True, False]), "h": np.array([1.5], np.float16),
     "i": np.zeros((0, 3), np.int32)},
    {"epoch": -5, "huge": 2**80, "lr": 1e-05, "x": 123456789012345680.0, "tiny": 5e-324, "nan": float("nan"),
     "inf": float("inf"), "nz": -0.0, "one": 3.0, "s": "caf\\u00e9 \\"q\\" \\n \\U0001f600", "ctl": "\\x00\\x1f\\x7f"})
state.set_optimizer_state({"W \\u00e9\\U0001f600": {"exp_avg": np.ones((2, 3), np.float32)}, "b": {"exp_avg": np.zeros(1)}}, 41, 0.0003)
CheckpointState.save_checkpoint(state, sys.argv[1], include_optimizer_state=True)
`, '', [pyFile]);
      const original = new Uint8Array(fs.readFileSync(pyFile));
      const state = await CheckpointState.loadCheckpoint(original);
      assert.equal(state.getProperty('huge'), 2n ** 80n);
      assert.equal(state.getProperty('x'), 123456789012345680.0);
      assert.deepEqual(await state.saveCheckpoint(true), original);

      // JS-written checkpoint: Python loads the same values and writes the same bytes
      const jsFile = path.join(dir, 'js.ckpt');
      const built = build();
      fs.writeFileSync(jsFile, await built.saveCheckpoint(true));
      const out = runPython(`
import sys, json, numpy as np
from ortlearn import CheckpointState
state = CheckpointState.load_checkpoint(sys.argv[1])
CheckpointState.save_checkpoint(state, sys.argv[1] + ".py", include_optimizer_state=True)
print(json.dumps({
    "same": open(sys.argv[1], "rb").read() == open(sys.argv[1] + ".py", "rb").read(),
    "W": state.parameters["param/W \\u00e9"].data.ravel().tolist(),
    "steps": state.parameters["steps"].data.tolist(),
    "half": float(state.parameters["half"].data[0]),
    "props": [[k, repr(v)] for k, v in state.properties.items()],
    "step": state.optimizer_step, "lr": state.optimizer_learning_rate}))
`, '', [jsFile]);
      const got = JSON.parse(out);
      assert.equal(got.same, true);
      assert.deepEqual(got.W, [1, -2, 3.5]);
      assert.deepEqual(got.steps, [1, -2]);
      assert.equal(got.half, 1);
      assert.deepEqual(got.props.slice(0, 3), [['epoch', '3'], ['big', `-${2n ** 70n}`], ['rate', '1e-05']]);
      assert.deepEqual(got.props.at(-1), ['three', '3.0']);
      assert.equal(got.step, 7);
      assert.equal(got.lr, 0.001);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
