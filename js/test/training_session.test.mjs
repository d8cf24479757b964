import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as ort from 'onnxruntime-node';
import { CheckpointState, TrainingSession, readGraphIO } from '../src/index.js';
import {
  F, N, linearBatches, linearEvalModel, linearTrainingModel, sequenceOptimizerModel,
  sgdOptimizerModel,
} from '../testing/onnx_builder.mjs';

const W0 = [0.25, -0.5];
const B0 = [0.1];

function state() {
  return CheckpointState.fromParameters({
    W: { dtype: 'float32', shape: [F, 1], data: new Float32Array(W0) },
    b: { dtype: 'float32', shape: [1], data: new Float32Array(B0) },
  });
}

async function open(rt = ort, { checkpointState = state(), optimizer = sgdOptimizerModel(), options } = {}) {
  return TrainingSession.create(rt, {
    checkpointState, trainModel: linearTrainingModel(), evalModel: linearEvalModel(), optimizerModel: optimizer,
  }, options);
}

function feeds(rt, batch) {
  return { X: new rt.Tensor('float32', batch.X, [N, F]), y: new rt.Tensor('float32', batch.y, [N, 1]) };
}

/** The gradient of the mean squared error, in float64. */
function gradient(W, b, { X, y }) {
  const gW = [0, 0];
  let gb = 0;
  let loss = 0;
  for (let r = 0; r < N; r++) {
    const d = X[r * F] * W[0] + X[r * F + 1] * W[1] + b[0] - y[r];
    loss += d * d / N;
    gW[0] += 2 * d * X[r * F] / N;
    gW[1] += 2 * d * X[r * F + 1] / N;
    gb += 2 * d / N;
  }
  return { gW, gb, loss };
}

function close(actual, expected, tol = 1e-5) {
  assert.equal(actual.length, expected.length);
  actual.forEach((a, i) => assert.ok(Math.abs(a - expected[i]) <= tol * (1 + Math.abs(expected[i])),
    `${[...actual]} vs ${expected}`));
}

