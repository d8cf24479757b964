// A minimal protobuf wire-format reader and writer for ONNX's ModelProto, without any
// dependency: what the training session reads of a model (its metadata_props, its graph's
// inputs and outputs with their types) and the inference model export (the eval model pruned
// to some outputs, parameters baked in as initializers). Every field it does not rewrite is
// copied through byte for byte.

import {
  DTYPES, asBytes, bytesOf, checkTensorData, concatBytes,
} from './safetensors.js';

const UTF8 = new TextEncoder();
const UTF8_DECODE = new TextDecoder('utf-8');

// Field numbers (onnx/onnx.proto3)
const MODEL = { graph: 7, metadata_props: 14 };
const GRAPH = {
  node: 1, name: 2, initializer: 5, doc_string: 10, input: 11, output: 12, value_info: 13,
  sparse_initializer: 15,
};
const NODE = { input: 1, output: 2, name: 3, op_type: 4, attribute: 5, domain: 7 };
const ATTRIBUTE = { name: 1, i: 3, g: 6, graphs: 11, type: 20 };
const ATTRIBUTE_INT = 2; // AttributeProto.AttributeType.INT
const VALUE_INFO = { name: 1, type: 2 };
const TYPE = { tensor_type: 1, sequence_type: 4, map_type: 5, sparse_tensor_type: 8, optional_type: 9 };
const TENSOR_TYPE = { elem_type: 1, shape: 2 };
const SHAPE = { dim: 1 };
const DIM = { dim_value: 1, dim_param: 2 };
const TENSOR = { dims: 1, data_type: 2, name: 8, raw_data: 9 };
const SPARSE_TENSOR = { values: 1 };
const STRING_ENTRY = { key: 1, value: 2 };

/** ONNX TensorProto.DataType -> dtype name (onnxruntime-js `Tensor.type`). */
export const ONNX_DTYPES = new Map([
  [1, 'float32'], [2, 'uint8'], [3, 'int8'], [4, 'uint16'], [5, 'int16'], [6, 'int32'],
  [7, 'int64'], [8, 'string'], [9, 'bool'], [10, 'float16'], [11, 'float64'], [12, 'uint32'],
  [13, 'uint64'], [14, 'complex64'], [15, 'complex128'], [16, 'bfloat16'],
]);
const ONNX_ELEM = new Map([...ONNX_DTYPES.entries()].map(([k, v]) => [v, k]));

// ---------------------------------------------------------------- wire format: reading

function readVarint(buf, pos) {
  let result = 0;
  let scale = 1;
  for (let i = 0; i < 10; i++) {
    if (pos >= buf.length) throw new Error('truncated varint (not an ONNX model?)');
    const b = buf[pos++];
    result += (b & 0x7f) * scale; // exact below 2**53, which lengths and tags are
    if (b < 0x80) return [result, pos];
    scale *= 128;
  }
  throw new Error('malformed varint (not an ONNX model?)');
}

/**
 * The fields of the message `buf[start:end]`, in order.
 * @param {Uint8Array} buf
 * @param {number} [start]
 * @param {number} [end]
 * @returns {{num: number, wire: number, start: number, end: number, value: number,
 *   vStart: number, vEnd: number}[]} `value` for varints, `vStart`/`vEnd` the payload
 */
export function readFields(buf, start = 0, end = buf.length) {
  const fields = [];
  let pos = start;
  while (pos < end) {
    const fieldStart = pos;
    let key;
    [key, pos] = readVarint(buf, pos);
    const num = Math.floor(key / 8);
    const wire = key % 8;
    if (num === 0) throw new Error('field number 0 (not an ONNX model?)');
    let value = 0;
    let vStart = pos;
    if (wire === 0) {
      [value, pos] = readVarint(buf, pos);
    } else if (wire === 1) {
      pos += 8;
    } else if (wire === 2) {
      let len;
      [len, pos] = readVarint(buf, pos);
      vStart = pos;
      pos += len;
    } else if (wire === 5) {
      pos += 4;
    } else {
      throw new Error(`unsupported protobuf wire type ${wire} (not an ONNX model?)`);
    }
    if (pos > end) throw new Error('truncated protobuf message (not an ONNX model?)');
    fields.push({ num, wire, start: fieldStart, end: pos, value, vStart, vEnd: pos });
  }
  return fields;
}

