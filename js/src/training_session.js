// TrainingSession: onnxruntime-training's on-device training API on the ordinary
// onnxruntime-node / onnxruntime-web InferenceSession, for ortlearn's training artifacts
// (doc/artifacts_format.md). It mirrors ortlearn's Python TrainingSession
// (ortlearn/training/session.py): gradient accumulation with a lazy reset, the optimizer
// model in its tensor or flat layout, the checkpoint, the federated-learning buffer calls and
// the inference model export.
//
// The library imports no onnxruntime package: the caller passes the `ort` namespace
// (`import * as ort from 'onnxruntime-node'` or 'onnxruntime-web'), so one source runs in Node
// and in browsers.

import { CheckpointState } from './checkpoint.js';
import { pyFloatRepr } from './pyformat.js';
import {
  exportForInferencing, flatTrainingModel, isOrtFormat, readGraphIO, readMetadata,
} from './onnx_proto.js';
import { DTYPES, asBytes, sizeOf } from './safetensors.js';

const GRAD_BUFFER_SUFFIX = '_grad.accumulation.buffer';
const GRAD_OUTPUT_SUFFIX = '_grad.accumulation.out';
const LAZY_RESET_GRAD = 'lazy_reset_grad';
const LEARNING_RATE = 'learning_rate';
const STEP = 'step';
const GRADIENT_SUFFIX = '.gradient';
const UPDATED_SUFFIX = '.updated';
const TRAINING_METADATA_KEY = 'ortlearn.training';
const OPTIMIZER_METADATA_KEY = 'ortlearn.optimizer';
const SEQUENCE_INPUTS = ['params', 'gradients', 'first_order_moments', 'second_order_moments'];
// the one parameter of the flat layout: every parameter end to end
const FLAT_PARAMS = 'params';
// the vectors of the training model made flat (flatTrainingModel) next to the flat optimizer
const FLAT_TRAINING = {
  params: 'ortlearn.flat.params',
  buffer: `ortlearn.flat.params${GRAD_BUFFER_SUFFIX}`,
  gradient: `ortlearn.flat.params${GRAD_OUTPUT_SUFFIX}`,
};
const DEFAULT_LEARNING_RATE = 1e-3;
const LAST_STEP = 2n ** 63n - 1n;
const FLOAT32_MAX = 3.4028234663852886e38;

/**
 * @typedef {import('./checkpoint.js').TensorData} TensorData
 * @typedef {object} OrtTensor an `ort.Tensor` (onnxruntime-common's Tensor)
 * @property {string} type
 * @property {readonly number[]} dims
 * @property {string} location
 * @property {function(boolean=): Promise<*>} getData
 * @property {function(): void} dispose
 */

/**
 * @typedef {object} Layout the names of a training or eval model (the artifacts contract)
 * @property {string[]} userInputs
 * @property {string[]} userOutputs
 * @property {string[]} trainable
 * @property {string[]} frozen
 * @property {string[]} updated frozen parameters a training step updates (`<p>.updated`)
 * @property {string[]} inputGrads user inputs whose gradients the model outputs
 */

function asModelBytes(model, what) {
  if (model === undefined || model === null) return null;
  const bytes = asBytes(model, `The ${what} model`);
  if (isOrtFormat(bytes)) {
    throw new Error(`The ${what} model is in onnxruntime's ORT format: pass the ONNX file `
      + `(${what === 'training' ? 'training' : what}_model.onnx). The session reads the `
      + 'names and metadata from the ONNX graph, which onnxruntime\'s JS API does not expose.');
  }
  return bytes;
}

function parseJsonMetadata(meta, key, what) {
  if (!(key in meta)) return null;
  try {
    return JSON.parse(meta[key]);
  } catch (err) {
    throw new Error(`The ${what} model's metadata_props[${JSON.stringify(key)}] is not valid `
      + `JSON: ${err.message}`);
  }
}

function stringList(value, what) {
  if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) {
    throw new Error(`${what} must be a list of names.`);
  }
  return [...value];
}

/** Python's `read_layout`: the metadata, or the contract's input order without it. */
function readLayout(io, meta, what) {
  const inputs = io.inputs.map((i) => i.name);
  const outputs = io.outputs.map((o) => o.name);
  const m = parseJsonMetadata(meta, TRAINING_METADATA_KEY, what);
  if (m !== null) {
    const lack = ['user_inputs', 'user_outputs', 'trainable', 'frozen'].filter((k) => !(k in m));
    if (lack.length) {
      throw new Error(`The ${what} model's metadata_props[${JSON.stringify(TRAINING_METADATA_KEY)}] `
        + `lacks ${JSON.stringify(lack)}.`);
    }
    const key = `metadata_props[${JSON.stringify(TRAINING_METADATA_KEY)}]`;
    const layout = {
      userInputs: stringList(m.user_inputs, `${key}.user_inputs`),
      userOutputs: stringList(m.user_outputs, `${key}.user_outputs`),
      trainable: stringList(m.trainable, `${key}.trainable`),
      frozen: stringList(m.frozen, `${key}.frozen`),
      updated: stringList(m.updated_frozen ?? [], `${key}.updated_frozen`),
      inputGrads: stringList(m.input_gradients ?? [], `${key}.input_gradients`),
    };
    const missing = [
      ...layout.userInputs.filter((n) => !inputs.includes(n)),
      ...layout.userOutputs.filter((n) => !outputs.includes(n)),
      ...layout.updated.map((n) => `${n}${UPDATED_SUFFIX}`).filter((n) => !outputs.includes(n)),
      ...layout.updated.filter((n) => !layout.frozen.includes(n)),
    ];
    if (missing.length) {
      throw new Error(`The ${what} model's metadata names values the graph does not have: `
        + `${JSON.stringify(missing)}.`);
    }
    return layout;
  }
  // No metadata: the trainable parameters are the ones with a gradient buffer.
  const buffers = inputs.filter((n) => n.endsWith(GRAD_BUFFER_SUFFIX));
  const trainable = buffers.map((n) => n.slice(0, -GRAD_BUFFER_SUFFIX.length));
  const first = trainable.length ? inputs.indexOf(trainable[0]) : inputs.length;
  const end = buffers.length ? inputs.indexOf(buffers[0]) : inputs.length;
  return {
    userInputs: inputs.slice(0, first),
    userOutputs: outputs.filter((n) => !n.endsWith(GRAD_OUTPUT_SUFFIX)),
    trainable,
    frozen: inputs.slice(first, end).filter((n) => !trainable.includes(n)),
    updated: [],
    inputGrads: [],
  };
}

