// The web explorer at `/ui/`, used as a person would, at 1280 and 390 px:
// datastores, an index query with a range filter paged forward and back,
// the generated GraphQL, a row with its history, a shard's cell log that
// follows new cells, and the health page (with each datastore's topology
// version). Expected values are read from the API in the test (the demo
// data may grow); assertions are on visible text.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  startServer,
  launchBrowser,
  gql,
  screenshot,
  screenshotTop,
  assertAccessible,
  assertNoSidewaysScroll,
  eventually,
  DEMO_DRIVER,
} from './harness.mjs';

let server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server?.stop();
});

const BOUND = '2024-03-05T00:00:00Z';
const PAGE_SIZE = 2;

/** The demo driver's trips from BOUND on, oldest first, as the API returns them. */
async function expectedTrips() {
  const query = `query($d: UUID, $w: TripsDriverPartnerIndexWhere) {
    trips { driverPartnerIndex(driverPartnerUuid: $d, where: $w, orderBy: [{ field: TRIP_CREATED_AT }], first: 1000) {
      edges { node { rowKey cityUuid tripCreatedAt } } } } }`;
  const filtered = (await gql(server.url, query, { d: DEMO_DRIVER, w: { tripCreatedAt: { gte: BOUND } } })).trips.driverPartnerIndex.edges;
  const all = (await gql(server.url, query, { d: DEMO_DRIVER })).trips.driverPartnerIndex.edges;
  assert.ok(filtered.length > PAGE_SIZE, 'the filtered trips fill more than one page');
  assert.ok(all.length > filtered.length, 'the range filter leaves some trips out');
  return filtered.map((e) => e.node);
}

/** The rows of the results table as a person reads them: one array of cell texts per row. */
async function resultRows(page) {
  return page.locator('table.results-table tbody tr').evaluateAll((rows) =>
    rows.map((row) => [...row.children].map((cell) => cell.innerText.trim())),
  );
}

async function checkPage(page, name, width) {
  await assertAccessible(page, `${name} at ${width} px`);
  if (width < 600) await assertNoSidewaysScroll(page, `${name} at ${width} px`);
  await screenshot(page, `explorer-${name}`);
}

