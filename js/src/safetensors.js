// The safetensors file format, read with every declared size checked and written byte for
// byte as ortlearn's Python `_safetensors.write` (which writes what `safetensors.numpy.save`
// writes, with the metadata keys sorted).

import { comparePyStr, pyJsonLoads, pyJsonString } from './pyformat.js';

/**
 * @typedef {Int8Array|Uint8Array|Int16Array|Uint16Array|Int32Array|Uint32Array|Float32Array|
 *   Float64Array|BigInt64Array|BigUint64Array} TypedArray
 */

/**
 * @typedef {object} TensorData
 * @property {string} dtype numpy's name: 'float32', 'float64', 'float16', 'int32', 'int64',
 *   'bool', 'uint8', 'int8', 'int16', 'uint16', 'uint32', 'uint64'
 * @property {number[]} shape
 * @property {TypedArray} data the elements, row-major (float16 as their raw `Uint16Array` bits,
 *   bool as a `Uint8Array` of 0 and 1)
 */

/**
 * The dtypes, by numpy name: safetensors name, bytes per element, typed array. The order is
 * safetensors' rank (its Rust enum), by which a file orders its tensors (decreasing).
 * @type {Map<string, {st: string, itemsize: number, array: Function}>}
 */
export const DTYPES = new Map([
  ['bool', { st: 'BOOL', itemsize: 1, array: Uint8Array }],
  ['uint8', { st: 'U8', itemsize: 1, array: Uint8Array }],
  ['int8', { st: 'I8', itemsize: 1, array: Int8Array }],
  ['int16', { st: 'I16', itemsize: 2, array: Int16Array }],
  ['uint16', { st: 'U16', itemsize: 2, array: Uint16Array }],
  ['float16', { st: 'F16', itemsize: 2, array: Uint16Array }],
  ['int32', { st: 'I32', itemsize: 4, array: Int32Array }],
  ['uint32', { st: 'U32', itemsize: 4, array: Uint32Array }],
  ['float32', { st: 'F32', itemsize: 4, array: Float32Array }],
  ['float64', { st: 'F64', itemsize: 8, array: Float64Array }],
  ['int64', { st: 'I64', itemsize: 8, array: BigInt64Array }],
  ['uint64', { st: 'U64', itemsize: 8, array: BigUint64Array }],
]);

const RANK = new Map([...DTYPES.values()].map((d, rank) => [d.st, rank]));
const FROM_ST = new Map([...DTYPES.entries()].map(([name, d]) => [d.st, name]));
// Sizes of safetensors dtypes this module cannot hold, to check a file's layout all the same.
const OTHER_ITEMSIZE = new Map([['BF16', 2], ['F8_E5M2', 1], ['F8_E4M3', 1]]);

/** Largest header read, as ortlearn's MAX_HEADER (2**26 bytes). */
export const MAX_HEADER = 2 ** 26;

if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
  throw new Error('ortlearn-training needs a little-endian platform (safetensors and ONNX '
    + 'store little-endian data, read here through typed arrays).');
}

const UTF8 = new TextEncoder();
const UTF8_STRICT = new TextDecoder('utf-8', { fatal: true });

/**
 * The bytes of `bytes` (a Uint8Array, an ArrayBuffer, a Node Buffer or another view).
 * @param {Uint8Array|ArrayBuffer|ArrayBufferView} bytes
 * @param {string} what
 * @returns {Uint8Array}
 */
export function asBytes(bytes, what = 'the data') {
  // A Node Buffer is a Uint8Array whose slice() is a view: make it a plain Uint8Array.
  if (bytes instanceof Uint8Array && bytes.constructor === Uint8Array) return bytes;
  if (bytes instanceof ArrayBuffer
      || (typeof SharedArrayBuffer !== 'undefined' && bytes instanceof SharedArrayBuffer)) {
    return new Uint8Array(bytes);
  }
  if (ArrayBuffer.isView(bytes)) return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  throw new TypeError(`${what} must be a Uint8Array or an ArrayBuffer, got `
    + `${bytes === null ? 'null' : typeof bytes === 'object' ? bytes.constructor?.name : typeof bytes}.`);
}

/**
 * The raw bytes of a typed array (a view, no copy).
 * @param {TypedArray} data
 * @returns {Uint8Array}
 */
