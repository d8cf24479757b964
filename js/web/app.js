// The page of `python -m ortlearn export-web`: trains the artifacts beside it with
// onnxruntime-web (its WebGPU build where the browser has a WebGPU adapter and the models hold
// no float64 value, which that build has no kernel for; its WebAssembly build otherwise),
// draws the loss of every step and the test score of every epoch, and offers the trained
// inference model and checkpoint. window.ortlearn holds the run's numbers (read by the
// test-suite).
import { CheckpointState, TrainingSession, parseSafetensors } from './lib/index.js';

let ort; // the onnxruntime-web build of the backend (loadRuntime)

const result = { done: false, error: null, backend: null, losses: [], epochs: [] };
window.ortlearn = result;

const $ = (id) => document.getElementById(id);

function status(text, error = false) {
  $('status').textContent = text;
  $('status').className = error ? 'error' : '';
}

async function fetchBytes(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

// A seeded permutation (mulberry32 + Fisher-Yates): the same batches on every run.
function permutation(n, seed) {
  let a = seed >>> 0;
  const random = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const order = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  return order;
}

// Rows `rows` of a safetensors array {dtype (numpy's name), shape, data} as an ort.Tensor.
function gather(array, rows) {
  const width = array.shape.slice(1).reduce((a, b) => a * b, 1);
  const out = new array.data.constructor(rows.length * width);
  rows.forEach((r, i) => out.set(array.data.subarray(r * width, (r + 1) * width), i * width));
  return new ort.Tensor(array.dtype, out, [rows.length, ...array.shape.slice(1)]);
}

function score(task, predictions, y) {
  const n = y.shape[0];
  const width = predictions.dims.length > 1 ? predictions.dims[1] : 1;
  const p = predictions.data;
  if (task.kind === 'regressor') {
    let mean = 0;
    for (let i = 0; i < y.data.length; i++) mean += y.data[i] / y.data.length;
    let residual = 0;
    let total = 0;
    for (let i = 0; i < y.data.length; i++) {
      residual += (y.data[i] - p[i]) ** 2;
      total += (y.data[i] - mean) ** 2;
    }
    return 1 - residual / total;
  }
  let right = 0;
  if (task.kind === 'multilabel') { // the share of the labels right
    for (let i = 0; i < p.length; i++) right += Number(p[i] > 0) === Number(y.data[i]) ? 1 : 0;
    return right / p.length;
  }
  for (let i = 0; i < n; i++) {
    let label;
    if (width === 1) {
      label = p[i] > 0 ? 1 : 0;
    } else {
      label = 0;
      for (let k = 1; k < width; k++) if (p[i * width + k] > p[i * width + label]) label = k;
    }
    if (Number(y.data[i]) === label) right++;
  }
  return right / n;
}

// The mean of the last `window` values at each step: the trend of a noisy per-batch loss.
function runningMean(values, window) {
  let sum = 0;
  return values.map((v, i) => {
    sum += v - (i >= window ? values[i - window] : 0);
    return sum / Math.min(i + 1, window);
  });
}

function draw(canvas, values, { xLabel, yLabel, log = false, points = false, trend = null }) {
  const ctx = canvas.getContext('2d');
  const { width, height } = canvas;
  const left = 56;
  const bottom = 36;
  const top = 28;
  ctx.clearRect(0, 0, width, height);
  ctx.font = '12px system-ui, sans-serif';
  ctx.fillStyle = '#333';
  ctx.fillText(yLabel, 8, 14); // above the plot area: no overlap with the tick labels
  ctx.fillText(xLabel, width / 2 - 20, height - 6);
  if (!values.length) return;
  const f = log ? (v) => Math.log10(Math.max(v, 1e-12)) : (v) => v;
  const ys = values.map(f);
  let lo = Math.min(...ys);
  let hi = Math.max(...ys);
  if (hi === lo) { hi += 0.5; lo -= 0.5; }
  const x = (i) => left + (i + (points ? 1 : 0)) * (width - left - 12) /
    Math.max(values.length - (points ? 0 : 1), 1);
  const y = (v) => top + (hi - f(v)) * (height - bottom - top) / (hi - lo);
  ctx.strokeStyle = '#ccc';
  ctx.beginPath();
  ctx.moveTo(left, top);
  ctx.lineTo(left, height - bottom);
  ctx.lineTo(width - 8, height - bottom);
  ctx.stroke();
  for (const v of [hi, lo]) {
    const text = log ? (10 ** v).toPrecision(2) : v.toFixed(3);
    ctx.fillText(text, 4, top + (hi - v) * (height - bottom - top) / (hi - lo) + 4);
  }
  const line = (series, color, width) => {
    ctx.strokeStyle = color;
    ctx.lineWidth = width;
    ctx.beginPath();
    series.forEach((v, i) => (i ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v))));
    ctx.stroke();
    ctx.lineWidth = 1;
  };
  line(values, trend ? '#aec7e8' : '#1f77b4', 1);
  if (trend) line(trend, '#d62728', 2);
  ctx.fillStyle = '#1f77b4';
  if (points) values.forEach((v, i) => ctx.fillRect(x(i) - 3, y(v) - 3, 6, 6));
}

