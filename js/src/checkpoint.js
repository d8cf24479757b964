// The training state (parameters, optimizer state, properties) and its checkpoint file, in
// ortlearn's format version 1 (ortlearn/training/checkpoint.py): a safetensors file whose
// metadata holds the format tag, a JSON header written by Python's `json.dumps` and a SHA-256
// checksum. A checkpoint written by Python, loaded and saved here unchanged, is byte-identical
// to the original file; one saved here loads in Python bit for bit.

import {
  comparePyStr, pyFloatParse, pyFloatRepr, pyHex, pyIntParseHex, pyJsonDumps, pyJsonLoads,
} from './pyformat.js';
import {
  DTYPES, asBytes, bytesOf, checkTensorData, checkWellFormed, concatBytes, parseSafetensors,
  serializeSafetensors, sizeOf,
} from './safetensors.js';

export const FORMAT_TAG = 'ortlearn.checkpoint';
export const FORMAT_VERSION = '1';
const HEADER_KEY = 'ortlearn.header';
const CHECKSUM_KEY = 'ortlearn.checksum';
const INT64_MAX = 2n ** 63n - 1n;
const FLOAT32_MAX = 3.4028234663852886e38;

/** The dtypes a version-1 checkpoint holds (numpy names). */
export const CHECKPOINT_DTYPES = ['float16', 'float32', 'float64', 'int32', 'int64', 'bool'];

const UTF8 = new TextEncoder();

/**
 * @typedef {import('./safetensors.js').TypedArray} TypedArray
 * @typedef {import('./safetensors.js').TensorData} TensorData
 */

/**
 * One parameter of a CheckpointState.
 * @typedef {object} Parameter
 * @property {string} name
 * @property {string} dtype numpy's name ('float32', ...)
 * @property {number[]} shape
 * @property {boolean} requiresGrad true for a trainable parameter, false for a frozen one
 * @property {boolean} nominal true while the parameter has no value (a nominal checkpoint)
 * @property {TypedArray|null} data its value, row-major (null when nominal)
 */

/**
 * The optimizer state of a CheckpointState.
 * @typedef {object} OptimizerState
 * @property {number|bigint} step updates made so far (a bigint beyond 2**53)
 * @property {number} learningRate the learning rate of the next updates
 * @property {Map<string, Map<string, TensorData>>} states trainable parameter -> state name
 *   (e.g. 'exp_avg') -> tensor
 */

/**
 * A property value: an int is a `bigint`, a float a `number`, a str a `string` (so that `3`
 * and `3.0` round-trip as what they are).
 * @typedef {bigint|number|string} PropertyValue
 */

/**
 * Python's `_checksum`: SHA-256 over the header text (UTF-8), then for each tensor key in
 * sorted order the UTF-8 of `json.dumps([key, dtype, shape])` and the raw little-endian bytes.
 * @param {string} header
 * @param {Map<string, TensorData>} tensors
 * @returns {Promise<string>} lowercase hex digest
 */
export async function checkpointChecksum(header, tensors) {
  const parts = [UTF8.encode(header)];
  const keys = [...tensors.keys()].sort(comparePyStr);
  for (const key of keys) {
    const t = tensors.get(key);
    parts.push(UTF8.encode(pyJsonDumps([key, t.dtype, t.shape])));
    parts.push(bytesOf(t.data));
  }
  return toHex(await sha256(concatBytes(parts)));
}

async function webCrypto() {
  if (globalThis.crypto?.subtle) return globalThis.crypto.subtle;
  // Node 18 has Web Crypto in node:crypto, global only from Node 19 on (the specifier is a
  // variable so that bundlers for browsers leave it alone).
  if (typeof process !== 'undefined' && process.versions?.node) {
    const name = 'node:crypto';
    const mod = await import(/* webpackIgnore: true */ /* @vite-ignore */ name);
    if (mod.webcrypto?.subtle) return mod.webcrypto.subtle;
  }
  throw new Error('Web Crypto (crypto.subtle) is missing: checkpoints need SHA-256. In a browser, '
    + 'serve the page over https or from localhost (a secure context).');
}