/** A declared shape matches an actual one: same rank, equal static dims, one size per symbol. */
function shapeMatches(declared, actual, symbols) {
  if (declared === null || declared === undefined) return true;
  if (declared.length !== actual.length) return false;
  for (let i = 0; i < declared.length; i++) {
    const d = declared[i];
    if (typeof d === 'number') {
      if (d !== actual[i]) return false;
    } else if (typeof d === 'string' && d && symbols) {
      if (symbols.has(d) && symbols.get(d) !== actual[i]) return false;
      symbols.set(d, actual[i]);
    }
  }
  return true;
}

function showShape(shape) {
  return shape === null || shape === undefined ? 'any shape'
    : `[${shape.map((d) => (d === null ? '?' : typeof d === 'string' ? JSON.stringify(d) : d)).join(', ')}]`;
}

function isTensorLike(v) {
  return v !== null && typeof v === 'object' && typeof v.type === 'string' && Array.isArray(v.dims);
}

function usesWebGpu(options) {
  const eps = options?.executionProviders ?? [];
  return eps.some((ep) => (typeof ep === 'string' ? ep : ep?.name) === 'webgpu');
}

/** A tensor's values on the host: a CPU tensor's own array, without a wait. */
async function hostData(tensor) {
  return tensor.location === 'cpu' ? tensor.data : tensor.getData();
}

/** Release a tensor we own once replaced: frees GPU memory; a CPU one is left to the GC. */
function drop(tensor) {
  if (tensor && tensor.location && tensor.location !== 'cpu' && tensor.location !== 'none'
      && typeof tensor.dispose === 'function') {
    tensor.dispose();
  }
}

/**
 * Train ortlearn training artifacts with onnxruntime's ordinary InferenceSession.
 *
 * Create it with `await TrainingSession.create(ort, {checkpointState, trainModel, evalModel,
 * optimizerModel}, sessionOptions)`. Parameters, accumulated gradients and optimizer state
 * stay `ort.Tensor`s between steps: a step's outputs are fed to the next step as they are
 * (on the GPU with WebGPU, whose sessions keep their outputs there).
 */
export class TrainingSession {
  /** Use `TrainingSession.create`. */
  constructor(secret) {
    if (secret !== CREATE) {
      throw new TypeError('Use `await TrainingSession.create(ort, {checkpointState, trainModel, '
        + '...})` to make a TrainingSession.');
    }
  }

  /**
   * Open a training session on ortlearn training artifacts.
   * @param {object} ort the onnxruntime namespace (`onnxruntime-node` or `onnxruntime-web`):
   *   its `InferenceSession` and `Tensor` are used
   * @param {object} artifacts
   * @param {CheckpointState|Uint8Array|ArrayBuffer} artifacts.checkpointState the state to
   *   start from, or a checkpoint's bytes. The session copies its values; `saveCheckpoint`
   *   writes the trained ones back into it.
   * @param {Uint8Array|ArrayBuffer} artifacts.trainModel training_model.onnx
   * @param {Uint8Array|ArrayBuffer} [artifacts.evalModel] eval_model.onnx (for `runEvalStep`
   *   and `exportModelForInferencing`)
   * @param {Uint8Array|ArrayBuffer} [artifacts.optimizerModel] optimizer_model.onnx in the
   *   tensor layout (for `runOptimizerStep`)
   * @param {object} [sessionOptions] `InferenceSession.SessionOptions` of the three sessions
   *   (`executionProviders: ['webgpu']` keeps the outputs on the GPU)
   * @returns {Promise<TrainingSession>}
   */
  static async create(ort, artifacts = {}, sessionOptions = {}) {
    if (!ort || typeof ort.InferenceSession?.create !== 'function' || typeof ort.Tensor !== 'function') {
      throw new TypeError('TrainingSession.create needs the onnxruntime namespace as its first '
        + "argument: `import * as ort from 'onnxruntime-node'` (or 'onnxruntime-web'), then "
        + 'TrainingSession.create(ort, {...}).');
    }
    const { checkpointState, trainModel, evalModel, optimizerModel } = artifacts ?? {};
    let state = checkpointState;
    if (!(state instanceof CheckpointState)) {
      if (state === undefined || state === null) {
        throw new TypeError('TrainingSession.create needs artifacts.checkpointState: a '
          + 'CheckpointState (CheckpointState.loadCheckpoint(bytes)) or the checkpoint\'s bytes.');
      }
      state = await CheckpointState.loadCheckpoint(state);
    }
    const session = new TrainingSession(CREATE);
    session._ort = ort;
    session._state = state;
    session._closed = false;
    session._busy = null;
    const trainBytes = asModelBytes(trainModel, 'training');
    if (!trainBytes) {
      throw new TypeError('TrainingSession.create needs artifacts.trainModel (the bytes of '
        + 'training_model.onnx).');
    }
    session._trainBytes = trainBytes;
    session._trainIO = readGraphIO(trainBytes);
    session._trainLayout = readLayout(session._trainIO, readMetadata(trainBytes), 'training');
    session._checkTrainingModel();
    session._evalBytes = asModelBytes(evalModel, 'eval');
    if (session._evalBytes) {
      session._evalIO = readGraphIO(session._evalBytes);
      session._evalLayout = readLayout(session._evalIO, readMetadata(session._evalBytes), 'eval');
    }
    session._paramTypes = session._checkState();

    const options = { ...sessionOptions };
    if (usesWebGpu(options) && options.preferredOutputLocation === undefined) {
      options.preferredOutputLocation = 'gpu-buffer';
    }
    session._sessionOptions = options;
    session._flatTraining = session._flatTrainingModel(optimizerModel, options);
    session._trainSess = await ort.InferenceSession.create(
      session._flatTraining?.bytes ?? trainBytes, options);
    session._evalSess = session._evalBytes
      ? await ort.InferenceSession.create(session._evalBytes, options) : null;
    session._initParameters();
    session._optimizer = null;
    if (optimizerModel !== undefined && optimizerModel !== null) {
      await session._attachOptimizer(optimizerModel);
    }
    return session;
  }

  // ------------------------------------------------------------------ setup

  _checkTrainingModel() {
    const layout = this._trainLayout;
    const inputs = new Set(this._trainIO.inputs.map((i) => i.name));
    const outputs = new Set(this._trainIO.outputs.map((o) => o.name));
    const wanted = [...layout.trainable, ...layout.frozen,
      ...[...layout.trainable, ...layout.inputGrads].map((n) => `${n}${GRAD_BUFFER_SUFFIX}`),
      LAZY_RESET_GRAD];
    const missing = wanted.filter((n) => !inputs.has(n));
    const wantedOut = [...layout.trainable, ...layout.inputGrads].map((n) => `${n}${GRAD_OUTPUT_SUFFIX}`);
    const missingOut = wantedOut.filter((n) => !outputs.has(n));
    if (missing.length || missingOut.length) {
      throw new Error('The training model does not follow ortlearn\'s training artifacts: it lacks '
        + `${missing.length ? `the inputs ${JSON.stringify(missing)}` : ''}`
        + `${missing.length && missingOut.length ? ' and ' : ''}`
        + `${missingOut.length ? `the outputs ${JSON.stringify(missingOut)}` : ''}. Pass the `
        + 'training_model.onnx that ortlearn.artifacts.generate_artifacts wrote.');
    }
  }

