import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  comparePyStr, pyFloatParse, pyFloatRepr, pyHex, pyIntParseHex, pyJsonDumps, pyJsonLoads,
} from '../src/pyformat.js';
import { python, runPython } from '../testing/python.mjs';

test('pyFloatRepr writes what Python repr(float) writes', () => {
  const cases = [
    [0.1, '0.1'], [1e-05, '1e-05'], [1e16, '1e+16'], [123456789012345680.0, '1.2345678901234568e+17'],
    [5e-324, '5e-324'], [NaN, 'nan'], [Infinity, 'inf'], [-Infinity, '-inf'], [-0.0, '-0.0'],
    [0.0, '0.0'], [0.001, '0.001'], [3.0, '3.0'], [0.0001, '0.0001'], [1.5e16, '1.5e+16'],
    [1e15, '1000000000000000.0'], [9999999999999998.0, '9999999999999998.0'], [-2.5, '-2.5'],
    [1.7976931348623157e308, '1.7976931348623157e+308'], [2.2250738585072014e-308, '2.2250738585072014e-308'],
    [123.456, '123.456'], [1e22, '1e+22'], [1e21, '1e+21'], [1e-7, '1e-07'], [0.30000000000000004, '0.30000000000000004'],
    [Math.fround(0.001), '0.0010000000474974513'], [100, '100.0'], [1e-100, '1e-100'],
  ];
  for (const [x, want] of cases) assert.equal(pyFloatRepr(x), want, `repr(${x})`);
  assert.throws(() => pyFloatRepr('1'), TypeError);
});

test('pyFloatParse reads what Python float() reads', () => {
  assert.equal(pyFloatParse('0.001'), 0.001);
  assert.equal(pyFloatParse(' 1e-05 '), 1e-5);
  assert.equal(pyFloatParse('1_000.5'), 1000.5);
  assert.ok(Object.is(pyFloatParse('-0.0'), -0));
  assert.ok(Number.isNaN(pyFloatParse('nan')));
  assert.equal(pyFloatParse('-inf'), -Infinity);
  assert.equal(pyFloatParse('Infinity'), Infinity);
  assert.equal(pyFloatParse('.5'), 0.5);
  for (const bad of ['', '0x10', '1e', 'abc', '1__0', '_1']) {
    assert.throws(() => pyFloatParse(bad), /could not convert/, bad);
  }
});

test('ints as Python hex() and int(text, 16)', () => {
  assert.equal(pyHex(-5n), '-0x5');
  assert.equal(pyHex(0), '0x0');
  assert.equal(pyHex(2n ** 100n), `0x1${'0'.repeat(25)}`);
  assert.equal(pyIntParseHex('-0x5'), -5n);
  assert.equal(pyIntParseHex('0x1_f'), 31n);
  assert.throws(() => pyIntParseHex('0xg'), /invalid literal/);
});

test('pyJsonDumps escapes as Python json.dumps', () => {
  // ensure_ascii=True (the default)
  assert.equal(pyJsonDumps('é😀\u007f\u0001\n\t"\\/'), '"\\u00e9\\ud83d\\ude00\\u007f\\u0001\\n\\t\\"\\\\/"');
  assert.equal(pyJsonDumps('\b\f\r\u001f\u2028'), '"\\b\\f\\r\\u001f\\u2028"');
  assert.equal(pyJsonDumps('\ud800'), '"\\ud800"'); // a lone surrogate, as Python writes it
  // ensure_ascii=False: only quotes, backslashes and control characters
  assert.equal(pyJsonDumps('é😀\u007f\u0001\n"', { ensureAscii: false }), '"é😀\u007f\\u0001\\n\\""');
  // separators and containers
  assert.equal(pyJsonDumps(['param/W', 'float32', [3, 1]]), '["param/W", "float32", [3, 1]]');
  assert.equal(pyJsonDumps(new Map([['b', 1], ['a', [true, false, null]], ['2', {}]])),
    '{"b": 1, "a": [true, false, null], "2": {}}');
  assert.equal(pyJsonDumps({ x: [1, 2] }, { separators: [',', ':'] }), '{"x":[1,2]}');
  assert.equal(pyJsonDumps([2n ** 64n, 0.5, -0.0, NaN, -Infinity]),
    '[18446744073709551616, 0.5, -0.0, NaN, -Infinity]');
  assert.equal(pyJsonDumps([[], new Map()]), '[[], {}]');
});