async function sha256(bytes) {
  const subtle = await webCrypto();
  return new Uint8Array(await subtle.digest('SHA-256', bytes));
}

function toHex(bytes) {
  let s = '';
  for (const b of bytes) s += b.toString(16).padStart(2, '0');
  return s;
}

function typeName(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'list';
  if (v instanceof Map) return 'dict';
  return typeof v;
}

function strList(value, what) {
  if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) {
    throw new Error(`expected a list of names for ${what}, got a ${typeName(value)}`);
  }
  return value;
}

function encodeProperty(name, value) {
  if (typeof value === 'bigint') return [name, 'int', pyHex(value)];
  if (typeof value === 'number') return [name, 'float', pyFloatRepr(value)];
  if (typeof value === 'string') return [name, 'str', value];
  throw new TypeError(`Property ${JSON.stringify(name)}: only int (bigint), float (number) `
    + `and str values are supported, got ${typeof value}.`);
}

function decodeProperty(item) {
  if (!Array.isArray(item) || item.length !== 3 || !item.every((x) => typeof x === 'string')) {
    throw new Error(`malformed property entry ${pyJsonDumps(item)}`);
  }
  const [name, kind, text] = item;
  if (kind === 'int') return [name, pyIntParseHex(text)];
  if (kind === 'float') return [name, pyFloatParse(text)];
  if (kind === 'str') return [name, text];
  throw new Error(`property ${JSON.stringify(name)} has unknown type ${JSON.stringify(kind)}`);
}

/** A step count as a number when exact, else a bigint. */
function stepValue(step) {
  const big = BigInt(step);
  return big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
}

function isFloating(dtype) {
  return dtype === 'float32' || dtype === 'float64' || dtype === 'float16';
}

function allFinite(dtype, data) {
  if (dtype === 'float16') {
    for (const bits of data) if ((bits & 0x7c00) === 0x7c00) return false;
    return true;
  }
  for (const x of data) if (!Number.isFinite(x)) return false;
  return true;
}

/** A copy of a typed array (its own buffer). */
function copyOf(data) {
  return data.slice();
}

/**
 * The training state: parameters, optimizer state and properties, and its checkpoint file.
 *
 * The JavaScript counterpart of `ortlearn.CheckpointState` (and of onnxruntime-training's):
 * `CheckpointState.loadCheckpoint(bytes)` reads a checkpoint, `saveCheckpoint()` writes one.
 */
export class CheckpointState {
  constructor() {
    /** @type {Map<string, Parameter>} trainable first, then frozen (file order) */
    this.parameters = new Map();
    /** @type {Map<string, PropertyValue>} */
    this.properties = new Map();
    /** @type {OptimizerState|null} */
    this.optimizerState = null;
  }

  /** Names of the trainable parameters, in order. @returns {string[]} */
  get trainableNames() {
    return [...this.parameters.values()].filter((p) => p.requiresGrad).map((p) => p.name);
  }

  /** Names of the frozen parameters, in order. @returns {string[]} */
  get frozenNames() {
    return [...this.parameters.values()].filter((p) => !p.requiresGrad).map((p) => p.name);
  }

  /** True if a parameter has no value (a nominal checkpoint). @returns {boolean} */
  get isNominal() {
    return [...this.parameters.values()].some((p) => p.nominal);
  }

