// Python's text formats, reproduced exactly: `repr(float)`, `float(text)`, `json.dumps`
// (both `ensure_ascii` modes, any separators) and a `json.loads` that keeps the key order of
// every object (as Python's dicts do) and the exact value of large integers.
//
// ortlearn's checkpoint header is Python's `json.dumps(...)` text and its checksum covers that
// text, so a checkpoint that JavaScript saves is byte-identical to Python's only if these
// functions produce Python's text character for character.

/**
 * Compare two strings by Unicode code points, as Python sorts `str` (JavaScript's default
 * `sort` compares UTF-16 code units, which orders astral characters before U+E000..U+FFFF).
 * @param {string} a
 * @param {string} b
 * @returns {number} negative, zero or positive
 */
export function comparePyStr(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    const xs = x >= 0xd800 && x <= 0xdfff;
    const ys = y >= 0xd800 && y <= 0xdfff;
    // A surrogate (an astral code point, or a lone surrogate) against a BMP character:
    // an astral code point is above every BMP one, a lone surrogate is what it is.
    if (xs !== ys) {
      const cx = a.codePointAt(i);
      const cy = b.codePointAt(i);
      return cx < cy ? -1 : 1;
    }
    if (xs && ys) {
      const cx = a.codePointAt(i);
      const cy = b.codePointAt(i);
      if (cx !== cy) return cx < cy ? -1 : 1;
      continue;
    }
    return x < y ? -1 : 1;
  }
  return a.length - b.length;
}

/**
 * Python's `repr(x)` of a float: the shortest digits that round-trip, in scientific notation
 * when the decimal exponent is below -4 or at least 16 (`1e-05`, `1.5e+16`), in fixed notation
 * with at least one decimal otherwise (`0.001`, `3.0`); `nan`, `inf`, `-inf`, `-0.0`.
 * @param {number} x
 * @returns {string}
 */
export function pyFloatRepr(x) {
  if (typeof x !== 'number') {
    throw new TypeError(`pyFloatRepr expects a number, got ${typeof x}.`);
  }
  if (Number.isNaN(x)) return 'nan';
  if (x === Infinity) return 'inf';
  if (x === -Infinity) return '-inf';
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const sign = x < 0 ? '-' : '';
  // String(x) gives the shortest round-trip digits (the closest when several are as short),
  // as Python's repr does; only the layout differs.
  const text = String(Math.abs(x));
  const cut = text.indexOf('e');
  const mantissa = cut < 0 ? text : text.slice(0, cut);
  const shift = cut < 0 ? 0 : Number(text.slice(cut + 1));
  const dot = mantissa.indexOf('.');
  const intLength = dot < 0 ? mantissa.length : dot;
  const all = mantissa.replace('.', '');
  let lead = 0;
  while (lead < all.length - 1 && all[lead] === '0') lead++;
  const digits = all.slice(lead).replace(/0+$/, '') || '0';
  const exp = intLength - 1 - lead + shift; // x = d.ddd * 10**exp
  if (exp < -4 || exp >= 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    const e = Math.abs(exp);
    return `${sign}${m}e${exp < 0 ? '-' : '+'}${e < 10 ? '0' : ''}${e}`;
  }
  if (exp >= 0) {
    const whole = digits.length > exp + 1
      ? digits.slice(0, exp + 1) : digits + '0'.repeat(exp + 1 - digits.length);
    const frac = digits.length > exp + 1 ? digits.slice(exp + 1) : '0';
    return `${sign}${whole}.${frac}`;
  }
  return `${sign}0.${'0'.repeat(-exp - 1)}${digits}`;
}