const sub = (buf, f) => buf.subarray(f.vStart, f.vEnd);
const str = (buf, f) => UTF8_DECODE.decode(sub(buf, f));

function stringField(buf, message, num) {
  let out = '';
  for (const f of readFields(buf, message.vStart, message.vEnd)) {
    if (f.num === num && f.wire === 2) out = str(buf, f);
  }
  return out;
}

// ---------------------------------------------------------------- wire format: writing

function varintBytes(n) {
  let v = BigInt(n);
  if (v < 0n) v += 1n << 64n; // int64 as two's complement, as protobuf does
  const out = [];
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v) b |= 0x80;
    out.push(b);
  } while (v);
  return out;
}

/** A varint field. @param {number} num @param {number|bigint} value @returns {Uint8Array} */
export function varintField(num, value) {
  return new Uint8Array([...varintBytes(num * 8), ...varintBytes(value)]);
}

/**
 * A length-delimited field (bytes, a string or an embedded message).
 * @param {number} num
 * @param {Uint8Array|string} payload
 * @returns {Uint8Array}
 */
export function bytesField(num, payload) {
  const data = typeof payload === 'string' ? UTF8.encode(payload) : payload;
  return concatBytes([new Uint8Array([...varintBytes(num * 8 + 2), ...varintBytes(data.length)]), data]);
}

/**
 * Concatenate encoded fields into a message.
 * @param {Uint8Array[]} fields
 * @returns {Uint8Array}
 */
export function message(fields) {
  return concatBytes(fields);
}

// ---------------------------------------------------------------- reading a model

function graphField(buf) {
  const graphs = readFields(buf).filter((f) => f.num === MODEL.graph && f.wire === 2);
  if (graphs.length !== 1) {
    throw new Error(graphs.length ? 'the model has several graph fields'
      : 'the bytes hold no ONNX graph (not an ONNX model, or in onnxruntime\'s ORT format?)');
  }
  return graphs[0];
}

/**
 * True if `bytes` is a model in onnxruntime's ORT format (flatbuffers, identifier "ORTM").
 * @param {Uint8Array|ArrayBuffer} bytes
 * @returns {boolean}
 */
export function isOrtFormat(bytes) {
  const b = asBytes(bytes);
  return b.length >= 8 && b[4] === 0x4f && b[5] === 0x52 && b[6] === 0x54 && b[7] === 0x4d;
}

/**
 * The model's `metadata_props` (ModelProto field 14), as an object key -> value.
 * @param {Uint8Array|ArrayBuffer} modelBytes
 * @returns {Object<string, string>}
 */
export function readMetadata(modelBytes) {
  const buf = asBytes(modelBytes, 'a model');
  const out = {};
  for (const f of readFields(buf)) {
    if (f.num !== MODEL.metadata_props || f.wire !== 2) continue;
    let key = '';
    let value = '';
    for (const g of readFields(buf, f.vStart, f.vEnd)) {
      if (g.num === STRING_ENTRY.key && g.wire === 2) key = str(buf, g);
      else if (g.num === STRING_ENTRY.value && g.wire === 2) value = str(buf, g);
    }
    out[key] = value;
  }
  return out;
}

function readType(buf, typeField) {
  const info = { kind: 'unknown', elemType: 0, dtype: undefined, shape: null };
  for (const f of readFields(buf, typeField.vStart, typeField.vEnd)) {
    if (f.wire !== 2) continue;
    if (f.num === TYPE.tensor_type) {
      info.kind = 'tensor';
      for (const g of readFields(buf, f.vStart, f.vEnd)) {
        if (g.num === TENSOR_TYPE.elem_type && g.wire === 0) info.elemType = g.value;
        if (g.num === TENSOR_TYPE.shape && g.wire === 2) {
          info.shape = [];
          for (const d of readFields(buf, g.vStart, g.vEnd)) {
            if (d.num !== SHAPE.dim || d.wire !== 2) continue;
            let dim = null;
            for (const h of readFields(buf, d.vStart, d.vEnd)) {
              if (h.num === DIM.dim_value && h.wire === 0) dim = h.value;
              else if (h.num === DIM.dim_param && h.wire === 2) dim = str(buf, h);
            }
            info.shape.push(dim);
          }
        }
      }
      info.dtype = ONNX_DTYPES.get(info.elemType);
    } else if (f.num === TYPE.sequence_type) {
      info.kind = 'sequence';
    } else if (f.num === TYPE.map_type) {
      info.kind = 'map';
    } else if (f.num === TYPE.optional_type) {
      info.kind = 'optional';
    } else if (f.num === TYPE.sparse_tensor_type) {
      info.kind = 'sparse_tensor';
    }
  }
  return info;
}

