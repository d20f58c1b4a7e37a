// Shared by the browser tests: a real `cellgate serve --demo` on a free
// port with its own data directory, Debian's Chromium driven by
// playwright-core (never a downloaded browser), requests to anything but
// 127.0.0.1 refused and recorded, console errors and accessibility
// violations collected, screenshots saved as artifacts.

import { spawn, spawnSync } from 'node:child_process';
import { mkdtemp, rm, mkdir, readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
export const root = join(here, '..', '..');
const artifacts = process.env.BROWSER_ARTIFACTS || join(root, 'target', 'browser-artifacts');

/** The demo driver and city (gateway/src/demo.rs): stable keys of the sample. */
export const DEMO_DRIVER = '5f0c8a4e-6d1b-4c2e-9a57-3b8e1d2c4f60';
export const DEMO_CITY = 'a3c1e9d2-7b44-4e0f-8c1a-2d5f6e7a8b90';

const CHROMIUM_FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  // Name resolution fails for every host but the loopback address, so even
  // a request that bypassed the route below could not leave the machine.
  '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1',
];

const bin = () => process.env.CELLGATE_BIN || join(root, 'target', 'debug', 'cellgate');
// The gateway must not pick up a database or config from the caller's environment.
const cleanEnv = () => Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('CELLGATE_')));

/**
 * Starts `cellgate serve --demo` on a free port; resolves when it listens.
 * `args` are added to the command line; `prepare(cellgate, data)` runs first
 * with a function that runs another cellgate command on the same store and
 * returns its stdout. `datastores` replaces the repository's definitions
 * directory (e.g. a copy with a trigger added).
 */
export async function startServer({ args = [], prepare, datastores = join(root, 'datastores') } = {}) {
  const data = await mkdtemp(join(tmpdir(), 'cellgate-browser-'));
  const env = cleanEnv();
  const common = ['--data', data, '--datastores', datastores];
  if (prepare) {
    const cellgate = (...command) => {
      const run = spawnSync(bin(), [...command, ...common], { env, encoding: 'utf8' });
      assert.equal(run.status, 0, `cellgate ${command.join(' ')}: ${run.stderr}`);
      return run.stdout;
    };
    await prepare(cellgate);
  }
  const child = spawn(bin(), ['serve', '--demo', '--listen', '127.0.0.1:0', ...common, ...args], {
    env: { ...env, RUST_LOG: 'warn' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (chunk) => {
    stderr += chunk;
  });
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`cellgate did not start within 60 s:\n${stderr}`)), 60_000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`cellgate exited with ${code} before listening:\n${stderr}`));
    });
    createInterface({ input: child.stdout }).on('line', (line) => {
      const match = /^cellgate listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(line);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
  });
  return {
    url,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGTERM');
        await exited;
      }
      await rm(data, { recursive: true, force: true });
    },
  };
}

/** One GraphQL request to the gateway, outside the browser; throws on errors. */
export async function gql(url, query, variables = {}) {
  const response = await fetch(`${url}/graphql`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/graphql-response+json' },
    body: JSON.stringify({ query, variables }),
  });
  const body = await response.json();
  if (body.errors) throw new Error(`GraphQL errors: ${JSON.stringify(body.errors)}`);
  return body.data;
}

/**
 * Chromium with a fresh profile directory. Every request that is not for
 * 127.0.0.1 is aborted and recorded in `blocked`; console errors and
 * uncaught exceptions of every page go to `problems`.
 */
export async function launchBrowser({ width = 1280, height = 900 } = {}) {
  const profile = await mkdtemp(join(tmpdir(), 'cellgate-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: CHROMIUM_FLAGS,
    viewport: { width, height },
    reducedMotion: 'reduce',
  });
  context.setDefaultTimeout(10_000);
  const blocked = [];
  const problems = [];
  await context.route('**/*', (route) => {
    const url = new URL(route.request().url());
    if (url.hostname === '127.0.0.1') return route.continue();
    blocked.push(url.href);
    return route.abort('blockedbyclient');
  });
  const watch = (page) => {
    page.on('console', (message) => {
      if (message.type() === 'error') problems.push(`console: ${message.text()}`);
    });
    page.on('pageerror', (error) => problems.push(`uncaught: ${error.message}`));
  };
  context.on('page', watch);
  const page = context.pages()[0] || (await context.newPage());
  watch(page);
  return {
    context,
    page,
    blocked,
    problems,
    /** Fails the test if the pages tried the network or logged errors. */
    assertClean() {
      assert.deepEqual(blocked, [], 'the pages requested nothing but 127.0.0.1');
      assert.deepEqual(problems, [], 'the pages logged no errors');
    },
    async close() {
      await context.close();
      await rm(profile, { recursive: true, force: true });
    },
  };
}

/** Saves a full-page screenshot as target/browser-artifacts/<name>-<width>.png. */
export async function screenshot(page, name) {
  await mkdir(artifacts, { recursive: true });
  const width = page.viewportSize().width;
  const path = join(artifacts, `${name}-${width}.png`);
  await page.screenshot({ path, fullPage: true });
  return path;
}

/**
 * Saves the top of the page down to the bottom of `last` (plus a margin)
 * as target/browser-artifacts/<name>.png.
 */
export async function screenshotTop(page, name, last) {
  await mkdir(artifacts, { recursive: true });
  const bottom = await last.evaluate((el) => el.getBoundingClientRect().bottom + window.scrollY);
  const path = join(artifacts, `${name}.png`);
  const height = Math.ceil(bottom + 24);
  await page.screenshot({ path, fullPage: true, clip: { x: 0, y: 0, width: page.viewportSize().width, height } });
  return path;
}

let axeSource = null;

/**
 * Runs axe-core (WCAG 2.1 A and AA rules and best practices) on the page
 * and fails with every violation found.
 */
export async function assertAccessible(page, what) {
  axeSource ??= await readFile(join(here, 'node_modules', 'axe-core', 'axe.min.js'), 'utf8');
  await page.evaluate(axeSource);
  const result = await page.evaluate(() =>
    // eslint-disable-next-line no-undef
    axe.run(document, { runOnly: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice'] }),
  );
  const violations = result.violations.map(
    (v) => `${v.id} (${v.impact}): ${v.help}\n    ${v.nodes.map((n) => n.target.join(' ')).join('\n    ')}`,
  );
  assert.deepEqual(violations, [], `accessibility violations on ${what}`);
}

/** Fails when the page is wider than the window (sideways scrolling). */
export async function assertNoSidewaysScroll(page, what) {
  const { scroll, client } = await page.evaluate(() => ({
    scroll: document.documentElement.scrollWidth,
    client: document.documentElement.clientWidth,
  }));
  assert.ok(scroll <= client, `${what} is ${scroll} px wide in a ${client} px window`);
}

/** Polls `check` until it returns a truthy value or `ms` pass. */
export async function eventually(check, what, ms = 10_000) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      last = await check();
      if (last) return last;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) assert.fail(`${what} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