  /**
   * With a flat optimizer model and the tensors on the host, the training model rewritten to
   * read the parameters and gradient buffers as the flat vectors and write the gradients as
   * one (`flatTrainingModel`): 5 tensors cross into a step and 2 out, not 3 a parameter, and
   * the vectors go from one model to the other as they are. Null where it does not apply
   * (the optimizer model is checked when it is attached).
   * @returns {{bytes: Uint8Array, total: number}|null}
   */
  _flatTrainingModel(optimizerModel, options) {
    if (optimizerModel === undefined || optimizerModel === null || usesWebGpu(options)) return null;
    let meta;
    try {
      const bytes = asModelBytes(optimizerModel, 'optimizer');
      meta = parseJsonMetadata(readMetadata(bytes), OPTIMIZER_METADATA_KEY, 'optimizer');
    } catch {
      return null;
    }
    const params = meta?.layout === 'flat' && Array.isArray(meta.params) ? meta.params : [];
    const trainable = this._trainLayout.trainable;
    if (!params.length || params.length !== trainable.length
        || !params.every((p) => this._paramTypes.has(p) && trainable.includes(p))) return null;
    const types = params.map((p) => this._paramTypes.get(p));
    const shapes = types.map((t) => t.shape);
    const taken = new Set([...this._trainIO.inputs, ...this._trainIO.outputs].map((v) => v.name));
    if (types.some((t) => t.dtype !== types[0].dtype) || shapes.some((sh) => sh.includes(0))
        || Object.values(FLAT_TRAINING).some((n) => taken.has(n))) return null;
    const bytes = flatTrainingModel(this._trainBytes,
      { params, shapes, dtype: types[0].dtype, names: FLAT_TRAINING },
      GRAD_BUFFER_SUFFIX, GRAD_OUTPUT_SUFFIX);
    return { bytes, params };
  }

  /** Compare the checkpoint with the models' parameter inputs (Python's check_matches). */
  _checkState() {
    const typeOf = (io) => new Map(io.inputs.map((i) => [i.name, i]));
    const train = typeOf(this._trainIO);
    /** @type {Map<string, {dtype: string, shape: number[]}>} */
    const expected = new Map();
    for (const name of [...this._trainLayout.trainable, ...this._trainLayout.frozen]) {
      expected.set(name, train.get(name));
    }
    if (this._evalLayout) {
      const evalTypes = typeOf(this._evalIO);
      for (const name of [...this._evalLayout.trainable, ...this._evalLayout.frozen]) {
        if (!expected.has(name)) {
          if (!evalTypes.has(name)) {
            throw new Error(`The eval model's metadata names the parameter ${JSON.stringify(name)}, `
              + 'which is not one of its inputs.');
          }
          expected.set(name, evalTypes.get(name));
        }
      }
    }
    const params = this._state.parameters;
    const problems = [];
    const missing = [...expected.keys()].filter((n) => !params.has(n));
    const extra = [...params.keys()].filter((n) => !expected.has(n));
    if (missing.length) problems.push(`missing parameters ${JSON.stringify(missing)}`);
    if (extra.length) problems.push(`unexpected parameters ${JSON.stringify(extra)}`);
    for (const [name, info] of expected) {
      const p = params.get(name);
      if (!p) continue;
      if (info.dtype !== p.dtype || !shapeMatches(info.shape, p.shape, null)) {
        problems.push(`${JSON.stringify(name)} is ${p.dtype} [${p.shape}] in the checkpoint, `
          + `${info.dtype ?? 'of an unknown type'} ${showShape(info.shape)} in the model`);
      }
    }
    const trainable = new Set(this._trainLayout.trainable);
    for (const [name, p] of params) {
      if (expected.has(name) && p.requiresGrad !== trainable.has(name)) {
        problems.push(`${JSON.stringify(name)} is ${p.requiresGrad ? 'trainable' : 'frozen'} in `
          + 'the checkpoint but not in the model');
      }
    }
    if (problems.length) {
      throw new Error(`The checkpoint does not match the model: ${problems.join('; ')}. Load the `
        + 'checkpoint that was written with these training artifacts.');
    }
    // A checkpoint saved from a diverged run: training would resume from NaN.
    const broken = this._trainLayout.trainable.filter((n) => {
      const p = params.get(n);
      return !p.nominal && (p.dtype === 'float32' || p.dtype === 'float64')
        && !p.data.every(Number.isFinite);
    });
    if (broken.length) {
      throw new Error(`The trained parameters ${JSON.stringify(broken)} hold NaN or infinite `
        + 'values (a checkpoint saved from a run that diverged?): training would go on from '
        + 'them. Load a checkpoint saved before the divergence.');
    }
    const types = new Map();
    for (const name of expected.keys()) {
      const p = params.get(name);
      types.set(name, { dtype: p.dtype, shape: [...p.shape] });
    }
    return types;
  }

  _tensor(dtype, data, shape) {
    return new this._ort.Tensor(dtype, data, shape);
  }

  _zeros(dtype, shape) {
    const info = DTYPES.get(dtype);
    if (!info) throw new TypeError(`Cannot make a tensor of ${dtype}.`);
    return this._tensor(dtype, new info.array(sizeOf(shape)), [...shape]);
  }

  _initParameters() {
    const params = this._state.parameters;
    /** @type {Map<string, OrtTensor>} the live values */
    this._params = new Map();
    /** names without a value yet (a nominal checkpoint) */
    this._missing = new Set();
    for (const [name, { dtype, shape }] of this._paramTypes) {
      const p = params.get(name);
      if (p.nominal) {
        this._missing.add(name);
        this._params.set(name, this._zeros(dtype, shape));
      } else {
        this._params.set(name, this._tensor(dtype, p.data.slice(), [...shape]));
      }
    }
    /** @type {Map<string, OrtTensor>} accumulated gradients: zeros, as a new session's */
    this._grads = new Map(this._trainLayout.trainable.map((n) => {
      const { dtype, shape } = this._paramTypes.get(n);
      return [n, this._zeros(dtype, shape)];
    }));
    // A new session starts with a reset, as onnxruntime-training's does.
    this._resetPending = true;
    this._resetTrue = this._tensor('bool', new Uint8Array([1]), []);
    this._resetFalse = this._tensor('bool', new Uint8Array([0]), []);
    /** @type {Map<string, OrtTensor>} the inputs' gradients of the last step */
    this._inputGrads = new Map();
    const snap = this._state.optimizerState;
    this._savedOptimizer = snap ?? null;
  }

