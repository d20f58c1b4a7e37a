// Derives the playground's third-party files in playground/vendor/ from the
// packages pinned by package.json and package-lock.json, so the committed
// bytes can always be traced back to the npm registry's tarballs (whose
// integrity hashes `npm ci` verifies against the lock file).
//
//   npm ci && node vendor.mjs           # (re)write playground/vendor/
//   npm ci && node vendor.mjs --check   # exit 1 unless the committed files match
//
// The files are copied byte for byte: GraphiQL's and React's own production
// UMD bundles need no build step, and `cargo build` embeds them as they are.
// Their names carry the package version, so the gateway can serve them with
// an immutable cache lifetime; index.html must name the same files.

import { readFileSync, readdirSync, writeFileSync, mkdirSync, rmSync, existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const vendorDir = join(here, 'playground', 'vendor');
const check = process.argv.includes('--check');

const lock = JSON.parse(readFileSync(join(here, 'package-lock.json'), 'utf8'));

function pkg(name) {
  const dir = join(here, 'node_modules', name);
  if (!existsSync(join(dir, 'package.json'))) {
    fail(`node_modules/${name} is missing: run \`npm ci\` in web/ first`);
  }
  const version = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')).version;
  const locked = lock.packages[`node_modules/${name}`]?.version;
  if (version !== locked) {
    fail(`node_modules/${name} is ${version} but package-lock.json pins ${locked}: run \`npm ci\``);
  }
  return { dir, version };
}

function fail(message) {
  console.error(`vendor: ${message}`);
  process.exit(1);
}

const react = pkg('react');
const reactDom = pkg('react-dom');
const graphiql = pkg('graphiql');

/** file name in playground/vendor/ → contents */
const expected = new Map([
  [`react-${react.version}.production.min.js`, readFileSync(join(react.dir, 'umd/react.production.min.js'))],
  [
    `react-dom-${reactDom.version}.production.min.js`,
    readFileSync(join(reactDom.dir, 'umd/react-dom.production.min.js')),
  ],
  [`graphiql-${graphiql.version}.min.js`, readFileSync(join(graphiql.dir, 'graphiql.min.js'))],
  [`graphiql-${graphiql.version}.min.css`, readFileSync(join(graphiql.dir, 'graphiql.min.css'))],
]);
const licenses = [
  ['react', react],
  ['react-dom', reactDom],
  ['graphiql', graphiql],
]
  .map(([name, p]) => `${name} ${p.version}\n\n${readFileSync(join(p.dir, 'LICENSE'), 'utf8').trim()}\n`)
  .join('\n' + '-'.repeat(72) + '\n\n');
expected.set('LICENSES.txt', Buffer.from(licenses));

if (check) {
  const problems = [];
  const actual = existsSync(vendorDir) ? readdirSync(vendorDir) : [];
  for (const [name, bytes] of expected) {
    if (!actual.includes(name)) {
      problems.push(`missing playground/vendor/${name}`);
    } else if (!readFileSync(join(vendorDir, name)).equals(bytes)) {
      problems.push(`playground/vendor/${name} differs from the pinned package`);
    }
  }
  for (const name of actual) {
    if (!expected.has(name)) problems.push(`unexpected playground/vendor/${name}`);
  }
  const html = readFileSync(join(here, 'playground', 'index.html'), 'utf8');
  for (const name of expected.keys()) {
    if (/\.(js|css)$/.test(name) && !html.includes(`vendor/${name}`)) {
      problems.push(`playground/index.html does not load vendor/${name}`);
    }
  }
  if (problems.length > 0) {
    for (const p of problems) console.error(`vendor: ${p}`);
    fail('playground/vendor/ is stale: run `npm ci && node vendor.mjs` in web/ and commit the result');
  }
  console.log(`vendor: ${expected.size} files in playground/vendor/ match package-lock.json`);
} else {
  rmSync(vendorDir, { recursive: true, force: true });
  mkdirSync(vendorDir, { recursive: true });
  for (const [name, bytes] of expected) writeFileSync(join(vendorDir, name), bytes);
  console.log(`vendor: wrote ${expected.size} files to playground/vendor/`);
}