const FLOAT_SPECIAL = /^([+-]?)(nan|inf|infinity)$/i;
const FLOAT_DECIMAL = /^[+-]?(?:\d(?:_?\d)*(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:[eE][+-]?\d(?:_?\d)*)?$/;

/**
 * Python's `float(text)`: decimal text (underscores between digits allowed), `nan`, `inf`,
 * `infinity` in any case, surrounding whitespace ignored.
 * @param {string} text
 * @returns {number}
 */
export function pyFloatParse(text) {
  if (typeof text !== 'string') {
    throw new TypeError(`a float's text must be a string, got ${typeof text}.`);
  }
  const t = text.trim();
  const special = FLOAT_SPECIAL.exec(t);
  if (special) {
    const v = special[2].toLowerCase() === 'nan' ? NaN : Infinity;
    return special[1] === '-' ? -v : v;
  }
  if (!FLOAT_DECIMAL.test(t)) {
    throw new Error(`could not convert string to float: ${JSON.stringify(text)}`);
  }
  return Number(t.replace(/_/g, ''));
}

/**
 * Python's `hex(n)` of an integer: `0x1f`, `-0x5`, `0x0`.
 * @param {bigint|number} n
 * @returns {string}
 */
export function pyHex(n) {
  const v = BigInt(n);
  return v < 0n ? `-0x${(-v).toString(16)}` : `0x${v.toString(16)}`;
}

const INT_HEX = /^([+-]?)(?:0[xX])?_?([0-9a-fA-F](?:_?[0-9a-fA-F])*)$/;

/**
 * Python's `int(text, 16)` (surrounding whitespace, a sign, an optional `0x` prefix and
 * underscores between digits accepted).
 * @param {string} text
 * @returns {bigint}
 */
export function pyIntParseHex(text) {
  if (typeof text !== 'string') {
    throw new TypeError(`an int's text must be a string, got ${typeof text}.`);
  }
  const m = INT_HEX.exec(text.trim());
  if (!m) throw new Error(`invalid literal for int() with base 16: ${JSON.stringify(text)}`);
  const v = BigInt(`0x${m[2].replace(/_/g, '')}`);
  return m[1] === '-' ? -v : v;
}

const NAMED_ESCAPES = {
  '"': '\\"', '\\': '\\\\', '\n': '\\n', '\r': '\\r', '\t': '\\t', '\b': '\\b', '\f': '\\f',
};

function hex4(code) {
  return `\\u${code.toString(16).padStart(4, '0')}`;
}

/**
 * A string as Python's `json.dumps` writes it (quotes included).
 *
 * With `ensureAscii` (Python's default), every character outside ' '..'~' is escaped as
 * `\uXXXX` in lowercase hex, an astral character as its surrogate pair; without it only the
 * quote, the backslash and the control characters below U+0020 are.
 * @param {string} s
 * @param {boolean} [ensureAscii=true]
 * @returns {string}
 */
export function pyJsonString(s, ensureAscii = true) {
  let out = '"';
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const plain = ensureAscii ? c >= 0x20 && c <= 0x7e && c !== 0x22 && c !== 0x5c
      : c >= 0x20 && c !== 0x22 && c !== 0x5c;
    if (plain) continue;
    out += s.slice(start, i);
    const ch = s[i];
    out += NAMED_ESCAPES[ch] ?? hex4(c);
    start = i + 1;
  }
  return `${out}${s.slice(start)}"`;
}

/**
 * Python's `json.dumps(value, ensure_ascii=..., separators=...)`.
 *
 * Objects are `Map`s (any key order, kept) or plain objects (their own enumerable keys, in
 * JavaScript's order: integer-like keys first; use a Map where that matters). Integers are
 * `bigint`s or integral `number`s; other numbers are written as Python writes floats
 * (`NaN`, `Infinity` and `-Infinity` as `json.dumps` does). `null`/`undefined` give `null`.
 * @param {*} value
 * @param {{ensureAscii?: boolean, separators?: [string, string]}} [options]
 * @returns {string}
 */
