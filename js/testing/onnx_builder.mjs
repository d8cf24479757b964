// A tiny ONNX encoder for the tests (on top of src/onnx_proto.js's writer), and hand-built
// training artifacts of a linear regression: training model (explicit gradient, gradient
// accumulation with lazy_reset_grad), eval model, SGD optimizer model in the tensor layout
// (with a state recording the step it was fed) and the same optimizer in the sequence layout.

import {
  bytesField, encodeTensor, encodeValueInfo, message, varintField,
} from '../src/onnx_proto.js';

const ATTR = { FLOAT: 1, INT: 2, STRING: 3, TENSOR: 4, GRAPH: 5, INTS: 7 };

function fixed32Field(num, value) {
  const out = new Uint8Array(5);
  out[0] = num * 8 + 5;
  new DataView(out.buffer).setFloat32(1, value, true);
  return out;
}

/** An AttributeProto: value a number (int or {float}), string, tensor {tensor}, graph {graph}, int array. */
export function attr(name, value) {
  const f = [bytesField(1, name)];
  if (Array.isArray(value)) {
    for (const v of value) f.push(varintField(8, v));
    f.push(varintField(20, ATTR.INTS));
  } else if (typeof value === 'number') {
    f.push(varintField(3, value), varintField(20, ATTR.INT));
  } else if (typeof value === 'string') {
    f.push(bytesField(4, value), varintField(20, ATTR.STRING));
  } else if (value.float !== undefined) {
    f.push(fixed32Field(2, value.float), varintField(20, ATTR.FLOAT));
  } else if (value.tensor) {
    f.push(bytesField(5, encodeTensor(value.tensor.name ?? '', value.tensor)), varintField(20, ATTR.TENSOR));
  } else if (value.graph) {
    f.push(bytesField(6, value.graph), varintField(20, ATTR.GRAPH));
  }
  return message(f);
}

/** A NodeProto. */
export function node(opType, inputs, outputs, attrs = {}, name = '') {
  return message([
    ...inputs.map((i) => bytesField(1, i)),
    ...outputs.map((o) => bytesField(2, o)),
    ...(name ? [bytesField(3, name)] : []),
    bytesField(4, opType),
    ...Object.entries(attrs).map(([k, v]) => bytesField(5, attr(k, v))),
  ]);
}

/** A ValueInfoProto of a tensor ([name, dtype, shape]) or of a sequence of tensors ([name, dtype, 'sequence']). */
export function valueInfo([name, dtype, shape]) {
  if (shape === 'sequence') {
    const elem = message([bytesField(1, message([varintField(1, dtype === 'float32' ? 1 : 7)]))]);
    return message([bytesField(1, name), bytesField(2, bytesField(4, bytesField(1, elem)))]);
  }
  return encodeValueInfo(name, dtype, shape);
}

/** A GraphProto. initializers: [{name, dtype, shape, data}] */
export function graph({ name = 'g', nodes, inputs, outputs, initializers = [], valueInfos = [] }) {
  return message([
    ...nodes.map((n) => bytesField(1, n)),
    bytesField(2, name),
    ...initializers.map((t) => bytesField(5, encodeTensor(t.name, t))),
    ...inputs.map((v) => bytesField(11, valueInfo(v))),
    ...outputs.map((v) => bytesField(12, valueInfo(v))),
    ...valueInfos.map((v) => bytesField(13, valueInfo(v))),
  ]);
}

/** A ModelProto (ai.onnx opset `opset`, IR version 8). */
export function model(graphBytes, { opset = 17, metadata = {}, producer = 'ortlearn-training tests' } = {}) {
  return message([
    varintField(1, 8),
    bytesField(2, producer),
    bytesField(7, graphBytes),
    bytesField(8, message([bytesField(1, ''), varintField(2, opset)])),
    ...Object.entries(metadata).map(([k, v]) => bytesField(14, message([bytesField(1, k), bytesField(2, v)]))),
  ]);
}

export const N = 4; // rows per batch (static)
export const F = 2; // features

const training = {
  user_inputs: ['X', 'y'], user_outputs: ['loss', 'pred'], trainable: ['W', 'b'], frozen: [],
};

/** training_model.onnx of a linear regression, mean squared error, explicit gradient. */
export function linearTrainingModel() {
  const nodes = [
    node('MatMul', ['X', 'W'], ['xw']),
    node('Add', ['xw', 'b'], ['pred']),
    node('Sub', ['pred', 'y'], ['diff']),
    node('Mul', ['diff', 'diff'], ['sq']),
    node('ReduceMean', ['sq'], ['loss'], { keepdims: 0 }),
    // d loss / d pred = 2 * diff / N
    node('Mul', ['diff', 'two_over_n'], ['g']),
    node('Transpose', ['X'], ['Xt']),
    node('MatMul', ['Xt', 'g'], ['gW']),
    node('ReduceSum', ['g', 'axis0'], ['gb'], { keepdims: 0 }),
    node('Add', ['W_grad.accumulation.buffer', 'gW'], ['accW']),
    node('Where', ['lazy_reset_grad', 'gW', 'accW'], ['W_grad.accumulation.out']),
    node('Add', ['b_grad.accumulation.buffer', 'gb'], ['accb']),
    node('Where', ['lazy_reset_grad', 'gb', 'accb'], ['b_grad.accumulation.out']),
  ];
  return model(graph({
    nodes,
    inputs: [['X', 'float32', ['N', F]], ['y', 'float32', ['N', 1]], ['W', 'float32', [F, 1]],
      ['b', 'float32', [1]], ['W_grad.accumulation.buffer', 'float32', [F, 1]],
      ['b_grad.accumulation.buffer', 'float32', [1]], ['lazy_reset_grad', 'bool', []]],
    outputs: [['loss', 'float32', []], ['pred', 'float32', ['N', 1]],
      ['W_grad.accumulation.out', 'float32', [F, 1]], ['b_grad.accumulation.out', 'float32', [1]]],
    initializers: [
      { name: 'two_over_n', dtype: 'float32', shape: [], data: new Float32Array([2 / N]) },
      { name: 'axis0', dtype: 'int64', shape: [1], data: new BigInt64Array([0n]) },
    ],
  }), { metadata: { 'ortlearn.training': JSON.stringify(training) } });
}

