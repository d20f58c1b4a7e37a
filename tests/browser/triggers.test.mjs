// The explorer's operations views of the cell log: the live tail of a
// datastore (the `tripsCells` subscription over /graphql/ws) shows a cell
// written through GraphQL after the page opened, resumes after its socket
// drops and after a pause with the cells written meanwhile, once each; and
// the triggers page lists a webhook trigger whose receiver refuses every
// POST, with its quarantined cells and a Retry button.
//
// The gateway runs the repository's definitions plus one trigger
// (`trips/support_notes`, NOTES cells, one attempt per cell) posting to a
// receiver this test runs on 127.0.0.1, which answers 503.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { cp, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { startServer, launchBrowser, gql, root, screenshot, assertAccessible, assertNoSidewaysScroll, eventually } from './harness.mjs';

let server;
let receiver;
let posts = 0;
let dir;

before(async () => {
  receiver = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      posts += 1;
      response.writeHead(503).end('not today');
    });
  });
  await new Promise((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const port = receiver.address().port;
  dir = await mkdtemp(join(tmpdir(), 'cellgate-triggers-'));
  const datastores = join(dir, 'datastores');
  await cp(join(root, 'datastores'), datastores, { recursive: true });
  await mkdir(join(datastores, 'trips', 'triggers'), { recursive: true });
  await writeFile(
    join(datastores, 'trips', 'triggers', 'support_notes.yaml'),
    `name: support_notes
datastore: trips
columns: [NOTES]
webhook:
  url: http://127.0.0.1:${port}/notes
  timeout_ms: 2000
batch_size: 10
max_attempts: 1
`,
  );
  const config = join(dir, 'cellgate.yaml');
  await writeFile(
    config,
    'triggers:\n  sweep_interval_ms: 200\n  min_backoff_ms: 10\n  max_backoff_ms: 50\n  quarantine_limit: 100000\n',
  );
  server = await startServer({ datastores, args: ['--config', config] });
});

