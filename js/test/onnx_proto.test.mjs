import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as ort from 'onnxruntime-node';
import {
  exportForInferencing, flatTrainingModel, readFields, readGraphIO, readMetadata, isOrtFormat,
  inputNames, outputNames,
} from '../src/onnx_proto.js';
import { linearEvalModel, linearTrainingModel, node, graph, model } from '../testing/onnx_builder.mjs';

const params = new Map([
  ['W', { dtype: 'float32', shape: [2, 1], data: new Float32Array([1.5, -2]) }],
  ['b', { dtype: 'float32', shape: [1], data: new Float32Array([0.5]) }],
]);

test('readMetadata and readGraphIO read the model', () => {
  const bytes = linearEvalModel();
  const meta = readMetadata(bytes);
  assert.deepEqual(Object.keys(meta), ['ortlearn.training', 'other']);
  assert.deepEqual(JSON.parse(meta['ortlearn.training']).trainable, ['W', 'b']);
  const io = readGraphIO(bytes);
  assert.deepEqual(io.inputs.map((i) => i.name), ['X', 'y', 'W', 'b']);
  assert.deepEqual(io.inputs[0], { name: 'X', kind: 'tensor', elemType: 1, dtype: 'float32', shape: ['N', 2] });
  assert.deepEqual(io.outputs.map((o) => [o.name, o.dtype, o.shape]), [['loss', 'float32', []], ['pred', 'float32', ['N', 1]]]);
  const train = readGraphIO(linearTrainingModel());
  assert.deepEqual(train.inputs.at(-1), { name: 'lazy_reset_grad', kind: 'tensor', elemType: 9, dtype: 'bool', shape: [] });
  assert.deepEqual(train.initializers, ['two_over_n', 'axis0']);
  assert.deepEqual(inputNames(bytes), ['X', 'y', 'W', 'b']);
  assert.deepEqual(outputNames(bytes), ['loss', 'pred']);
  assert.equal(isOrtFormat(bytes), false);
  assert.throws(() => readGraphIO(new Uint8Array([0x08, 0x01])), /no ONNX graph/);
  assert.throws(() => readMetadata(new Uint8Array([0x0a, 0x05, 0x01])), /truncated/);
});

test('exportForInferencing prunes to the outputs and bakes the parameters in', async () => {
  const bytes = linearEvalModel();
  const out = exportForInferencing(bytes, params, ['pred']);
  const io = readGraphIO(out);
  assert.deepEqual(io.inputs.map((i) => i.name), ['X']); // y (a label) and the parameters gone
  assert.deepEqual(io.outputs.map((o) => [o.name, o.dtype]), [['pred', 'float32']]);
  assert.deepEqual(io.initializers, ['W', 'b']);
  // the If node reads b only inside its branches: b is kept, and so are the If and its condition
  const graphField = readFields(out).find((f) => f.num === 7);
  const ops = readFields(out, graphField.vStart, graphField.vEnd).filter((f) => f.num === 1)
    .map((f) => new TextDecoder().decode(out.subarray(f.vStart, f.vEnd)).match(/(MatMul|Constant|If|Add|Sub|Mul|ReduceMean|Neg)/)[1]);
  assert.deepEqual(ops, ['MatMul', 'Constant', 'If', 'Add']);
  // metadata: the training contract dropped, the rest kept; the other model fields byte for byte
  assert.deepEqual(readMetadata(out), { other: 'kept' });
  const others = (b) => readFields(b).filter((f) => f.num !== 7 && f.num !== 14).map((f) => [...b.subarray(f.start, f.end)]);
  assert.deepEqual(others(out), others(bytes));
  // it runs, with the parameters' values
  const session = await ort.InferenceSession.create(out);
  const X = new ort.Tensor('float32', new Float32Array([1, 0, 0, 1, 2, 2]), [3, 2]);
  const { pred } = await session.run({ X });
  assert.deepEqual([...pred.data], [2, -1.5, -0.5]); // X @ [1.5, -2] + 0.5
  await session.release();
});