  async _attachOptimizer(optimizerModel) {
    const bytes = asModelBytes(optimizerModel, 'optimizer');
    const io = readGraphIO(bytes);
    const meta = parseJsonMetadata(readMetadata(bytes), OPTIMIZER_METADATA_KEY, 'optimizer');
    // the flat layout's one vector is called 'params', as the sequence of all parameters
    const sequences = io.inputs.filter((i) => i.kind === 'sequence'
      || (meta?.layout !== 'flat' && SEQUENCE_INPUTS.includes(i.name)));
    if (sequences.length) {
      throw new Error('The optimizer model is in the sequence layout (its inputs '
        + `${JSON.stringify(sequences.map((i) => i.name))} are tensor sequences, onnxruntime-`
        + 'training\'s layout that generate_artifacts writes), and onnxruntime\'s JS API cannot '
        + 'feed tensor sequences. Export the tensor layout: `python -m ortlearn export-web '
        + 'ARTIFACTS_DIR`, or in Python `onnx.save(ortlearn.optim.unpack_optimizer_model('
        + 'onnx.load("optimizer_model.onnx")), "optimizer_model.onnx")`.');
    }
    if (meta === null) {
      throw new Error(`The optimizer model has no metadata_props[${JSON.stringify(OPTIMIZER_METADATA_KEY)}]: `
        + 'it was not written by ortlearn.artifacts.generate_artifacts.');
    }
    const layout = {
      params: stringList(meta.params ?? [], 'the optimizer metadata\'s params'),
      states: stringList(meta.states ?? [], 'the optimizer metadata\'s states'),
      hyper: meta.hyper && typeof meta.hyper === 'object' ? meta.hyper : {},
      flat: meta.layout === 'flat',
    };
    const trainable = this._trainLayout.trainable;
    if ([...layout.params].sort().join('\u0000') !== [...trainable].sort().join('\u0000')) {
      throw new Error('The optimizer model does not update the trainable parameters of the '
        + `training model: optimizer parameters ${JSON.stringify(layout.params)}, trainable `
        + `parameters ${JSON.stringify(trainable)}.`);
    }
    const inputs = new Map(io.inputs.map((i) => [i.name, i]));
    const outputs = new Set(io.outputs.map((o) => o.name));
    const updatedNames = layout.flat ? [FLAT_PARAMS] : trainable;
    const wanted = [LEARNING_RATE, STEP, ...updatedNames.flatMap((p) => [p, `${p}${GRADIENT_SUFFIX}`,
      ...layout.states.map((s) => `${p}.${s}`)])];
    const wantedOut = updatedNames.flatMap((p) => [`${p}${UPDATED_SUFFIX}`,
      ...layout.states.map((s) => `${p}.${s}${UPDATED_SUFFIX}`)]);
    const missing = [...wanted.filter((n) => !inputs.has(n)), ...wantedOut.filter((n) => !outputs.has(n))];
    if (missing.length) {
      throw new Error(`The optimizer model lacks the inputs or outputs ${JSON.stringify(missing)}.`);
    }
    const saved = this._checkSavedOptimizer(layout);
    let sessionOptions = this._sessionOptions;
    if (layout.flat) {
      this._flat = this._flatLayout(layout, meta.shapes, inputs.get(FLAT_PARAMS).dtype, saved);
      // the updated vector is cut into the parameters' views on the host
      sessionOptions = { ...sessionOptions, preferredOutputLocation: 'cpu' };
    } else {
      /** @type {Map<string, Map<string, OrtTensor>>} */
      this._optStates = new Map(trainable.map((p) => {
        const { dtype, shape } = this._paramTypes.get(p);
        return [p, new Map(layout.states.map((s) => {
          const value = saved?.states.get(p).get(s);
          return [s, value ? this._tensor(dtype, value.data.slice(), [...shape]) : this._zeros(dtype, shape)];
        }))];
      }));
    }
    this._step = saved ? BigInt(saved.step) : 0n;
    const lr = saved ? saved.learningRate : (typeof layout.hyper.lr === 'number'
      ? layout.hyper.lr : DEFAULT_LEARNING_RATE);
    // shape [1] in onnxruntime-training's layout, [] in ortlearn's older tensor layout
    this._scalarShape = {};
    for (const name of [LEARNING_RATE, STEP]) {
      const shape = inputs.get(name).shape;
      const fixed = shape && shape.every((d) => typeof d === 'number') ? shape : [1];
      if (sizeOf(fixed) !== 1) {
        throw new Error(`The optimizer model declares ${name} of shape ${showShape(shape)}: `
          + 'a single value is expected.');
      }
      this._scalarShape[name] = fixed;
    }
    this._lr = lr;
    this._lrTensor = this._tensor('float32', new Float32Array([lr]), this._scalarShape[LEARNING_RATE]);
    this._optimizerLayout = layout;
    this._optimizerBytes = bytes;
    this._optimizer = await this._ort.InferenceSession.create(bytes, sessionOptions);
  }

  /**
   * Where each parameter lies in the flat layout's vector, and its optimizer states as vectors.
   * @returns {{names: string[], offsets: number[], sizes: number[], dtype: string,
   *   gradient: ArrayLike<number>, views: OrtTensor[], states: Map<string, OrtTensor>}}
   */
  _flatLayout(layout, shapes, dtype, saved) {
    if (!Array.isArray(shapes) || shapes.length !== layout.params.length) {
      throw new Error('The flat optimizer model\'s metadata lacks the parameters\' "shapes" (one '
        + 'per parameter): write it with ortlearn.optim.build_optimizer_model(..., layout="flat").');
    }
    const offsets = [];
    const sizes = [];
    let total = 0;
    layout.params.forEach((p, i) => {
      const { dtype: own, shape } = this._paramTypes.get(p);
      if (own !== dtype || !Array.isArray(shapes[i]) || shapes[i].join() !== shape.join()
          || shapes[i].length !== shape.length) {
        throw new Error(`The flat optimizer model holds ${p} as ${dtype} [${shapes[i]}]; the training `
          + `model declares ${own} [${shape}]. Export the optimizer model of these artifacts again.`);
      }
      offsets.push(total);
      sizes.push(sizeOf(shape));
      total += sizeOf(shape);
    });
    const { array } = DTYPES.get(dtype);
    const states = new Map(layout.states.map((s) => {
      const data = new array(total);
      if (saved) layout.params.forEach((p, i) => data.set(saved.states.get(p).get(s).data, offsets[i]));
      return [s, this._tensor(dtype, data, [total])];
    }));
    // with the flat training model, the accumulated gradients come as this vector
    const gradients = this._flatTraining ? this._tensor(dtype, new array(total), [total]) : null;
    return {
      names: layout.params, offsets, sizes, dtype, gradient: new array(total), views: [], states,
      gradients,
    };
  }