test('train, optimize, accumulate, reset: the parameters follow SGD', async () => {
  const session = await open();
  assert.deepEqual(session.trainingInputNames, ['X', 'y']);
  assert.deepEqual(session.trainingOutputNames, ['loss', 'pred']);
  assert.deepEqual(session.evalInputNames, ['X', 'y']);
  assert.deepEqual(session.evalOutputNames, ['loss', 'pred']);
  assert.equal(session.getLearningRate(), Math.fround(0.1)); // the optimizer's hyper lr
  const [b1, b2, b3] = linearBatches(3);
  let W = [...W0];
  let b = [...B0];

  // one step
  const out = await session.runTrainStep(feeds(ort, b1));
  const g1 = gradient(W, b, b1);
  close([out.loss.data[0]], [g1.loss]);
  assert.deepEqual(out.pred.dims, [N, 1]);
  await session.runOptimizerStep();
  W = W.map((w, i) => w - Math.fround(0.1) * g1.gW[i]);
  b = [b[0] - Math.fround(0.1) * g1.gb];
  close((await session.getContiguousParameters()).data, [...W, ...b]);

  // two steps accumulated (no reset in between), then one update with their sum
  session.setLearningRate(0.05);
  assert.equal(session.getLearningRate(), Math.fround(0.05));
  session.lazyResetGrad();
  await session.runTrainStep([feeds(ort, b2).X, feeds(ort, b2).y]); // positional feeds
  await session.runTrainStep(feeds(ort, b3));
  const g2 = gradient(W, b, b2);
  const g3 = gradient(W, b, b3);
  await session.runOptimizerStep();
  W = W.map((w, i) => w - Math.fround(0.05) * (g2.gW[i] + g3.gW[i]));
  b = [b[0] - Math.fround(0.05) * (g2.gb + g3.gb)];
  close((await session.getContiguousParameters()).data, [...W, ...b]);

  // without lazyResetGrad, the next step adds to the gradients already applied
  await session.runTrainStep(feeds(ort, b1));
  const g4 = gradient(W, b, b1);
  await session.runOptimizerStep();
  W = W.map((w, i) => w - Math.fround(0.05) * (g2.gW[i] + g3.gW[i] + g4.gW[i]));
  b = [b[0] - Math.fround(0.05) * (g2.gb + g3.gb + g4.gb)];
  close((await session.getContiguousParameters()).data, [...W, ...b]);
  assert.equal(session.optimizerStep, 3);

  // eval model: the current parameters
  const ev = await session.runEvalStep(feeds(ort, b2));
  close([ev.loss.data[0]], [gradient(W, b, b2).loss]);

  // the checkpoint holds the live values, the step and the learning rate; the optimizer
  // state recorded the step fed at each update (1, 2, 3)
  const saved = await CheckpointState.loadCheckpoint(await session.saveCheckpoint());
  close(saved.parameters.get('W').data, W);
  assert.equal(saved.optimizerState.step, 3);
  assert.equal(saved.optimizerState.learningRate, 0.05);
  assert.deepEqual([...saved.optimizerState.states.get('W').get('last_step').data], [3, 3]);
  assert.deepEqual([...(await session.saveCheckpoint(false))].length > 0, true);
  await session.release();

  // resumed from it: the step count goes on
  const resumed = await open(ort, { checkpointState: saved });
  assert.equal(resumed.getLearningRate(), Math.fround(0.05));
  await resumed.runTrainStep(feeds(ort, b1));
  await resumed.runOptimizerStep();
  const again = await CheckpointState.loadCheckpoint(await resumed.saveCheckpoint());
  assert.equal(again.optimizerState.step, 4);
  assert.deepEqual([...again.optimizerState.states.get('b').get('last_step').data], [4]);
  await resumed.release();
});

test('contiguous parameters and loadParametersBuffer (federated learning calls)', async () => {
  const session = await open();
  assert.equal(session.getParametersSize(), 3);
  assert.equal(session.getParametersSize(false), 3);
  const flat = await session.getContiguousParameters();
  assert.equal(flat.type, 'float32');
  assert.deepEqual(flat.dims, [3]);
  assert.deepEqual([...flat.data], [...new Float32Array([...W0, ...B0])]);
  await session.loadParametersBuffer(new Float32Array([1, 2, 3]));
  assert.deepEqual([...(await session.getContiguousParameters(false)).data], [1, 2, 3]);
  await session.loadParametersBuffer(new ort.Tensor('float32', new Float32Array([4, 5, 6]), [3]));
  assert.deepEqual([...(await session.getContiguousParameters()).data], [4, 5, 6]);
  await session.loadParametersBuffer(new Uint8Array(new Float32Array([7, 8, 9]).buffer)); // raw bytes
  assert.deepEqual([...(await session.getContiguousParameters()).data], [7, 8, 9]);
  await assert.rejects(session.loadParametersBuffer(new Float32Array(2)), /The buffer has 2 elements, the trainable parameters have 3/);
  await assert.rejects(session.loadParametersBuffer(new Float64Array(3)), /must hold float32/);
  await assert.rejects(session.loadParametersBuffer(new ort.Tensor('int32', new Int32Array(3), [3])), /must hold float32/);
  await assert.rejects(session.loadParametersBuffer([1, 2, 3]), TypeError);
  const saved = await CheckpointState.loadCheckpoint(await session.saveCheckpoint());
  assert.deepEqual([...saved.parameters.get('b').data], [9]);
  await session.release();
});