  /**
   * Build a state from parameter values (what `CheckpointState.from_parameters` does in
   * Python).
   * @param {Map<string, TensorData>|Object<string, TensorData>} trainable in order
   * @param {Map<string, TensorData>|Object<string, TensorData>} [frozen] in order
   * @param {Map<string, *>|Object<string, *>} [properties] values as `addProperty` takes them
   * @param {{nominal?: boolean}} [options] nominal: keep dtypes and shapes only
   * @returns {CheckpointState}
   */
  static fromParameters(trainable, frozen = {}, properties = {}, { nominal = false } = {}) {
    const state = new CheckpointState();
    const entries = (m) => (m instanceof Map ? [...m.entries()] : Object.entries(m ?? {}));
    for (const [params, requiresGrad] of [[trainable, true], [frozen, false]]) {
      for (const [name, t] of entries(params)) {
        if (state.parameters.has(name)) {
          throw new Error(`Parameter ${JSON.stringify(name)} is given twice (both trainable `
            + 'and frozen?).');
        }
        const dtype = t.dtype ?? dtypeOfArray(t.data, name);
        const shape = t.shape ?? [t.data.length];
        if (!CHECKPOINT_DTYPES.includes(dtype)) {
          throw new TypeError(`Parameter ${JSON.stringify(name)} has dtype ${dtype}; `
            + `checkpoints hold only ${CHECKPOINT_DTYPES.join(', ')}.`);
        }
        checkTensorData(dtype, shape, t.data, `Parameter ${JSON.stringify(name)}`);
        state.parameters.set(name, {
          name, dtype, shape: [...shape], requiresGrad, nominal,
          data: nominal ? null : copyOf(t.data),
        });
      }
    }
    for (const [name, value] of entries(properties)) state.addProperty(name, value);
    return state;
  }

  /**
   * Add or replace a property. Without `kind`: a bigint, a boolean (stored as the int it is,
   * as Python does) or an integral number is an int, another number a float, a string a str;
   * give `kind` ('int', 'float' or 'str') to store an integral number as a float.
   * @param {string} name
   * @param {bigint|number|boolean|string} value
   * @param {'int'|'float'|'str'} [kind]
   */
  addProperty(name, value, kind) {
    if (typeof name !== 'string') {
      throw new TypeError(`Property names are strings, got ${typeof name}.`);
    }
    let v;
    if (kind === undefined) {
      if (typeof value === 'boolean') v = value ? 1n : 0n;
      else if (typeof value === 'bigint' || typeof value === 'string') v = value;
      else if (typeof value === 'number') {
        v = Number.isInteger(value) && !Object.is(value, -0) ? BigInt(value) : value;
      }
    } else if (kind === 'int') {
      if (typeof value === 'bigint') v = value;
      else if (typeof value === 'boolean') v = value ? 1n : 0n;
      else if (typeof value === 'number' && Number.isInteger(value)) v = BigInt(value);
    } else if (kind === 'float') {
      if (typeof value === 'number') v = value;
      else if (typeof value === 'bigint') v = Number(value);
    } else if (kind === 'str') {
      if (typeof value === 'string') v = value;
    } else {
      throw new TypeError(`A property's kind is 'int', 'float' or 'str', got ${String(kind)}.`);
    }
    if (v === undefined) {
      throw new TypeError(`Property ${JSON.stringify(name)}: only int (bigint or integral `
        + `number), float (number) and str values are supported, got ${typeof value}`
        + `${kind ? ` as ${kind}` : ''}.`);
    }
    this.properties.set(name, v);
  }

  /**
   * A property's value (an int as a bigint, a float as a number, a str as a string).
   * @param {string} name
   * @returns {PropertyValue}
   */
  getProperty(name) {
    if (!this.properties.has(name)) {
      throw new Error(`Property ${JSON.stringify(name)} not found; the properties are `
        + `${JSON.stringify([...this.properties.keys()])}.`);
    }
    return this.properties.get(name);
  }

  /**
   * Replace the optimizer state (to resume a training), as Python's `set_optimizer_state`.
   * @param {Map<string, Map<string, TensorData|TypedArray>>|Object} states trainable parameter
   *   -> state name -> tensor (a bare typed array has the parameter's dtype and shape)
   * @param {number|bigint} step updates already made (>= 0)
   * @param {number} learningRate finite, >= 0, within float32's range
   */
  setOptimizerState(states, step, learningRate) {
    this.optimizerState = this._validatedOptimizer(states, step, learningRate, true);
  }