function readValueInfo(buf, f) {
  let name = '';
  let type = { kind: 'unknown', elemType: 0, dtype: undefined, shape: null };
  for (const g of readFields(buf, f.vStart, f.vEnd)) {
    if (g.num === VALUE_INFO.name && g.wire === 2) name = str(buf, g);
    else if (g.num === VALUE_INFO.type && g.wire === 2) type = readType(buf, g);
  }
  return { name, ...type };
}

/**
 * @typedef {object} ValueInfo
 * @property {string} name
 * @property {'tensor'|'sequence'|'map'|'optional'|'sparse_tensor'|'unknown'} kind
 * @property {number} elemType ONNX element type (0 when unknown)
 * @property {string|undefined} dtype its name ('float32', 'int64', ...)
 * @property {(number|string|null)[]|null} shape declared dims (a number, a symbol, or null
 *   when unknown); null when no shape is declared
 */

/**
 * The graph's inputs and outputs with their declared types, and its initializers' names.
 * @param {Uint8Array|ArrayBuffer} modelBytes
 * @returns {{inputs: ValueInfo[], outputs: ValueInfo[], initializers: string[]}}
 */
export function readGraphIO(modelBytes) {
  const buf = asBytes(modelBytes, 'a model');
  const graph = graphField(buf);
  const inputs = [];
  const outputs = [];
  const initializers = [];
  for (const f of readFields(buf, graph.vStart, graph.vEnd)) {
    if (f.wire !== 2) continue;
    if (f.num === GRAPH.input) inputs.push(readValueInfo(buf, f));
    else if (f.num === GRAPH.output) outputs.push(readValueInfo(buf, f));
    else if (f.num === GRAPH.initializer) initializers.push(stringField(buf, f, TENSOR.name));
  }
  return { inputs, outputs, initializers };
}

/** Names of the graph's inputs. @param {Uint8Array|ArrayBuffer} modelBytes @returns {string[]} */
export function inputNames(modelBytes) {
  return readGraphIO(modelBytes).inputs.map((i) => i.name);
}

/** Names of the graph's outputs. @param {Uint8Array|ArrayBuffer} modelBytes @returns {string[]} */
export function outputNames(modelBytes) {
  return readGraphIO(modelBytes).outputs.map((o) => o.name);
}

/**
 * A node's inputs and outputs, and every name it reads: its inputs and, for a node with graph
 * attributes (If, Loop, Scan), every name read inside its subgraphs.
 */
function readNode(buf, f) {
  const inputs = [];
  const outputs = [];
  const reads = new Set();
  const visit = (start, end) => {
    for (const g of readFields(buf, start, end)) {
      if (g.wire !== 2) continue;
      if (g.num === NODE.input) {
        const name = str(buf, g);
        if (start === f.vStart) inputs.push(name);
        if (name) reads.add(name);
      } else if (g.num === NODE.output && start === f.vStart) {
        outputs.push(str(buf, g));
      } else if (g.num === NODE.attribute) {
        for (const a of readFields(buf, g.vStart, g.vEnd)) {
          if ((a.num === ATTRIBUTE.g || a.num === ATTRIBUTE.graphs) && a.wire === 2) {
            for (const n of readFields(buf, a.vStart, a.vEnd)) {
              if (n.num === GRAPH.node && n.wire === 2) visit(n.vStart, n.vEnd);
            }
          }
        }
      }
    }
  };
  visit(f.vStart, f.vEnd);
  return { inputs, outputs, reads };
}

// ---------------------------------------------------------------- writing tensors

/**
 * An ONNX TensorProto: dims (int64 varints), data_type, name, raw_data (little-endian).
 * @param {string} name
 * @param {{dtype: string, shape: number[], data: import('./safetensors.js').TypedArray}} t
 * @returns {Uint8Array}
 */
