"""A minimal RFC 6455 WebSocket client (standard library only) for the one route that needs
one: ``/v1/sandboxes/{id}/exec/ws`` (interactive stdin, terminals, resize, signals). Text
messages only; client frames masked; pings answered; no extensions."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import ssl
import struct
import threading
from typing import Any, Dict, Iterator, Optional

from ._errors import DsecError, UnavailableError
from ._http import USER_AGENT, Cancel, _Target, current_cancel, error_from_reply

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#: Largest message accepted from the server.
_MAX_MESSAGE = 8 * 1024 * 1024


class WebSocket:
    """One open WebSocket connection."""

    def __init__(self, sock: socket.socket, buffered: bytes, cancel: Optional[Cancel]) -> None:
        self._sock = sock
        self._buf = bytearray(buffered)
        self._send_lock = threading.Lock()
        self._closed = False
        self._cancel = cancel
        if cancel is not None:
            cancel._register(sock)

    @classmethod
    def connect(cls, target: _Target, path: str, api_key: Optional[str], timeout: Optional[float], ssl_context: Optional[ssl.SSLContext]) -> "WebSocket":
        cancel = current_cancel()
        try:
            sock = socket.create_connection((target.host, target.port), timeout=timeout)
            if target.scheme == "https":
                sock = (ssl_context or ssl.create_default_context()).wrap_socket(sock, server_hostname=target.host)
        except OSError as e:
            errno = "ECONNREFUSED" if isinstance(e, ConnectionRefusedError) else None
            raise UnavailableError(f"cannot reach {target.url}: {e}", details={"errno": errno} if errno else {}) from e
        key = base64.b64encode(os.urandom(16)).decode("ascii")
        host = target.host if target.port in (80, 443) else f"{target.host}:{target.port}"
        lines = [
            f"GET {target.prefix}{path} HTTP/1.1",
            f"Host: {host}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            f"User-Agent: {USER_AGENT}",
        ]
        if api_key:
            lines.append(f"Authorization: Bearer {api_key}")
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
            raw = b""
            while b"\r\n\r\n" not in raw:
                chunk = sock.recv(4096)
                if not chunk:
                    raise UnavailableError(f"{target.url}: connection closed during the WebSocket upgrade")
                raw += chunk
                if len(raw) > 65536:
                    raise UnavailableError(f"{target.url}: WebSocket upgrade reply too large")
            head, rest = raw.split(b"\r\n\r\n", 1)
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            status = int(status_line.split(" ")[1])
            headers: Dict[str, str] = {}
            for h in header_lines:
                k, _, v = h.partition(":")
                headers[k.strip().lower()] = v.strip()
            if status != 101:
                want = int(headers.get("content-length", "0") or 0)
                while len(rest) < want:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    rest += chunk
                raise error_from_reply(status, rest[:want] if want else rest, headers.get("retry-after"))
            accept = base64.b64encode(hashlib.sha1((key + _GUID).encode("ascii")).digest()).decode("ascii")
            if headers.get("sec-websocket-accept") != accept:
                raise UnavailableError(f"{target.url}: bad Sec-WebSocket-Accept")
        except DsecError:
            sock.close()
            raise
        except OSError as e:
            sock.close()
            if isinstance(e, socket.timeout):
                from ._errors import DsecTimeoutError

                raise DsecTimeoutError(f"{target.url}: no WebSocket upgrade within the deadline") from e
            raise UnavailableError(f"cannot reach {target.url}: {e}") from e
        sock.settimeout(None)
        return cls(sock, rest, cancel)

    # ---- sending ----

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        header = bytearray([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header.append(0x80 | n)
        elif n < 65536:
            header.append(0x80 | 126)
            header += struct.pack("!H", n)
        else:
            header.append(0x80 | 127)
            header += struct.pack("!Q", n)
        mask = os.urandom(4)
        header += mask
        masked = bytes(b ^ mask[i & 3] for i, b in enumerate(payload)) if n < 4096 else _mask(payload, mask)
        with self._send_lock:
            if self._closed:
                raise UnavailableError("the WebSocket is closed")
            try:
                self._sock.sendall(bytes(header) + masked)
            except OSError as e:
                raise UnavailableError(f"WebSocket send failed: {e}") from e

    def send_json(self, obj: Any) -> None:
        self._send_frame(0x1, json.dumps(obj).encode("utf-8"))

    # ---- receiving ----

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            try:
                chunk = self._sock.recv(max(65536, n - len(self._buf)))
            except socket.timeout as e:
                from ._errors import DsecTimeoutError

                raise DsecTimeoutError("no WebSocket message within the deadline") from e
            except OSError as e:
                if self._cancel is not None and self._cancel.cancelled:
                    from ._errors import CancelledError

                    raise CancelledError("cancelled") from e
                raise UnavailableError(f"WebSocket read failed: {e}") from e
            if not chunk:
                raise EOFError
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def recv_text(self) -> Optional[str]:
        """The next text message, or None once the connection is closed."""
        message = bytearray()
        while True:
            try:
                b0, b1 = self._read(2)
                n = b1 & 0x7F
                if n == 126:
                    (n,) = struct.unpack("!H", self._read(2))
                elif n == 127:
                    (n,) = struct.unpack("!Q", self._read(8))
                if n > _MAX_MESSAGE:
                    raise UnavailableError("WebSocket message too large")
                mask = self._read(4) if b1 & 0x80 else None
                payload = self._read(n)
            except EOFError:
                self.close()
                return None
            if mask:
                payload = _mask(payload, mask)
            opcode = b0 & 0x0F
            if opcode == 0x8:  # close
                self.close()
                return None
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            message += payload
            if len(message) > _MAX_MESSAGE:
                raise UnavailableError("WebSocket message too large")
            if b0 & 0x80:
                return message.decode("utf-8")

    # ---- the shape of a StreamResponse, for ExecHandle ----

    def iter_json_lines(self) -> Iterator[Any]:
        while True:
            text = self.recv_text()
            if text is None:
                return
            yield json.loads(text)

    def set_read_timeout(self, seconds: Optional[float]) -> None:
        self._sock.settimeout(seconds)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._send_frame(0x8, struct.pack("!H", 1000))
        except DsecError:
            pass
        self._closed = True
        if self._cancel is not None:
            self._cancel._unregister(self._sock)
        try:
            self._sock.close()
        except OSError:
            pass


def _mask(payload: bytes, mask: bytes) -> bytes:
    n = len(payload)
    if n == 0:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
