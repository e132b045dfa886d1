"""``dsec.Sandbox``: create, find, list and drive sandboxes; ``sb.exec``, ``sb.spawn`` and
``sb.attach`` (streamed output, reattach from offsets), ``sb.files``, pause/resume,
snapshot/fork, trajectory/replay and network policy."""

from __future__ import annotations

import base64
import codecs
import os
import re
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

from ._errors import (
    CommandExitError,
    DsecError,
    DsecTimeoutError,
    InternalError,
    NotFoundError,
    UnavailableError,
    invalid_argument,
)
from ._http import StreamResponse, path_segment, streamed_error
from ._ws import WebSocket
from ._screen import Screen
from ._types import (
    ExecResult,
    ExitInfo,
    FileInfo,
    LayerInfo,
    NetworkInfo,
    OutputEvent,
    Page,
    PauseResult,
    ProcessInfo,
    SandboxInfo,
    SandboxStats,
    TrajectoryPage,
    camelize,
    from_api,
    snakify,
)
from .client import Client

#: Command timeout of ``exec`` when none is given (seconds).
DEFAULT_EXEC_TIMEOUT = 60.0
#: Most output ``exec`` collects per stream when it streams (as the server does without streaming).
MAX_COLLECTED_OUTPUT_BYTES = 16 * 1024 * 1024
#: How often a dropped output stream is reopened before a handle gives up.
MAX_RECONNECTS = 3

Command = Union[str, Sequence[str]]
TextCallback = Optional[Callable[[str], None]]

_SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _check_sandbox_id(sandbox_id: str) -> str:
    if not isinstance(sandbox_id, str) or not _SANDBOX_ID.match(sandbox_id):
        raise invalid_argument("sandbox_id", "not a sandbox id")
    return sandbox_id


def _client(client: Optional[Client]) -> Client:
    return client if client is not None else Client.default()


def _command_fields(cmd: Command) -> Dict[str, Any]:
    if isinstance(cmd, str):
        if not cmd:
            raise invalid_argument("cmd", "must not be empty")
        return {"cmd": cmd}
    if isinstance(cmd, (list, tuple)) and cmd and all(isinstance(a, str) for a in cmd):
        return {"argv": list(cmd)}
    raise invalid_argument("cmd", "must be a string or a non-empty list of strings")


def _ms(seconds: Optional[float], field: str) -> Optional[int]:
    if seconds is None or seconds == 0:
        return None
    if not isinstance(seconds, (int, float)) or seconds < 0:
        raise invalid_argument(field, "must be a number of seconds >= 0")
    return max(1, int(round(seconds * 1000)))


def _exec_body(cmd: Command, *, cwd: Optional[str], env: Optional[Dict[str, str]], uid: Optional[int], gid: Optional[int], stdin: Union[str, bytes, None], timeout_ms: Optional[int]) -> Dict[str, Any]:
    body: Dict[str, Any] = _command_fields(cmd)
    if cwd is not None:
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise invalid_argument("cwd", "must be an absolute path")
        body["cwd"] = cwd
    if env is not None:
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise invalid_argument("env", "must map names to strings")
        body["env"] = env
    if uid is not None:
        body["uid"] = uid
    if gid is not None:
        body["gid"] = gid
    if isinstance(stdin, str):
        body["stdin"] = stdin
    elif isinstance(stdin, (bytes, bytearray)):
        body["stdinBase64"] = base64.b64encode(bytes(stdin)).decode("ascii")
    elif stdin is not None:
        raise invalid_argument("stdin", "must be str or bytes")
    if timeout_ms is not None:
        body["timeoutMs"] = timeout_ms
    return body


def _describe(cmd: Command) -> str:
    return cmd if isinstance(cmd, str) else " ".join(cmd)


@dataclass
class BatchItem:
    """One item of a batch: its sandbox, or the error that kept it from being created."""

    index: int
    sandbox: "Optional[Sandbox]" = None
    error: Optional[DsecError] = None


@dataclass
class BatchResult:
    """What ``Sandbox.create_batch`` returns: one item per requested sandbox, in request order."""

    items: List[BatchItem]
    created: int
    failed: int

    @property
    def sandboxes(self) -> "List[Sandbox]":
        """The created sandboxes, in request order."""
        return [i.sandbox for i in self.items if i is not None and i.sandbox is not None]


@dataclass
class ForkResult:
    snapshot: LayerInfo
    sandboxes: "List[Sandbox]"


@dataclass
class ReplayResult:
    """The replay's new sandbox and a verdict per step (``same``, ``exit-differs``, ...)."""

    sandbox: "Sandbox"
    from_seq: int
    steps: List[Dict[str, Any]]
    summary: Dict[str, Any]
    truncated: bool
    error: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


# ---------------------------------------------------------------------------------------------
# Processes