export function encodeTensor(name, t) {
  const elem = ONNX_ELEM.get(t.dtype);
  if (!elem || !DTYPES.has(t.dtype)) {
    throw new TypeError(`${JSON.stringify(name)} has dtype ${t.dtype}, which cannot be `
      + 'written as an initializer here.');
  }
  checkTensorData(t.dtype, t.shape, t.data, `Parameter ${JSON.stringify(name)}`);
  return message([
    ...t.shape.map((d) => varintField(TENSOR.dims, d)),
    varintField(TENSOR.data_type, elem),
    bytesField(TENSOR.name, name),
    bytesField(TENSOR.raw_data, bytesOf(t.data)),
  ]);
}

/**
 * A ValueInfoProto of a tensor: name, element type and shape (dims numbers, symbols or null).
 * @param {string} name
 * @param {string} [dtype]
 * @param {(number|string|null)[]|null} [shape]
 * @returns {Uint8Array}
 */
export function encodeValueInfo(name, dtype, shape) {
  const fields = [bytesField(VALUE_INFO.name, name)];
  if (dtype !== undefined && ONNX_ELEM.has(dtype)) {
    const tensorType = [varintField(TENSOR_TYPE.elem_type, ONNX_ELEM.get(dtype))];
    if (shape) {
      tensorType.push(bytesField(TENSOR_TYPE.shape, message(shape.map((d) => bytesField(SHAPE.dim,
        typeof d === 'string' && d ? bytesField(DIM.dim_param, d)
          : typeof d === 'number' && d >= 0 ? varintField(DIM.dim_value, d) : new Uint8Array(0))))));
    }
    fields.push(bytesField(VALUE_INFO.type, bytesField(TYPE.tensor_type, message(tensorType))));
  }
  return message(fields);
}

// ---------------------------------------------------------------- inference model

/**
 * The eval model as an inference model: its outputs restricted to `graphOutputNames`, the
 * nodes they do not need removed, graph inputs that are neither parameters nor needed (labels)
 * removed, and the parameters it reads baked in as initializers holding `parameters`' values.
 * The `ortlearn.training` metadata entry (the training contract, which no longer holds) is
 * dropped; every other field is copied through byte for byte.
 * @param {Uint8Array|ArrayBuffer} evalModelBytes
 * @param {Map<string, {dtype: string, shape: number[], data: *}>} parameters
 * @param {string[]} graphOutputNames values of the eval model (its outputs or node outputs)
 * @param {object} [options]
 * @param {Map<string, {dtype: string, shape: (number|string|null)[]|null}>} [options.outputTypes]
 *   types of the outputs the model declares no type for (an intermediate value without
 *   `value_info`); such an output is written with its name only otherwise, which onnxruntime
 *   accepts (it infers the type) and ONNX's checker does not
 * @returns {Uint8Array}
 */
