"""Project-wide APIs and the transport: function calls, pools, keys and projects, retries on
429 honouring Retry-After, failover over several API URLs, cancellation, and the async API."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import dsec
from conftest import until


def test_calls_run_and_batch(client):
    r = client.calls.run("echo $((6*7)); echo e >&2; exit 4")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("42\n", "e\n", 4, False)
    up = client.calls.run("tr a-z A-Z", stdin="abc", env={"X": "1"})
    assert up.stdout == "ABC" and up.exit_code == 0
    files = client.calls.run(argv=["cat", "data/in.txt"], files={"data/in.txt": "file body"})
    assert files.stdout == "file body"
    slow = client.calls.run("sleep 30", timeout_ms=500)
    assert slow.timed_out
    out = client.calls.run_batch([{"code": f"echo {i}"} for i in range(5)] + [{"argv": ["sh", "-c", "echo argv"]}])
    assert [x.stdout for x in out] == [f"{i}\n" for i in range(5)] + ["argv\n"]
    with pytest.raises(dsec.InvalidArgumentError) as e:
        client.calls.run("x", runtime="ruby")
    assert e.value.field == "runtime"


def test_pools(client, run_id):
    name = f"py-{run_id}"
    pool = client.pools.put(name, {"image": {"base": "busybox"}, "resources": {"memory_mib": 64}}, 1, idle_timeout_ms=60_000)
    try:
        assert pool.name == name and pool.size == 1
        until("the pool to fill", lambda: client.pools.get(name).ready == 1, timeout=60)
        assert name in [p.name for p in client.pools.list()]
        sb = dsec.Sandbox.create("busybox", resources={"memory_mib": 64}, labels={"run": run_id}, client=client)
        try:
            assert sb.exec("echo pooled").stdout == "pooled\n"
        finally:
            sb.kill()
    finally:
        client.pools.delete(name)
    with pytest.raises(dsec.NotFoundError):
        client.pools.get(name)


def test_keys_projects_and_quota_retry(platform, client, run_id):
    project = client.projects.create(f"py-{run_id}", quota={"sandboxes": 1, "cpu": 8, "memory_mib": 8192})
    assert project.quota["sandboxes"] == 1 and project.parent is not None
    assert project.id in [p.id for p in client.projects.list()]
    assert client.projects.get(project.id).name == f"py-{run_id}"
    key = client.keys.create(f"py-{run_id}", "member", project=project.id)
    assert key.key and key.key.startswith("dsec_") and key.role == "member"
    assert key.id in [k.id for k in client.keys.list()]
    member = dsec.Client(platform.url, key.key, max_retries=6)
    first = dsec.Sandbox.create("busybox", client=member)
    try:
        # The quota is full: refused with 429 and Retry-After (no retry asked for)...
        no_retry = dsec.Client(platform.url, key.key, max_retries=0)
        with pytest.raises(dsec.QuotaExceededError) as e:
            dsec.Sandbox.create("busybox", client=no_retry)
        assert e.value.status == 429 and e.value.retry_after == 1.0
        assert isinstance(e.value, dsec.TooManyRequestsError)
        # ...and retried after the wait it asks for, until the quota frees.
        threading.Timer(0.3, first.kill).start()
        t0 = time.monotonic()
        second = dsec.Sandbox.create("busybox", client=member)
        assert time.monotonic() - t0 >= 0.9
        second.kill()
    finally:
        try:
            first.kill()
        except dsec.NotFoundError:
            pass
    viewer = client.keys.create(f"view-{run_id}", "viewer", project=project.id)
    with pytest.raises(dsec.PermissionDeniedError):
        dsec.Sandbox.create("busybox", client=dsec.Client(platform.url, viewer.key))
    client.keys.revoke(key.id)
    with pytest.raises(dsec.AuthenticationError):
        member.projects.list()


def test_failover_and_connection_reuse(platform, client):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens there: connections are refused
    c = dsec.Client(f"{dead},{platform.url}", platform.api_key)
    assert c.api_urls == [dead, platform.url.rstrip("/")]
    assert c.health()
    # The URL that answered is the one tried first from then on; connections are reused.
    assert c.transport._current == 1
    for _ in range(5):
        c.calls.run("true")
    assert len(c.transport.targets[1].idle) == 1
    only_dead = dsec.Client(dead, platform.api_key, max_retries=1)
    with pytest.raises(dsec.UnavailableError) as e:
        only_dead.health()
    assert e.value.details.get("errno") == "ECONNREFUSED"


def test_cancel_and_deadline(sandbox, platform):
    token = dsec.Cancel()
    threading.Timer(0.5, token.cancel).start()
    t0 = time.monotonic()
    with pytest.raises(dsec.CancelledError):
        with token:
            sandbox.exec("sleep 30")
    assert time.monotonic() - t0 < 10
    # A call's deadline (seconds): the client's default, or the call's own.
    short = dsec.Client(platform.url, platform.api_key, timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(dsec.DsecTimeoutError) as e:
        short.calls.run("sleep 30", timeout=0.5)
    assert isinstance(e.value, TimeoutError) and time.monotonic() - t0 < 10


def test_async_sandbox(platform, client, run_id):
    async def main() -> None:
        aclient = dsec.AsyncClient(platform.url, platform.api_key)
        async with await dsec.AsyncSandbox.create("busybox", labels={"run": run_id}, client=aclient) as sb:
            r = await sb.exec("echo async")
            assert r.stdout == "async\n"
            await sb.files.write("/tmp/x", "y")
            assert await sb.files.read("/tmp/x") == "y"
            h = await sb.spawn("for i in 1 2 3; do echo $i; done")
            data = b"".join([ev.data async for ev in h])
            assert data == b"1\n2\n3\n" and (await h.wait()).exit_code == 0
            infos = [i async for i in dsec.AsyncSandbox.list(labels={"run": run_id}, client=aclient)]
            assert [i.id for i in infos] == [sb.id]
            # Cancelling the task cancels the call at once.
            task = asyncio.ensure_future(sb.exec("sleep 30"))
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert time.monotonic() - t0 < 5
            calls = await asyncio.gather(*(aclient.calls.run(f"echo {i}") for i in range(4)))
            assert [c.stdout for c in calls] == [f"{i}\n" for i in range(4)]
            batch = await dsec.AsyncSandbox.create_batch(2, {"image": "busybox", "labels": {"run": run_id}}, client=aclient)
            outs = await asyncio.gather(*(s.exec("hostname") for s in batch.sandboxes))
            assert all(o.exit_code == 0 for o in outs)
            await asyncio.gather(*(s.kill() for s in batch.sandboxes))

    asyncio.run(main())
