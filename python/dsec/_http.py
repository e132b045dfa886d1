"""The one place where HTTP happens: pooled keep-alive connections, deadlines, cancellation,
retries with backoff on 429/503 (honouring Retry-After), failover over several API URLs, and
every non-2xx reply or network failure turned into a DsecError."""

from __future__ import annotations

import http.client
import json
import random
import select
import socket
import ssl
import threading
import time
from typing import IO, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote, urlencode, urlsplit

from ._errors import (
    CancelledError,
    DsecError,
    DsecTimeoutError,
    UnavailableError,
    error_for,
    invalid_argument,
)

__all__ = ["Cancel", "Transport", "Response", "StreamResponse", "current_cancel"]

USER_AGENT = "dsec-python/0.1"
#: A kept-alive connection idle longer than this is not reused (the API keeps them 65 s).
_MAX_IDLE_S = 50.0
#: Idle connections kept per API URL.
_MAX_POOLED = 32

QueryValue = Union[str, int, float, bool, Sequence[str], None]
Body = Union[bytes, bytearray, str, IO[bytes], None]


class Cancel:
    """A cancellation token. ``cancel()`` (from any thread) ends the calls made under it at once
    with ``dsec.CancelledError``: calls inside ``with token:`` use it, as do calls that the async
    API makes for a task that gets cancelled."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._socks: "set[socket.socket]" = set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        self._event.set()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def sleep(self, seconds: float) -> None:
        """Sleeps, or raises CancelledError as soon as the token is cancelled."""
        if self._event.wait(max(0.0, seconds)):
            raise CancelledError("cancelled")

    def check(self) -> None:
        if self._event.is_set():
            raise CancelledError("cancelled")

    def _register(self, sock: Optional[socket.socket]) -> None:
        if sock is None:
            return
        with self._lock:
            self._socks.add(sock)
        if self._event.is_set():
            self.cancel()

    def _unregister(self, sock: Optional[socket.socket]) -> None:
        if sock is None:
            return
        with self._lock:
            self._socks.discard(sock)

    def __enter__(self) -> "Cancel":
        stack = _local.__dict__.setdefault("stack", [])
        stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.stack.pop()


_local = threading.local()


def current_cancel() -> Optional[Cancel]:
    """The innermost ``with Cancel()`` of this thread, if any."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


class _Target:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise invalid_argument("api_url", f"not an http(s) URL: {url}")
        self.url = url.rstrip("/")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.idle: List[Tuple[http.client.HTTPConnection, float]] = []
        self.lock = threading.Lock()


class Response:
    """A reply whose body has been read."""

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8")) if self.body else None


class StreamResponse:
    """A reply whose body is read as it comes (ndjson, tar, downloads). Close it when done."""

    def __init__(self, transport: "Transport", target: _Target, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, cancel: Optional[Cancel]) -> None:
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}
        self._transport = transport
        self._target = target
        self._conn = conn
        self._resp = resp
        self._cancel = cancel
        self._closed = False

    def read(self, n: int = -1) -> bytes:
        try:
            return self._resp.read(n) if n >= 0 else self._resp.read()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise self._transport._network_error(e, self._target, self._cancel) from e

    def readline(self) -> bytes:
        try:
            return self._resp.readline()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise self._transport._network_error(e, self._target, self._cancel) from e

    def set_read_timeout(self, seconds: Optional[float]) -> None:
        """Deadline of each further read (None: none); a read past it raises DsecTimeoutError."""
        if self._conn.sock is not None:
            self._conn.sock.settimeout(seconds)

    def iter_json_lines(self) -> Iterator[Any]:
        """One parsed value per non-empty line (``application/x-ndjson``)."""
        while True:
            line = self.readline()
            if not line:
                return
            line = line.strip()
            if line:
                yield json.loads(line.decode("utf-8"))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._cancel is not None:
            self._cancel._unregister(self._conn.sock)
        if self._resp.isclosed() and not self._resp.will_close:
            self._transport._release(self._target, self._conn)
        else:
            self._conn.close()

    def __enter__(self) -> "StreamResponse":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def build_query(query: Optional[Mapping[str, QueryValue]]) -> str:
    if not query:
        return ""
    pairs: List[Tuple[str, str]] = []
    for k, v in query.items():
        if v is None:
            continue
        if isinstance(v, bool):
            pairs.append((k, "true" if v else "false"))
        elif isinstance(v, (list, tuple)):
            pairs.extend((k, str(x)) for x in v)
        else:
            pairs.append((k, str(v)))
    return ("?" + urlencode(pairs)) if pairs else ""


