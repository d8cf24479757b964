#!/usr/bin/env node
// Train ortlearn training artifacts for a few steps with onnxruntime-node: the command the
// Python test-suite runs to compare Node's training with Python's.
//
//   node js/tools/train_steps.mjs --artifacts DIR --batches FILE.safetensors --steps N
//        --out-checkpoint PATH [--checkpoint PATH] [--losses PATH.json]
//        [--export PATH.onnx --export-outputs a,b] [--lr X] [--accumulate K] [--threads N] [--time]
//
// DIR holds checkpoint, training_model.onnx, eval_model.onnx (optional) and
// optimizer_model.onnx (in the tensor layout); --checkpoint starts from another checkpoint
// than DIR/checkpoint (to resume a training). The batches file is a safetensors file of
// tensors named `batch/<i>/<user input name>` (i = 0..B-1); step s (0-based) feeds batch
// s mod B. Each step: lazyResetGrad() when s mod K == 0, runTrainStep(batch), and
// runOptimizerStep() when (s + 1) mod K == 0 (K = --accumulate, 1 by default: reset, train
// and update at every step; with K > 1 the optimizer updates with the gradients summed over
// K consecutive steps, and trailing steps that do not complete a group update nothing).
// --lr sets the learning rate before the first step.
//
// Writes the checkpoint with its optimizer state (when the checkpoint it started from had one,
// an optimizer update ran or --lr was given: N = 0 writes the checkpoint it loaded, byte for
// byte), the JSON list of the losses (the first user output of each step, as numbers, in
// Python's json.dumps text), and the inference model. --time prints
// {"seconds_per_step": median} (the median over the steps after 3 warm-up steps, each step
// timed from its reset to the end of its optimizer update).

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as ort from 'onnxruntime-node';
import {
  CheckpointState, TrainingSession, parseSafetensors, pyJsonDumps,
} from '../src/index.js';

const USAGE = `usage: node train_steps.mjs --artifacts DIR --batches FILE.safetensors --steps N
       --out-checkpoint PATH [--checkpoint PATH] [--losses PATH.json]
       [--export PATH.onnx --export-outputs a,b] [--lr X] [--accumulate K] [--threads N] [--time]`;

function fail(message) {
  process.stderr.write(`train_steps: ${message}\n${USAGE}\n`);
  process.exit(2);
}

function integer(text, what, least) {
  if (!/^\d+$/.test(text ?? '') || Number(text) < least) {
    fail(`${what} must be an integer >= ${least}, got ${text}`);
  }
  return Number(text);
}

function writeAtomic(file, bytes) {
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.${process.pid}.tmp`);
  fs.writeFileSync(tmp, bytes);
  fs.renameSync(tmp, file);
}

function readBatches(file, inputNames) {
  const { tensors } = parseSafetensors(fs.readFileSync(file));
  const batches = new Map();
  for (const [key, t] of tensors) {
    const m = /^batch\/(\d+)\/(.+)$/.exec(key);
    if (!m) fail(`${file}: tensor ${JSON.stringify(key)} is not named batch/<i>/<input name>`);
    const i = Number(m[1]);
    if (!batches.has(i)) batches.set(i, {});
    batches.get(i)[m[2]] = new ort.Tensor(t.dtype, t.data, t.shape);
  }
  const count = batches.size;
  if (!count) fail(`${file} holds no batch`);
  const out = [];
  for (let i = 0; i < count; i++) {
    const batch = batches.get(i);
    if (!batch) fail(`${file}: the batches are not numbered 0..${count - 1} (batch ${i} is missing)`);
    const missing = inputNames.filter((n) => !(n in batch));
    const extra = Object.keys(batch).filter((n) => !inputNames.includes(n));
    if (missing.length || extra.length) {
      fail(`${file}: batch ${i} ${missing.length ? `lacks ${JSON.stringify(missing)}` : ''}`
        + `${extra.length ? ` has unknown inputs ${JSON.stringify(extra)}` : ''}; the training `
        + `model's user inputs are ${JSON.stringify(inputNames)}`);
    }
    out.push(batch);
  }
  return out;
}

