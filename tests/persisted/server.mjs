// Starts `cellgate serve --demo` on a free port with its own data directory
// and stops it again (run by persisted.mjs).
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const STARTUP_TIMEOUT_MS = 60_000;
const running = new Set();

// Never leave a gateway behind, whatever way this process ends.
process.on('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => process.exit(130));
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
  const data = mkdtempSync(join(tmpdir(), 'cellgate-persisted-'));
  const argv = [
    'serve', '--demo', '--data', data, '--datastores', datastores,
    '--listen', '127.0.0.1:0', '--auth', 'off', ...args,
  ];
  const child = spawn(bin, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  running.add(child);
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (chunk) => {
    stderr = (stderr + chunk).slice(-20_000);
  });
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));

  const cleanUp = () => {
    running.delete(child);
    rmSync(data, { recursive: true, force: true });
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
    const timer = setTimeout(() => reject(new Error(`no "listening" line after ${STARTUP_TIMEOUT_MS} ms`)), STARTUP_TIMEOUT_MS);
    createInterface({ input: child.stdout }).on('line', (line) => {
      const m = /cellgate listening on (http:\/\/\S+)/.exec(line);
      if (m) {
        clearTimeout(timer);
        resolve(m[1].replace(/\/$/, ''));
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`cellgate ${argv.join(' ')} exited (${signal ?? code}) before listening:\n${tail(stderr)}`));
    });
  }).catch(async (err) => {
    await stop();
    throw err;
  });

  return { url, stop, log: () => tail(stderr) };
}

function tail(text, lines = 15) {
  return text.trimEnd().split('\n').slice(-lines).join('\n');
}