async function evaluate(session, task, data) {
  const model = await session.exportModelForInferencing([task.prediction]);
  if (!data.X_test) return { model, value: null };
  const inference = await ort.InferenceSession.create(model, { executionProviders: ['wasm'] });
  const rows = Array.from({ length: data.X_test.shape[0] }, (_, i) => i);
  const outputs = await inference.run({ X: gather(data.X_test, rows) });
  await inference.release();
  return { model, value: score(task, outputs[task.prediction], data.y_test) };
}

async function webgpuAdapter() {
  try {
    return Boolean(navigator.gpu && await navigator.gpu.requestAdapter());
  } catch {
    return false;
  }
}

async function loadRuntime(backend) {
  ort = await import(backend === 'webgpu' ? './ort/ort.webgpu.min.mjs' : './ort/ort.wasm.min.mjs');
  // One thread: several need a cross-origin isolated page (COOP/COEP headers), which a plain
  // static server does not send.
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.wasmPaths = new URL('./ort/', import.meta.url).href;
}

async function main() {
  const task = await (await fetch('task.json')).json();
  const [checkpoint, trainModel, evalModel, optimizerModel, dataBytes] = await Promise.all(
    ['checkpoint', 'training_model.onnx', 'eval_model.onnx', 'optimizer_model.onnx',
      'data.safetensors'].map(fetchBytes));
  const data = Object.fromEntries(parseSafetensors(dataBytes).tensors);
  result.backend = task.webgpu && await webgpuAdapter() ? 'webgpu' : 'wasm';
  await loadRuntime(result.backend);
  const scoreName = task.kind === 'regressor' ? 'R²' : 'accuracy';
  $('score-name').textContent = `test ${scoreName}`;
  $('what').textContent = `${task.estimator} exported by ortlearn: ${task.epochs} epochs of ` +
    `${data.X_train.shape[0]} rows in batches of ${task.batch_size}, on ${result.backend}.`;
  const state = await CheckpointState.loadCheckpoint(checkpoint);
  const session = await TrainingSession.create(
    ort, { checkpointState: state, trainModel, evalModel, optimizerModel },
    { executionProviders: [result.backend] });
  const before = await evaluate(session, task, data);
  result.scoreBefore = before.value;
  const n = data.X_train.shape[0];
  let exported = before.model;
  for (let epoch = 1; epoch <= task.epochs; epoch++) {
    const start = performance.now();
    const order = task.shuffle ? permutation(n, epoch) : Array.from({ length: n }, (_, i) => i);
    let sum = 0;
    let batches = 0;
    for (let b = 0; b < n; b += task.batch_size) {
      const rows = order.slice(b, b + task.batch_size);
      session.lazyResetGrad();
      const outputs = await session.runTrainStep({ X: gather(data.X_train, rows),
        y: gather(data.y_train, rows) });
      const loss = Number((await outputs[session.trainingOutputNames[0]].getData())[0]);
      await session.runOptimizerStep();
      result.losses.push(loss);
      sum += loss;
      batches += 1;
    }
    const evaluation = await evaluate(session, task, data);
    exported = evaluation.model;
    const seconds = (performance.now() - start) / 1000;
    result.epochs.push({ epoch, loss: sum / batches, score: evaluation.value, seconds });
    const row = document.createElement('tr');
    row.innerHTML = `<td>${epoch}</td><td>${(sum / batches).toFixed(4)}</td>` +
      `<td>${evaluation.value === null ? '–' : evaluation.value.toFixed(4)}</td>` +
      `<td>${seconds.toFixed(2)}</td>`;
    $('epochs').tBodies[0].appendChild(row);
    draw($('loss'), result.losses, {
      xLabel: 'step', yLabel: 'training loss per batch (log); red: mean of the last 20', log: true,
      trend: runningMean(result.losses, 20),
    });
    draw($('score'), result.epochs.map((e) => e.score ?? NaN),
      { xLabel: 'epoch', yLabel: `test ${scoreName}`, points: true });
    status(`epoch ${epoch} of ${task.epochs}: mean loss ${(sum / batches).toFixed(4)}` +
      (evaluation.value === null ? '' : `, test ${scoreName} ${evaluation.value.toFixed(4)}`));
  }
  result.inferenceModel = exported;
  result.checkpoint = await session.saveCheckpoint(true);
  const link = (id, bytes) => {
    $(id).href = URL.createObjectURL(new Blob([bytes], { type: 'application/octet-stream' }));
  };
  link('download-model', exported);
  link('download-checkpoint', result.checkpoint);
  $('downloads').hidden = false;
  await session.release();
  status(`done: ${task.epochs} epochs on ${result.backend}` + (result.epochs.at(-1).score === null
    ? '' : `, test ${scoreName} ${result.epochs.at(-1).score.toFixed(4)}`));
  result.done = true;
}

main().catch((error) => {
  result.error = String(error && error.stack ? error.stack : error);
  result.done = true;
  status(`error: ${error.message || error}`, true);
});