  /** The optimizer state of each parameter: `[param, state, OrtTensor]` (views in the flat layout). */
  * _optimizerStates() {
    if (!this._flat) {
      for (const [p, st] of this._optStates) for (const [s, tensor] of st) yield [p, s, tensor];
      return;
    }
    const { names, offsets, sizes, states } = this._flat;
    for (const [i, p] of names.entries()) {
      const { dtype, shape } = this._paramTypes.get(p);
      for (const [s, vector] of states) {
        yield [p, s, this._tensor(dtype, vector.data.subarray(offsets[i], offsets[i] + sizes[i]), [...shape])];
      }
    }
  }

  _checkSavedOptimizer(layout) {
    const saved = this._savedOptimizer;
    if (!saved) return null;
    const problems = [];
    for (const p of layout.params) {
      const { dtype, shape } = this._paramTypes.get(p);
      for (const s of layout.states) {
        const value = saved.states.get(p)?.get(s);
        if (!value) {
          problems.push(`it lacks ${p}.${s}`);
        } else if (value.dtype !== dtype || value.shape.join() !== shape.join()
            || value.shape.length !== shape.length) {
          problems.push(`${p}.${s} is ${value.dtype} [${value.shape}], the parameter ${dtype} [${shape}]`);
        }
      }
    }
    if (problems.length) {
      throw new Error('The checkpoint\'s optimizer state does not match the optimizer model: '
        + `${problems.join('; ')}. Load the checkpoint without its optimizer state `
        + '(state.optimizerState = null) to start the optimizer afresh.');
    }
    return saved;
  }

  // ------------------------------------------------------------------ guards

  _requireOpen(method) {
    if (this._closed) {
      throw new Error(`TrainingSession.${method} was called after release(): the session `
        + 'released its onnxruntime sessions. Create a new TrainingSession to go on training.');
    }
  }

  _enter(method) {
    if (this._closed) {
      throw new Error(`TrainingSession.${method} was called after release(): the session `
        + 'released its onnxruntime sessions. Create a new TrainingSession to go on training.');
    }
    if (this._busy) {
      throw new Error(`TrainingSession.${method} was called while ${this._busy} is still running: `
        + 'await each call before making the next one.');
    }
    this._busy = method;
  }

  _leave() {
    this._busy = null;
  }

  async _guarded(method, body) {
    this._enter(method);
    try {
      return await body();
    } finally {
      this._leave();
    }
  }

  _requireValues(method) {
    if (this._missing.size) {
      throw new Error(`${method} needs the parameters' values, and the checkpoint is nominal `
        + `(names and shapes only; no value for ${JSON.stringify([...this._missing])}). Load them `
        + 'first: loadParametersBuffer(buffer, false) with a buffer of all the parameters, or '
        + 'open a complete checkpoint.');
    }
  }

  _requireEval(method) {
    if (!this._evalSess) {
      throw new Error(`${method} needs an eval model: pass evalModel to TrainingSession.create.`);
    }
  }

  _requireOptimizer(method) {
    if (!this._optimizer) {
      throw new Error(`${method} needs an optimizer model: pass optimizerModel to `
        + 'TrainingSession.create.');
    }
  }

  /** The user feeds checked against the model's declared inputs: `{name: tensor}`. */
  _userFeeds(feeds, layout, io, what) {
    const names = layout.userInputs;
    let given;
    if (Array.isArray(feeds)) {
      if (feeds.length !== names.length) {
        throw new Error(`${what} expects ${names.length} input(s) ${JSON.stringify(names)}, got `
          + `${feeds.length}.`);
      }
      given = new Map(names.map((n, i) => [n, feeds[i]]));
    } else if (feeds !== null && typeof feeds === 'object' && !isTensorLike(feeds)) {
      given = new Map(Object.entries(feeds));
      const missing = names.filter((n) => !given.has(n));
      const unknown = [...given.keys()].filter((n) => !names.includes(n));
      if (missing.length || unknown.length) {
        throw new Error(`${what} ${missing.length ? `misses the feed(s) ${JSON.stringify(missing)}` : ''}`
          + `${missing.length && unknown.length ? ' and ' : ''}`
          + `${unknown.length ? `got the unknown feed(s) ${JSON.stringify(unknown)}` : ''}; the `
          + `model's user inputs are ${JSON.stringify(names)}.`);
      }
    } else {
      throw new TypeError(`${what} takes its inputs as an object {name: ort.Tensor} or an array `
        + `in the order ${JSON.stringify(names)}.`);
    }
    io.byName ??= new Map(io.inputs.map((i) => [i.name, i]));
    const declared = io.byName;
    const symbols = new Map();
    const out = {};
    for (const name of names) {
      const value = given.get(name);
      const info = declared.get(name);
      if (!isTensorLike(value)) {
        throw new TypeError(`Input ${JSON.stringify(name)} of ${what} must be an ort.Tensor, got `
          + `${value === null ? 'null' : Array.isArray(value) ? 'an array'
            : typeof value === 'object' ? value.constructor?.name : typeof value}; wrap the `
          + `data: new ort.Tensor(${JSON.stringify(info?.dtype ?? 'float32')}, data, dims).`);
      }
      if (info?.dtype && value.type !== info.dtype) {
        throw new TypeError(`Input ${JSON.stringify(name)} of ${what} must be ${info.dtype}, got a `
          + `${value.type} tensor; create it as new ort.Tensor(${JSON.stringify(info.dtype)}, `
          + `${info.dtype === 'int64' ? 'BigInt64Array.from(...)' : 'data'}, dims).`);
      }
      if (info && !shapeMatches(info.shape, value.dims, symbols)) {
        throw new Error(`Input ${JSON.stringify(name)} of ${what} has shape [${value.dims}]; the `
          + `model declares ${showShape(info.shape)}${symbols.size ? ` (so far ${[...symbols]
            .map(([k, v]) => `${k}=${v}`).join(', ')})` : ''}. Give every input the same `
          + 'batch size.');
      }
      out[name] = value;
    }
    return out;
  }

  // ------------------------------------------------------------------ names

  /** User inputs of the training model, in order. @returns {string[]} */
  get trainingInputNames() {
    return [...this._trainLayout.userInputs];
  }

  /** User outputs of the training model (the loss first). @returns {string[]} */
  get trainingOutputNames() {
    return [...this._trainLayout.userOutputs];
  }

  /** User inputs of the eval model ([] without one). @returns {string[]} */
  get evalInputNames() {
    return this._evalLayout ? [...this._evalLayout.userInputs] : [];
  }