export function bytesOf(data) {
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

/**
 * The byte arrays `parts` one after the other, in one new array.
 * @param {Uint8Array[]} parts
 * @returns {Uint8Array}
 */
export function concatBytes(parts) {
  let total = 0;
  for (const p of parts) total += p.length;
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/**
 * Number of elements of `shape` (1 for a scalar).
 * @param {number[]} shape
 * @returns {number}
 */
export function sizeOf(shape) {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/**
 * Check that `data` is a typed array of `dtype` holding `shape`'s elements; TypeError or
 * Error naming `what` otherwise.
 * @param {string} dtype
 * @param {number[]} shape
 * @param {*} data
 * @param {string} what
 */
export function checkTensorData(dtype, shape, data, what) {
  const info = DTYPES.get(dtype);
  if (!info) {
    throw new TypeError(`${what} has the dtype ${JSON.stringify(dtype)}; supported: `
      + `${[...DTYPES.keys()].join(', ')}.`);
  }
  if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new TypeError(`${what} has the shape ${JSON.stringify(shape)}; a shape is an array `
      + 'of non-negative integers.');
  }
  if (!(data instanceof info.array)) {
    throw new TypeError(`${what} is ${dtype}: its data must be a ${info.array.name}, got `
      + `${data === null || data === undefined ? data : data.constructor?.name}.`);
  }
  if (data.length !== sizeOf(shape)) {
    throw new Error(`${what} has the shape [${shape}] (${sizeOf(shape)} elements), its data `
      + `holds ${data.length}.`);
  }
}

/**
 * Read a safetensors file. Everything the header declares is checked before any tensor is
 * read: the header's length within the file, every tensor's dtype, shape and offsets inside
 * the body with `end - begin` equal to dtype size times elements, the tensors tiling the body.
 * Each tensor is copied into its own typed array.
 * @param {Uint8Array|ArrayBuffer} bytes the whole file
 * @returns {{metadata: Map<string, string>, tensors: Map<string, TensorData>}}
 *   the tensors in file order
 */
export function parseSafetensors(bytes) {
  const data = asBytes(bytes, 'a safetensors file');
  if (data.length < 8) {
    throw new Error(`${data.length} bytes, too short for a safetensors file`);
  }
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const size = view.getBigUint64(0, true);
  if (size > BigInt(data.length - 8)) {
    throw new Error(`the header declares ${size} bytes, longer than the file's `
      + `${data.length - 8} after its length (truncated, or not a safetensors file)`);
  }
  if (size > BigInt(MAX_HEADER)) {
    throw new Error(`the header declares ${size} bytes, more than the ${MAX_HEADER} a `
      + 'checkpoint header may have');
  }
  const headerLength = Number(size);
  let text;
  try {
    text = UTF8_STRICT.decode(data.subarray(8, 8 + headerLength));
  } catch {
    throw new Error('the header is not valid UTF-8 (not a safetensors file)');
  }
  let header;
  try {
    header = pyJsonLoads(text);
  } catch (err) {
    throw new Error(`the header is not valid JSON (${err.message})`);
  }
  if (!(header instanceof Map)) throw new Error('not a safetensors header');
  const bodyStart = 8 + headerLength;
  const bodySize = data.length - bodyStart;
  const metadata = new Map();
  const entries = [];
  for (const [key, info] of header) {
    if (key === '__metadata__') {
      if (!(info instanceof Map)) throw new Error('not a safetensors header (bad __metadata__)');
      for (const [k, v] of info) {
        if (typeof v !== 'string') {
          throw new Error(`the metadata value of ${JSON.stringify(k)} is not a string`);
        }
        metadata.set(k, v);
      }
      continue;
    }
    const malformed = () => new Error(`tensor ${JSON.stringify(key)} has a malformed entry`);
    if (!(info instanceof Map)) throw malformed();
    const st = info.get('dtype');
    const shape = info.get('shape');
    const offsets = info.get('data_offsets');
    const itemsize = typeof st === 'string'
      ? (DTYPES.get(FROM_ST.get(st))?.itemsize ?? OTHER_ITEMSIZE.get(st)) : undefined;
    if (itemsize === undefined || !Array.isArray(shape)
        || !shape.every((d) => typeof d === 'bigint' && d >= 0n)
        || !Array.isArray(offsets) || offsets.length !== 2
        || !offsets.every((o) => typeof o === 'bigint')) {
      throw malformed();
    }
    let nbytes = BigInt(itemsize);
    for (const d of shape) nbytes *= d; // BigInt: no overflow on absurd shapes
    const [begin, end] = offsets;
    if (!(begin >= 0n && begin <= end && end <= BigInt(bodySize)) || end - begin !== nbytes) {
      throw new Error(`tensor ${JSON.stringify(key)} declares ${nbytes} bytes at offsets `
        + `[${begin}, ${end}], out of proportion to the file's ${bodySize} bytes of data `
        + '(truncated or damaged)');
    }
    entries.push({ key, st, shape: shape.map(Number), begin: Number(begin), end: Number(end) });
  }
  // As safetensors requires: the tensors tile the body, in file order.
  entries.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let end = 0;
  for (const e of entries) {
    if (e.begin !== end) {
      throw new Error(`tensor ${JSON.stringify(e.key)} does not start where the previous one ends`);
    }
    end = e.end;
  }
  if (end !== bodySize) throw new Error('the tensors do not cover the file\'s data');
  const tensors = new Map();
  for (const e of entries) {
    const dtype = FROM_ST.get(e.st);
    if (dtype === undefined) {
      throw new Error(`tensor ${JSON.stringify(e.key)} has the unsupported dtype `
        + `${JSON.stringify(e.st)}`);
    }
    const info = DTYPES.get(dtype);
    // a copy: aligned for its typed array, and independent of the file's buffer
    const raw = data.slice(bodyStart + e.begin, bodyStart + e.end);
    tensors.set(e.key, {
      dtype, shape: e.shape, data: new info.array(raw.buffer, 0, raw.length / info.itemsize),
    });
  }
  return { metadata, tensors };
}

function entriesOf(mapping, what) {
  if (mapping instanceof Map) return [...mapping.entries()];
  if (mapping && typeof mapping === 'object') return Object.entries(mapping);
  throw new TypeError(`${what} must be a Map or an object.`);
}

/**
 * Write a safetensors file, byte for byte as ortlearn's Python `_safetensors.write`:
 * compact JSON (non-ASCII text as is) with `__metadata__` first and its keys sorted, then the
 * tensors by decreasing safetensors dtype rank then key, with contiguous offsets; the header
 * padded with spaces to a multiple of 8 bytes; then the little-endian data.
 * @param {Map<string, TensorData>|Object<string, TensorData>} tensors
 * @param {Map<string, string>|Object<string, string>} [metadata]
 * @returns {Uint8Array}
 */
export function serializeSafetensors(tensors, metadata = {}) {
  const items = entriesOf(tensors, 'tensors');
  const seen = new Set();
  for (const [key, t] of items) {
    if (typeof key !== 'string') throw new TypeError('tensor names must be strings.');
    if (seen.has(key)) throw new Error(`the tensor name ${JSON.stringify(key)} is repeated.`);
    seen.add(key);
    checkWellFormed(key, 'a tensor name');
    checkTensorData(t.dtype, t.shape, t.data, `tensor ${JSON.stringify(key)}`);
  }
  const meta = entriesOf(metadata, 'metadata');
  for (const [k, v] of meta) {
    if (typeof k !== 'string' || typeof v !== 'string') {
      throw new TypeError('safetensors metadata keys and values must be strings.');
    }
    checkWellFormed(k, 'a metadata key');
    checkWellFormed(v, `the metadata value of ${JSON.stringify(k)}`);
  }
  meta.sort((a, b) => comparePyStr(a[0], b[0]));
  const rank = (t) => RANK.get(DTYPES.get(t.dtype).st);
  items.sort((a, b) => rank(b[1]) - rank(a[1]) || comparePyStr(a[0], b[0]));
  const str = (s) => pyJsonString(s, false);
  let json = `{"__metadata__":{${meta.map(([k, v]) => `${str(k)}:${str(v)}`).join(',')}}`;
  let offset = 0;
  for (const [key, t] of items) {
    const next = offset + t.data.byteLength;
    json += `,${str(key)}:{"dtype":"${DTYPES.get(t.dtype).st}","shape":[${t.shape.join(',')}],`
      + `"data_offsets":[${offset},${next}]}`;
    offset = next;
  }
  json += '}';
  const text = UTF8.encode(json);
  const padded = text.length + ((8 - (text.length % 8)) % 8);
  const out = new Uint8Array(8 + padded + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(padded), true);
  out.set(text, 8);
  out.fill(0x20, 8 + text.length, 8 + padded);
  let at = 8 + padded;
  for (const [, t] of items) {
    out.set(bytesOf(t.data), at);
    at += t.data.byteLength;
  }
  return out;
}

/**
 * Refuse a string with a lone surrogate: Python cannot encode it to UTF-8 either.
 * @param {string} s
 * @param {string} what
 */
export function checkWellFormed(s, what) {
  const ok = typeof s.isWellFormed === 'function' ? s.isWellFormed()
    : !/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(s);
  if (!ok) {
    throw new Error(`${what} holds a lone UTF-16 surrogate, which UTF-8 cannot encode: `
      + `${JSON.stringify(s)}.`);
  }
}
