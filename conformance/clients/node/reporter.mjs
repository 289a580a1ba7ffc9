// A node:test reporter that writes one line per top-level test: "PASS|FAIL|SKIP amqplib/<name>",
// the format conformance/clients/run.sh compares between brokers. Use it next to the spec
// reporter:
//   node --test --test-reporter=spec --test-reporter-destination=stdout \
//     --test-reporter=./reporter.mjs --test-reporter-destination=results.txt test/
const suite = process.env.SUITE_NAME || 'amqplib';

export default async function* lines(source) {
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    const { name, nesting, skip, todo } = event.data;
    if (nesting !== 0) continue;
    let outcome = event.type === 'test:pass' ? 'PASS' : 'FAIL';
    if (skip !== undefined || todo !== undefined) outcome = 'SKIP';
    yield `${outcome} ${suite}/${name.replace(/\s+/g, '_')}\n`;
  }
}