test('pyJsonLoads keeps key order, ints exact, and Python\'s extensions', () => {
  const v = pyJsonLoads('{"2": 1, "b": [1.0, 2, -3e2], "a": {"x": null}, "2": 9, "big": 18446744073709551616}');
  assert.deepEqual([...v.keys()], ['2', 'b', 'a', 'big']);
  assert.equal(v.get('2'), 9n);
  assert.deepEqual(v.get('b'), [1, 2n, -300]);
  assert.equal(v.get('big'), 2n ** 64n);
  assert.deepEqual(pyJsonLoads(' [NaN, Infinity, -Infinity, "\\u00e9\\n"] ').slice(1), [Infinity, -Infinity, 'é\n']);
  for (const bad of ['{', '[1,]', '{"a" 1}', '"\u0001"', '01', '[1] x', 'tru']) {
    assert.throws(() => pyJsonLoads(bad), SyntaxError, bad);
  }
  assert.deepEqual(pyJsonLoads(' [ ] '), []);
  assert.equal(pyJsonLoads('{ }').size, 0);
  const nested = pyJsonLoads('[[1], {"a": [], "b": {}}]');
  assert.deepEqual(nested[0], [1n]);
  assert.deepEqual([...nested[1].entries()], [['a', []], ['b', new Map()]]);
  // an object and an array say which closing bracket they expected, and where
  assert.throws(() => pyJsonLoads('[1 2]'), /expected ',' or '\]' at character 3/);
  assert.throws(() => pyJsonLoads('{"a": 1 "b": 2}'), /expected ',' or '\}' at character 8/);
});

test('comparePyStr orders by code point, as Python sorts str', () => {
  const keys = ['\uff01', '\u{1f600}', 'b', 'a', 'ab', ''];
  assert.deepEqual(keys.sort(comparePyStr), ['', 'a', 'ab', 'b', '\uff01', '\u{1f600}']);
});

test('pyFloatRepr and pyJsonDumps agree with Python on random values', { skip: !python && 'ORTLEARN_PYTHON is not set' }, () => {
  const bits = new BigUint64Array(5000);
  let s = 0x9e3779b97f4a7c15n;
  for (let i = 0; i < bits.length; i++) {
    s ^= s << 13n; s &= 2n ** 64n - 1n; s ^= s >> 7n; s ^= s << 17n; s &= 2n ** 64n - 1n;
    bits[i] = s;
  }
  const floats = new Float64Array(bits.buffer);
  const strings = ['é', '😀', '\u007f', 'a"b\\c', '\u0000\u001f', '\u2028', 'plain', 'ü\n\t'];
  const out = runPython(`
import json, struct, sys
data = json.load(sys.stdin)
floats = struct.unpack('<%dd' % (len(data['hex']) // 16), bytes.fromhex(data['hex']))
print(json.dumps({'repr': [repr(x) for x in floats], 'dumps': json.dumps(data['strings']),
                  'dumps_na': json.dumps(data['strings'], ensure_ascii=False)}))
`, JSON.stringify({ hex: Buffer.from(floats.buffer).toString('hex'), strings }));
  const want = JSON.parse(out);
  floats.forEach((x, i) => assert.equal(pyFloatRepr(x), want.repr[i], `bits ${bits[i]}`));
  assert.equal(pyJsonDumps(strings), want.dumps);
  assert.equal(pyJsonDumps(strings, { ensureAscii: false }), want.dumps_na);
});