export function exportForInferencing(evalModelBytes, parameters, graphOutputNames,
  { outputTypes } = {}) {
  const buf = asBytes(evalModelBytes, 'the eval model');
  if (isOrtFormat(buf)) {
    throw new Error('exportForInferencing needs the eval model in ONNX format (eval_model.onnx): '
      + 'an ORT-format model has no ONNX graph to export.');
  }
  const params = parameters instanceof Map ? parameters : new Map(Object.entries(parameters ?? {}));
  if (!Array.isArray(graphOutputNames) || !graphOutputNames.length
      || !graphOutputNames.every((n) => typeof n === 'string')) {
    throw new TypeError('graphOutputNames must be a non-empty array of value names.');
  }
  const repeated = graphOutputNames.filter((n, i) => graphOutputNames.indexOf(n) !== i);
  if (repeated.length) throw new Error(`graphOutputNames repeats ${JSON.stringify(repeated)}.`);
  const top = readFields(buf);
  const graph = graphField(buf);
  const fields = readFields(buf, graph.vStart, graph.vEnd);
  const nodes = [];
  const outputInfos = new Map();
  const valueInfos = new Map();
  for (const f of fields) {
    if (f.wire !== 2) continue;
    if (f.num === GRAPH.node) nodes.push({ field: f, ...readNode(buf, f) });
    else if (f.num === GRAPH.output) outputInfos.set(readValueInfo(buf, f).name, f);
    else if (f.num === GRAPH.value_info) {
      const name = readValueInfo(buf, f).name;
      if (!valueInfos.has(name)) valueInfos.set(name, f);
    }
  }
  const known = new Set(outputInfos.keys());
  for (const node of nodes) for (const o of node.outputs) if (o) known.add(o);
  const unknown = graphOutputNames.filter((n) => !known.has(n));
  if (unknown.length) {
    throw new Error(`${JSON.stringify(unknown)} are not values of the eval model. Its outputs `
      + `are ${JSON.stringify([...outputInfos.keys()])}; an inference model can output any `
      + 'value its nodes compute from the features alone.');
  }
  // Walk back from the outputs: a node is kept when one of its outputs is needed.
  const needed = new Set(graphOutputNames);
  const kept = new Set();
  for (let i = nodes.length - 1; i >= 0; i--) {
    const node = nodes[i];
    if (node.outputs.some((o) => o && needed.has(o))) {
      kept.add(node.field);
      for (const r of node.reads) needed.add(r);
    }
  }
  const produced = new Set();
  for (const node of nodes) if (kept.has(node.field)) for (const o of node.outputs) produced.add(o);
  const newOutputs = graphOutputNames.map((name) => {
    const declared = [outputInfos.get(name), valueInfos.get(name)].filter(Boolean);
    const typed = declared.find((f) => readValueInfo(buf, f).kind !== 'unknown');
    if (typed) return retag(buf.subarray(typed.start, typed.end), GRAPH.output);
    const type = outputTypes?.get(name);
    return bytesField(GRAPH.output, encodeValueInfo(name, type?.dtype, type?.shape));
  });
  const parts = [];
  let outputsWritten = false;
  for (const f of fields) {
    const raw = buf.subarray(f.start, f.end);
    if (f.wire !== 2) {
      parts.push(raw);
      continue;
    }
    if (f.num === GRAPH.node) {
      if (kept.has(f)) parts.push(raw);
    } else if (f.num === GRAPH.initializer) {
      const name = stringField(buf, f, TENSOR.name);
      if (needed.has(name) && !params.has(name)) parts.push(raw);
    } else if (f.num === GRAPH.sparse_initializer) {
      let name = '';
      for (const g of readFields(buf, f.vStart, f.vEnd)) {
        if (g.num === SPARSE_TENSOR.values && g.wire === 2) name = stringField(buf, g, TENSOR.name);
      }
      if (needed.has(name) && !params.has(name)) parts.push(raw);
    } else if (f.num === GRAPH.input) {
      const name = readValueInfo(buf, f).name;
      if (needed.has(name) && !params.has(name)) parts.push(raw);
    } else if (f.num === GRAPH.output) {
      if (!outputsWritten) parts.push(...newOutputs);
      outputsWritten = true;
    } else if (f.num === GRAPH.value_info) {
      const name = readValueInfo(buf, f).name;
      if (needed.has(name) || produced.has(name)) parts.push(raw);
    } else {
      parts.push(raw);
    }
  }
  if (!outputsWritten) parts.push(...newOutputs);
  for (const [name, t] of params) {
    if (needed.has(name)) parts.push(bytesField(GRAPH.initializer, encodeTensor(name, t)));
  }
  const newGraph = message(parts);
  const out = [];
  for (const f of top) {
    if (f.start === graph.start) {
      out.push(bytesField(MODEL.graph, newGraph));
    } else if (f.num === MODEL.metadata_props && f.wire === 2
        && stringField(buf, f, STRING_ENTRY.key) === 'ortlearn.training') {
      // the training contract (user inputs, labels, loss) does not describe this model
    } else {
      out.push(buf.subarray(f.start, f.end));
    }
  }
  return message(out);
}

// ---------------------------------------------------------------- flat training model

/** A NodeProto whose attributes are ints. */
function encodeNode(opType, inputs, outputs, attributes = {}) {
  return message([
    ...inputs.map((i) => bytesField(NODE.input, i)),
    ...outputs.map((o) => bytesField(NODE.output, o)),
    bytesField(NODE.name, outputs[0]),
    bytesField(NODE.op_type, opType),
    ...Object.entries(attributes).map(([name, value]) => bytesField(NODE.attribute, message([
      bytesField(ATTRIBUTE.name, name), varintField(ATTRIBUTE.i, value),
      varintField(ATTRIBUTE.type, ATTRIBUTE_INT)]))),
  ]);
}