for (const width of [1280, 390]) {
  test(`explorer at ${width} px: datastores, an index query paged forward and back, a row's history, a following cell log, health`, async () => {
    const browser = await launchBrowser({ width, height: width < 600 ? 844 : 900 });
    const { page } = browser;
    await browser.context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: server.url });
    try {
      const api = (
        await gql(server.url, '{ datastores { name columns { name } indexes { name shardField } topology { cluster } topologyVersion } }')
      ).datastores;
      const trips = api.find((d) => d.name === 'trips');

      // Datastores.
      await page.goto(`${server.url}/ui/`);
      await page.getByRole('heading', { name: 'Datastores', level: 1 }).waitFor();
      for (const ds of api) await page.getByRole('link', { name: ds.name, exact: true }).waitFor();
      await checkPage(page, 'home', width);

      // One datastore: columns, indexes with their shard field, topology.
      await page.getByRole('link', { name: 'trips', exact: true }).click();
      await page.getByRole('heading', { name: 'trips', level: 1 }).waitFor();
      const columns = page.getByRole('table', { name: 'Columns' });
      for (const column of trips.columns) await columns.getByRole('rowheader', { name: column.name }).waitFor();
      for (const index of trips.indexes) {
        const row = page
          .getByRole('table', { name: `Fields of ${index.name}` })
          .getByRole('row')
          .filter({ has: page.getByRole('rowheader', { name: index.shardField, exact: true }) });
        assert.match(await row.innerText(), /shard field/);
      }
      const ranges = await page.getByRole('table', { name: 'Shard ranges' }).innerText();
      for (const range of trips.topology) assert.ok(ranges.includes(range.cluster), ranges);
      await page.getByText(`(topology version ${trips.topologyVersion}):`).waitFor();
      await checkPage(page, 'datastore', width);

      // The index query form, with a range filter and an order.
      const expected = await expectedTrips();
      await page.getByRole('link', { name: 'Query driver_partner_index' }).click();
      await page.getByRole('heading', { name: 'driver_partner_index', level: 1 }).waitFor();
      await page.getByRole('textbox', { name: 'driver_partner_uuid (UUID, required)' }).fill(DEMO_DRIVER);
      await page.getByLabel('trip_created_at operator').selectOption({ label: '≥ at least' });
      await page.getByLabel('trip_created_at value').fill(BOUND);
      await page.getByLabel('Order by').selectOption({ label: 'trip_created_at' });
      await page.getByLabel('Page size').fill(String(PAGE_SIZE));
      await page.getByRole('button', { name: 'Run query' }).click();

      const pageOf = async (n, from) => {
        await page.getByText(new RegExp(`^Page ${n}: ${Math.min(PAGE_SIZE, expected.length - from)} entr`)).waitFor();
        const rows = await resultRows(page);
        const want = expected.slice(from, from + PAGE_SIZE).map((t) => [t.rowKey, t.cityUuid, t.tripCreatedAt]);
        assert.deepEqual(rows, want, `page ${n}`);
        for (const [, , created] of rows) assert.ok(created >= BOUND, `${created} is in range`);
      };
      await pageOf(1, 0);
      // The README's picture of the explorer: the form and the first page.
      if (width === 1280) await screenshotTop(page, 'explorer', page.getByRole('navigation', { name: 'Pages' }));
      const header = await page.locator('table.results-table thead').innerText();
      assert.deepEqual(header.split(/\t|\n/).map((s) => s.trim()).filter(Boolean), ['Row key', 'city_uuid', 'trip_created_at']);

      // The GraphQL of the page: shown, copyable, and what the API answers.
      const shownQuery = await page.getByTestId('generated-query').innerText();
      const shownVariables = JSON.parse(await page.getByTestId('generated-variables').innerText());
      assert.match(shownQuery, /driverPartnerIndex\(/);
      assert.match(shownQuery, /\$where: TripsDriverPartnerIndexWhere/);
      assert.deepEqual(shownVariables.where, { tripCreatedAt: { gte: BOUND } });
      const direct = (await gql(server.url, shownQuery, shownVariables)).trips.driverPartnerIndex.edges;
      assert.deepEqual(
        direct.map((e) => e.node.rowKey),
        expected.slice(0, PAGE_SIZE).map((t) => t.rowKey),
      );
      await page.getByRole('button', { name: 'Copy query' }).click();
      await page.getByText('Query copied to the clipboard.', { exact: true }).waitFor();
      assert.equal(await page.evaluate(() => navigator.clipboard.readText()), shownQuery);
      const playground = new URL(await page.getByRole('link', { name: 'Open in playground' }).getAttribute('href'));
      assert.equal(`${playground.origin}${playground.pathname}`, `${server.url}/`);
      assert.equal(playground.searchParams.get('query'), shownQuery);
      assert.deepEqual(JSON.parse(playground.searchParams.get('variables')), shownVariables);
      await checkPage(page, 'query', width);

      await page.getByRole('button', { name: 'Next page →' }).click();
      await pageOf(2, PAGE_SIZE);
      await page.getByRole('button', { name: '← Previous page' }).click();
      await pageOf(1, 0);

      // A row and its history.
      const rowKey = expected[0].rowKey;
      await page.getByRole('link', { name: rowKey }).click();
      await page.getByRole('heading', { name: `Row ${rowKey}`, level: 1 }).waitFor();
      const history = (
        await gql(server.url, 'query($k: UUID!) { trips { history(rowKey: $k, column: STATUS) { refKey shard addedId createdAt body } } }', {
          k: rowKey,
        })
      ).trips.history;
      assert.ok(history.length >= 2, 'the trip has several statuses');
      const status = page.getByRole('list', { name: 'Versions of STATUS' });
      const versions = status.getByRole('listitem');
      assert.equal(await versions.count(), history.length);
      for (let i = 0; i < history.length; i += 1) {
        const text = await versions.nth(i).innerText();
        assert.ok(text.includes(`ref key ${history[i].refKey}`), text);
        assert.ok(text.includes(`"status": "${history[i].body.status}"`), text);
        assert.ok(text.includes(history[i].createdAt), text);
        assert.ok(text.includes(`Added id\n${history[i].addedId}`) || text.includes(`Added id\t${history[i].addedId}`), text);
      }
      assert.match(await versions.first().innerText(), /latest/);
      const shard = history[0].shard;
      assert.match(await page.locator('main').innerText(), new RegExp(`Shard\\s+${shard}\\b`));
      await checkPage(page, 'row', width);

      // The shard's cell log follows a cell written now.
      await page.getByRole('link', { name: `Cell log of shard ${shard}` }).click();
      await page.getByRole('heading', { name: `Cell log of shard ${shard}`, level: 1 }).waitFor();
      const log = page.getByRole('table', { name: `Cells of shard ${shard}` });
      await log.getByRole('link', { name: rowKey }).first().waitFor();
      assert.ok(await page.getByLabel('Follow new cells').isChecked());
      const note = `followed at ${width} px ${Date.now()}`;
      const written = await gql(
        server.url,
        'mutation($k: UUID!, $r: Int64!, $b: JSON!) { tripsPutCells(cells: [{ rowKey: $k, column: NOTES, refKey: $r, body: $b }]) { status } }',
        { k: rowKey, r: String(Date.now()), b: { text: note } },
      );
      assert.equal(written.tripsPutCells[0].status, 'WRITTEN');
      const fresh = log.getByRole('row').filter({ hasText: note });
      await fresh.waitFor({ timeout: 10_000 });
      assert.match(await fresh.innerText(), /new/);
      assert.match(await fresh.innerText(), /NOTES/);
      await checkPage(page, 'log', width);

      // Health: readiness, clusters, index lag per datastore.
      await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Health' }).click();
      await page.getByRole('heading', { name: 'Health', level: 1 }).waitFor();
      await page.getByText('Ready', { exact: true }).waitFor();
      const clusters = await page.getByRole('table', { name: 'Storage clusters' }).innerText();
      assert.ok(clusters.includes(trips.topology[0].cluster), clusters);
      assert.ok(clusters.includes('none (a file database)'), clusters);
      const lag = page.getByRole('table', { name: 'Index lag per datastore' });
      for (const ds of api) {
        const row = lag.getByRole('row').filter({ has: page.getByRole('rowheader', { name: ds.name, exact: true }) });
        await eventually(async () => (await row.innerText()).includes('up to date'), `${ds.name}'s indexes are up to date`);
      }
      await page.getByText('No buffers: this gateway has one storage cluster.').waitFor();
      const topology = page.getByRole('table', { name: 'Topology per datastore' });
      for (const ds of api) {
        const row = topology.getByRole('row').filter({ has: page.getByRole('rowheader', { name: ds.name, exact: true }) });
        const cells = (await row.innerText()).split(/\t|\n/).map((t) => t.trim()).filter(Boolean);
        assert.deepEqual(cells.slice(-2), [String(ds.topologyVersion), 'none'], `${ds.name}: version, no move`);
      }
      await checkPage(page, 'health', width);

      browser.assertClean();
    } finally {
      await browser.close();
    }
  });
}