class ExecHandle:
    """A process started with ``sb.spawn`` or found again with ``sb.attach``.

    Iterate it for ``OutputEvent``s (bytes with their offsets); ``on_stdout``/``on_stderr``
    see the same output as text. ``wait()`` reads to the exit. A dropped connection is reopened
    from the offsets seen (``MAX_RECONNECTS`` times). ``disconnect()`` leaves the process
    running: ``sb.attach(handle.pid, from_stdout=..., from_stderr=...)`` reads on from
    ``handle.offsets`` without loss or repetition, from this process or another one."""

    def __init__(self, sandbox: "Sandbox", pid: int, stream: Any, *, on_stdout: TextCallback = None, on_stderr: TextCallback = None, offsets: Optional[Dict[str, int]] = None, reconnect: bool = True, ws: Optional[WebSocket] = None) -> None:
        self.sandbox = sandbox
        self.pid = pid
        #: The WebSocket of an interactive process (``spawn(stdin=True)`` or ``pty``), else None.
        self._ws = ws
        self._stream: Any = stream
        self._events: Optional[Iterator[Any]] = stream.iter_json_lines()
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}
        self._offsets = {"stdout": 0, "stderr": 0, **(offsets or {})}
        #: Bytes lost per stream (no longer held by the agent when read).
        self.lost_bytes = {"stdout": 0, "stderr": 0}
        self._exit: Optional[ExitInfo] = None
        self._reconnect = reconnect
        self._disconnected = False

    @property
    def sandbox_id(self) -> str:
        return self.sandbox.id

    @property
    def offsets(self) -> Dict[str, int]:
        """Bytes of output seen so far per stream (where to attach again from)."""
        return dict(self._offsets)

    @property
    def exit_info(self) -> Optional[ExitInfo]:
        """How the process ended, once it has."""
        return self._exit

    def __iter__(self) -> Iterator[OutputEvent]:
        while True:
            ev = self._next()
            if ev is None:
                return
            yield ev

    def __enter__(self) -> "ExecHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disconnect()

    def wait(self, timeout: Optional[float] = None) -> ExitInfo:
        """Reads to the exit (callbacks see the rest of the output) and returns how it ended.
        With ``timeout`` (seconds) and no exit by then: DsecTimeoutError, and the handle is
        disconnected (the process runs on; attach again from ``offsets``)."""
        deadline = time.monotonic() + timeout if timeout else None
        while self._exit is None:
            if deadline is not None and self._stream is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.disconnect()
                    raise DsecTimeoutError(f"process {self.pid}: no exit within {timeout} s", details={"pid": self.pid})
                self._stream.set_read_timeout(left)
            try:
                if self._next() is None and self._exit is None:
                    break
            except DsecTimeoutError:
                self.disconnect()
                raise DsecTimeoutError(f"process {self.pid}: no exit within {timeout} s", details={"pid": self.pid}) from None
        if self._exit is None:
            raise UnavailableError(f"process {self.pid}: output stream ended before the exit", details={"pid": self.pid})
        return self._exit

    def kill(self, signal: str = "SIGKILL") -> None:
        """Sends a signal to the process (default SIGKILL)."""
        if self._ws is not None and self._stream is not None:
            self._ws.send_json({"type": "signal", "signal": signal})
        else:
            self.sandbox.signal(self.pid, signal)

    def write_stdin(self, data: Union[str, bytes]) -> None:
        """Writes to the process's stdin (spawned with ``stdin=True`` or ``pty``)."""
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        if self._ws is not None:
            # Messages are capped at 2 MiB of base64: big writes go in pieces.
            for i in range(0, max(len(payload), 1), 1 << 20):
                self._ws.send_json({"type": "stdin", "data": base64.b64encode(payload[i : i + (1 << 20)]).decode("ascii")})
        else:
            self.sandbox._write_stdin(self.pid, payload, False)

    def close_stdin(self) -> None:
        """Closes the process's stdin (EOF)."""
        if self._ws is not None:
            self._ws.send_json({"type": "eof"})
        else:
            self.sandbox._write_stdin(self.pid, b"", True)

    def resize(self, rows: int, cols: int) -> None:
        """Resizes the terminal of a process spawned with ``pty``."""
        if self._ws is None:
            raise invalid_argument("pty", "the process has no terminal")
        self._ws.send_json({"type": "resize", "rows": rows, "cols": cols})

    def disconnect(self) -> None:
        """Drops the connection without stopping the process."""
        self._disconnected = True
        if self._stream is not None:
            self._stream.close()
        self._stream = None
        self._events = None

    def _next(self) -> Optional[OutputEvent]:
        reconnects = 0
        while True:
            if self._exit is not None:
                return None
            if self._events is None:
                if self._disconnected:
                    raise UnavailableError(f"process {self.pid}: disconnected by the client", details={"pid": self.pid})
                self._open()
            try:
                assert self._events is not None
                raw = next(self._events, None)
            except (DsecError, ValueError) as e:
                if isinstance(e, DsecTimeoutError):
                    raise
                if isinstance(e, DsecError) and e.code not in ("UNAVAILABLE",):
                    self._drop()
                    raise
                if isinstance(e, DsecError) and e.code == "CANCELLED":
                    raise
                raw = None
                failure: Optional[BaseException] = e
            else:
                failure = None
            if raw is None:
                self._drop()
                if not self._reconnect or reconnects >= MAX_RECONNECTS or self._disconnected:
                    if failure is not None:
                        raise failure
                    raise UnavailableError(f"process {self.pid}: output stream ended before the exit", details={"pid": self.pid})
                reconnects += 1
                time.sleep(0.05 * reconnects)
                continue
            out = self._handle(raw)
            if out is not None:
                return out
            if self._exit is not None:
                self._drop()
                self._flush()
                return None

    def _open(self) -> None:
        self._stream = self.sandbox._output_stream(self.pid, self._offsets["stdout"], self._offsets["stderr"])
        self._events = self._stream.iter_json_lines()

    def _drop(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream = None
        self._events = None

    def _flush(self) -> None:
        for s, d in self._decoders.items():
            rest = d.decode(b"", final=True)
            cb = self._callbacks[s]
            if rest and cb is not None:
                cb(rest)

    def _handle(self, ev: Dict[str, Any]) -> Optional[OutputEvent]:
        t = ev.get("type")
        if t == "output":
            stream = ev["stream"]
            data = base64.b64decode(ev.get("data", ""))
            offset = int(ev["offset"])
            seen = self._offsets[stream]
            if offset + len(data) <= seen:
                return None  # already delivered (overlap after a reattach)
            if offset < seen:
                data = data[seen - offset :]
                offset = seen
            elif offset > seen:
                self.lost_bytes[stream] += offset - seen
            self._offsets[stream] = offset + len(data)
            cb = self._callbacks[stream]
            if cb is not None:
                text = self._decoders[stream].decode(data)
                if text:
                    cb(text)
            return OutputEvent(stream=stream, data=data, offset=offset)
        if t == "gap":
            stream = ev["stream"]
            end = int(ev["offset"]) + int(ev["bytes"])
            if end > self._offsets[stream]:
                self.lost_bytes[stream] += end - max(int(ev["offset"]), self._offsets[stream])
                self._offsets[stream] = end
            return None
        if t == "exit":
            self._exit = from_api(ExitInfo, {k: v for k, v in ev.items() if k not in ("type", "pid")})
            return None
        if t == "error":
            self._drop()
            raise streamed_error(ev.get("error"))
        return None


def _collect(handle: ExecHandle) -> ExecResult:
    chunks: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
    sizes = {"stdout": 0, "stderr": 0}
    truncated = False
    for ev in handle:
        room = MAX_COLLECTED_OUTPUT_BYTES - sizes[ev.stream]
        if room <= 0:
            truncated = True
            continue
        data = ev.data
        if len(data) > room:
            data, truncated = data[:room], True
        chunks[ev.stream].append(data)
        sizes[ev.stream] += len(data)
    exit_info = handle.wait()
    if handle.lost_bytes["stdout"] or handle.lost_bytes["stderr"]:
        truncated = True
    raw = dict(exit_info.raw)
    return from_api(
        ExecResult,
        {
            **raw,
            "pid": handle.pid,
            "stdout": b"".join(chunks["stdout"]).decode("utf-8", "replace"),
            "stderr": b"".join(chunks["stderr"]).decode("utf-8", "replace"),
            "truncated": truncated,
        },
    )


# ---------------------------------------------------------------------------------------------
# Files


class Files:
    """Files of one sandbox. Paths are absolute paths inside the sandbox."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def _route(self, suffix: str = "") -> str:
        return self._sb._route("/files" + suffix)

    @staticmethod
    def _path(path: str, field: str = "path") -> str:
        if not isinstance(path, str) or not path.startswith("/") or len(path) > 4096:
            raise invalid_argument(field, "must be an absolute path")
        return path

    def read(self, path: str, *, format: str = "text", offset: Optional[int] = None, length: Optional[int] = None) -> Any:
        """Reads a file as text (``format="text"``, default) or bytes (``format="bytes"``)."""
        if format not in ("text", "bytes"):
            raise invalid_argument("format", "must be text or bytes")
        q = {"path": self._path(path), "offset": offset, "length": length}
        body = self._sb._t.request("GET", self._route(), query=q, accept="application/octet-stream").body
        return body if format == "bytes" else body.decode("utf-8")

    def read_bytes(self, path: str) -> bytes:
        return self.read(path, format="bytes")  # type: ignore[no-any-return]

    def write(self, path: str, data: Union[str, bytes, IO[bytes]], *, mode: Optional[int] = None, append: bool = False) -> None:
        """Writes a file (creating parent directories), replacing it or appending to it.
        ``mode``: permission bits of a new file, e.g. ``0o755``."""
        q: Dict[str, Any] = {"path": self._path(path)}
        if mode is not None:
            if not isinstance(mode, int) or not 0 <= mode <= 0o7777:
                raise invalid_argument("mode", "must be permission bits such as 0o644")
            q["mode"] = format(mode, "04o")
        if append:
            q["append"] = "true"
        body = data.encode("utf-8") if isinstance(data, str) else data
        self._sb._t.request("PUT", self._route(), query=q, body=body, content_type="application/octet-stream")

    def list(self, path: str) -> List[FileInfo]:
        """Lists a directory."""
        reply = self._sb._t.request("GET", self._route("/list"), query={"path": self._path(path)}).json()
        return [from_api(FileInfo, x) for x in reply["items"]]

    def stat(self, path: str) -> FileInfo:
        """Metadata of one file (``FileNotFoundInSandboxError`` when missing)."""
        return from_api(FileInfo, self._sb._t.request("GET", self._route("/stat"), query={"path": self._path(path)}).json())

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except NotFoundError:
            return False

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, or a directory with ``recursive``."""
        self._sb._t.request("DELETE", self._route(), query={"path": self._path(path), "recursive": "true" if recursive else None})

    def make_dir(self, path: str) -> None:
        """Creates a directory and its parents (``mkdir -p``)."""
        self._sb._t.request("POST", self._route("/mkdir"), query={"path": self._path(path)})

    def rename(self, src: str, dst: str) -> None:
        self._sb._t.request("POST", self._route("/rename"), json_body={"from": self._path(src, "src"), "to": self._path(dst, "dst")})

    def upload_tar(self, remote_dir: str, tar: Union[bytes, IO[bytes]], *, timeout: Optional[float] = None) -> None:
        """Unpacks a tar archive (bytes, or a seekable binary file) into ``remote_dir``."""
        self._sb._t.request("PUT", self._route("/tar"), query={"path": self._path(remote_dir, "remote_dir")}, body=tar, content_type="application/x-tar", timeout=timeout)

    def download_tar(self, remote_dir: str, out: Optional[IO[bytes]] = None, *, timeout: Any = "default") -> Union[bytes, int]:
        """``remote_dir`` as a tar archive: its bytes, or written to ``out`` (returns the count)."""
        stream = self._sb._t.request("GET", self._route("/tar"), query={"path": self._path(remote_dir, "remote_dir")}, accept="application/x-tar", stream=True, timeout=timeout)
        with stream:
            if out is None:
                return stream.read()
            n = 0
            while True:
                chunk = stream.read(1 << 16)
                if not chunk:
                    return n
                out.write(chunk)
                n += len(chunk)

    def upload_dir(self, local_dir: str, remote_dir: str, *, timeout: Optional[float] = None) -> int:
        """Uploads the content of a local directory into ``remote_dir`` as one tar; returns its size."""
        if not os.path.isdir(local_dir):
            raise invalid_argument("local_dir", f"not a directory: {local_dir}")
        with tempfile.TemporaryFile() as tmp:
            with tarfile.open(fileobj=tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for name in sorted(os.listdir(local_dir)):
                    tar.add(os.path.join(local_dir, name), arcname=name)
            size = tmp.tell()
            tmp.seek(0)
            self.upload_tar(remote_dir, tmp, timeout=timeout)
            return size

    def download_dir(self, remote_dir: str, local_dir: str) -> int:
        """Downloads ``remote_dir`` as a tar and unpacks it into ``local_dir`` (created if
        missing); members that would land outside it are refused. Returns the tar's size."""
        os.makedirs(local_dir, exist_ok=True)
        with tempfile.TemporaryFile() as tmp:
            n = self.download_tar(remote_dir, tmp)
            tmp.seek(0)
            with tarfile.open(fileobj=tmp, mode="r:") as tar:
                _safe_extract(tar, local_dir)
        return int(n)


def _safe_extract(tar: tarfile.TarFile, dest: str) -> None:
    root = os.path.realpath(dest)
    members = []
    for m in tar.getmembers():
        target = os.path.realpath(os.path.join(root, m.name))
        if target != root and not target.startswith(root + os.sep):
            raise InternalError(f"download_dir: tar member {m.name!r} escapes the directory")
        if m.issym() or m.islnk():
            link = os.path.realpath(os.path.join(os.path.dirname(target), m.linkname)) if m.issym() else os.path.realpath(os.path.join(root, m.linkname))
            if link != root and not link.startswith(root + os.sep):
                continue  # a link out of the directory is left out
        if m.isdev():
            continue
        members.append(m)
    if hasattr(tarfile, "data_filter"):
        tar.extractall(root, members=members, filter="data")  # type: ignore[call-arg]
    else:  # pragma: no cover - Pythons without the extraction filters
        tar.extractall(root, members=members)


# ---------------------------------------------------------------------------------------------
# Network


class Network:
    """The network of one sandbox: policy, addresses, counters and egress log."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def info(self) -> NetworkInfo:
        return from_api(NetworkInfo, self._sb._t.request("GET", self._sb._route("/network")).json())

    def set(self, policy: Dict[str, Any]) -> NetworkInfo:
        """Replaces the policy (``{"mode": "none"}`` or ``{"mode": "allowlist", "allow": [...], "presets": [...]}``)."""
        return from_api(NetworkInfo, self._sb._t.request("PUT", self._sb._route("/network"), json_body=camelize(policy)).json())

    def patch(self, patch: Dict[str, Any]) -> NetworkInfo:
        """Changes part of the policy (``{"presets": {"add": ["pypi"]}}``)."""
        return from_api(NetworkInfo, self._sb._t.request("PATCH", self._sb._route("/network"), json_body=camelize(patch)).json())

    def log(self, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """The latest egress attempts (allowed and denied), oldest first."""
        reply = self._sb._t.request("GET", self._sb._route("/network/log"), query={"limit": limit}).json()
        return snakify(reply["items"])  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------
# Sandbox


class Sandbox:
    """A sandbox. Make one with ``Sandbox.create``, ``create_batch``, ``connect`` or ``find``.

    Every call takes the client's deadline (``Client(timeout=...)``) and can be cancelled with
    ``dsec.Cancel``. ``with Sandbox.create(...) as sb:`` kills it at the end of the block."""

    def __init__(self, client: Client, sandbox_id: str, info: Optional[SandboxInfo] = None) -> None:
        self.client = client
        self.id = sandbox_id
        #: The latest description the API gave of it.
        self.last_info = info
        self.files = Files(self)
        self.network = Network(self)
        #: A VM's screen, mouse and keyboard: ``sb.screen.capture()``, ``.click(x, y)``, ``.type(text)``.
        self.screen = Screen(self)

    def __repr__(self) -> str:
        state = self.last_info.state if self.last_info else "?"
        return f"Sandbox({self.id!r}, state={state!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill()
        except NotFoundError:
            pass

    @property
    def _t(self) -> Any:
        return self.client.transport

    def _route(self, suffix: str = "") -> str:
        return f"/v1/sandboxes/{path_segment(self.id)}{suffix}"

    def _remember(self, data: Dict[str, Any]) -> SandboxInfo:
        self.last_info = from_api(SandboxInfo, data)
        return self.last_info

    # ---- creating and finding ----

    @classmethod
    def create(
        cls,
        image: Union[str, Dict[str, Any], None] = None,
        *,
        client: Optional[Client] = None,
        idempotency_key: Optional[str] = None,
        timeout: Any = "default",
        **spec: Any,
    ) -> "Sandbox":
        """Creates a sandbox: ``Sandbox.create("busybox", env={...}, labels={...},
        resources={"memory_mib": 256}, lease={"idle_timeout_ms": 0}, network={...})``.
        ``image`` is a base layer name or ``{"base", "workspace", "toolkits"}``; or give
        ``snapshot=``. The create is idempotent under ``idempotency_key`` (default: a random key
        per call, so that retries and failover never create twice)."""
        c = _client(client)
        body = _spec_body(image, spec)
        if "owner" not in body and c.owner_session is not None:
            body["owner"] = c.owner_session.id()
        t = timeout
        adm = body.get("admission") or {}
        if t == "default" and adm.get("wait") and c.timeout:
            t = c.timeout + adm.get("timeoutMs", 30_000) / 1000.0
        reply = c.transport.request("POST", "/v1/sandboxes", json_body=body, headers=_idempotency(idempotency_key), timeout=t).json()
        return cls(c, reply["id"], from_api(SandboxInfo, reply))

    @classmethod
    def create_batch(
        cls,
        count: Optional[int] = None,
        spec: Optional[Dict[str, Any]] = None,
        *,
        items: Optional[Sequence[Dict[str, Any]]] = None,
        admission: Optional[Dict[str, Any]] = None,
        client: Optional[Client] = None,
        idempotency_key: Optional[str] = None,
        on_item: Optional[Callable[[BatchItem], None]] = None,
        timeout: Optional[float] = None,
    ) -> BatchResult:
        """Creates ``count`` sandboxes of one ``spec`` (a dict of ``create``'s arguments, ``image``
        included), or one per entry of ``items``; items stream back as they finish (``on_item``).
        Returns one item per sandbox in request order: its sandbox, or its error."""
        c = _client(client)
        owner = c.owner_session.id() if c.owner_session is not None else None
        body: Dict[str, Any] = {}
        if items is not None:
            body["items"] = [_with_owner(_spec_body(it.get("image"), {k: v for k, v in it.items() if k != "image"}), owner) for it in items]
        else:
            if spec is None or count is None:
                raise invalid_argument("count", "give count with spec, or items")
            s = dict(spec)
            body["spec"] = _with_owner(_spec_body(s.pop("image", None), s), owner)
            body["count"] = count
        if admission is not None:
            body["admission"] = camelize(admission)
        stream = c.transport.request("POST", "/v1/sandboxes:batch", json_body=body, accept="application/x-ndjson", headers=_idempotency(idempotency_key), stream=True, timeout=timeout)
        n = len(body["items"]) if "items" in body else int(body["count"])
        out: List[Any] = [None] * n
        summary = None
        with stream:
            for ev in stream.iter_json_lines():
                if ev.get("type") == "error":
                    raise streamed_error(ev.get("error"))
                if ev.get("type") == "summary":
                    summary = ev
                    continue
                item = BatchItem(index=ev["index"])
                if ev.get("sandbox"):
                    item.sandbox = cls(c, ev["sandbox"]["id"], from_api(SandboxInfo, ev["sandbox"]))
                if ev.get("error"):
                    item.error = streamed_error(ev["error"])
                out[item.index] = item
                if on_item is not None:
                    on_item(item)
        if summary is None:
            raise UnavailableError("batch: the stream ended before its summary")
        return BatchResult(items=out, created=summary["created"], failed=summary["failed"])

    @classmethod
    def connect(cls, sandbox_id: str, *, client: Optional[Client] = None, claim: bool = True) -> "Sandbox":
        """An existing sandbox by id (``SandboxNotFoundError`` if there is none). A client with
        an owner session takes it over (``claim=False`` to only look), resuming it if its old
        owner's loss paused it."""
        c = _client(client)
        sb = cls(c, _check_sandbox_id(sandbox_id))
        if c.owner_session is not None and claim:
            sb.set_owner(c.owner_session.id())
        else:
            sb.info()
        return sb

    @classmethod
    def from_id(cls, sandbox_id: str, *, client: Optional[Client] = None) -> "Sandbox":
        """A handle by id without asking the API (e.g. to read or replay a gone sandbox's trajectory)."""
        return cls(_client(client), _check_sandbox_id(sandbox_id))

    @classmethod
    def find(cls, *, labels: Optional[Dict[str, str]] = None, state: Optional[str] = None, client: Optional[Client] = None, claim: bool = True) -> "List[Sandbox]":
        """Connects to every sandbox with these labels (and state), as ``connect`` does."""
        c = _client(client)
        out = []
        for info in cls.list(labels=labels, state=state, client=c):
            sb = cls(c, info.id, info)
            if c.owner_session is not None and claim:
                sb.set_owner(c.owner_session.id())
            out.append(sb)
        return out

    @classmethod
    def list(cls, *, labels: Optional[Dict[str, str]] = None, state: Optional[str] = None, limit: Optional[int] = None, client: Optional[Client] = None) -> Iterator[SandboxInfo]:
        """Every sandbox (with these labels, in this state), fetching pages as it is iterated;
        ``limit`` is the page size."""
        c = _client(client)
        cursor: Optional[str] = None
        while True:
            page = cls.list_page(labels=labels, state=state, limit=limit, cursor=cursor, client=c)
            yield from page.items
            cursor = page.next_cursor
            if not cursor:
                return

    @classmethod
    def list_page(cls, *, labels: Optional[Dict[str, str]] = None, state: Optional[str] = None, limit: Optional[int] = None, cursor: Optional[str] = None, client: Optional[Client] = None) -> Page:
        c = _client(client)
        q = {"label": [f"{k}={v}" for k, v in (labels or {}).items()] or None, "state": state, "limit": limit, "cursor": cursor}
        reply = c.transport.request("GET", "/v1/sandboxes", query=q).json()
        return Page(items=[from_api(SandboxInfo, x) for x in reply["items"]], next_cursor=reply.get("nextCursor"))

    # ---- lifecycle ----

    @property
    def state(self) -> Optional[str]:
        """The state in the latest description (``info()`` refreshes it)."""
        return self.last_info.state if self.last_info else None

    def info(self) -> SandboxInfo:
        """Fetches the sandbox's current description."""
        return self._remember(self._t.request("GET", self._route()).json())

    def stats(self) -> SandboxStats:
        return from_api(SandboxStats, self._t.request("GET", self._route("/stats")).json())

    def kill(self) -> None:
        """Destroys the sandbox and everything in it."""
        self._t.request("DELETE", self._route())

    def pause(self, *, memory: Optional[str] = None) -> PauseResult:
        """Freezes every process and makes its memory reclaimable; everything is kept.

        ``memory="file"`` (microVMs) writes the memory to a file on the node and frees it until resumed.
        """
        body = {} if memory is None else {"memory": memory}
        r = from_api(PauseResult, self._t.request("POST", self._route("/pause"), json_body=body).json())
        self.last_info = r.sandbox
        return r

    def resume(self, *, prefetch: Optional[bool] = None) -> PauseResult:
        body = {} if prefetch is None else {"prefetch": prefetch}
        r = from_api(PauseResult, self._t.request("POST", self._route("/resume"), json_body=body).json())
        self.last_info = r.sandbox
        return r

    def set_lease(self, **lease: Any) -> SandboxInfo:
        """Changes the lease: ``idle_timeout_ms``, ``max_lifetime_ms``, ``on_idle``,
        ``owner_grace_ms``, ``on_owner_lost``, ``auto_resume``."""
        return self._remember(self._t.request("PATCH", self._route(), json_body={"lease": camelize(lease)}).json())

    def set_owner(self, owner: Optional[str]) -> SandboxInfo:
        """Hands the sandbox to an owner session (None: none); resumes it if its old owner's loss paused it."""
        return self._remember(self._t.request("PATCH", self._route(), json_body={"owner": owner}).json())

    # ---- commands ----

    def exec(
        self,
        cmd: Command,
        *,
        timeout: Optional[float] = DEFAULT_EXEC_TIMEOUT,
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        uid: Optional[int] = None,
        gid: Optional[int] = None,
        check: bool = False,
        on_stdout: TextCallback = None,
        on_stderr: TextCallback = None,
    ) -> ExecResult:
        """Runs a command to completion (a string runs under ``/bin/sh -c``; a list is an argv).
        ``timeout``: seconds before the command is killed (None: never). A non-zero exit is a
        result unless ``check``. With ``on_stdout``/``on_stderr`` output streams to them."""
        timeout_ms = _ms(timeout, "timeout")
        body = _exec_body(cmd, cwd=cwd, env=env, uid=uid, gid=gid, stdin=stdin, timeout_ms=timeout_ms)
        req_timeout = (timeout_ms / 1000.0 + (self.client.timeout or 30.0)) if timeout_ms else None
        if on_stdout is not None or on_stderr is not None:
            handle = self._spawn(body, on_stdout, on_stderr, req_timeout, reconnect=False)
            result = _collect(handle)
        else:
            result = from_api(ExecResult, self._t.request("POST", self._route("/exec"), json_body=body, timeout=req_timeout).json())
        if check and result.exit_code != 0:
            raise CommandExitError(result, _describe(cmd), self.id)
        return result

    def spawn(
        self,
        cmd: Command,
        *,
        timeout: Optional[float] = None,
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[bool, str, bytes, None] = None,
        pty: Optional[Dict[str, int]] = None,
        uid: Optional[int] = None,
        gid: Optional[int] = None,
        on_stdout: TextCallback = None,
        on_stderr: TextCallback = None,
    ) -> ExecHandle:
        """Starts a command and returns at once with a handle (output streamed over HTTP as
        ndjson; the handle reattaches by itself if the connection drops). ``stdin`` (str or
        bytes) is written, then closed. ``stdin=True`` keeps it open for ``write_stdin``, and
        ``pty={"rows": 24, "cols": 80}`` runs under a terminal: both go over the WebSocket
        route. ``timeout``: seconds before the process is killed (default: never)."""
        timeout_ms = _ms(timeout, "timeout")
        if stdin is True or pty is not None:
            body = _exec_body(cmd, cwd=cwd, env=env, uid=uid, gid=gid, stdin=None, timeout_ms=timeout_ms)
            if pty is not None:
                if not isinstance(pty, dict) or not all(isinstance(pty.get(k), int) for k in ("rows", "cols")):
                    raise invalid_argument("pty", "must be {'rows': int, 'cols': int}")
                body["pty"] = {"rows": pty["rows"], "cols": pty["cols"]}
            return self._spawn_ws(body, on_stdout, on_stderr)
        body = _exec_body(cmd, cwd=cwd, env=env, uid=uid, gid=gid, stdin=None if stdin is False else stdin, timeout_ms=timeout_ms)  # type: ignore[arg-type]
        return self._spawn(body, on_stdout, on_stderr, "default", reconnect=True)

    def _spawn_ws(self, body: Dict[str, Any], on_stdout: TextCallback, on_stderr: TextCallback) -> ExecHandle:
        t = self._t
        target = t.targets[t._current]
        ws = WebSocket.connect(target, self._route("/exec/ws"), t.api_key, t.timeout, t.ssl_context)
        try:
            ws.set_read_timeout(t.timeout)
            ws.send_json(body)
            events = ws.iter_json_lines()
            first = next(events, None)
            ws.set_read_timeout(None)
        except BaseException:
            ws.close()
            raise
        if first is None:
            ws.close()
            raise UnavailableError("exec ws: closed before the start event")
        if first.get("type") == "error":
            ws.close()
            raise streamed_error(first.get("error"))
        if first.get("type") != "start":
            ws.close()
            raise InternalError(f"exec ws: expected a start event, got {first.get('type')}")
        handle = ExecHandle(self, int(first["pid"]), ws, on_stdout=on_stdout, on_stderr=on_stderr, reconnect=False, ws=ws)
        handle._events = events
        return handle

    def _spawn(self, body: Dict[str, Any], on_stdout: TextCallback, on_stderr: TextCallback, timeout: Any, reconnect: bool) -> ExecHandle:
        stream = self._t.request("POST", self._route("/exec"), json_body=body, accept="application/x-ndjson", stream=True, timeout="default" if timeout is None else timeout)
        if timeout not in (None, "default") and isinstance(timeout, (int, float)):
            stream.set_read_timeout(float(timeout))
        events = stream.iter_json_lines()
        try:
            first = next(events, None)
        except BaseException:
            stream.close()
            raise
        if first is None:
            stream.close()
            raise UnavailableError("exec: the stream ended before the start event")
        if first.get("type") == "error":
            stream.close()
            raise streamed_error(first.get("error"))
        if first.get("type") != "start":
            stream.close()
            raise InternalError(f"exec: expected a start event, got {first.get('type')}")
        handle = ExecHandle(self, int(first["pid"]), stream, on_stdout=on_stdout, on_stderr=on_stderr, reconnect=reconnect)
        handle._events = events
        return handle

    def attach(self, pid: int, *, from_stdout: int = 0, from_stderr: int = 0, on_stdout: TextCallback = None, on_stderr: TextCallback = None) -> ExecHandle:
        """Attaches to a process again (after a restart, a crash, a ``disconnect()``), reading
        its output from the given byte offsets (a handle's ``offsets``)."""
        if not isinstance(pid, int) or pid < 0:
            raise invalid_argument("pid", "not a process handle")
        for name, v in (("from_stdout", from_stdout), ("from_stderr", from_stderr)):
            if not isinstance(v, int) or v < 0:
                raise invalid_argument(name, "must be an integer >= 0")
        stream = self._output_stream(pid, from_stdout, from_stderr)
        return ExecHandle(self, pid, stream, on_stdout=on_stdout, on_stderr=on_stderr, offsets={"stdout": from_stdout, "stderr": from_stderr})

    def _output_stream(self, pid: int, from_stdout: int, from_stderr: int) -> StreamResponse:
        return self._t.request(  # type: ignore[no-any-return]
            "GET", self._route(f"/processes/{pid}/output"), query={"from": from_stdout, "fromStderr": from_stderr}, accept="application/x-ndjson", stream=True
        )

    def processes(self) -> List[ProcessInfo]:
        """Processes the sandbox's agent knows, running and exited."""
        return [from_api(ProcessInfo, p) for p in self._t.request("GET", self._route("/processes")).json()["items"]]

    def signal(self, pid: int, signal: str = "SIGKILL") -> None:
        """Sends a signal to a process of the sandbox."""
        self._t.request("POST", self._route(f"/processes/{int(pid)}/signal"), json_body={"signal": signal})

    def _write_stdin(self, pid: int, data: Union[str, bytes], eof: bool) -> None:
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self._t.request("POST", self._route(f"/processes/{int(pid)}/stdin"), query={"eof": "true" if eof else None}, body=payload)

    # ---- network ----

    def set_network(self, policy: Dict[str, Any]) -> NetworkInfo:
        return self.network.set(policy)

    def patch_network(self, patch: Dict[str, Any]) -> NetworkInfo:
        return self.network.patch(patch)

    def network_log(self, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        return self.network.log(limit)

    # ---- snapshots, changes ----

    def snapshot(self, name: Optional[str] = None, *, timeout: Any = "default") -> LayerInfo:
        """Packs the sandbox's writable layer into a snapshot layer
        (``Sandbox.create(snapshot=layer.digest)`` starts sandboxes from it)."""
        body = {} if name is None else {"name": name}
        return from_api(LayerInfo, self._t.request("POST", self._route("/snapshot"), json_body=body, timeout=timeout).json())

    def fork(self, count: int, *, labels: Optional[Dict[str, str]] = None, timeout_ms: Optional[int] = None, timeout: Optional[float] = None) -> ForkResult:
        """One snapshot, then ``count`` independent sandboxes from it (all or none)."""
        body = camelize({"count": count, "labels": labels, "timeout_ms": timeout_ms})
        reply = self._t.request("POST", self._route("/fork"), json_body=body, timeout=timeout).json()
        return ForkResult(
            snapshot=from_api(LayerInfo, reply["snapshot"]),
            sandboxes=[Sandbox(self.client, s["id"], from_api(SandboxInfo, s)) for s in reply["sandboxes"]],
        )

    def diff(self, *, paths: Optional[Sequence[str]] = None, hash: Optional[bool] = None, limit: Optional[int] = None, cursor: Optional[str] = None) -> Dict[str, Any]:
        """One page of what the sandbox changed against its layers."""
        q = {"path": list(paths) if paths else None, "hash": hash, "limit": limit, "cursor": cursor}
        return snakify(self._t.request("GET", self._route("/diff"), query=q).json())  # type: ignore[no-any-return]

    def verify(self, expected: Dict[str, str]) -> Dict[str, Any]:
        """Whether each path holds a regular file with the given sha256."""
        return snakify(self._t.request("POST", self._route("/verify"), json_body={"expected": expected}).json())  # type: ignore[no-any-return]

    # ---- trajectory ----

    def trajectory_page(self, *, after: Optional[int] = None, limit: Optional[int] = None, content: Optional[bool] = None) -> TrajectoryPage:
        q = {"after": after, "limit": limit, "content": None if content is None else ("true" if content else "false")}
        return from_api(TrajectoryPage, self._t.request("GET", self._route("/trajectory"), query=q).json())

    def trajectory(self, *, after: Optional[int] = None, limit: Optional[int] = None, content: Optional[bool] = None) -> Iterator[Dict[str, Any]]:
        """Every recorded step (commands and file changes) in order, a page at a time; each a
        dict with snake_case keys (``seq``, ``kind``, ``command``, ``exit``, ``stdout``...)."""
        while True:
            page = self.trajectory_page(after=after, limit=limit, content=content)
            yield from page.items
            if page.next_cursor is None:
                return
            after = int(page.next_cursor)

    def replay(self, *, on_step: Optional[Callable[[Dict[str, Any]], None]] = None, timeout: Optional[float] = None, **opts: Any) -> ReplayResult:
        """A fresh sandbox with the recorded steps re-run and compared (``up_to``, ``snapshot``,
        ``resources``, ``env``, ``labels``, ``timeout_ms``, ``stop_on_divergence``). Works after
        this sandbox is gone, while its trajectory is kept."""
        body = camelize(opts)
        result: Optional[Dict[str, Any]] = None
        if on_step is None:
            result = self._t.request("POST", self._route("/replay"), json_body=body, timeout=timeout).json()
        else:
            with self._t.request("POST", self._route("/replay"), json_body=body, accept="application/x-ndjson", stream=True, timeout=timeout) as stream:
                for ev in stream.iter_json_lines():
                    if ev.get("type") == "step":
                        on_step(snakify(ev["step"]))
                    elif ev.get("type") == "done":
                        result = ev["result"]
                    elif ev.get("type") == "error":
                        raise streamed_error(ev.get("error"))
            if result is None:
                raise UnavailableError("replay: the stream ended without a result")
        assert result is not None
        s = result["sandbox"]
        return ReplayResult(
            sandbox=Sandbox(self.client, s["id"], from_api(SandboxInfo, s)),
            from_seq=result["fromSeq"],
            steps=snakify(result["steps"]),
            summary=snakify(result["summary"]),
            truncated=result["truncated"],
            error=result.get("error"),
            raw=result,
        )


def _spec_body(image: Union[str, Dict[str, Any], None], spec: Dict[str, Any]) -> Dict[str, Any]:
    body = dict(spec)
    if image is not None:
        body["image"] = {"base": image} if isinstance(image, str) else image
    if isinstance(body.get("image"), str):
        body["image"] = {"base": body["image"]}
    return camelize(body)  # type: ignore[no-any-return]


def _with_owner(body: Dict[str, Any], owner: Optional[str]) -> Dict[str, Any]:
    if owner is not None and "owner" not in body:
        body["owner"] = owner
    return body


def _idempotency(key: Optional[str]) -> Dict[str, str]:
    if key is None:
        return {"Idempotency-Key": f"auto-{uuid.uuid4()}"}
    if not isinstance(key, str) or not re.match(r"^[\x21-\x7e]{1,255}$", key):
        raise invalid_argument("idempotency_key", "1-255 printable ASCII characters")
    return {"Idempotency-Key": key}