  _validatedOptimizer(states, step, learningRate, checkValues) {
    if (typeof step !== 'bigint' && !(typeof step === 'number' && Number.isInteger(step))) {
      throw new TypeError(`step must be an integer, got ${typeof step}.`);
    }
    const big = BigInt(step);
    if (big < 0n) throw new Error(`step must be >= 0 (the number of updates made), got ${step}.`);
    if (checkValues) {
      if (big > INT64_MAX) {
        throw new Error(`step must fit in int64 (<= ${INT64_MAX}), got ${step}; the step `
          + 'counts the optimizer updates made, give that number.');
      }
      if (typeof learningRate !== 'number') {
        throw new TypeError(`learning_rate must be a real number, got ${typeof learningRate}.`);
      }
      if (!(Number.isFinite(learningRate) && learningRate >= 0 && learningRate <= FLOAT32_MAX)) {
        throw new Error('learning_rate must be a finite number >= 0 that float32 can hold '
          + `(<= 3.403e+38), got ${pyFloatRepr(learningRate)}; set the rate the training `
          + 'should resume with.');
      }
    }
    const clean = new Map();
    const entries = (m) => (m instanceof Map ? [...m.entries()] : Object.entries(m ?? {}));
    for (const [param, paramStates] of entries(states)) {
      const record = this.parameters.get(param);
      if (!record || !record.requiresGrad) {
        throw new Error(`Optimizer state for ${JSON.stringify(param)}, which is not a `
          + 'trainable parameter.');
      }
      const out = new Map();
      for (const [stateName, value] of entries(paramStates)) {
        if (typeof stateName !== 'string' || !stateName) {
          throw new Error(`Bad optimizer state name ${JSON.stringify(stateName)} for `
            + `${JSON.stringify(param)}.`);
        }
        const t = ArrayBuffer.isView(value)
          ? { dtype: record.dtype, shape: record.shape, data: value } : value;
        const what = `Optimizer state ${JSON.stringify(stateName)} of ${JSON.stringify(param)}`;
        if (!CHECKPOINT_DTYPES.includes(t.dtype)) {
          throw new TypeError(`${what} has dtype ${t.dtype}; checkpoints hold only `
            + `${CHECKPOINT_DTYPES.join(', ')}.`);
        }
        checkTensorData(t.dtype, t.shape, t.data, what);
        if (checkValues && isFloating(t.dtype) && !allFinite(t.dtype, t.data)) {
          throw new Error(`${what} has NaN or infinite values; a diverged state cannot be `
            + 'resumed: resume from an earlier checkpoint or without the optimizer state.');
        }
        out.set(stateName, { dtype: t.dtype, shape: [...t.shape], data: t.data });
      }
      clean.set(param, out);
    }
    return { step: stepValue(big), learningRate: Number(learningRate), states: clean };
  }

  /**
   * Load a checkpoint written by ortlearn (Python's `CheckpointState.save_checkpoint` or
   * `saveCheckpoint` here), full or nominal. Checks the format tag, the checksum (a damaged
   * file is refused) and every declared dtype and shape.
   * @param {Uint8Array|ArrayBuffer} bytes the file's content
   * @returns {Promise<CheckpointState>}
   */
  static async loadCheckpoint(bytes) {
    const data = asBytes(bytes, 'a checkpoint');
    try {
      return await CheckpointState._decode(data);
    } catch (err) {
      if (err instanceof TypeError && /must be a Uint8Array/.test(err.message)) throw err;
      const e = new Error(`The bytes given are not a valid ortlearn checkpoint: ${err.message}`);
      e.cause = err;
      throw e;
    }
  }

