// Starts `cellgate serve --demo` on a free port with its own data directory
// (or on a database given by URL) and stops it again (run by federation.mjs).
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const STARTUP_TIMEOUT_MS = 60_000;
const running = new Set();

// Never leave a child behind, whatever way this process ends.
process.on('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => process.exit(130));
}

/**
 * Starts a child process and resolves to { url, stop, log } once a line of
 * its stdout matches `listening` (whose first group is the URL).
 *
 * @param {object} o
 * @param {string} o.name what to call it in messages
 * @param {string} o.command the program
 * @param {string[]} o.args its arguments
 * @param {RegExp} o.listening the line it prints once it serves
 * @param {object} [o.options] further options of child_process.spawn (cwd, env)
 * @param {() => void} [o.onStop] cleaning up after it exited
 */
export async function startProcess({ name, command, args, listening, options = {}, onStop = () => {} }) {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], ...options });
  running.add(child);
  let output = '';
  const keep = (chunk) => {
    output = (output + chunk).slice(-20_000);
  };
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', keep);
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));

  const cleanUp = () => {
    running.delete(child);
    onStop();
  };
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    }
    cleanUp();
  };

  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name}: no "listening" line after ${STARTUP_TIMEOUT_MS} ms:\n${tail(output)}`)), STARTUP_TIMEOUT_MS);
    createInterface({ input: child.stdout }).on('line', (line) => {
      keep(`${line}\n`);
      const m = listening.exec(line);
      if (m) {
        clearTimeout(timer);
        resolve(m[1].replace(/\/$/, ''));
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`${name}: ${command} ${args.join(' ')} exited (${signal ?? code}) before listening:\n${tail(output)}`));
    });
  }).catch(async (err) => {
    await stop();
    throw err;
  });

  return { url, stop, log: () => tail(output) };
}

/**
 * Starts a gateway; resolves to { url, stop, log } once it prints the line
 * `cellgate listening on http://127.0.0.1:PORT — …`.
 *
 * @param {object} o
 * @param {string} o.bin path of the cellgate binary
 * @param {string} o.datastores the datastores directory
 * @param {string[]} o.args further flags of `cellgate serve`
 */
export async function startServer({ bin, datastores, args }) {
  const data = mkdtempSync(join(tmpdir(), 'cellgate-federation-'));
  return startProcess({
    name: 'cellgate',
    command: bin,
    args: [
      'serve', '--demo', '--data', data, '--datastores', datastores,
      '--listen', '127.0.0.1:0', '--auth', 'off', ...args,
    ],
    listening: /cellgate listening on (http:\/\/\S+)/,
    onStop: () => rmSync(data, { recursive: true, force: true }),
  });
}

export function tail(text, lines = 15) {
  return text.trimEnd().split('\n').slice(-lines).join('\n');
}