export function pyJsonDumps(value, { ensureAscii = true, separators = [', ', ': '] } = {}) {
  const [itemSep, keySep] = separators;
  const dump = (v) => {
    if (v === null || v === undefined) return 'null';
    if (v === true) return 'true';
    if (v === false) return 'false';
    if (typeof v === 'bigint') return v.toString();
    if (typeof v === 'number') {
      if (Number.isNaN(v)) return 'NaN';
      if (v === Infinity) return 'Infinity';
      if (v === -Infinity) return '-Infinity';
      if (Number.isInteger(v) && !Object.is(v, -0)) return BigInt(v).toString();
      return pyFloatRepr(v);
    }
    if (typeof v === 'string') return pyJsonString(v, ensureAscii);
    if (Array.isArray(v)) return `[${v.map(dump).join(itemSep)}]`;
    const entries = v instanceof Map ? [...v.entries()] : Object.entries(v);
    return `{${entries.map(([k, x]) => {
      if (typeof k !== 'string') {
        throw new TypeError(`JSON object keys must be strings, got ${typeof k}.`);
      }
      return `${pyJsonString(k, ensureAscii)}${keySep}${dump(x)}`;
    }).join(itemSep)}}`;
  };
  return dump(value);
}

/**
 * Python's `json.loads(text)`, objects as `Map`s in the text's key order (a repeated key keeps
 * its first position and its last value, as a dict does). Integers are `bigint`s and floats
 * `number`s, so that `3` and `3.0` stay apart as in Python; `NaN`, `Infinity` and `-Infinity`
 * are accepted, as Python accepts them.
 * @param {string} text
 * @returns {*}
 */
export function pyJsonLoads(text) {
  let i = 0;
  const n = text.length;
  const fail = (what) => {
    throw new SyntaxError(`invalid JSON: ${what} at character ${i}`);
  };
  const ws = () => {
    while (i < n) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) i++;
      else break;
    }
  };
  const string = () => {
    i++; // opening quote
    let out = '';
    let start = i;
    for (;;) {
      if (i >= n) fail('unterminated string');
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        out += text.slice(start, i);
        i++;
        return out;
      }
      if (c < 0x20) fail('control character in string');
      if (c !== 0x5c) {
        i++;
        continue;
      }
      out += text.slice(start, i);
      const e = text[i + 1];
      const simple = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' }[e];
      if (simple !== undefined) {
        out += simple;
        i += 2;
      } else if (e === 'u') {
        const h = text.slice(i + 2, i + 6);
        if (!/^[0-9a-fA-F]{4}$/.test(h)) fail('bad \\u escape');
        out += String.fromCharCode(parseInt(h, 16));
        i += 6;
      } else {
        fail('bad escape');
      }
      start = i;
    }
  };
  const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;
  // The members of an object or array after its opening bracket: `member()` reads one,
  // commas separate them, `close` ends them.
  const members = (close, member) => {
    i++;
    ws();
    if (text[i] === close) {
      i++;
      return;
    }
    for (;;) {
      member();
      ws();
      if (text[i] === ',') {
        i++;
      } else if (text[i] === close) {
        i++;
        return;
      } else {
        fail(`expected ',' or '${close}'`);
      }
    }
  };
  const value = () => {
    ws();
    if (i >= n) fail('unexpected end');
    const c = text[i];
    if (c === '{') {
      const map = new Map();
      members('}', () => {
        ws();
        if (text[i] !== '"') fail('expected a key');
        const key = string();
        ws();
        if (text[i] !== ':') fail("expected ':'");
        i++;
        map.set(key, value());
      });
      return map;
    }
    if (c === '[') {
      const list = [];
      members(']', () => list.push(value()));
      return list;
    }
    if (c === '"') return string();
    for (const [word, v] of [['true', true], ['false', false], ['null', null], ['NaN', NaN],
      ['Infinity', Infinity], ['-Infinity', -Infinity]]) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return v;
      }
    }
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (!m) fail('unexpected character');
    i = NUMBER.lastIndex;
    if (m[1] === undefined && m[2] === undefined) return BigInt(m[0]);
    return Number(m[0]);
  };
  const result = value();
  ws();
  if (i !== n) fail('extra data');
  return result;
}