  /** User outputs of the eval model ([] without one). @returns {string[]} */
  get evalOutputNames() {
    return this._evalLayout ? [...this._evalLayout.userOutputs] : [];
  }

  /** The CheckpointState the session started from (`saveCheckpoint` updates it). */
  get checkpointState() {
    return this._state;
  }

  // ------------------------------------------------------------------ training loop

  /**
   * Run the training model: the user outputs, and the gradients accumulated (or, after a
   * reset, replaced). Frozen parameters the step updates (BatchNormalization's running
   * statistics) take their new values.
   * @param {Object<string, OrtTensor>|OrtTensor[]} feeds the user inputs, by name or in the
   *   order of `trainingInputNames`
   * @returns {Promise<Object<string, OrtTensor>>} the user outputs, by name
   */
  async runTrainStep(feeds) {
    return this._guarded('runTrainStep', async () => {
      this._requireValues('runTrainStep');
      const layout = this._trainLayout;
      const user = this._userFeeds(feeds, layout, this._trainIO, 'runTrainStep');
      // the names of a step, made once: a step of a small model takes tens of microseconds
      const flat = this._flatTraining ? this._flat : null;
      const names = layout.stepNames ??= {
        params: flat ? layout.frozen : [...layout.trainable, ...layout.frozen],
        buffers: layout.trainable.map((n) => `${n}${GRAD_BUFFER_SUFFIX}`),
        gradOut: flat ? [FLAT_TRAINING.gradient]
          : layout.trainable.map((n) => `${n}${GRAD_OUTPUT_SUFFIX}`),
        updatedOut: layout.updated.map((n) => `${n}${UPDATED_SUFFIX}`),
        inputGradOut: layout.inputGrads.map((n) => `${n}${GRAD_OUTPUT_SUFFIX}`),
      };
      names.fetches ??= [...layout.userOutputs, ...names.gradOut, ...names.updatedOut,
        ...names.inputGradOut];
      const inputs = user;
      for (const name of names.params) inputs[name] = this._params.get(name);
      if (flat) {
        inputs[FLAT_TRAINING.params] = await this._flatParameters();
        inputs[FLAT_TRAINING.buffer] = flat.gradients;
      } else {
        layout.trainable.forEach((n, i) => { inputs[names.buffers[i]] = this._grads.get(n); });
      }
      for (const name of layout.inputGrads) {
        // an input's gradient is the step's own: its buffer is zeros
        inputs[`${name}${GRAD_BUFFER_SUFFIX}`] = this._zeros(user[name].type, user[name].dims);
      }
      inputs[LAZY_RESET_GRAD] = this._resetPending ? this._resetTrue : this._resetFalse;
      const results = await this._trainSess.run(inputs, names.fetches);
      if (flat) {
        flat.gradients = results[FLAT_TRAINING.gradient];
      } else {
        layout.trainable.forEach((n, i) => {
          drop(this._grads.get(n));
          this._grads.set(n, results[names.gradOut[i]]);
        });
      }
      layout.updated.forEach((n, i) => {
        drop(this._params.get(n));
        this._params.set(n, results[names.updatedOut[i]]);
      });
      for (const t of this._inputGrads.values()) drop(t);
      this._inputGrads = new Map(layout.inputGrads.map((n, i) => [n, results[names.inputGradOut[i]]]));
      this._resetPending = false;
      return Object.fromEntries(layout.userOutputs.map((n) => [n, results[n]]));
    });
  }

  /**
   * Run the eval model with the current parameters.
   * @param {Object<string, OrtTensor>|OrtTensor[]} feeds the user inputs, by name or in the
   *   order of `evalInputNames`
   * @returns {Promise<Object<string, OrtTensor>>} the user outputs, by name
   */
  async runEvalStep(feeds) {
    return this._guarded('runEvalStep', async () => {
      this._requireEval('runEvalStep');
      this._requireValues('runEvalStep');
      const layout = this._evalLayout;
      const inputs = this._userFeeds(feeds, layout, this._evalIO, 'runEvalStep');
      for (const name of [...layout.trainable, ...layout.frozen]) inputs[name] = this._params.get(name);
      const results = await this._evalSess.run(inputs, layout.userOutputs);
      return Object.fromEntries(layout.userOutputs.map((n) => [n, results[n]]));
    });
  }

  /** Reset the accumulated gradients at the next `runTrainStep` (nothing is written now). */
  lazyResetGrad() {
    this._requireOpen('lazyResetGrad');
    this._resetPending = true;
  }

  /**
   * Update the trainable parameters with the accumulated gradients (one run of the optimizer
   * model, with step = updates made + 1).
   * @returns {Promise<void>}
   */
  async runOptimizerStep() {
    return this._guarded('runOptimizerStep', async () => {
      this._requireOptimizer('runOptimizerStep');
      this._requireValues('runOptimizerStep');
      if (this._step >= LAST_STEP) {
        throw new Error(`The optimizer has made ${this._step} steps, the most its int64 step `
          + 'count holds. Reset the optimizer state or load another checkpoint.');
      }
      const layout = this._optimizerLayout;
      const feeds = {
        [LEARNING_RATE]: this._lrTensor,
        [STEP]: this._tensor('int64', new BigInt64Array([this._step + 1n]), this._scalarShape[STEP]),
      };
      if (this._flat) {
        await this._flatOptimizerStep(feeds);
        this._step += 1n;
        return;
      }
      const fetches = [];
      for (const p of layout.params) {
        feeds[p] = this._params.get(p);
        feeds[`${p}${GRADIENT_SUFFIX}`] = this._grads.get(p);
        fetches.push(`${p}${UPDATED_SUFFIX}`);
        for (const s of layout.states) {
          feeds[`${p}.${s}`] = this._optStates.get(p).get(s);
          fetches.push(`${p}.${s}${UPDATED_SUFFIX}`);
        }
      }
      const results = await this._optimizer.run(feeds, fetches);
      for (const p of layout.params) {
        drop(this._params.get(p));
        this._params.set(p, results[`${p}${UPDATED_SUFFIX}`]);
        for (const s of layout.states) {
          drop(this._optStates.get(p).get(s));
          this._optStates.get(p).set(s, results[`${p}.${s}${UPDATED_SUFFIX}`]);
        }
      }
      this._step += 1n;
    });
  }