  static async _decode(data) {
    const { metadata, tensors } = parseSafetensors(data);
    const version = metadata.get(FORMAT_TAG);
    if (version === undefined) throw new Error('it has no ortlearn header');
    if (version !== FORMAT_VERSION) {
      throw new Error(`format version ${JSON.stringify(version)}, this reader reads version `
        + `${FORMAT_VERSION}`);
    }
    const headerText = metadata.get(HEADER_KEY);
    if (headerText === undefined) throw new Error(`its metadata lacks ${HEADER_KEY}`);
    const header = pyJsonLoads(headerText);
    if (!(header instanceof Map)) throw new Error('its header is not a JSON object');
    if (await checkpointChecksum(headerText, tensors) !== metadata.get(CHECKSUM_KEY)) {
      throw new Error('checksum mismatch, the file is damaged');
    }
    const need = (key) => {
      if (!header.has(key)) throw new Error(`its header lacks ${JSON.stringify(key)}`);
      return header.get(key);
    };
    const state = new CheckpointState();
    const trainable = strList(need('trainable'), 'trainable');
    const frozen = strList(need('frozen'), 'frozen');
    const names = [...trainable, ...frozen];
    const specs = need('tensors');
    if (!(specs instanceof Map) || new Set(names).size !== names.length
        || names.length !== specs.size || !names.every((n) => specs.has(n))) {
      throw new Error('inconsistent parameter names');
    }
    const trainableSet = new Set(trainable);
    const left = new Map(tensors);
    for (const name of names) {
      const spec = specs.get(name);
      if (!(spec instanceof Map)) throw new Error(`malformed entry for ${JSON.stringify(name)}`);
      const dtype = spec.get('dtype');
      if (!CHECKPOINT_DTYPES.includes(dtype)) {
        throw new Error(`parameter ${JSON.stringify(name)} has the unsupported dtype `
          + `${pyJsonDumps(dtype ?? null)}`);
      }
      const shape = spec.get('shape');
      if (!Array.isArray(shape) || !shape.every((d) => typeof d === 'bigint' && d >= 0n)) {
        throw new Error(`bad shape ${pyJsonDumps(shape ?? null)}`);
      }
      const nominal = spec.get('nominal');
      const value = left.get(`param/${name}`);
      left.delete(`param/${name}`);
      if (nominal !== (value === undefined)) {
        throw new Error('nominal flags do not match the tensors');
      }
      const dims = shape.map(Number);
      if (value && (value.dtype !== dtype || value.shape.length !== dims.length
          || !value.shape.every((d, i) => d === dims[i]))) {
        throw new Error('a tensor disagrees with its declared dtype or shape');
      }
      state.parameters.set(name, {
        name, dtype, shape: dims, requiresGrad: trainableSet.has(name), nominal,
        data: value ? value.data : null,
      });
    }
    const properties = need('properties');
    if (!Array.isArray(properties)) throw new Error('malformed properties');
    for (const item of properties) {
      const [name, value] = decodeProperty(item);
      state.properties.set(name, value);
    }
    const optimizer = need('optimizer');
    if (optimizer !== null) {
      if (!(optimizer instanceof Map)) throw new Error('malformed optimizer entry');
      const step = optimizer.get('step');
      if (typeof step !== 'bigint') throw new Error('bad optimizer step');
      const lrText = optimizer.get('learning_rate');
      // Python's float() of the entry: ortlearn writes the text of repr(learning_rate)
      let lr;
      if (typeof lrText === 'string') lr = pyFloatParse(lrText);
      else if (typeof lrText === 'number') lr = lrText;
      else if (typeof lrText === 'bigint') lr = Number(lrText);
      else throw new Error('bad optimizer learning rate');
      const specStates = optimizer.get('states');
      if (!(specStates instanceof Map)) throw new Error('malformed optimizer states');
      const states = new Map();
      for (const [param, stateNames] of specStates) {
        const out = new Map();
        for (const s of strList(stateNames, `the optimizer states of ${param}`)) {
          const key = `optim/${param}/${s}`;
          if (!left.has(key)) throw new Error(`the tensor ${JSON.stringify(key)} is missing`);
          out.set(s, left.get(key));
          left.delete(key);
        }
        states.set(param, out);
      }
      state.optimizerState = state._validatedOptimizer(states, step, lr, true);
    }
    if (left.size) {
      throw new Error(`unexpected tensors ${pyJsonDumps([...left.keys()].sort(comparePyStr))}`);
    }
    return state;
  }

