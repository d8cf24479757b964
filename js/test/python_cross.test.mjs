// Training in Node against training in Python on artifacts that ortlearn generates: run only
// when ORTLEARN_PYTHON names a Python with ortlearn (and scikit-learn) installed.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as ort from 'onnxruntime-node';
import { CheckpointState, TrainingSession, parseSafetensors } from '../src/index.js';
import { python, runPython } from '../testing/python.mjs';

const TOOL = fileURLToPath(new URL('../tools/train_steps.mjs', import.meta.url));
const STEPS = 7;
const LR = 0.01;

// Artifacts of an MLP classifier on digits (the optimizer model in the tensor layout next to
// the sequence one, or in the flat layout export_web writes), batches of 32 rows, and
// Python's own training: STEPS steps, then STEPS steps accumulating pairs of steps (as
// train_steps.mjs --accumulate 2 does).
const GENERATE = `
import json, shutil, sys, numpy as np, onnx
from sklearn.datasets import load_digits
from ortlearn import OrtMLPClassifier, TrainingSession, CheckpointState
from ortlearn.optim import unpack_optimizer_model
from ortlearn.training._safetensors import write
d, steps, lr, layout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
X, y = load_digits(return_X_y=True); X = (X / 16).astype(np.float32); y = y.astype(np.int64)
est = OrtMLPClassifier(hidden_layer_sizes=(8,), max_iter=1, random_state=0).fit(X, y)
art = d + "/art"
if layout == "flat":
    est.export_web(art, X[:100], y[:100])
    assert json.loads(onnx.load(art + "/optimizer_model.onnx").metadata_props[0].value)["layout"] == "flat"
    onnx.save(unpack_optimizer_model(onnx.load(art + "/optimizer_model.onnx")), d + "/optimizer_tensors.onnx")
    bad = onnx.load(art + "/optimizer_model.onnx")
    meta = json.loads(bad.metadata_props[0].value)
    bad.metadata_props[0].value = json.dumps({**meta, "shapes": [s[::-1] for s in meta["shapes"]]})
    onnx.save(bad, d + "/optimizer_bad_shapes.onnx")
else:
    est.export_artifacts(art)
    shutil.copy(art + "/optimizer_model.onnx", d + "/optimizer_sequence.onnx")
    onnx.save(unpack_optimizer_model(onnx.load(art + "/optimizer_model.onnx")), art + "/optimizer_model.onnx")
batches = [(X[i * 32:(i + 1) * 32], y[i * 32:(i + 1) * 32]) for i in range(5)]
with open(d + "/batches.safetensors", "wb") as f:
    write(f, {f"batch/{i}/{n}": v for i, b in enumerate(batches) for n, v in zip("Xy", b)}, {})
for tag, k in (("py", 1), ("py_acc", 2)):
    state = CheckpointState.load_checkpoint(art + "/checkpoint")
    s = TrainingSession(state, art + "/training_model.onnx", art + "/eval_model.onnx", art + "/optimizer_model.onnx")
    s.set_learning_rate(lr)
    losses = []
    for i in range(steps):
        if i % k == 0:
            s.lazy_reset_grad()
        losses.append(float(s.train_step(*batches[i % len(batches)])[0]))
        if (i + 1) % k == 0:
            s.optimizer_step()
    if k == 1:
        s.export_model_for_inferencing(d + "/py.onnx", ["raw_scores"])
    s.close()
    CheckpointState.save_checkpoint(state, d + "/" + tag + ".ckpt", include_optimizer_state=True)
    json.dump(losses, open(d + "/" + tag + ".losses.json", "w"))
`;

function maxDiff(a, b) {
  let worst = 0;
  for (const [name, p] of a.parameters) {
    const q = b.parameters.get(name).data;
    p.data.forEach((v, i) => { worst = Math.max(worst, Math.abs(v - q[i])); });
  }
  for (const [p, states] of a.optimizerState.states) {
    for (const [s, t] of states) {
      const q = b.optimizerState.states.get(p).get(s).data;
      t.data.forEach((v, i) => { worst = Math.max(worst, Math.abs(v - q[i])); });
    }
  }
  return worst;
}

