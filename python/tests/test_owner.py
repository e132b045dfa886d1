"""Owner sessions with heartbeats: a trainer process SIGKILLed in the middle of a command lets
its sandbox pause (owner lost); a new trainer process takes the sandbox over (resuming it) and
reattaches to the command, reading the rest of its output from the offsets the first one saw."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import dsec
from conftest import until

N_LINES = 60
EXPECTED = "".join(f"line-{i}\n" for i in range(N_LINES)) + "done\n"

TRAINER = textwrap.dedent(
    f"""
    import json, sys, time
    import dsec
    client = dsec.Client(owner={{"grace_ms": 1000, "name": "trainer-1"}})
    sb = dsec.Sandbox.create("busybox", labels={{"run": sys.argv[1]}}, client=client)
    h = sb.spawn("i=0; while [ $i -lt {N_LINES} ]; do echo line-$i; i=$((i+1)); sleep 0.1; done; echo done")
    seen = b""
    for ev in h:
        seen += ev.data
        if seen.count(b"\\n") >= 5:
            break
    print(json.dumps({{"sandbox": sb.id, "pid": h.pid, "offsets": h.offsets, "seen": seen.decode(), "owner": sb.last_info.owner}}), flush=True)
    time.sleep(120)  # SIGKILLed here, mid-command
    """
)

RESUMER = textwrap.dedent(
    """
    import json, sys
    import dsec
    state = json.loads(sys.argv[1])
    with dsec.Client(owner={"name": "trainer-2"}) as client:
        sb = dsec.Sandbox.connect(state["sandbox"], client=client)  # takes it over, resumes it
        h = sb.attach(state["pid"], from_stdout=state["offsets"]["stdout"], from_stderr=state["offsets"]["stderr"])
        rest = b"".join(ev.data for ev in h if ev.stream == "stdout")
        print(json.dumps({"rest": rest.decode(), "exit": h.wait(timeout=60).exit_code, "state": sb.last_info.state, "owner": sb.last_info.owner}), flush=True)
        sb.set_owner(None)
    """
)


def test_killed_trainer_pauses_then_a_new_one_reattaches(platform, client, run_id):
    env = platform.env()
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, run_id], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    sandbox_id = None
    try:
        line = trainer.stdout.readline()
        assert line, trainer.stderr.read().decode()
        state = json.loads(line)
        sandbox_id = state["sandbox"]
        assert state["owner"].startswith("own_")
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(timeout=30)
        # No more heartbeats: the owner is lost after its grace and the sandbox paused, kept.
        sb = dsec.Sandbox.connect(sandbox_id, client=client, claim=False)
        until("the owner-lost pause", lambda: sb.info().state == "paused", timeout=30)
        assert sb.last_info.pause_reason == "owner-lost"
        assert client.owners.get(state["owner"]).state == "lost"

        out = subprocess.run([sys.executable, "-c", RESUMER, json.dumps(state)], env=env, capture_output=True, timeout=90)
        assert out.returncode == 0, out.stderr.decode()
        result = json.loads(out.stdout)
        assert result["state"] == "running" and result["owner"] != state["owner"]
        assert result["exit"] == 0
        # Nothing lost, nothing repeated: what the killed trainer saw, then the rest.
        assert state["seen"] + result["rest"] == EXPECTED
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        if sandbox_id is not None:
            try:
                dsec.Sandbox.from_id(sandbox_id, client=client).kill()
            except dsec.NotFoundError:
                pass


def test_owner_session_heartbeats_and_close(client, platform, run_id):
    owned = dsec.Client(platform.url, platform.api_key, owner={"grace_ms": 1000})
    sb = dsec.Sandbox.create("busybox", labels={"run": run_id}, client=owned)
    try:
        owner_id = sb.last_info.owner
        assert owner_id and owned.owner_session.id() == owner_id
        info = client.owners.get(owner_id)
        assert info.state == "active" and info.heartbeat_interval_ms <= 1000 and info.sandboxes == 1
        # Heartbeats keep it running well past the grace period.
        import time

        time.sleep(2.5)
        assert sb.info().state == "running" and client.owners.get(owner_id).state == "active"
        owned.close()
        assert client.owners.get(owner_id).state == "closed"
        until("the owner-closed pause", lambda: sb.info().state == "paused", timeout=30)
        assert sb.last_info.pause_reason == "owner-closed"
        low = client.owners.create(name="manual", grace_ms=5000)
        assert client.owners.heartbeat(low.id).state == "active"
        client.owners.close(low.id)
    finally:
        sb.kill()