def path_segment(s: str) -> str:
    return quote(s, safe="")


_NEVER_SENT = (ConnectionRefusedError, socket.gaierror)
_STALE = (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected, http.client.BadStatusLine)


class Transport:
    """Sends requests to one API (several URLs of replicas, tried in turn)."""

    def __init__(
        self,
        urls: Sequence[str],
        api_key: Optional[str],
        timeout: Optional[float],
        max_retries: int = 4,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        if not urls:
            raise invalid_argument("api_url", "no URL given")
        self.targets = [_Target(u) for u in urls]
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.ssl_context = ssl_context
        self._current = 0

    @property
    def api_urls(self) -> List[str]:
        return [t.url for t in self.targets]

    # ---- connections ----

    def _connect(self, target: _Target, timeout: Optional[float]) -> http.client.HTTPConnection:
        if target.scheme == "https":
            ctx = self.ssl_context or ssl.create_default_context()
            return http.client.HTTPSConnection(target.host, target.port, timeout=timeout, context=ctx)
        return http.client.HTTPConnection(target.host, target.port, timeout=timeout)

    def _acquire(self, target: _Target) -> Optional[http.client.HTTPConnection]:
        now = time.monotonic()
        with target.lock:
            while target.idle:
                conn, since = target.idle.pop()
                if now - since > _MAX_IDLE_S or conn.sock is None or _readable(conn.sock):
                    conn.close()
                    continue
                return conn
        return None

    def _release(self, target: _Target, conn: http.client.HTTPConnection) -> None:
        if conn.sock is None:
            return
        with target.lock:
            if len(target.idle) < _MAX_POOLED:
                target.idle.append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        """Closes every pooled connection."""
        for t in self.targets:
            with t.lock:
                idle, t.idle = t.idle, []
            for conn, _ in idle:
                conn.close()

    # ---- requests ----

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, QueryValue]] = None,
        json_body: Any = None,
        body: Body = None,
        content_type: Optional[str] = None,
        accept: str = "application/json",
        headers: Optional[Mapping[str, str]] = None,
        timeout: Union[float, None, str] = "default",
        stream: bool = False,
        retries: Optional[int] = None,
    ) -> Any:
        """Sends a request, with failover and retries; returns a Response, or a StreamResponse
        with ``stream=True`` (its deadline then covers only the reply's headers).
        ``timeout`` is in seconds; None or 0: no deadline; "default": the client's."""
        cancel = current_cancel()
        t = self.timeout if timeout == "default" else timeout
        deadline = (time.monotonic() + float(t)) if t else None  # type: ignore[arg-type]
        hdrs: Dict[str, str] = {"accept": accept, "user-agent": USER_AGENT}
        if self.api_key:
            hdrs["authorization"] = f"Bearer {self.api_key}"
        if headers:
            hdrs.update({k.lower(): v for k, v in headers.items()})
        payload: Any = None
        start_pos = 0
        if json_body is not None:
            payload = json.dumps(json_body).encode("utf-8")
            hdrs["content-type"] = "application/json"
        elif body is not None:
            if isinstance(body, str):
                payload = body.encode("utf-8")
                hdrs["content-type"] = content_type or "text/plain; charset=utf-8"
            elif isinstance(body, (bytes, bytearray)):
                payload = bytes(body)
                hdrs["content-type"] = content_type or "application/octet-stream"
            else:
                payload = body
                start_pos = body.tell()
                body.seek(0, 2)
                hdrs["content-length"] = str(body.tell() - start_pos)
                body.seek(start_pos)
                hdrs["content-type"] = content_type or "application/octet-stream"
        elif method in ("POST", "PUT", "PATCH"):
            payload = b""
        repeatable = method in ("GET", "PUT", "DELETE", "HEAD") or "idempotency-key" in hdrs
        full_path = path + build_query(query)
        n = len(self.targets)
        max_retries = self.max_retries if retries is None else retries
        attempt = 0
        while True:
            start = self._current
            for i in range(n):
                idx = (start + i) % n
                target = self.targets[idx]
                if payload is not None and not isinstance(payload, bytes):
                    payload.seek(start_pos)
                try:
                    reply = self._send(target, method, full_path, hdrs, payload, deadline, stream, cancel, repeatable)
                    self._current = idx
                    return reply
                except DsecError as err:
                    last = err
                    if cancel is not None and cancel.cancelled:
                        raise CancelledError("cancelled") from err
                    if i + 1 < n and _worth_failing_over(err, repeatable):
                        continue
                    break
            err = last
            if attempt >= max_retries or not _worth_retrying(err, repeatable):
                raise err
            delay = err.retry_after
            if delay is None:
                delay = min(8.0, 0.25 * (2**attempt)) * (0.5 + random.random() / 2)
            delay = min(delay, 30.0)
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise err
            attempt += 1
            if cancel is not None:
                cancel.sleep(delay)
            else:
                time.sleep(delay)

    def _send(
        self,
        target: _Target,
        method: str,
        path: str,
        headers: Dict[str, str],
        payload: Any,
        deadline: Optional[float],
        stream: bool,
        cancel: Optional[Cancel],
        repeatable: bool,
    ) -> Any:
        if cancel is not None:
            cancel.check()
        conn = self._acquire(target)
        reused = conn is not None
        pos = payload.tell() if payload is not None and not isinstance(payload, bytes) else 0
        for _ in range(2):
            if conn is None:
                conn = self._connect(target, _remaining(deadline))
            try:
                resp = self._exchange(conn, target, method, path, headers, payload, deadline, cancel)
                break
            except (OSError, http.client.HTTPException) as e:
                if cancel is not None:
                    cancel._unregister(conn.sock)
                conn.close()
                # A kept-alive socket the server closed while idle fails at once: repeat once.
                if reused and isinstance(e, _STALE) and (repeatable or isinstance(e, BrokenPipeError)) and not (cancel and cancel.cancelled):
                    conn, reused = None, False
                    if payload is not None and not isinstance(payload, bytes):
                        payload.seek(pos)
                    continue
                raise self._network_error(e, target, cancel) from e
        else:  # pragma: no cover
            raise UnavailableError(f"cannot reach {target.url}")
        try:
            if resp.status < 200 or resp.status >= 300:
                raw = resp.read()
                raise error_from_reply(resp.status, raw, resp.getheader("retry-after"))
            if stream:
                if conn.sock is not None:
                    conn.sock.settimeout(None)
                return StreamResponse(self, target, conn, resp, cancel)
            data = resp.read()
        except DsecError:
            if cancel is not None:
                cancel._unregister(conn.sock)
            if resp.will_close:
                conn.close()
            else:
                self._release(target, conn)
            raise
        except (OSError, http.client.HTTPException) as e:
            if cancel is not None:
                cancel._unregister(conn.sock)
            conn.close()
            raise self._network_error(e, target, cancel) from e
        if cancel is not None:
            cancel._unregister(conn.sock)
        if resp.will_close:
            conn.close()
        else:
            self._release(target, conn)
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        target: _Target,
        method: str,
        path: str,
        headers: Dict[str, str],
        payload: Any,
        deadline: Optional[float],
        cancel: Optional[Cancel],
    ) -> http.client.HTTPResponse:
        remaining = _remaining(deadline)
        if conn.sock is None:
            conn.timeout = remaining
            conn.connect()
        else:
            conn.sock.settimeout(remaining)
        if cancel is not None:
            cancel._register(conn.sock)
        conn.request(method, target.prefix + path, body=payload, headers=headers)
        if conn.sock is not None:
            conn.sock.settimeout(_remaining(deadline))
        return conn.getresponse()

    def _network_error(self, e: BaseException, target: _Target, cancel: Optional[Cancel]) -> DsecError:
        if cancel is not None and cancel.cancelled:
            return CancelledError("cancelled")
        if isinstance(e, socket.timeout):
            return DsecTimeoutError(f"{target.url}: no answer within the deadline")
        errno = None
        if isinstance(e, ConnectionRefusedError):
            errno = "ECONNREFUSED"
        elif isinstance(e, socket.gaierror):
            errno = "ENOTFOUND"
        elif isinstance(e, ConnectionResetError):
            errno = "ECONNRESET"
        elif isinstance(e, OSError) and e.errno in (101, 113, 99):
            errno = "EHOSTUNREACH"
        details = {"errno": errno} if errno else {}
        return UnavailableError(f"cannot reach {target.url}: {type(e).__name__}: {e}", details=details)