/** eval_model.onnx: the same forward and loss; an If node reads `b` inside its branches. */
export function linearEvalModel() {
  const branch = (value) => graph({
    name: `branch${value}`,
    nodes: [node('Identity', ['b'], [`bb${value}`])],
    inputs: [],
    outputs: [[`bb${value}`, 'float32', [1]]],
  });
  const nodes = [
    node('MatMul', ['X', 'W'], ['xw']),
    node('Constant', [], ['cond'], { value: { tensor: { name: 'cond', dtype: 'bool', shape: [], data: new Uint8Array([1]) } } }),
    node('If', ['cond'], ['b_used'], { then_branch: { graph: branch(1) }, else_branch: { graph: branch(2) } }),
    node('Add', ['xw', 'b_used'], ['pred']),
    node('Sub', ['pred', 'y'], ['diff']),
    node('Mul', ['diff', 'diff'], ['sq']),
    node('ReduceMean', ['sq'], ['loss'], { keepdims: 0 }),
    node('Neg', ['pred'], ['neg_pred']),
  ];
  return model(graph({
    nodes,
    inputs: [['X', 'float32', ['N', F]], ['y', 'float32', ['N', 1]], ['W', 'float32', [F, 1]],
      ['b', 'float32', [1]]],
    outputs: [['loss', 'float32', []], ['pred', 'float32', ['N', 1]]],
  }), { metadata: { 'ortlearn.training': JSON.stringify(training), other: 'kept' } });
}

/** optimizer_model.onnx (tensor layout): SGD, and a state `last_step` = the step it was fed. */
export function sgdOptimizerModel({ lr = 0.1 } = {}) {
  const nodes = [];
  const inputs = [['learning_rate', 'float32', [1]], ['step', 'int64', [1]]];
  const outputs = [];
  nodes.push(node('Cast', ['step'], ['stepf'], { to: 1 }));
  for (const [p, shape] of [['W', [F, 1]], ['b', [1]]]) {
    inputs.push([p, 'float32', shape], [`${p}.gradient`, 'float32', shape], [`${p}.last_step`, 'float32', shape]);
    nodes.push(
      node('Mul', ['learning_rate', `${p}.gradient`], [`${p}_lg`]),
      node('Sub', [p, `${p}_lg`], [`${p}.updated`]),
      node('Mul', [`${p}.last_step`, 'zero'], [`${p}_z`]),
      node('Add', [`${p}_z`, 'stepf'], [`${p}.last_step.updated`]),
    );
    outputs.push([`${p}.updated`, 'float32', shape], [`${p}.last_step.updated`, 'float32', shape]);
  }
  return model(graph({
    nodes, inputs, outputs,
    initializers: [{ name: 'zero', dtype: 'float32', shape: [], data: new Float32Array([0]) }],
  }), {
    metadata: {
      'ortlearn.optimizer': JSON.stringify({
        type: 'SGD', params: ['W', 'b'], states: ['last_step'], hyper: { lr },
      }),
    },
  });
}

/** An optimizer model in the sequence layout (inputs `params`, `gradients`): refused in JS. */
export function sequenceOptimizerModel() {
  return model(graph({
    nodes: [node('SequenceAt', ['params', 'zero_i'], ['W']), node('Identity', ['W'], ['W.updated'])],
    inputs: [['learning_rate', 'float32', [1]], ['step', 'int64', [1]],
      ['params', 'float32', 'sequence'], ['gradients', 'float32', 'sequence']],
    outputs: [['W.updated', 'float32', [F, 1]]],
    initializers: [{ name: 'zero_i', dtype: 'int64', shape: [], data: new BigInt64Array([0n]) }],
  }), {
    metadata: {
      'ortlearn.optimizer': JSON.stringify({ type: 'SGD', params: ['W', 'b'], states: [], hyper: {}, layout: 'sequence' }),
    },
  });
}

/** Deterministic batches: X (N, F) and y = X @ [1.5, -2] + 0.5 plus a little noise. */
export function linearBatches(count = 3) {
  const out = [];
  let seed = 12345;
  const rand = () => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed / 2147483648 - 0.5;
  };
  for (let i = 0; i < count; i++) {
    const X = new Float32Array(N * F).map(() => rand() * 4);
    const y = new Float32Array(N).map((_, r) => X[r * F] * 1.5 - X[r * F + 1] * 2 + 0.5 + rand() * 0.1);
    out.push({ X, y });
  }
  return out;
}