after(async () => {
  await server?.stop();
  receiver?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const PUT = `mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status } }`;

/** Writes a NOTES cell of a new row through GraphQL; returns the row key with the cell's shard and added id. */
async function writeNote(text) {
  const rowKey = randomUUID();
  const put = await gql(server.url, PUT, { cells: [{ rowKey, column: 'NOTES', refKey: '1', body: { text } }] });
  assert.equal(put.tripsPutCells[0].status, 'WRITTEN');
  const read = await gql(server.url, 'query($r: UUID!) { trips { cell(rowKey: $r, column: NOTES, refKey: "1") { shard addedId } } }', {
    r: rowKey,
  });
  return { rowKey, ...read.trips.cell };
}

/** The tail's rows whose row key is `rowKey`, as cell texts. */
async function tailRows(page, rowKey) {
  return page.locator('table.tail-table tbody tr').evaluateAll(
    (rows, key) => rows.map((row) => [...row.children].map((cell) => cell.innerText.trim())).filter((cells) => cells[0] === key),
    rowKey,
  );
}

test('live tail: a new cell appears, and the tail resumes from its cursor after a dropped socket and a pause', async () => {
  const browser = await launchBrowser();
  const { page } = browser;
  // Keeps every WebSocket the page opens, so the test can drop them.
  await page.addInitScript(() => {
    const Native = window.WebSocket;
    window.testSockets = [];
    window.WebSocket = class extends Native {
      constructor(...args) {
        super(...args);
        window.testSockets.push(this);
      }
    };
  });
  try {
    await page.goto(`${server.url}/ui/#/ds/trips`);
    await page.getByRole('link', { name: 'live tail of trips' }).click();
    await page.getByRole('heading', { name: 'Live tail of trips', level: 1 }).waitFor();
    await page.getByText(/^Live since/).waitFor();

    // Without a cursor the tail starts at the log's head as the server
    // reads it when the subscription starts, a moment the page cannot see:
    // a cell written before then is not in the tail. Cells are written
    // until one arrives; from then on the tail has a cursor.
    let first;
    for (let attempt = 1; !first; attempt += 1) {
      const note = await writeNote(`written after the tail opened (${attempt})`);
      try {
        await eventually(async () => (await tailRows(page, note.rowKey)).length === 1, 'the new cell is shown', 3_000);
        first = note;
      } catch (error) {
        if (attempt === 5) throw error;
      }
    }
    const [cells] = await tailRows(page, first.rowKey);
    assert.deepEqual(cells.slice(0, 4), [first.rowKey, 'NOTES', String(first.shard), String(first.addedId)]);
    assert.match(cells[6], /written after the tail opened/);
    await assertAccessible(page, 'the live tail');
    await screenshot(page, 'explorer-tail');
    await page.setViewportSize({ width: 390, height: 844 });
    await assertNoSidewaysScroll(page, 'the live tail at 390 px');
    await screenshot(page, 'explorer-tail');
    await page.setViewportSize({ width: 1280, height: 900 });

    // The socket drops; a cell written before the reconnect still arrives, once.
    await page.evaluate(() => window.testSockets.forEach((s) => s.close()));
    await page.getByText(/^Connection lost; reconnecting/).waitFor();
    const second = await writeNote('written while the socket was down');
    await eventually(async () => (await tailRows(page, second.rowKey)).length === 1, 'the cell written while disconnected is shown');

    // Paused, nothing arrives; resumed, the cell written meanwhile does.
    await page.getByRole('button', { name: 'Pause' }).click();
    await page.getByText(/^Paused/).waitFor();
    const third = await writeNote('written while paused');
    await new Promise((resolve) => setTimeout(resolve, 500));
    assert.equal((await tailRows(page, third.rowKey)).length, 0, 'nothing arrives while paused');
    await page.getByRole('button', { name: 'Resume' }).click();
    await eventually(async () => (await tailRows(page, third.rowKey)).length === 1, 'the cell written while paused is shown');
    for (const { rowKey } of [first, second, third]) {
      assert.equal((await tailRows(page, rowKey)).length, 1, `${rowKey} is shown once`);
    }
    browser.assertClean();
  } finally {
    await browser.close();
  }
});

test('triggers page: the webhook trigger, its lag and its quarantine, retried by a button', async () => {
  const browser = await launchBrowser();
  const { page } = browser;
  try {
    const note = await writeNote('for a receiver that refuses');
    await page.goto(`${server.url}/ui/`);
    await page.getByRole('link', { name: 'Triggers' }).click();
    await page.getByRole('heading', { name: 'Triggers', level: 1 }).waitFor();
    const trigger = page.locator('section[data-trigger="trips/support_notes"]');
    await trigger.getByRole('heading', { name: 'trips/support_notes', level: 3 }).waitFor();
    const facts = Object.fromEntries(
      await trigger.locator('dl.facts dt').evaluateAll((terms) => terms.map((dt) => [dt.innerText.trim(), dt.nextElementSibling.innerText.trim()])),
    );
    assert.equal(facts.Kind, 'webhook');
    assert.equal(facts.Columns, 'NOTES');
    await trigger.getByText('Running', { exact: true }).waitFor();
    await page.getByText('No trigger consumer of payments runs in this gateway.').waitFor();

    // The refused cell is quarantined (the page refreshes every 5 s).
    const quarantine = trigger.getByRole('table', { name: 'Quarantined cells of support_notes' });
    const row = quarantine.getByRole('row').filter({ has: page.getByRole('link', { name: note.rowKey }) });
    await row.waitFor({ timeout: 30_000 });
    const texts = await row.locator('td').allInnerTexts();
    assert.equal(texts[0], String(note.shard));
    assert.equal(texts[1], String(note.addedId));
    assert.equal(texts[3], 'NOTES');
    assert.equal(texts[4], '1');
    assert.match(texts[5], /503/);
    assert.ok(posts > 0, 'the receiver was asked');
    const api = await gql(server.url, '{ trips { triggers(name: "support_notes") { quarantine(first: 1000) { rowKey } lag { clusters { cluster } } } } }');
    const quarantined = api.trips.triggers[0].quarantine.length;
    assert.ok(quarantined >= 1);
    for (const { cluster } of api.trips.triggers[0].lag.clusters) {
      await trigger.getByRole('table', { name: 'Lag of support_notes per cluster' }).getByRole('rowheader', { name: cluster }).waitFor();
    }
    await assertAccessible(page, 'the triggers page');
    await screenshot(page, 'explorer-triggers');
    await page.setViewportSize({ width: 390, height: 844 });
    await assertNoSidewaysScroll(page, 'the triggers page at 390 px');
    await assertAccessible(page, 'the triggers page at 390 px');
    await screenshot(page, 'explorer-triggers');
    await page.setViewportSize({ width: 1280, height: 900 });

    await trigger.getByRole('button', { name: 'Retry the quarantined cells of support_notes' }).click();
    await trigger.getByText(/cells? asked to be delivered again/).waitFor();
    const asked = Number(/^(\d+)/.exec(await trigger.locator('.retry-result').innerText())[1]);
    assert.ok(asked >= 1 && asked <= quarantined + 100, `asked ${asked}`);
    browser.assertClean();
  } finally {
    await browser.close();
  }
});