test('explorer by keyboard alone: skip link, navigation, the query form', async () => {
  const browser = await launchBrowser({ width: 1280 });
  const { page } = browser;
  try {
    await page.goto(`${server.url}/ui/`);
    await page.getByRole('heading', { name: 'Datastores', level: 1 }).waitFor();

    const focused = () =>
      page.evaluate(() => {
        const el = document.activeElement;
        const style = getComputedStyle(el);
        return {
          tag: el.tagName,
          text: (el.innerText || el.value || '').replace(/\s+/g, ' ').trim(),
          label: el.labels && el.labels[0] ? el.labels[0].innerText.trim() : null,
          outline: `${style.outlineStyle} ${parseFloat(style.outlineWidth)}`,
        };
      });
    const tabTo = async (matches, what) => {
      for (let i = 0; i < 60; i += 1) {
        await page.keyboard.press('Tab');
        const f = await focused();
        if (matches(f)) return f;
      }
      assert.fail(`Tab never reached ${what}`);
    };
    const assertVisibleFocus = (f) => assert.match(f.outline, /^solid [3-9]/, `${f.tag} "${f.text}" shows its focus`);

    await page.keyboard.press('Tab');
    const skip = await focused();
    assert.equal(skip.text, 'Skip to content');
    assertVisibleFocus(skip);
    await page.keyboard.press('Enter');
    assert.equal((await focused()).tag, 'MAIN');

    assertVisibleFocus(await tabTo((f) => f.tag === 'A' && f.text === 'trips', 'the trips link'));
    await page.keyboard.press('Enter');
    await page.getByRole('heading', { name: 'trips', level: 1 }).waitFor();
    assert.equal((await focused()).tag, 'H1', 'navigation moves focus to the new page’s heading');

    assertVisibleFocus(await tabTo((f) => f.tag === 'A' && f.text === 'Query driver_partner_index', 'the query link'));
    await page.keyboard.press('Enter');
    await page.getByRole('heading', { name: 'driver_partner_index', level: 1 }).waitFor();

    assertVisibleFocus(await tabTo((f) => f.tag === 'INPUT' && /^driver_partner_uuid/.test(f.label || ''), 'the shard field'));
    await page.keyboard.type(DEMO_DRIVER);
    const operator = await tabTo((f) => f.tag === 'SELECT' && (f.label || '').endsWith('operator'), 'an operator');
    assertVisibleFocus(operator);
    const run = await tabTo((f) => f.tag === 'BUTTON' && f.text === 'Run query', 'the run button');
    assertVisibleFocus(run);
    await page.keyboard.press('Enter');
    await page.getByRole('region', { name: 'Results' }).getByText(/^Page 1: \d+ entr/).waitFor();
    assert.ok((await resultRows(page)).length > 0);
    browser.assertClean();
  } finally {
    await browser.close();
  }
});