for (const layout of ['tensors', 'flat']) {
  test(`Node trains ortlearn artifacts as Python does (${layout} optimizer layout; in process and through train_steps.mjs)`,
    { skip: !python && 'ORTLEARN_PYTHON is not set', timeout: 300000 }, (t) => crossCheck(t, layout));
}

// The flat layout's session after loadParametersBuffer updates the loaded values, as the
// same update in the tensor layout does.
async function checkReplacedParameters(session, tensors, art, dir) {
  const other = await TrainingSession.create(ort, {
    checkpointState: await CheckpointState.loadCheckpoint(await session.saveCheckpoint()),
    trainModel: fs.readFileSync(path.join(art, 'training_model.onnx')),
    optimizerModel: fs.readFileSync(path.join(dir, 'optimizer_tensors.onnx')),
  });
  other.setLearningRate(LR);
  const loaded = (await session.getContiguousParameters()).data.map((v, i) => v + ((i % 7) - 3) * 1e-3);
  const after = [];
  for (const s of [session, other]) {
    await s.loadParametersBuffer(loaded.slice());
    for (let i = 0; i < 2; i++) {
      s.lazyResetGrad();
      await s.runTrainStep({
        X: new ort.Tensor('float32', tensors.get(`batch/${i}/X`).data, [32, 64]),
        y: new ort.Tensor('int64', tensors.get(`batch/${i}/y`).data, [32]),
      });
      await s.runOptimizerStep();
    }
    after.push((await s.getContiguousParameters()).data);
  }
  await other.release();
  assert.deepEqual(after[0], after[1]);
  assert.notDeepEqual(after[0], loaded);
}

