"""The synchronous SDK against a real platform: create/connect/find/list, exec, spawn and
reattach, files, pause/resume, lease, snapshot/fork, trajectory/replay, network."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

import dsec


def test_config_from_environment_and_errors(platform, client, monkeypatch):
    monkeypatch.setenv("DSEC_API_URL", platform.url)
    monkeypatch.setenv("DSEC_API_KEY", platform.api_key)
    env_client = dsec.Client()
    assert env_client.api_url == platform.url.rstrip("/")
    assert env_client.health()
    # The key falls back to $DSEC_HOME/admin.key, as the CLI does.
    monkeypatch.delenv("DSEC_API_KEY")
    monkeypatch.setenv("DSEC_HOME", platform.home)
    assert dsec.Client().transport.api_key == platform.api_key

    with pytest.raises(dsec.AuthenticationError) as e:
        list(dsec.Sandbox.list(client=dsec.Client(platform.url, "dsec_not_a_key")))
    assert e.value.status == 401 and e.value.code == "UNAUTHENTICATED"
    with pytest.raises(dsec.SandboxNotFoundError) as nf:
        dsec.Sandbox.connect(f"{client.api_url.split(':')[-1]}-nosuchsandbox", client=client)
    assert isinstance(nf.value, dsec.NotFoundError) and isinstance(nf.value, dsec.DsecError)
    with pytest.raises(dsec.InvalidArgumentError) as bad:
        dsec.Sandbox.create("busybox", resources={"memory_mib": 4}, client=client)
    assert bad.value.field == "resources.memoryMiB"
    with pytest.raises(dsec.LayerNotFoundError):
        dsec.Sandbox.create("no-such-layer", client=client)
    # Client-side validation names the Python argument.
    with pytest.raises(dsec.InvalidArgumentError) as local:
        dsec.Client(platform.url, timeout=-1)
    assert local.value.field == "timeout"
    with pytest.raises(dsec.InvalidArgumentError):
        dsec.Sandbox.from_id("bad id!", client=client)


def test_exec_result_env_cwd_stdin_timeout_check(sandbox):
    r = sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.ok) == ("out\n", "err\n", 3, False, False)
    assert r.pid >= 0 and r.duration_ms >= 0 and r.signal is None
    r = sandbox.exec(["sh", "-c", 'echo "$A-$B" && pwd'], env={"A": "1", "B": "two"}, cwd="/tmp")
    assert r.stdout == "1-two\n/tmp\n"
    assert sandbox.exec("cat", stdin="from stdin").stdout == "from stdin"
    assert sandbox.exec("wc -c", stdin=bytes(range(256))).stdout.strip() == "256"
    slow = sandbox.exec("sleep 30", timeout=1)
    assert slow.timed_out and slow.exit_code is None and slow.signal == "SIGKILL"
    with pytest.raises(dsec.CommandExitError) as e:
        sandbox.exec("echo nope >&2; exit 7", check=True)
    assert e.value.exit_code == 7 and e.value.code == "COMMAND_FAILED" and "nope" in str(e.value)
    seen = []
    r = sandbox.exec("for i in 1 2 3; do echo $i; done; echo x >&2", on_stdout=seen.append, on_stderr=seen.append)
    assert "".join(seen).replace("x\n", "") == "1\n2\n3\n" and r.stdout == "1\n2\n3\n" and r.stderr == "x\n"
    with pytest.raises(dsec.InvalidArgumentError) as bad:
        sandbox.exec("true", cwd="relative")
    assert bad.value.field == "cwd"


def test_spawn_streams_and_reattaches_from_offsets(sandbox):
    expected = "".join(f"line-{i}\n" for i in range(30))
    h = sandbox.spawn("i=0; while [ $i -lt 30 ]; do echo line-$i; i=$((i+1)); sleep 0.02; done; echo bye >&2")
    first = b""
    for ev in h:
        assert ev.stream == "stdout" and ev.offset == len(first)
        first += ev.data
        if first.count(b"\n") >= 3:
            break
    offsets = h.offsets
    assert offsets["stdout"] == len(first)
    h.disconnect()
    with pytest.raises(dsec.UnavailableError):
        h.wait()
    text = []
    again = sandbox.attach(h.pid, from_stdout=offsets["stdout"], from_stderr=offsets["stderr"], on_stdout=text.append)
    exit_info = again.wait(timeout=30)
    assert exit_info.exit_code == 0
    assert first.decode() + "".join(text) == expected
    assert again.offsets == {"stdout": len(expected), "stderr": 4}
    procs = {p.pid: p for p in sandbox.processes()}
    assert procs[h.pid].state == "exited"
    # A handle read from 0 sees everything once; kill ends a running one.
    full = sandbox.attach(h.pid)
    assert b"".join(ev.data for ev in full if ev.stream == "stdout").decode() == expected
    long = sandbox.spawn("sleep 30")
    long.kill()
    assert long.wait(timeout=30).signal == "SIGKILL"
    with pytest.raises(dsec.DsecTimeoutError):
        sandbox.spawn("sleep 30", timeout=40).wait(timeout=0.5)


def test_files(sandbox, tmp_path):
    f = sandbox.files
    f.make_dir("/work/a")
    f.write("/work/a/b.txt", "hello")
    f.write("/work/a/b.txt", " world", append=True)
    assert f.read("/work/a/b.txt") == "hello world"
    f.write("/work/bin.dat", bytes(range(256)), mode=0o600)
    assert f.read_bytes("/work/bin.dat") == bytes(range(256))
    assert f.read("/work/bin.dat", format="bytes", offset=10, length=3) == bytes([10, 11, 12])
    st = f.stat("/work/bin.dat")
    assert (st.type, st.size, st.mode & 0o777) == ("file", 256, 0o600)
    assert sorted(x.name for x in f.list("/work")) == ["a", "bin.dat"]
    f.make_dir("/work/d/e")
    f.rename("/work/a/b.txt", "/work/d/e/c.txt")
    assert f.exists("/work/d/e/c.txt") and not f.exists("/work/a/b.txt")
    with pytest.raises(dsec.FileNotFoundInSandboxError):
        f.read("/work/nope")
    f.remove("/work/d", recursive=True)
    assert not f.exists("/work/d")
    # Directories as tar, both ways.
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(src / "run.sh", 0o755)
    assert f.upload_dir(str(src), "/work/proj") > 0
    assert sandbox.exec("/work/proj/run.sh && cat /work/proj/pkg/mod.py").stdout == "ran\nX = 1\n"
    sandbox.exec("echo made > /work/proj/pkg/out.txt")
    dst = tmp_path / "dst"
    assert f.download_dir("/work/proj", str(dst)) > 0
    assert (dst / "pkg" / "out.txt").read_text() == "made\n"
    assert os.access(dst / "run.sh", os.X_OK)
    names = tarfile.open(fileobj=io.BytesIO(f.download_tar("/work/proj"))).getnames()
    assert any(n.endswith("pkg/mod.py") for n in names)


def test_pause_resume_lease_stats(sandbox):
    h = sandbox.spawn("i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done")
    p = sandbox.pause()
    assert p.sandbox.state == "paused" and sandbox.state == "paused" and p.duration_ms >= 0
    n1 = sandbox.files.read("/tmp/n") if sandbox.info().lease["auto_resume"] is False else None
    assert n1 is None
    r = sandbox.resume()
    assert r.sandbox.state == "running"
    assert sandbox.stats().memory_limit_bytes > 0
    info = sandbox.set_lease(idle_timeout_ms=0, on_owner_lost="kill")
    assert info.lease["idle_timeout_ms"] == 0 and info.lease["on_owner_lost"] == "kill"
    h.kill()
    h.wait(timeout=30)


def test_batch_list_find_and_context_manager(client, run_id):
    items = []
    res = dsec.Sandbox.create_batch(3, {"image": "busybox", "labels": {"run": run_id, "kind": "batch"}}, client=client, on_item=items.append)
    try:
        assert (res.created, res.failed, len(res.sandboxes)) == (3, 0, 3)
        assert sorted(i.index for i in items) == [0, 1, 2]
        listed = list(dsec.Sandbox.list(labels={"run": run_id, "kind": "batch"}, limit=2, client=client))
        assert sorted(s.id for s in listed) == sorted(s.id for s in res.sandboxes)
        found = dsec.Sandbox.find(labels={"run": run_id}, state="running", client=client)
        assert len(found) == 3 and all(s.last_info.labels["kind"] == "batch" for s in found)
        mixed = dsec.Sandbox.create_batch(items=[{"image": "busybox", "labels": {"run": run_id}}, {"image": "no-such-layer"}], client=client)
        assert (mixed.created, mixed.failed) == (1, 1)
        assert isinstance(mixed.items[1].error, dsec.LayerNotFoundError)
        mixed.sandboxes[0].kill()
    finally:
        for sb in res.sandboxes:
            sb.kill()
    with dsec.Sandbox.create("busybox", labels={"run": run_id}, client=client) as sb:
        same = dsec.Sandbox.connect(sb.id, client=client)
        assert same.info().state == "running"
    with pytest.raises(dsec.SandboxNotFoundError):
        sb.info()


def test_idempotent_create(client, run_id):
    a = dsec.Sandbox.create("busybox", labels={"run": run_id}, client=client, idempotency_key=f"k-{run_id}")
    try:
        b = dsec.Sandbox.create("busybox", labels={"run": run_id}, client=client, idempotency_key=f"k-{run_id}")
        assert a.id == b.id
    finally:
        a.kill()


def test_snapshot_fork_trajectory_replay(sandbox):
    sandbox.files.make_dir("/work")
    sandbox.files.write("/work/state.txt", "v1\n")
    sandbox.exec("echo step >> /work/state.txt")
    snap = sandbox.snapshot(name="py-snap")
    assert snap.digest and snap.kind == "snapshot"
    from_snap = dsec.Sandbox.create(snapshot=snap.digest, client=sandbox.client)
    fork = sandbox.fork(2, labels={"forked": "yes"})
    try:
        assert from_snap.files.read("/work/state.txt") == "v1\nstep\n"
        assert len(fork.sandboxes) == 2
        for s in fork.sandboxes:
            assert s.exec("cat /work/state.txt").stdout == "v1\nstep\n"
            assert s.last_info.labels["forked"] == "yes"
    finally:
        from_snap.kill()
        for s in fork.sandboxes:
            s.kill()
    steps = list(sandbox.trajectory())
    kinds = [s["kind"] for s in steps]
    assert kinds[:3] == ["mkdir", "write", "exec"]
    assert steps[2]["command"]["cmd"] == "echo step >> /work/state.txt" and steps[2]["exit"]["exit_code"] == 0
    page = sandbox.trajectory_page(limit=1)
    assert len(page.items) == 1 and page.next_cursor is not None and page.sandbox_id == sandbox.id
    verdicts = []
    rep = sandbox.replay(on_step=verdicts.append)
    try:
        assert rep.summary["same"] >= 3 and rep.summary["exit_differs"] == 0
        assert [v["verdict"] for v in verdicts][:3] == ["same", "same", "same"]
        assert rep.sandbox.files.read("/work/state.txt") == "v1\nstep\n"
    finally:
        rep.sandbox.kill()


def test_network_policy(sandbox, client, run_id):
    info = sandbox.network.info()
    assert info.policy == {"mode": "none"}
    info = sandbox.set_network({"mode": "allowlist", "allow": [{"host": "example.com", "ports": [443]}]})
    assert info.policy["mode"] == "allowlist" and info.policy["allow"][0]["host"] == "example.com"
    info = sandbox.patch_network({"allow": {"add": [{"host": "example.org"}]}})
    assert sorted(r["host"] for r in info.policy["allow"]) == ["example.com", "example.org"]
    assert isinstance(sandbox.network_log(limit=10), list)
    with pytest.raises(dsec.InvalidArgumentError) as e:
        sandbox.set_network({"mode": "none", "allow": [{"host": "x.com"}]})
    assert e.value.field.startswith("allow") or e.value.field.startswith("network")
    res = client.apply_network({"labels": {"run": run_id}}, policy={"mode": "none"})
    assert isinstance(res, dict)
    assert sandbox.network.info().policy == {"mode": "none"}


def test_interactive_stdin_and_pty_over_websocket(sandbox):
    h = sandbox.spawn("while read line; do echo got-$line; done; echo eof", stdin=True)
    h.write_stdin("a\n")
    first = next(iter(h))
    assert first.data == b"got-a\n"
    h.write_stdin(b"b\n")
    h.close_stdin()
    rest = b"".join(ev.data for ev in h)
    assert rest == b"got-b\neof\n" and h.wait(timeout=30).exit_code == 0
    t = sandbox.spawn("stty size; read x; echo [$x]", pty={"rows": 30, "cols": 100})
    t.write_stdin("hi\r")
    out = b"".join(ev.data for ev in t)
    assert b"30 100" in out and b"[hi]" in out
    k = sandbox.spawn("sleep 30", stdin=True)
    k.kill("SIGTERM")
    assert k.wait(timeout=30).signal == "SIGTERM"
    with pytest.raises(dsec.InvalidArgumentError):
        sandbox.spawn("true", pty={"rows": "x"})