  /**
   * One run of a flat-layout optimizer model: three vectors cross into onnxruntime whatever
   * the number of parameters; the parameters become views of the updated vector.
   */
  async _flatOptimizerStep(feeds) {
    const flat = this._flat;
    const { names, offsets, dtype } = flat;
    const total = flat.gradient.length;
    feeds[FLAT_PARAMS] = await this._flatParameters();
    if (flat.gradients) {
      feeds[`${FLAT_PARAMS}${GRADIENT_SUFFIX}`] = flat.gradients;
    } else {
      for (const [i, p] of names.entries()) flat.gradient.set(await hostData(this._grads.get(p)), offsets[i]);
      feeds[`${FLAT_PARAMS}${GRADIENT_SUFFIX}`] = this._tensor(dtype, flat.gradient, [total]);
    }
    for (const [s, tensor] of flat.states) feeds[`${FLAT_PARAMS}.${s}`] = tensor;
    const fetches = [`${FLAT_PARAMS}${UPDATED_SUFFIX}`,
      ...[...flat.states.keys()].map((s) => `${FLAT_PARAMS}.${s}${UPDATED_SUFFIX}`)];
    const results = await this._optimizer.run(feeds, fetches);
    for (const s of flat.states.keys()) flat.states.set(s, results[`${FLAT_PARAMS}.${s}${UPDATED_SUFFIX}`]);
    this._setFlatParameters(results[fetches[0]]);
  }

  /**
   * The trainable parameters as the flat vector: the last update's, unless a parameter was
   * replaced since (loadParametersBuffer), then gathered.
   * @returns {Promise<OrtTensor>}
   */
  async _flatParameters() {
    const flat = this._flat;
    const { names, offsets, dtype } = flat;
    if (flat.vector && names.every((p, i) => this._params.get(p) === flat.views[i])) {
      return flat.vector;
    }
    const total = flat.gradient.length;
    const data = new (DTYPES.get(dtype).array)(total);
    for (const [i, p] of names.entries()) data.set(await hostData(this._params.get(p)), offsets[i]);
    this._setFlatParameters(this._tensor(dtype, data, [total]));
    return flat.vector;
  }

  /** Make `vector` the trainable parameters: each one a view of its part. */
  _setFlatParameters(vector) {
    const flat = this._flat;
    const { names, offsets, sizes, dtype } = flat;
    flat.vector = vector;
    flat.views = names.map((p, i) => {
      drop(this._params.get(p));
      const view = this._tensor(dtype, vector.data.subarray(offsets[i], offsets[i] + sizes[i]),
        [...this._paramTypes.get(p).shape]);
      this._params.set(p, view);
      return view;
    });
  }

  /**
   * Set the learning rate of the next optimizer steps.
   * @param {number} learningRate finite, >= 0, within float32's range
   */
  setLearningRate(learningRate) {
    this._requireOpen('setLearningRate');
    this._requireOptimizer('setLearningRate');
    if (typeof learningRate !== 'number') {
      throw new TypeError(`learning_rate must be a number, got ${typeof learningRate}.`);
    }
    if (!(Number.isFinite(learningRate) && learningRate >= 0)) {
      throw new Error(`learning_rate must be a finite number >= 0, got ${pyFloatRepr(learningRate)}.`);
    }
    if (learningRate > FLOAT32_MAX) {
      throw new Error(`learning_rate ${pyFloatRepr(learningRate)} overflows float32 (at most `
        + '3.403e+38), the optimizer model\'s learning-rate type.');
    }
    if (learningRate !== this._lr) {
      this._lr = learningRate;
      this._lrTensor = this._tensor('float32', new Float32Array([learningRate]),
        this._scalarShape[LEARNING_RATE]);
    }
  }

  /**
   * The learning rate of the next optimizer step (as the float32 the optimizer model gets).
   * @returns {number}
   */
  getLearningRate() {
    this._requireOpen('getLearningRate');
    this._requireOptimizer('getLearningRate');
    return Math.fround(this._lr);
  }

  /** Number of optimizer updates made so far (a bigint beyond 2**53). @returns {number|bigint} */
  get optimizerStep() {
    if (!this._optimizer) return null;
    return this._step <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(this._step) : this._step;
  }

  /**
   * The gradient of the loss with respect to a user input, computed by the last training
   * step (for the inputs the training model's `input_gradients` metadata lists).
   * @param {string} name
   * @returns {OrtTensor}
   */
  getInputGradient(name) {
    this._requireOpen('getInputGradient');
    if (!this._trainLayout.inputGrads.includes(name)) {
      throw new Error(`The training model outputs no gradient for ${JSON.stringify(name)}; it `
        + `does for ${JSON.stringify(this._trainLayout.inputGrads)}.`);
    }
    if (!this._inputGrads.has(name)) {
      throw new Error(`No gradient of ${JSON.stringify(name)} yet: run runTrainStep first.`);
    }
    return this._inputGrads.get(name);
  }

  // ------------------------------------------------------------------ parameters

  _paramNames(trainableOnly) {
    const trainable = this._trainLayout.trainable;
    return trainableOnly ? [...trainable]
      : [...trainable, ...[...this._paramTypes.keys()].filter((n) => !trainable.includes(n))];
  }

  _bufferDtype(names) {
    const dtypes = [...new Set(names.map((n) => this._paramTypes.get(n).dtype))];
    if (dtypes.length > 1) {
      throw new TypeError(`The parameters do not share one dtype (${dtypes.join(', ')}): they `
        + 'cannot share a buffer.');
    }
    return dtypes[0] ?? 'float32';
  }

  /**
   * Number of scalars in the (trainable) parameters.
   * @param {boolean} [trainableOnly=true]
   * @returns {number}
   */
  getParametersSize(trainableOnly = true) {
    this._requireOpen('getParametersSize');
    return this._paramNames(trainableOnly)
      .reduce((n, name) => n + sizeOf(this._paramTypes.get(name).shape), 0);
  }

  /**
   * The parameters flattened and concatenated into one 1-D tensor, in the training model's
   * order: the trainable ones, then (with `trainableOnly` false) the frozen ones.
   * @param {boolean} [trainableOnly=true]
   * @returns {Promise<OrtTensor>} float32 (the parameters' dtype)
   */
  async getContiguousParameters(trainableOnly = true) {
    return this._guarded('getContiguousParameters', async () => {
      this._requireValues('getContiguousParameters');
      const names = this._paramNames(trainableOnly);
      const dtype = this._bufferDtype(names);
      const out = new (DTYPES.get(dtype).array)(this.getParametersSize(trainableOnly));
      let offset = 0;
      for (const name of names) {
        const data = await this._params.get(name).getData();
        out.set(data, offset);
        offset += data.length;
      }
      return this._tensor(dtype, out, [out.length]);
    });
  }