test('exportForInferencing: an intermediate value gets typed when told, several outputs', async () => {
  const bytes = linearEvalModel();
  const untyped = exportForInferencing(bytes, params, ['neg_pred', 'pred']);
  assert.deepEqual(readGraphIO(untyped).outputs.map((o) => [o.name, o.kind]), [['neg_pred', 'unknown'], ['pred', 'tensor']]);
  const typed = exportForInferencing(bytes, params, ['neg_pred', 'pred'],
    { outputTypes: new Map([['neg_pred', { dtype: 'float32', shape: ['N', 1] }]]) });
  assert.deepEqual(readGraphIO(typed).outputs[0], { name: 'neg_pred', kind: 'tensor', elemType: 1, dtype: 'float32', shape: ['N', 1] });
  const session = await ort.InferenceSession.create(typed);
  const r = await session.run({ X: new ort.Tensor('float32', new Float32Array([1, 1]), [1, 2]) });
  assert.deepEqual([...r.neg_pred.data].map((v) => v + 0), [0]); // -(1.5 - 2 + 0.5)
  await session.release();
});

test('exportForInferencing refuses unknown and repeated names', () => {
  const bytes = linearEvalModel();
  assert.throws(() => exportForInferencing(bytes, params, ['pred', 'nope', 'X']),
    /\["nope","X"\] are not values of the eval model. Its outputs are \["loss","pred"\]/);
  assert.throws(() => exportForInferencing(bytes, params, ['pred', 'pred']), /repeats/);
  assert.throws(() => exportForInferencing(bytes, params, []), TypeError);
});

test('exportForInferencing keeps needed initializers and drops the others', () => {
  const g = graph({
    nodes: [node('Mul', ['X', 'k'], ['y1']), node('Add', ['X', 'unused'], ['y2'])],
    inputs: [['X', 'float32', [1]]],
    outputs: [['y1', 'float32', [1]], ['y2', 'float32', [1]]],
    initializers: [
      { name: 'k', dtype: 'float32', shape: [1], data: new Float32Array([2]) },
      { name: 'unused', dtype: 'float32', shape: [1], data: new Float32Array([3]) },
    ],
  });
  const out = exportForInferencing(model(g), new Map(), ['y1']);
  const io = readGraphIO(out);
  assert.deepEqual(io.initializers, ['k']);
  assert.deepEqual(io.outputs.map((o) => o.name), ['y1']);
});

test('flatTrainingModel: the parameters and gradient buffers in, the gradients out, as vectors', async () => {
  const names = { params: 'flat.p', buffer: 'flat.p_grad.accumulation.buffer', gradient: 'flat.p_grad.accumulation.out' };
  const flat = flatTrainingModel(linearTrainingModel(), {
    params: ['W', 'b'], shapes: [[2, 1], [1]], dtype: 'float32', names,
  }, '_grad.accumulation.buffer', '_grad.accumulation.out');
  const io = readGraphIO(flat);
  assert.deepEqual(io.inputs.map((i) => [i.name, i.shape]), [['X', ['N', 2]], ['y', ['N', 1]],
    ['lazy_reset_grad', []], ['flat.p', [3]], ['flat.p_grad.accumulation.buffer', [3]]]);
  assert.deepEqual(io.outputs.map((o) => o.name), ['loss', 'pred', 'flat.p_grad.accumulation.out']);
  assert.deepEqual(readMetadata(flat), readMetadata(linearTrainingModel()));
  // the same numbers as the model it rewrites, accumulating or not
  const X = new ort.Tensor('float32', new Float32Array([1, 2, 3, -1, 0.5, 4]), [3, 2]);
  const y = new ort.Tensor('float32', new Float32Array([1, -1, 2]), [3, 1]);
  const one = (v, dims) => new ort.Tensor('float32', new Float32Array(v), dims);
  const reference = await ort.InferenceSession.create(linearTrainingModel());
  const flattened = await ort.InferenceSession.create(flat);
  for (const reset of [true, false]) {
    const flag = new ort.Tensor('bool', new Uint8Array([reset ? 1 : 0]), []);
    const want = await reference.run({
      X, y, W: one([1.5, -2], [2, 1]), b: one([0.5], [1]), lazy_reset_grad: flag,
      'W_grad.accumulation.buffer': one([0.25, 1], [2, 1]), 'b_grad.accumulation.buffer': one([-3], [1]),
    });
    const got = await flattened.run({
      X, y, 'flat.p': one([1.5, -2, 0.5], [3]), 'flat.p_grad.accumulation.buffer': one([0.25, 1, -3], [3]),
      lazy_reset_grad: flag,
    });
    assert.deepEqual([...got.loss.data], [...want.loss.data]);
    assert.deepEqual([...got['flat.p_grad.accumulation.out'].data],
      [...want['W_grad.accumulation.out'].data, ...want['b_grad.accumulation.out'].data]);
  }
  await reference.release();
  await flattened.release();
});
