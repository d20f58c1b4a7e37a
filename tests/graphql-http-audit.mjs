// GraphQL-over-HTTP conformance: runs the server audits of the `graphql-http`
// package against a running endpoint.
//
//   node graphql-http-audit.mjs http://127.0.0.1:PORT/graphql
//
// Prints one line per audit (`ok`, or the level of the failed requirement:
// `notice` for MAY, `warn` for SHOULD, `error` for MUST, with the reason),
// then `N passed, N failed`. Exits 1 when any MUST failed (or an audit
// could not run at all), else 0.
import { serverAudits } from 'graphql-http';

const url = process.argv[2];
if (!url || !url.startsWith('http')) {
  console.error('usage: node graphql-http-audit.mjs <http://host:port/graphql>');
  process.exit(2);
}

let passed = 0;
let failed = 0;
let mustFailures = 0;
for (const audit of serverAudits({ url })) {
  let result;
  try {
    result = await audit.fn();
  } catch (error) {
    result = { status: 'error', reason: `audit threw: ${error?.cause?.code ?? error?.message ?? error}` };
  }
  if (result.status === 'ok') {
    passed += 1;
    console.log(`ok     ${audit.id} ${audit.name}`);
    continue;
  }
  failed += 1;
  if (result.status === 'error') mustFailures += 1;
  let detail = '';
  if (result.response) {
    const body = await result.response.text().catch(() => '');
    detail = ` [status ${result.response.status}: ${body.slice(0, 200)}]`;
  }
  console.log(`${result.status.padEnd(6)} ${audit.id} ${audit.name} -- ${result.reason}${detail}`);
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(mustFailures > 0 ? 1 : 0);
