import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseSafetensors, serializeSafetensors } from '../src/safetensors.js';
import { python, runPython } from '../testing/python.mjs';

function sample() {
  return new Map([
    ['w', { dtype: 'float32', shape: [2, 3], data: new Float32Array([1, 2, 3, 4, 5, -6.5]) }],
    ['mask', { dtype: 'bool', shape: [3], data: new Uint8Array([1, 0, 1]) }],
    ['half', { dtype: 'float16', shape: [2], data: new Uint16Array([0x3c00, 0xc000]) }],
    ['count', { dtype: 'int64', shape: [], data: new BigInt64Array([-7n]) }],
    ['idx', { dtype: 'int32', shape: [2], data: new Int32Array([5, -1]) }],
    ['d', { dtype: 'float64', shape: [1, 1], data: new Float64Array([Math.PI]) }],
    ['empty', { dtype: 'float32', shape: [0, 4], data: new Float32Array(0) }],
    ['é', { dtype: 'float32', shape: [1], data: new Float32Array([0.25]) }],
  ]);
}

function header(bytes) {
  const n = Number(new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(0, true));
  return new TextDecoder().decode(bytes.subarray(8, 8 + n));
}

test('round trip of every dtype, values and shapes kept', () => {
  const tensors = sample();
  const bytes = serializeSafetensors(tensors, { b: '2', a: 'é' });
  const { metadata, tensors: back } = parseSafetensors(bytes);
  assert.deepEqual([...metadata], [['a', 'é'], ['b', '2']]);
  assert.equal(back.size, tensors.size);
  for (const [key, t] of tensors) {
    const u = back.get(key);
    assert.equal(u.dtype, t.dtype, key);
    assert.deepEqual(u.shape, t.shape, key);
    assert.deepEqual(u.data, t.data, key);
  }
  // the parsed tensors own their memory: a second round trip gives the same bytes
  assert.deepEqual(serializeSafetensors(back, metadata), bytes);
});

test('the layout is Python\'s: metadata first and sorted, dtype rank then key, padding', () => {
  const bytes = serializeSafetensors(sample(), new Map([['z', '1'], ['a', 'x"y']]));
  const text = header(bytes);
  const size = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  assert.equal(size % 8, 0); // the header's UTF-8 bytes, padded
  assert.equal(new TextEncoder().encode(text).length, size);
  const json = text.trimEnd();
  assert.ok(text.slice(json.length).split('').every((c) => c === ' '));
  assert.ok(json.startsWith('{"__metadata__":{"a":"x\\"y","z":"1"},"count":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"d":{"dtype":"F64","shape":[1,1],"data_offsets":[8,16]},'));
  const order = [...json.matchAll(/"([^"]+)":\{"dtype"/g)].map((m) => m[1]);
  assert.deepEqual(order, ['count', 'd', 'empty', 'w', 'é', 'idx', 'half', 'mask']);
  assert.ok(json.includes('"é":{"dtype":"F32"')); // non-ASCII as is
});

function rejects(bytes, pattern) {
  assert.throws(() => parseSafetensors(bytes), pattern);
}

function withHeader(text, body = new Uint8Array(0)) {
  const h = new TextEncoder().encode(text);
  const out = new Uint8Array(8 + h.length + body.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(h.length), true);
  out.set(h, 8);
  out.set(body, 8 + h.length);
  return out;
}

test('truncated and malformed files are refused', () => {
  const good = serializeSafetensors(sample(), {});
  rejects(good.subarray(0, 5), /too short/);
  rejects(good.subarray(0, good.length - 1), /out of proportion|do not cover/);
  rejects(good.subarray(0, 40), /header declares/);
  const huge = good.slice();
  new DataView(huge.buffer).setBigUint64(0, 2n ** 62n, true);
  rejects(huge, /header declares/);
  rejects(withHeader('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', new Uint8Array(4)), /out of proportion/);
  rejects(withHeader('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', new Uint8Array(8)), /does not start/);
  rejects(withHeader('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', new Uint8Array(8)), /do not cover/);
  rejects(withHeader('{"a":{"dtype":"X9","shape":[1],"data_offsets":[0,4]}}', new Uint8Array(4)), /malformed/);
  rejects(withHeader('{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', new Uint8Array(4)), /malformed/);
  rejects(withHeader('{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', new Uint8Array(4)), /malformed/);
  rejects(withHeader('{"a":{"dtype":"F32","shape":[1]}}', new Uint8Array(4)), /malformed/);
  rejects(withHeader('{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}', new Uint8Array(4)), /out of proportion/);
  rejects(withHeader('{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}', new Uint8Array(4)), /unsupported dtype/);
  rejects(withHeader('{"__metadata__":{"k":1}}'), /not a string/);
  rejects(withHeader('[1, 2]'), /not a safetensors header/);
  rejects(withHeader('{"a": '), /not valid JSON/);
  rejects(withHeader('{}\xff'), /not valid JSON|UTF-8/);
  const badUtf8 = withHeader('{} ');
  badUtf8[10] = 0xff;
  rejects(badUtf8, /UTF-8/);
});

test('serialization refuses inconsistent tensors', () => {
  assert.throws(() => serializeSafetensors({ a: { dtype: 'float32', shape: [3], data: new Float32Array(2) } }), /holds 2/);
  assert.throws(() => serializeSafetensors({ a: { dtype: 'float32', shape: [2], data: new Float64Array(2) } }), TypeError);
  assert.throws(() => serializeSafetensors({ a: { dtype: 'complex64', shape: [1], data: new Float32Array(2) } }), TypeError);
  assert.throws(() => serializeSafetensors({}, { k: '\ud800' }), /lone UTF-16 surrogate/);
});

test('bytes equal Python\'s _safetensors.write and load in safetensors', { skip: !python && 'ORTLEARN_PYTHON is not set' }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ortlearn-st-'));
  try {
    const file = path.join(dir, 'js.safetensors');
    fs.writeFileSync(file, serializeSafetensors(sample(), { b: '2', a: 'é' }));
    const out = runPython(`
import sys, numpy as np, safetensors.numpy
from ortlearn.training._safetensors import write, read_file
meta, tensors = read_file(sys.argv[1])
st = safetensors.numpy.load(open(sys.argv[1], 'rb').read())
assert sorted(st) == sorted(tensors) and all(np.array_equal(st[k], tensors[k]) for k in st)
with open(sys.argv[1] + '.py', 'wb') as f:
    write(f, tensors, meta)
print(open(sys.argv[1], 'rb').read() == open(sys.argv[1] + '.py', 'rb').read())
`, '', [file]);
    assert.equal(out.trim(), 'True');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