function median(values) {
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

async function main() {
  let args;
  try {
    ({ values: args } = parseArgs({
      options: {
        artifacts: { type: 'string' },
        batches: { type: 'string' },
        steps: { type: 'string' },
        'out-checkpoint': { type: 'string' },
        checkpoint: { type: 'string' },
        losses: { type: 'string' },
        export: { type: 'string' },
        'export-outputs': { type: 'string' },
        lr: { type: 'string' },
        accumulate: { type: 'string' },
        time: { type: 'boolean', default: false },
        threads: { type: 'string' },
        help: { type: 'boolean', short: 'h', default: false },
      },
      strict: true,
    }));
  } catch (err) {
    fail(err.message);
  }
  if (args.help) {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  for (const required of ['artifacts', 'batches', 'steps', 'out-checkpoint']) {
    if (args[required] === undefined) fail(`--${required} is required`);
  }
  if ((args.export === undefined) !== (args['export-outputs'] === undefined)) {
    fail('--export and --export-outputs go together');
  }
  const steps = integer(args.steps, '--steps', 0);
  const accumulate = args.accumulate === undefined ? 1 : integer(args.accumulate, '--accumulate', 1);
  if (args.time && steps <= 3) fail('--time needs --steps above 3 (3 warm-up steps are not timed)');
  const dir = args.artifacts;
  const read = (name) => fs.readFileSync(path.join(dir, name));
  const evalPath = path.join(dir, 'eval_model.onnx');
  const state = await CheckpointState.loadCheckpoint(args.checkpoint === undefined
    ? read('checkpoint') : fs.readFileSync(args.checkpoint));
  const hadOptimizerState = state.optimizerState !== null;
  const session = await TrainingSession.create(ort, {
    checkpointState: state,
    trainModel: read('training_model.onnx'),
    evalModel: fs.existsSync(evalPath) ? fs.readFileSync(evalPath) : undefined,
    optimizerModel: read('optimizer_model.onnx'),
  }, args.threads === undefined ? {} : {
    intraOpNumThreads: integer(args.threads, '--threads', 1), interOpNumThreads: 1,
  });
  if (args.lr !== undefined) {
    const lr = Number(args.lr);
    if (args.lr.trim() === '' || Number.isNaN(lr)) fail(`--lr must be a number, got ${args.lr}`);
    session.setLearningRate(lr);
  }
  const batches = readBatches(args.batches, session.trainingInputNames);
  const lossName = session.trainingOutputNames[0];
  const losses = [];
  const times = [];
  for (let s = 0; s < steps; s++) {
    const start = process.hrtime.bigint();
    if (s % accumulate === 0) session.lazyResetGrad();
    const outputs = await session.runTrainStep(batches[s % batches.length]);
    if ((s + 1) % accumulate === 0) await session.runOptimizerStep();
    times.push(Number(process.hrtime.bigint() - start) / 1e9);
    if (lossName !== undefined) {
      const data = await outputs[lossName].getData();
      losses.push(typeof data[0] === 'bigint' ? Number(data[0]) : data[0]);
    }
  }
  const updated = steps >= accumulate; // an optimizer update ran
  writeAtomic(args['out-checkpoint'],
    await session.saveCheckpoint(hadOptimizerState || updated || args.lr !== undefined));
  if (args.losses !== undefined) {
    // Python's json.dumps text (NaN and Infinity as Python writes them)
    writeAtomic(args.losses, pyJsonDumps(losses));
  }
  if (args.export !== undefined) {
    const names = args['export-outputs'].split(',').map((n) => n.trim()).filter(Boolean);
    writeAtomic(args.export, await session.exportModelForInferencing(names));
  }
  await session.release();
  if (args.time) {
    process.stdout.write(`${JSON.stringify({ seconds_per_step: median(times.slice(3)) })}\n`);
  }
}

main().catch((err) => {
  process.stderr.write(`train_steps: ${err.stack ?? err}\n`);
  process.exit(1);
});
