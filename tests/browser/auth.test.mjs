// The explorer against a gateway with auth on: without a token it says so,
// and after a person enters `Authorization: Bearer …` on the Settings page,
// every page works with that token.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, launchBrowser } from './harness.mjs';

let server;
let token;

before(async () => {
  server = await startServer({
    args: ['--auth', 'on'],
    prepare: (cellgate) => {
      // `token create` prints the token on its first line.
      token = cellgate('token', 'create', '--scope', '*:read', '--name', 'browser').split('\n')[0].trim();
      assert.match(token, /^cg_/);
    },
  });
});

after(async () => {
  await server?.stop();
});

test('explorer with auth on: a token entered on the Settings page opens the datastores', async () => {
  const browser = await launchBrowser();
  const { page } = browser;
  try {
    // Without a token the gateway refuses, and the page says why.
    await page.goto(`${server.url}/ui/`);
    await page.getByText(/UNAUTHENTICATED|Bearer/).first().waitFor();
    assert.equal(await page.getByRole('link', { name: 'trips', exact: true }).count(), 0);

    await page.goto(`${server.url}/ui/#/settings`);
    await page.getByRole('heading', { name: 'Settings', level: 1 }).waitFor();
    await page.getByRole('textbox', { name: 'Request headers' }).fill(`Authorization: Bearer ${token}`);
    await page.getByRole('button', { name: 'Save headers' }).click();
    await page.getByText('Saved: 1 header sent with every request from this tab.').waitFor();

    await page.goto(`${server.url}/ui/#/`);
    await page.reload();
    await page.getByRole('heading', { name: 'Datastores', level: 1 }).waitFor();
    await page.getByRole('link', { name: 'trips', exact: true }).waitFor();
    await page.getByRole('link', { name: 'payments', exact: true }).waitFor();
    // Requests refused before the token was entered are the only errors.
    assert.deepEqual(browser.blocked, [], 'the pages requested nothing but 127.0.0.1');
    for (const problem of browser.problems) assert.match(problem, /401|Unauthorized/, problem);
  } finally {
    await browser.close();
  }
});
