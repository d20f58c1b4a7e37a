// The GraphiQL playground at `/`, offline: it renders from the gateway's own
// files, opens the README's examples as tabs, loads the schema, sends the
// headers typed into its headers editor and shows a query's result.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { startServer, launchBrowser, gql, screenshot, eventually, root, DEMO_DRIVER } from './harness.mjs';

let server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server?.stop();
});

/** The operation names of the README's graphql examples, in order. */
async function readmeOperations() {
  const readme = await readFile(join(root, 'README.md'), 'utf8');
  return [...readme.matchAll(/```graphql\n(?:query|mutation|subscription) (\w+)/g)].map((m) => m[1]);
}

test('the playground renders offline, with the README examples as tabs, and runs a query with edited headers', async () => {
  const browser = await launchBrowser({ width: 1280 });
  const { page } = browser;
  try {
    const sent = [];
    page.on('request', (request) => {
      if (request.url() === `${server.url}/graphql` && request.method() === 'POST') sent.push(request);
    });
    await page.goto(`${server.url}/`);

    const operations = await readmeOperations();
    assert.deepEqual(operations, ['DriverTrips', 'WriteNote', 'ReadNote', 'FollowTrips']);
    for (const name of operations) {
      await page.getByRole('tab', { name }).waitFor();
    }
    assert.equal(await page.getByRole('tab').count(), operations.length);

    // The schema loads: the documentation explorer lists the root types.
    await page.getByRole('button', { name: 'Show Documentation Explorer' }).click();
    await page.getByText('Root Types').waitFor();
    await page.getByRole('link', { name: 'Query' }).first().waitFor();

    // Headers typed into the headers editor travel with the query.
    await page.getByRole('button', { name: 'Headers', exact: true }).click();
    await page.locator('section[aria-label="Headers"] .graphiql-editor:not(.hidden) .CodeMirror').click();
    await page.keyboard.type('{"X-Playground-Check": "offline"');

    const examples = JSON.parse(await readFile(join(root, 'web', 'playground', 'examples.json'), 'utf8'));
    const expected = (await gql(server.url, examples[0].query)).trips.driverPartnerIndex.edges;
    assert.ok(expected.length > 0, 'the first example returns trips of the demo driver');

    await page.getByRole('button', { name: 'Execute query (Ctrl-Enter)' }).click();
    const result = page.locator('section[aria-label="Result Window"]');
    // The top of the result: the first trip's BASE cell, as the API returns it.
    const first = expected[0].node.row.base.body;
    await eventually(
      async () => (await result.innerText()).includes(`"trip_created_at": "${first.trip_created_at}"`),
      'the result shows the first trip of the demo driver',
    );
    const text = await result.innerText();
    assert.match(text, /"driverPartnerIndex"/);
    assert.ok(text.includes(`"driver_name": "${first.driver_name}"`), text);

    const query = sent.find((r) => (r.postData() || '').includes('driverPartnerIndex'));
    assert.ok(query, 'the query was sent to /graphql');
    assert.equal(query.headers()['x-playground-check'], 'offline');
    assert.ok(query.postData().includes(DEMO_DRIVER));

    await screenshot(page, 'playground');
    await page.getByRole('button', { name: 'Hide Documentation Explorer' }).click();
    await page.setViewportSize({ width: 390, height: 844 });
    await page.getByRole('tab', { name: 'DriverTrips' }).waitFor();
    await screenshot(page, 'playground');

    await page.getByRole('link', { name: 'cellgate explorer' }).click();
    await page.getByRole('heading', { name: 'Datastores', level: 1 }).waitFor();
    assert.equal(page.url(), `${server.url}/ui/`);
    browser.assertClean();
  } finally {
    await browser.close();
  }
});

test('an operation passed in the address opens in its own tab', async () => {
  const browser = await launchBrowser({ width: 1280 });
  const { page } = browser;
  try {
    const query = 'query FromTheExplorer($n: Int) { trips { cellsForShard(shard: 0, limit: $n) { next } } }';
    const params = new URLSearchParams({ query, variables: '{"n": 1}' });
    await page.goto(`${server.url}/?${params}`);
    await page.getByRole('tab', { name: 'FromTheExplorer' }).waitFor();
    await page.getByRole('button', { name: 'Execute query (Ctrl-Enter)' }).click();
    const result = page.locator('section[aria-label="Result Window"]');
    await eventually(async () => (await result.innerText()).includes('"next"'), 'the result shows the log page');
    browser.assertClean();
  } finally {
    await browser.close();
  }
});
