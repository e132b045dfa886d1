// A trainer process for test/lifecycle.test.ts: opens an owner session (the SDK heartbeats it),
// creates a sandbox, starts a command that prints numbered lines, and reports on stdout, one JSON
// object per line, the sandbox, the process and every chunk of output with its byte offset. The
// test SIGKILLs it mid-command. Usage: node lifecycle-child.js <apiUrl> <apiKey> <graceMs> <label>
import { DsecClient, Sandbox } from '@dsec/sdk';

const [apiUrl, apiKey, graceMs, label] = process.argv.slice(2);
if (!apiUrl || !apiKey || !graceMs || !label) throw new Error('usage: lifecycle-child <apiUrl> <apiKey> <graceMs> <label>');

const report = (obj: object): void => void process.stdout.write(JSON.stringify(obj) + '\n');
const client = new DsecClient({ apiUrl, apiKey, owner: { graceMs: Number(graceMs), name: 'lifecycle-child' } });
const sandbox = await Sandbox.create({ image: { base: 'busybox' }, labels: { run: label }, resources: { memoryMiB: 64 } }, { client });
report({ type: 'sandbox', id: sandbox.id, owner: sandbox.lastInfo?.owner });
const handle = await sandbox.spawn('i=0; while true; do echo "line-$i"; i=$((i+1)); sleep 0.02; done');
report({ type: 'process', pid: handle.pid });
for await (const ev of handle) {
  report({ type: 'output', stream: ev.stream, offset: ev.offset, text: ev.data.toString('utf8'), end: ev.offset + ev.data.length });
}