async function crossCheck(t, layout) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ortlearn-cross-'));
  try {
    runPython(GENERATE, '', [dir, String(STEPS), String(LR), layout]);
    const art = path.join(dir, 'art');
    const read = (f) => fs.readFileSync(path.join(art, f));

    if (layout === 'flat') {
      // a flat file whose shapes are not the training model's is refused before any step
      await assert.rejects(TrainingSession.create(ort, {
        checkpointState: read('checkpoint'), trainModel: read('training_model.onnx'),
        optimizerModel: fs.readFileSync(path.join(dir, 'optimizer_bad_shapes.onnx')),
      }), /flat optimizer model holds coefficient as float32 \[8,64\]; the training model declares float32 \[64,8\]/);
    }
    if (layout === 'tensors') {
      // the sequence layout generate_artifacts writes is refused with the remedy
      await assert.rejects(TrainingSession.create(ort, {
        checkpointState: read('checkpoint'), trainModel: read('training_model.onnx'),
        optimizerModel: fs.readFileSync(path.join(dir, 'optimizer_sequence.onnx')),
      }), /cannot feed tensor sequences.*export-web.*unpack_optimizer_model/);
    }

    // in process
    const session = await TrainingSession.create(ort, {
      checkpointState: await CheckpointState.loadCheckpoint(read('checkpoint')),
      trainModel: read('training_model.onnx'), evalModel: read('eval_model.onnx'),
      optimizerModel: read('optimizer_model.onnx'),
    });
    session.setLearningRate(LR);
    const { tensors } = parseSafetensors(fs.readFileSync(path.join(dir, 'batches.safetensors')));
    const losses = [];
    for (let s = 0; s < STEPS; s++) {
      const i = s % 5;
      session.lazyResetGrad();
      const out = await session.runTrainStep({
        X: new ort.Tensor('float32', tensors.get(`batch/${i}/X`).data, [32, 64]),
        y: new ort.Tensor('int64', tensors.get(`batch/${i}/y`).data, [32]),
      });
      losses.push(out.loss.data[0]);
      await session.runOptimizerStep();
    }
    const js = await CheckpointState.loadCheckpoint(await session.saveCheckpoint());
    if (layout === 'flat') await checkReplacedParameters(session, tensors, art, dir);
    await session.release();
    const py = await CheckpointState.loadCheckpoint(fs.readFileSync(path.join(dir, 'py.ckpt')));
    const pyLosses = JSON.parse(fs.readFileSync(path.join(dir, 'py.losses.json'), 'utf8'));
    const diff = maxDiff(py, js);
    t.diagnostic(`largest |Python - Node| after ${STEPS} steps: ${diff}`);
    assert.ok(diff <= 1e-6, `parameters differ by ${diff}`);
    losses.forEach((l, i) => assert.ok(Math.abs(l - pyLosses[i]) <= 1e-6 * (1 + Math.abs(l))));
    assert.equal(js.optimizerState.step, py.optimizerState.step);
    assert.equal(js.optimizerState.learningRate, LR);

    // the command line tool: the same training, its export and its losses
    const run = (args) => {
      const r = spawnSync(process.execPath, [TOOL, '--artifacts', art, '--batches',
        path.join(dir, 'batches.safetensors'), '--steps', String(STEPS), '--lr', String(LR), ...args],
      { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stderr);
      return r.stdout;
    };
    run(['--out-checkpoint', path.join(dir, 'cli.ckpt'), '--losses', path.join(dir, 'cli.losses.json'),
      '--export', path.join(dir, 'cli.onnx'), '--export-outputs', 'raw_scores']);
    const cli = await CheckpointState.loadCheckpoint(fs.readFileSync(path.join(dir, 'cli.ckpt')));
    assert.equal(maxDiff(js, cli), 0);
    const cliLosses = JSON.parse(fs.readFileSync(path.join(dir, 'cli.losses.json'), 'utf8'));
    assert.deepEqual(cliLosses, losses);
    run(['--out-checkpoint', path.join(dir, 'cli_acc.ckpt'), '--accumulate', '2']);
    const acc = await CheckpointState.loadCheckpoint(fs.readFileSync(path.join(dir, 'cli_acc.ckpt')));
    const pyAcc = await CheckpointState.loadCheckpoint(fs.readFileSync(path.join(dir, 'py_acc.ckpt')));
    assert.equal(acc.optimizerState.step, pyAcc.optimizerState.step);
    assert.ok(maxDiff(pyAcc, acc) <= 1e-6);
    const timed = JSON.parse(run(['--out-checkpoint', path.join(dir, 'timed.ckpt'), '--time']));
    assert.ok(timed.seconds_per_step > 0);

    // Python reads Node's checkpoint and runs Node's inference model as its own
    const out = runPython(`
import json, sys, numpy as np, onnx, onnxruntime as ort
from sklearn.datasets import load_digits
from ortlearn import CheckpointState
d = sys.argv[1]
onnx.checker.check_model(onnx.load(d + "/cli.onnx"), full_check=True)
a, b = CheckpointState.load_checkpoint(d + "/cli.ckpt"), CheckpointState.load_checkpoint(d + "/py.ckpt")
X = (load_digits().data[:50] / 16).astype(np.float32)
run = lambda f: ort.InferenceSession(f, providers=["CPUExecutionProvider"]).run(None, {"X": X})[0]
print(json.dumps({"params": max(float(np.abs(a.parameters[n].data - b.parameters[n].data).max()) for n in a.parameters.keys()),
                "inference": float(np.abs(run(d + "/cli.onnx") - run(d + "/py.onnx")).max()),
                "step": a.optimizer_step}))
`, '', [dir]);
    const cross = JSON.parse(out);
    assert.ok(cross.params <= 1e-6);
    assert.ok(cross.inference <= 1e-5);
    assert.equal(cross.step, py.optimizerState.step);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