  /**
   * The checkpoint file's content, byte for byte what Python's
   * `CheckpointState.save_checkpoint` writes for the same state.
   * @param {boolean} [includeOptimizerState=true] also save the optimizer state, if any
   * @returns {Promise<Uint8Array>}
   */
  async saveCheckpoint(includeOptimizerState = true) {
    const tensors = new Map();
    const specs = new Map();
    for (const [name, p] of this.parameters) {
      checkWellFormed(name, 'a parameter name');
      if (!CHECKPOINT_DTYPES.includes(p.dtype)) {
        throw new TypeError(`Parameter ${JSON.stringify(name)} has dtype ${p.dtype}; `
          + `checkpoints hold only ${CHECKPOINT_DTYPES.join(', ')}.`);
      }
      specs.set(name, new Map([
        ['dtype', p.dtype], ['shape', p.shape.map(BigInt)], ['nominal', Boolean(p.nominal)]]));
      if (!p.nominal) {
        checkTensorData(p.dtype, p.shape, p.data, `Parameter ${JSON.stringify(name)}`);
        tensors.set(`param/${name}`, { dtype: p.dtype, shape: p.shape, data: p.data });
      }
    }
    let optimizer = null;
    const snapshot = includeOptimizerState ? this.optimizerState : null;
    if (snapshot) {
      const states = new Map();
      for (const [param, paramStates] of snapshot.states) {
        states.set(param, [...paramStates.keys()]);
        for (const [stateName, t] of paramStates) {
          const key = `optim/${param}/${stateName}`;
          if (tensors.has(key)) throw new Error(`Optimizer state names collide on ${JSON.stringify(key)}.`);
          checkTensorData(t.dtype, t.shape, t.data, `Optimizer state ${JSON.stringify(key)}`);
          tensors.set(key, t);
        }
      }
      optimizer = new Map([
        ['step', BigInt(snapshot.step)],
        ['learning_rate', pyFloatRepr(snapshot.learningRate)],
        ['states', states],
      ]);
    }
    const properties = [];
    for (const [name, value] of this.properties) {
      if (typeof value === 'string') checkWellFormed(value, `property ${JSON.stringify(name)}`);
      properties.push(encodeProperty(name, value));
    }
    const header = pyJsonDumps(new Map([
      ['trainable', this.trainableNames],
      ['frozen', this.frozenNames],
      ['tensors', specs],
      ['properties', properties],
      ['optimizer', optimizer],
    ]));
    const metadata = new Map([
      [FORMAT_TAG, FORMAT_VERSION],
      [HEADER_KEY, header],
      [CHECKSUM_KEY, await checkpointChecksum(header, tensors)],
    ]);
    return serializeSafetensors(tensors, metadata);
  }
}

/**
 * The dtype a typed array stands for (a Uint8Array is taken as bool, a Uint16Array as
 * float16 bits: give `dtype` explicitly otherwise).
 * @param {*} data
 * @param {string} name
 * @returns {string}
 */
function dtypeOfArray(data, name) {
  const byArray = new Map([
    [Float32Array, 'float32'], [Float64Array, 'float64'], [Int32Array, 'int32'],
    [BigInt64Array, 'int64'], [Uint8Array, 'bool'], [Uint16Array, 'float16']]);
  const dtype = data && byArray.get(data.constructor);
  if (!dtype) {
    throw new TypeError(`Parameter ${JSON.stringify(name)}: give {dtype, shape, data} with `
      + `data a typed array (${CHECKPOINT_DTYPES.join(', ')}).`);
  }
  return dtype;
}

export { sizeOf, DTYPES };
