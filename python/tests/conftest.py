"""A real dsec platform for the session: ``dsec up`` (the CLI of this checkout) on a throw-away
home and a free loopback port; stopped, cleaned and removed even when tests fail."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Dict, Iterator, List

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO_ROOT = os.path.dirname(PYTHON_DIR)
CLI = os.path.join(REPO_ROOT, "packages", "cli", "dist", "main.js")
AGENT = os.path.join(REPO_ROOT, "chronus", "build", "chronus")
START_TIMEOUT_S = 120.0

sys.path.insert(0, PYTHON_DIR)

import dsec  # noqa: E402


class Platform:
    def __init__(self, home: str) -> None:
        self.home = home
        self.proc: "subprocess.Popen[bytes] | None" = None
        self.url = ""
        self.api_key = ""
        self.output: List[str] = []

    def env(self) -> Dict[str, str]:
        """The environment a Python child (a trainer, a README example) gets: only this."""
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DSEC_API_URL": self.url, "DSEC_API_KEY": self.api_key, "PYTHONPATH": PYTHON_DIR}


def _start(home: str, args: List[str]) -> "tuple[subprocess.Popen[bytes], str, List[str]]":
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DSEC_HOME": home, "DSEC_AGENT": AGENT}
    proc = subprocess.Popen(
        ["node", CLI, "up", "--addr", "127.0.0.1:0", "--no-prebuild", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lines: List[str] = []
    found: Dict[str, str] = {}
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            lines.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                found["url"] = m.group(1)
            if "admin key" in line and "url" in found:
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(START_TIMEOUT_S) or "url" not in found or proc.poll() is not None:
        _stop(proc)
        raise RuntimeError("dsec up did not start:\n" + "\n".join(lines[-40:]))
    return proc, found["url"], lines


def _stop(proc: "subprocess.Popen[bytes]") -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # What it started in its session and left running (a runtime build, a helper) goes too.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _mounts_under(paths: List[str]) -> List[str]:
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            target = line.split(" ")[4]
            if any(target == p or target.startswith(p + "/") for p in paths):
                out.append(target)
    return out


def _remove_home(home: str) -> None:
    import hashlib

    run_dir = "/run/dsec/" + hashlib.sha256(os.path.realpath(os.path.join(home, "node")).encode()).hexdigest()[:12]
    if _mounts_under([home, run_dir]) and os.path.exists(os.path.join(home, "dsec.db")):
        try:
            proc, _, _ = _start(home, ["--clean"])
            _stop(proc)
        except RuntimeError:
            pass
    for _ in range(3):
        mounts = sorted(_mounts_under([home, run_dir]), key=len, reverse=True)
        if not mounts:
            break
        for m in mounts:
            subprocess.run(["umount", "-l", m], check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shutil.rmtree(home, ignore_errors=True)
    # The node's run directory (its clean shutdown removes it; a killed node leaves it).
    try:
        with open(os.path.join(run_dir, "home"), encoding="utf-8") as f:
            ours = f.read().strip() == os.path.join(home, "node")
    except OSError:
        ours = False
    if ours:
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def platform() -> Iterator[Platform]:
    if not os.path.exists(CLI) or not os.path.exists(AGENT):
        pytest.fail(f"build the checkout first (missing {CLI} or {AGENT})")
    home = tempfile.mkdtemp(prefix="dsec-pytest-")
    p = Platform(home)
    try:
        p.proc, p.url, p.output = _start(home, [])
        with open(os.path.join(home, "admin.key"), encoding="utf-8") as f:
            p.api_key = f.read().strip()
        yield p
    finally:
        if p.proc is not None:
            _stop(p.proc)
        _remove_home(home)


@pytest.fixture(scope="session")
def client(platform: Platform) -> Iterator[dsec.Client]:
    c = dsec.Client(platform.url, platform.api_key)
    yield c
    c.close()


@pytest.fixture()
def run_id() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture()
def sandbox(client: dsec.Client, run_id: str) -> Iterator[dsec.Sandbox]:
    sb = dsec.Sandbox.create("busybox", labels={"run": run_id}, client=client)
    try:
        yield sb
    finally:
        try:
            sb.kill()
        except dsec.DsecError:
            pass


def until(what: str, fn: Any, timeout: float = 30.0, interval: float = 0.1) -> Any:
    """Polls ``fn`` until it returns something truthy (a generous bound against a hang)."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