test('explorer: mistakes are explained next to the form, request headers from the settings are sent', async () => {
  const browser = await launchBrowser({ width: 1280 });
  const { page } = browser;
  try {
    await page.goto(`${server.url}/ui/#/ds/trips/index/city_trips_index`);
    await page.getByRole('heading', { name: 'city_trips_index', level: 1 }).waitFor();
    await page.getByRole('textbox', { name: 'city_uuid (UUID, required)' }).fill('not-a-uuid');
    await page.getByLabel('fare_total operator').selectOption({ label: '< less than' });
    await page.getByLabel('fare_total value').fill('cheap');
    await page.getByRole('button', { name: 'Run query' }).click();
    const alert = page.getByRole('alert');
    await alert.waitFor();
    assert.match(await alert.innerText(), /city_uuid: "not-a-uuid" is not a UUID/);
    assert.match(await alert.innerText(), /fare_total: "cheap" is not a number/);

    await page.goto(`${server.url}/ui/#/ds/nowhere`);
    await page.getByText('No datastore is named “nowhere”.').waitFor();

    await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Settings' }).click();
    await page.getByRole('textbox', { name: 'Request headers' }).fill('X-Explorer-Check: from settings');
    await page.getByRole('button', { name: 'Save headers' }).click();
    await page.getByText('Saved: 1 header sent with every request from this tab.').waitFor();
    const request = page.waitForRequest((r) => r.url() === `${server.url}/graphql` && r.method() === 'POST');
    await page.goto(`${server.url}/ui/#/ds/trips/row/${'0'.repeat(8)}-0000-4000-8000-000000000000`);
    assert.equal((await request).headers()['x-explorer-check'], 'from settings');
    await page.getByText('This row has no cells.').waitFor();
    browser.assertClean();
  } finally {
    await browser.close();
  }
});
