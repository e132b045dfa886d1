"""``dsec.AsyncSandbox`` and ``dsec.AsyncClient``: the same surface for asyncio.

Each call runs the synchronous SDK in a worker thread (the standard library has no asyncio HTTP
client); cancelling the awaiting task cancels the call at once (its connection is shut down)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, TypeVar, Union

from ._http import Cancel
from ._types import ExitInfo, OutputEvent, SandboxInfo
from .client import Client
from .sandbox import BatchResult, ExecHandle, ForkResult, ReplayResult, Sandbox

T = TypeVar("T")


async def run_sync(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Runs ``fn`` in a worker thread under a fresh ``Cancel``; cancelling the task cancels it."""
    token = Cancel()

    def call() -> T:
        with token:
            return fn(*args, **kwargs)

    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(None, call)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        token.cancel()
        raise


def _wrap(value: Any) -> Any:
    if isinstance(value, Sandbox):
        return AsyncSandbox(value)
    if isinstance(value, ExecHandle):
        return AsyncExecHandle(value)
    if isinstance(value, BatchResult):
        for item in value.items:
            if item is not None and item.sandbox is not None:
                item.sandbox = AsyncSandbox(item.sandbox)  # type: ignore[assignment]
        return value
    if isinstance(value, (ForkResult,)):
        value.sandboxes = [AsyncSandbox(s) for s in value.sandboxes]  # type: ignore[misc]
        return value
    if isinstance(value, ReplayResult):
        value.sandbox = AsyncSandbox(value.sandbox)  # type: ignore[assignment]
        return value
    if isinstance(value, list) and value and isinstance(value[0], Sandbox):
        return [AsyncSandbox(s) for s in value]
    return value


class _AsyncProxy:
    """Every method of the wrapped object as a coroutine; attributes as they are."""

    def __init__(self, inner: Any) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name.startswith("_") or not callable(attr) or isinstance(attr, type):
            return attr

        @functools.wraps(attr)
        async def method(*args: Any, **kwargs: Any) -> Any:
            return _wrap(await run_sync(attr, *args, **kwargs))

        return method


class AsyncClient(_AsyncProxy):
    """``dsec.Client`` for asyncio: ``await client.calls.run(...)``, ``await client.keys.list()``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        inner = args[0] if args and isinstance(args[0], Client) else Client(*args, **kwargs)
        super().__init__(inner)
        for name in ("keys", "projects", "calls", "pools", "owners"):
            object.__setattr__(self, name, _AsyncProxy(getattr(inner, name)))

    @property
    def sync(self) -> Client:
        return self._inner  # type: ignore[no-any-return]

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await run_sync(self._inner.close)


def _sync_client(client: Union[Client, AsyncClient, None]) -> Optional[Client]:
    return client.sync if isinstance(client, AsyncClient) else client


class AsyncSandbox(_AsyncProxy):
    """``dsec.Sandbox`` for asyncio: the same methods, each a coroutine; ``files`` and
    ``network`` are async too; ``spawn``/``attach`` give an ``AsyncExecHandle``."""

    def __init__(self, inner: Sandbox) -> None:
        super().__init__(inner)
        object.__setattr__(self, "files", _AsyncProxy(inner.files))
        object.__setattr__(self, "network", _AsyncProxy(inner.network))

    @property
    def sync(self) -> Sandbox:
        return self._inner  # type: ignore[no-any-return]

    @property
    def id(self) -> str:
        return self._inner.id  # type: ignore[no-any-return]

    @property
    def last_info(self) -> Optional[SandboxInfo]:
        return self._inner.last_info  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Async{self._inner!r}"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await run_sync(self._inner.__exit__, None, None, None)

    @classmethod
    async def create(cls, image: Union[str, Dict[str, Any], None] = None, *, client: Union[Client, AsyncClient, None] = None, **kw: Any) -> "AsyncSandbox":
        return cls(await run_sync(Sandbox.create, image, client=_sync_client(client), **kw))

    @classmethod
    async def create_batch(cls, count: Optional[int] = None, spec: Optional[Dict[str, Any]] = None, *, client: Union[Client, AsyncClient, None] = None, **kw: Any) -> BatchResult:
        return _wrap(await run_sync(Sandbox.create_batch, count, spec, client=_sync_client(client), **kw))  # type: ignore[no-any-return]

    @classmethod
    async def connect(cls, sandbox_id: str, *, client: Union[Client, AsyncClient, None] = None, claim: bool = True) -> "AsyncSandbox":
        return cls(await run_sync(Sandbox.connect, sandbox_id, client=_sync_client(client), claim=claim))

    @classmethod
    async def find(cls, *, client: Union[Client, AsyncClient, None] = None, **kw: Any) -> "List[AsyncSandbox]":
        return [cls(s) for s in await run_sync(Sandbox.find, client=_sync_client(client), **kw)]

    @classmethod
    def from_id(cls, sandbox_id: str, *, client: Union[Client, AsyncClient, None] = None) -> "AsyncSandbox":
        return cls(Sandbox.from_id(sandbox_id, client=_sync_client(client)))

    @classmethod
    async def list(cls, *, client: Union[Client, AsyncClient, None] = None, **kw: Any) -> AsyncIterator[SandboxInfo]:
        """Every sandbox, a page at a time: ``async for info in AsyncSandbox.list(labels=...)``."""
        c = _sync_client(client)
        cursor = None
        while True:
            page = await run_sync(Sandbox.list_page, client=c, cursor=cursor, **kw)
            for info in page.items:
                yield info
            cursor = page.next_cursor
            if not cursor:
                return


class AsyncExecHandle:
    """An ``ExecHandle`` for asyncio: ``async for ev in handle``, ``await handle.wait()``."""

    def __init__(self, inner: ExecHandle) -> None:
        self.sync = inner

    @property
    def pid(self) -> int:
        return self.sync.pid

    @property
    def offsets(self) -> Dict[str, int]:
        return self.sync.offsets

    @property
    def exit_info(self) -> Optional[ExitInfo]:
        return self.sync.exit_info

    def __aiter__(self) -> AsyncIterator[OutputEvent]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[OutputEvent]:
        while True:
            ev = await run_sync(self.sync._next)
            if ev is None:
                return
            yield ev

    async def wait(self, timeout: Optional[float] = None) -> ExitInfo:
        return await run_sync(self.sync.wait, timeout)

    async def kill(self, signal: str = "SIGKILL") -> None:
        await run_sync(self.sync.kill, signal)

    async def write_stdin(self, data: Union[str, bytes]) -> None:
        await run_sync(self.sync.write_stdin, data)

    async def close_stdin(self) -> None:
        await run_sync(self.sync.close_stdin)

    async def resize(self, rows: int, cols: int) -> None:
        await run_sync(self.sync.resize, rows, cols)

    def disconnect(self) -> None:
        self.sync.disconnect()


__all__ = ["AsyncClient", "AsyncSandbox", "AsyncExecHandle", "run_sync"]
