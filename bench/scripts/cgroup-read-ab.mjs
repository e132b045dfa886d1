// The exec path's synchronous cgroup counter reads (the OOM baseline of every exec: OOM kills and
// refused forks), microseconds per pair of reads, for two checkouts' builds in turn (alternating).
// Root: node bench/scripts/cgroup-read-ab.mjs <checkout-a> <checkout-b>
const [a, b] = process.argv.slice(2);
for (const checkout of [a, b, a, b]) {
  const { Cgroups, detectCgroupMode } = await import(`${checkout}/packages/edge/dist/host/cgroups.js`);
  const cg = new Cgroups(await detectCgroupMode(), `dsec-cgread-${process.pid}`);
  await cg.create('sb', { memoryBytes: 2 ** 26, cpu: 1, pids: 16 });
  try {
    const read = () => cg.oomKillsSync('sb') + cg.pidsLimitHitsSync('sb');
    for (let i = 0; i < 2000; i++) read();
    const t = process.hrtime.bigint();
    for (let i = 0; i < 20_000; i++) read();
    console.log(`RESULT ${checkout} us per read pair ${(Number(process.hrtime.bigint() - t) / 20_000 / 1000).toFixed(1)}`);
  } finally {
    await cg.remove('sb');
    await cg.removeParent();
  }
}