/**
 * The training model reading its trainable parameters, and their gradient buffers, as one
 * vector each and writing the accumulated gradients as one (the optimizer model's flat
 * layout): `Split` and `Reshape` in front of its nodes give each parameter and buffer its
 * name and shape back, `Reshape` and `Concat` behind them join the gradients. Copies only:
 * every value the model computes is the same. The other inputs and outputs are kept.
 * @param {Uint8Array|ArrayBuffer} trainModelBytes
 * @param {object} flat
 * @param {string[]} flat.params the trainable parameters, in the vectors' order
 * @param {number[][]} flat.shapes their shapes (no dimension of 0)
 * @param {string} flat.dtype their element type
 * @param {{params: string, buffer: string, gradient: string}} flat.names the vectors' names
 * @param {string} bufferSuffix the gradient buffers' suffix (`<p><bufferSuffix>`)
 * @param {string} outputSuffix the accumulated gradients' suffix
 * @returns {Uint8Array}
 */
export function flatTrainingModel(trainModelBytes, { params, shapes, dtype, names },
  bufferSuffix, outputSuffix) {
  const buf = asBytes(trainModelBytes, 'the training model');
  const top = readFields(buf);
  const graph = graphField(buf);
  const fields = readFields(buf, graph.vStart, graph.vEnd);
  const sizes = shapes.map((shape) => shape.reduce((a, d) => a * d, 1));
  const total = sizes.reduce((a, n) => a + n, 0);
  const bufferOf = (p) => `${p}${bufferSuffix}`;
  const gradientOf = (p) => `${p}${outputSuffix}`;
  const dropped = new Set([...params, ...params.map(bufferOf)]);
  const droppedOut = new Set(params.map(gradientOf));
  const ns = `${names.params}/`; // the names of the values added: under the vector's name
  const int64 = (name, values) => bytesField(GRAPH.initializer, encodeTensor(name, {
    dtype: 'int64', shape: [values.length], data: BigInt64Array.from(values, BigInt),
  }));
  const initializers = [int64(`${ns}sizes`, sizes), int64(`${ns}row`, [-1]),
    ...shapes.map((shape, i) => int64(`${ns}shape${i}`, shape))];
  const front = [];
  for (const [vector, nameOf] of [[names.params, (p) => p], [names.buffer, bufferOf]]) {
    const parts = params.length > 1 ? params.map((_, i) => `${vector}/part${i}`) : [vector];
    if (params.length > 1) front.push(encodeNode('Split', [vector, `${ns}sizes`], parts, { axis: 0 }));
    params.forEach((p, i) => front.push(encodeNode('Reshape', [parts[i], `${ns}shape${i}`], [nameOf(p)])));
  }
  const rows = params.map((_, i) => `${names.gradient}/row${i}`);
  const back = params.map((p, i) => encodeNode('Reshape', [gradientOf(p), `${ns}row`], [rows[i]]));
  back.push(encodeNode('Concat', rows, [names.gradient], { axis: 0 }));
  const parts = front.map((node) => bytesField(GRAPH.node, node));
  for (const f of fields) {
    if (f.wire === 2 && f.num === GRAPH.input && dropped.has(readValueInfo(buf, f).name)) continue;
    if (f.wire === 2 && f.num === GRAPH.output && droppedOut.has(readValueInfo(buf, f).name)) continue;
    parts.push(buf.subarray(f.start, f.end));
  }
  parts.push(...back.map((node) => bytesField(GRAPH.node, node)), ...initializers,
    bytesField(GRAPH.input, encodeValueInfo(names.params, dtype, [total])),
    bytesField(GRAPH.input, encodeValueInfo(names.buffer, dtype, [total])),
    bytesField(GRAPH.output, encodeValueInfo(names.gradient, dtype, [total])));
  return message(top.map((f) => (f.start === graph.start ? bytesField(MODEL.graph, message(parts))
    : buf.subarray(f.start, f.end))));
}

/** A length-delimited field's bytes under another field number. */
function retag(fieldBytes, num) {
  const [, pos] = readVarint(fieldBytes, 0);
  const [len, start] = readVarint(fieldBytes, pos);
  return bytesField(num, fieldBytes.subarray(start, start + len));
}