def _remaining(deadline: Optional[float]) -> Optional[float]:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise DsecTimeoutError("the call's deadline passed")
    return left


def _readable(sock: socket.socket) -> bool:
    """A pooled socket that is readable while idle was closed by the server (or is broken)."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r)
    except (OSError, ValueError):
        return True


def _worth_failing_over(err: DsecError, repeatable: bool) -> bool:
    if err.details.get("errno") in ("ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH"):
        return True
    if not repeatable:
        return False
    return err.code == "UNAVAILABLE" or err.status == 503


def _worth_retrying(err: DsecError, repeatable: bool) -> bool:
    """429s were refused before doing anything; 503s are repeated when that is harmless."""
    if err.status == 429:
        return True
    if err.status == 503 or err.code in ("UNAVAILABLE", "CAPACITY_EXHAUSTED"):
        if err.code == "CAPACITY_EXHAUSTED" or repeatable:
            return True
        return err.details.get("errno") in ("ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH")
    return False


def error_from_reply(status: int, raw: bytes, retry_after: Optional[str] = None) -> DsecError:
    """An error reply (``{"error": {"code", "message", ...}}``) as its DsecError."""
    code = None
    message = f"HTTP {status}"
    details: Dict[str, Any] = {}
    try:
        parsed = json.loads(raw.decode("utf-8"))
        e = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(e, dict):
            details = {k: v for k, v in e.items() if k not in ("code", "message")}
            if isinstance(e.get("code"), str):
                code = e["code"]
            if isinstance(e.get("message"), str):
                message = e["message"]
    except (ValueError, UnicodeDecodeError):
        text = raw.decode("utf-8", "replace").strip()
        if text:
            message = f"HTTP {status}: {text[:200]}"
    if "retryAfterMs" not in details and retry_after and retry_after.strip().isdigit():
        details["retryAfterMs"] = int(retry_after.strip()) * 1000
    if code is None:
        from ._errors import _STATUS_FALLBACK

        code = _STATUS_FALLBACK.get(status, "INTERNAL")
    return error_for(code, message, details, status)


def streamed_error(e: Any) -> DsecError:
    """The error event of a stream (``{"code", "message", ...}``) as its DsecError."""
    if not isinstance(e, dict):
        return error_for("INTERNAL", str(e))
    details = {k: v for k, v in e.items() if k not in ("code", "message")}
    return error_for(str(e.get("code", "INTERNAL")), str(e.get("message", "")), details)
