// Cross-checks against ortlearn's Python side run only when ORTLEARN_PYTHON names a Python
// interpreter with ortlearn installed (e.g. ORTLEARN_PYTHON=../venv/bin/python npm test).

import { spawnSync } from 'node:child_process';

/** The Python interpreter to cross-check with, or undefined. */
export const python = process.env.ORTLEARN_PYTHON || undefined;

/**
 * Run `code` with ORTLEARN_PYTHON, `input` on its stdin; its stdout (throws on failure).
 * @param {string} code
 * @param {string|Uint8Array} [input]
 * @param {string[]} [args]
 * @returns {string}
 */
export function runPython(code, input = '', args = []) {
  const r = spawnSync(python, ['-c', code, ...args], {
    input, encoding: 'utf8', maxBuffer: 1 << 28, env: { ...process.env, PYTHONWARNINGS: 'ignore' },
  });
  if (r.error) throw r.error;
  if (r.status !== 0) throw new Error(`Python failed (${r.status}):\n${r.stderr}`);
  return r.stdout;
}
