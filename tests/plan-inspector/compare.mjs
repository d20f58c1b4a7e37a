// Runs graphql-inspector's diff on pairs of SDL files and compares its
// classification with `cellgate plan --format json`'s GraphQL changes.
//
//   node compare.mjs OLD.graphql NEW.graphql PLAN.json [...more triples]
//
// Agreement: every path both report has the same criticality, and both
// report the same breaking paths. Prints the differences and exits 1 on
// any.
import { readFileSync } from 'node:fs';
import { buildSchema } from 'graphql';
import { diff, CriticalityLevel } from '@graphql-inspector/core';

const level = {
  [CriticalityLevel.Breaking]: 'breaking',
  [CriticalityLevel.Dangerous]: 'dangerous',
  [CriticalityLevel.NonBreaking]: 'safe',
};
const args = process.argv.slice(2);
let failed = false;
let compared = 0;
let reported = 0;
for (let i = 0; i < args.length; i += 3) {
  const [oldFile, newFile, planFile] = args.slice(i, i + 3);
  const changes = await diff(
    buildSchema(readFileSync(oldFile, 'utf8')),
    buildSchema(readFileSync(newFile, 'utf8')),
  );
  const theirs = new Map();
  for (const c of changes) {
    if (c.path) theirs.set(c.path, level[c.criticality.level]);
  }
  const ours = new Map();
  const plan = JSON.parse(readFileSync(planFile, 'utf8'));
  for (const c of plan.changes.filter((c) => c.section === 'graphql')) {
    ours.set(c.path, c.level);
  }
  const problems = [];
  for (const [path, criticality] of ours) {
    if (theirs.has(path) && theirs.get(path) !== criticality) {
      problems.push(`${path}: cellgate ${criticality}, graphql-inspector ${theirs.get(path)}`);
    }
    if (criticality === 'breaking' && !theirs.has(path)) {
      problems.push(`${path}: cellgate breaking, graphql-inspector reports nothing`);
    }
  }
  for (const [path, criticality] of theirs) {
    if (criticality === 'breaking' && !ours.has(path)) {
      problems.push(`${path}: graphql-inspector breaking, cellgate reports nothing`);
    }
  }
  compared += ours.size;
  reported += theirs.size;
  if (problems.length) {
    failed = true;
    console.log(`${planFile}:\n  ${problems.join('\n  ')}`);
  }
}
console.log(
  `${compared} GraphQL changes of cellgate plan, ${reported} of graphql-inspector: ${failed ? 'they differ' : 'they agree'}`,
);
process.exit(failed ? 1 : 0);