  /**
   * Load the parameters from one contiguous buffer (the inverse of `getContiguousParameters`).
   * With a nominal checkpoint, this is how the parameters get their values: all at once
   * (`trainableOnly` false).
   * @param {Float32Array|Float64Array|OrtTensor|Uint8Array} buffer the values, in the order of
   *   `getContiguousParameters(trainableOnly)`; a Uint8Array is read as their raw
   *   little-endian bytes (as onnxruntime-web's training API takes them)
   * @param {boolean} [trainableOnly=true]
   * @returns {Promise<void>}
   */
  async loadParametersBuffer(buffer, trainableOnly = true) {
    return this._guarded('loadParametersBuffer', async () => {
      const names = this._paramNames(trainableOnly);
      const left = trainableOnly ? this._paramNames(false).slice(names.length)
        .filter((n) => this._missing.has(n)) : [];
      if (left.length) {
        throw new Error(`The checkpoint is nominal and the frozen parameters ${JSON.stringify(left)} `
          + 'would stay without values: load all the parameters at once, loadParametersBuffer('
          + `buffer, false) with a buffer of ${this.getParametersSize(false)} elements (trainable `
          + 'then frozen, as getContiguousParameters(false) orders them).');
      }
      const dtype = this._bufferDtype(names);
      const info = DTYPES.get(dtype);
      const expected = this.getParametersSize(trainableOnly);
      let data = buffer;
      let given = null;
      if (isTensorLike(buffer)) {
        given = buffer.type;
        data = await buffer.getData();
      }
      if (data instanceof Uint8Array && !(info.array === Uint8Array) && given === null) {
        if (data.byteLength !== expected * info.itemsize) {
          throw new Error(`The buffer has ${data.byteLength} bytes, the `
            + `${trainableOnly ? 'trainable ' : ''}parameters have ${expected} ${dtype} values `
            + `(${expected * info.itemsize} bytes).`);
        }
        data = new info.array(data.slice().buffer);
      }
      if (!ArrayBuffer.isView(data)) {
        throw new TypeError(`loadParametersBuffer takes a ${info.array.name} or an ort.Tensor of `
          + `${dtype}, got ${data === null ? 'null' : typeof data === 'object' ? data.constructor?.name : typeof data}.`);
      }
      if (data.length !== expected) {
        throw new Error(`The buffer has ${data.length} elements, the `
          + `${trainableOnly ? 'trainable ' : ''}parameters have ${expected}`
          + `${trainableOnly ? ` (all the parameters: ${this.getParametersSize(false)}, with `
            + 'trainableOnly false)' : ''}.`);
      }
      if (!(data instanceof info.array) || (given !== null && given !== dtype)) {
        throw new TypeError(`The buffer must hold ${dtype} values (a ${info.array.name}), got `
          + `${given ?? data.constructor.name}.`);
      }
      let offset = 0;
      for (const name of names) {
        const { shape } = this._paramTypes.get(name);
        const size = sizeOf(shape);
        drop(this._params.get(name));
        this._params.set(name, this._tensor(dtype, data.slice(offset, offset + size), [...shape]));
        this._missing.delete(name);
        offset += size;
      }
    });
  }

  // ------------------------------------------------------------------ checkpoint, export

  /**
   * Copy the live values (parameters, and the optimizer state when the session has an
   * optimizer model) into the CheckpointState, then write it.
   * @param {boolean} [includeOptimizerState=true]
   * @returns {Promise<Uint8Array>} the checkpoint file's bytes (Python's
   *   `CheckpointState.load_checkpoint` reads them bit for bit)
   */
  async saveCheckpoint(includeOptimizerState = true) {
    return this._guarded('saveCheckpoint', async () => {
      await this._syncState();
      return this._state.saveCheckpoint(includeOptimizerState);
    });
  }

  /** Copy the live values into the CheckpointState. */
  async _syncState() {
    const params = this._state.parameters;
    for (const [name, tensor] of this._params) {
      if (this._missing.has(name)) continue;
      const p = params.get(name);
      p.data = (await tensor.getData()).slice();
      p.nominal = false;
    }
    if (this._optimizer) {
      const states = new Map();
      for (const [p, s, tensor] of this._optimizerStates()) {
        const { dtype, shape } = this._paramTypes.get(p);
        if (!states.has(p)) states.set(p, new Map());
        states.get(p).set(s, { dtype, shape: [...shape], data: (await tensor.getData()).slice() });
      }
      this._state.optimizerState = {
        step: this._step <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(this._step) : this._step,
        learningRate: this._lr,
        states,
      };
    }
  }

  /**
   * The inference model: the eval model pruned to `graphOutputNames`, the current parameters
   * baked in as initializers, labels and the loss removed.
   * @param {string[]} graphOutputNames values of the eval model (e.g. its probabilities)
   * @returns {Promise<Uint8Array>} the ONNX model's bytes
   */
  async exportModelForInferencing(graphOutputNames) {
    return this._guarded('exportModelForInferencing', async () => {
      this._requireEval('exportModelForInferencing');
      this._requireValues('exportModelForInferencing');
      const params = new Map();
      for (const [name, tensor] of this._params) {
        const { dtype, shape } = this._paramTypes.get(name);
        params.set(name, { dtype, shape, data: await tensor.getData() });
      }
      const model = exportForInferencing(this._evalBytes, params, graphOutputNames);
      // An intermediate value has no declared type: onnxruntime infers it, and the model
      // declares it, as ONNX's checker requires of a graph output.
      const untyped = readGraphIO(model).outputs.filter((o) => o.kind === 'unknown');
      if (!untyped.length) return model;
      const probe = await this._ort.InferenceSession.create(model);
      try {
        const metadata = probe.outputMetadata;
        if (!Array.isArray(metadata)) return model; // onnxruntime-js before 1.22
        const outputTypes = new Map(metadata.filter((m) => m.isTensor)
          .map((m) => [m.name, { dtype: m.type, shape: m.shape }]));
        return exportForInferencing(this._evalBytes, params, graphOutputNames, { outputTypes });
      } finally {
        await probe.release();
      }
    });
  }

  /**
   * Release the onnxruntime sessions (and GPU buffers). Every other method throws afterwards;
   * releasing twice does nothing.
   * @returns {Promise<void>}
   */
  async release() {
    if (this._closed) return;
    if (this._busy) {
      throw new Error(`TrainingSession.release was called while ${this._busy} is still running: `
        + 'await it first.');
    }
    this._closed = true;
    const sessions = [this._trainSess, this._evalSess, this._optimizer].filter(Boolean);
    for (const s of sessions) await s.release();
    for (const t of this._params.values()) drop(t);
    for (const t of this._grads.values()) drop(t);
    for (const t of this._inputGrads.values()) drop(t);
    if (this._optStates) for (const st of this._optStates.values()) for (const t of st.values()) drop(t);
    if (this._flat) for (const t of this._flat.states.values()) drop(t);
    this._trainSess = this._evalSess = this._optimizer = null;
  }
}

const CREATE = Symbol('TrainingSession.create');