test('a nominal checkpoint: steps refused until all the parameters are loaded', async () => {
  const nominal = CheckpointState.fromParameters({
    W: { dtype: 'float32', shape: [F, 1], data: new Float32Array(F) },
    b: { dtype: 'float32', shape: [1], data: new Float32Array(1) },
  }, {}, {}, { nominal: true });
  const session = await open(ort, { checkpointState: nominal });
  const [batch] = linearBatches(1);
  await assert.rejects(session.runTrainStep(feeds(ort, batch)), /checkpoint is nominal .*no value for \["W","b"\].*loadParametersBuffer\(buffer, false\)/);
  await assert.rejects(session.getContiguousParameters(), /nominal/);
  await assert.rejects(session.exportModelForInferencing(['pred']), /nominal/);
  await session.loadParametersBuffer(new Float32Array([...W0, ...B0]), false);
  await session.runTrainStep(feeds(ort, batch));
  const saved = await CheckpointState.loadCheckpoint(await session.saveCheckpoint());
  assert.equal(saved.isNominal, false);
  assert.deepEqual([...saved.parameters.get('W').data], [...new Float32Array(W0)]);
  await session.release();
});

test('clear errors: feeds, dtypes, shapes, checkpoints, optimizer layout, misuse', async () => {
  const session = await open();
  const [batch] = linearBatches(1);
  const good = feeds(ort, batch);
  await assert.rejects(session.runTrainStep({ X: good.X }), /runTrainStep misses the feed\(s\) \["y"\]; the model's user inputs are \["X","y"\]/);
  await assert.rejects(session.runTrainStep({ ...good, z: good.X }), /unknown feed\(s\) \["z"\]/);
  await assert.rejects(session.runTrainStep([good.X]), /expects 2 input\(s\)/);
  await assert.rejects(session.runTrainStep({ X: good.X, y: new ort.Tensor('float64', new Float64Array(N), [N, 1]) }),
    (err) => err instanceof TypeError && /Input "y" of runTrainStep must be float32, got a float64 tensor/.test(err.message));
  await assert.rejects(session.runTrainStep({ X: batch.X, y: good.y }), /Input "X" of runTrainStep must be an ort.Tensor, got Float32Array/);
  await assert.rejects(session.runTrainStep({ X: new ort.Tensor('float32', new Float32Array(3 * F), [3, F]), y: good.y }),
    /Input "y" of runTrainStep has shape \[4,1\]; the model declares \["N", 1\] \(so far N=3\)/);
  await assert.rejects(session.runEvalStep({ X: new ort.Tensor('float32', new Float32Array(3), [1, 3]), y: good.y }),
    /Input "X" of runEvalStep has shape \[1,3\]/);
  await assert.rejects(session.exportModelForInferencing(['nope']), /\["nope"\] are not values of the eval model/);
  assert.throws(() => session.setLearningRate(-1), /finite number >= 0/);
  assert.throws(() => session.setLearningRate(1e39), /overflows float32/);
  assert.throws(() => session.setLearningRate('0.1'), TypeError);
  // one call at a time
  const first = session.runTrainStep(good);
  await assert.rejects(session.runOptimizerStep(), /while runTrainStep is still running/);
  await first;
  await session.release();
  await assert.rejects(session.runTrainStep(good), /after release\(\)/);
  assert.throws(() => session.lazyResetGrad(), /after release\(\)/);
  await session.release(); // twice: nothing

  const extra = CheckpointState.fromParameters({
    W: { dtype: 'float32', shape: [F, 1], data: new Float32Array(F) },
    b: { dtype: 'float64', shape: [1], data: new Float64Array(1) },
    c: { dtype: 'float32', shape: [1], data: new Float32Array(1) },
  });
  await assert.rejects(open(ort, { checkpointState: extra }),
    /The checkpoint does not match the model: unexpected parameters \["c"\]; "b" is float64 \[1\] in the checkpoint, float32 \[1\] in the model/);
  const frozen = CheckpointState.fromParameters({ W: { dtype: 'float32', shape: [F, 1], data: new Float32Array(F) } },
    { b: { dtype: 'float32', shape: [1], data: new Float32Array(1) } });
  await assert.rejects(open(ort, { checkpointState: frozen }), /"b" is frozen in the checkpoint but not in the model/);
  const diverged = CheckpointState.fromParameters({
    W: { dtype: 'float32', shape: [F, 1], data: new Float32Array([NaN, 0]) },
    b: { dtype: 'float32', shape: [1], data: new Float32Array(1) },
  });
  await assert.rejects(open(ort, { checkpointState: diverged }), /\["W"\] hold NaN or infinite values/);
  await assert.rejects(open(ort, { optimizer: sequenceOptimizerModel() }),
    /sequence layout .*onnxruntime's JS API cannot feed tensor sequences.*python -m ortlearn export-web.*unpack_optimizer_model/);
  const withState = state();
  withState.setOptimizerState({ W: { exp_avg: new Float32Array(F) } }, 2, 0.1);
  await assert.rejects(open(ort, { checkpointState: withState }),
    /optimizer state does not match the optimizer model: it lacks W.last_step; it lacks b.last_step/);
  await assert.rejects(TrainingSession.create({}, {}), /needs the onnxruntime namespace/);
  await assert.rejects(TrainingSession.create(ort, { trainModel: linearTrainingModel() }), /needs artifacts.checkpointState/);
  assert.throws(() => new TrainingSession(), /TrainingSession.create/);
});

test('without an optimizer or an eval model', async () => {
  const session = await TrainingSession.create(ort, { checkpointState: await state().saveCheckpoint(), trainModel: linearTrainingModel() });
  await assert.rejects(session.runOptimizerStep(), /needs an optimizer model/);
  await assert.rejects(session.runEvalStep({}), /needs an eval model/);
  assert.throws(() => session.getLearningRate(), /needs an optimizer model/);
  assert.equal(session.optimizerStep, null);
  assert.deepEqual(session.evalInputNames, []);
  await session.runTrainStep(feeds(ort, linearBatches(1)[0]));
  await session.release();
});

test('exportModelForInferencing: the eval model with the trained parameters', async () => {
  const session = await open();
  const [batch] = linearBatches(1);
  await session.runTrainStep(feeds(ort, batch));
  await session.runOptimizerStep();
  const bytes = await session.exportModelForInferencing(['pred', 'neg_pred']);
  const io = readGraphIO(bytes);
  assert.deepEqual(io.inputs.map((i) => i.name), ['X']);
  // the intermediate value got its type from onnxruntime
  assert.deepEqual(io.outputs.map((o) => [o.name, o.dtype]), [['pred', 'float32'], ['neg_pred', 'float32']]);
  const inference = await ort.InferenceSession.create(bytes);
  const X = feeds(ort, batch).X;
  const r = await inference.run({ X });
  const ev = await session.runEvalStep(feeds(ort, batch));
  // initializers instead of inputs: onnxruntime may take another MatMul kernel (an ulp apart)
  close(r.pred.data, [...ev.pred.data], 1e-6);
  close(r.neg_pred.data, [...ev.pred.data].map((v) => -v), 1e-6);
  await inference.release();
  await session.release();
});

test('onnxruntime-web (wasm) trains the same as onnxruntime-node', async (t) => {
  let web;
  try {
    web = await import('onnxruntime-web');
    web.env.wasm.numThreads = 1;
  } catch (err) {
    t.skip(`onnxruntime-web does not load here: ${err.message}`);
    return;
  }
  const results = [];
  for (const rt of [ort, web]) {
    const session = await open(rt);
    for (const batch of linearBatches(3)) {
      session.lazyResetGrad();
      await session.runTrainStep(feeds(rt, batch));
      await session.runOptimizerStep();
    }
    results.push(await session.saveCheckpoint());
    await session.release();
  }
  const [a, b] = await Promise.all(results.map((r) => CheckpointState.loadCheckpoint(r)));
  close(b.parameters.get('W').data, [...a.parameters.get('W').data], 1e-6);
  close(b.parameters.get('b').data, [...a.parameters.get('b').data], 1e-6);
  assert.equal(b.optimizerState.step, 3);
});

/**
 * onnxruntime-node dressed as a WebGPU runtime: every output is a 'gpu-buffer' tensor whose
 * `data` cannot be read (only `getData()`), and feeding a disposed one fails, as on a GPU.
 */
function gpuLike(real) {
  const log = { options: [], disposed: 0, outputs: 0 };
  class GpuTensor {
    constructor(t) {
      this._t = t;
      this.type = t.type;
      this.dims = t.dims;
      this.location = 'gpu-buffer';
    }

    get data() {
      throw new Error('the data of a gpu-buffer tensor was read without getData()');
    }

    async getData() {
      if (this.location === 'none') throw new Error('The tensor is disposed.');
      return this._t.data;
    }

    dispose() {
      this.location = 'none';
      log.disposed += 1;
    }
  }
  const unwrap = (v) => {
    if (!(v instanceof GpuTensor)) return v;
    if (v.location === 'none') throw new Error('a disposed tensor was fed');
    return v._t;
  };
  const InferenceSession = {
    async create(bytes, options = {}) {
      log.options.push(options);
      const session = await real.InferenceSession.create(bytes); // the CPU underneath
      return {
        inputNames: session.inputNames,
        outputNames: session.outputNames,
        get outputMetadata() { return session.outputMetadata; },
        async run(feeds, fetches) {
          const plain = Object.fromEntries(Object.entries(feeds).map(([k, v]) => [k, unwrap(v)]));
          const out = await session.run(plain, fetches);
          log.outputs += Object.keys(out).length;
          return Object.fromEntries(Object.entries(out).map(([k, v]) => [k, new GpuTensor(v)]));
        },
        release: () => session.release(),
      };
    },
  };
  return { ort: { InferenceSession, Tensor: real.Tensor }, log };
}

test('WebGPU: outputs stay on the device (gpu-buffer), read with getData, replaced ones disposed', async () => {
  const { ort: gpu, log } = gpuLike(ort);
  const session = await open(gpu, { options: { executionProviders: [{ name: 'webgpu' }] } });
  assert.ok(log.options.length === 3 && log.options.every((o) => o.preferredOutputLocation === 'gpu-buffer'));
  const cpu = await open(ort);
  const losses = [];
  for (const batch of linearBatches(3)) {
    for (const s of [session, cpu]) {
      s.lazyResetGrad();
      const out = await s.runTrainStep(feeds(ort, batch));
      losses.push(await out.loss.getData());
      await s.runOptimizerStep();
    }
  }
  for (let i = 0; i < losses.length; i += 2) assert.deepEqual(losses[i], losses[i + 1]);
  // replaced parameters, gradients and optimizer states were released, none fed afterwards
  assert.ok(log.disposed >= 2 * 3 + 2 * 3, `${log.disposed} disposed`);
  assert.deepEqual([...(await session.getContiguousParameters()).data], [...(await cpu.getContiguousParameters()).data]);
  assert.deepEqual(await session.saveCheckpoint(), await cpu.saveCheckpoint());
  const exported = await session.exportModelForInferencing(['pred']);
  assert.deepEqual(exported, await cpu.exportModelForInferencing(['pred']));
  const ev = await session.runEvalStep(feeds(ort, linearBatches(1)[0]));
  assert.equal(ev.loss.location, 'gpu-buffer');
  await session.release();
  await cpu.release();
  // without webgpu the caller's options go through untouched
  const plain = gpuLike(ort);
  const s2 = await open(plain.ort, { options: { executionProviders: ['cpu'], logSeverityLevel: 3 } });
  assert.deepEqual(plain.log.options[0], { executionProviders: ['cpu'], logSeverityLevel: 3 });
  await s2.release();
});
