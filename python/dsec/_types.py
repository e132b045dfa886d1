"""Typed results (dataclasses with snake_case fields) and the snake_case <-> camelCase mapping
between Python and the API's JSON."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Type, TypeVar

T = TypeVar("T")

#: Maps whose keys are the caller's data (variable names, labels, paths): never renamed.
_OPAQUE = frozenset({"env", "labels", "files", "hosts", "mirrors", "expected", "sandboxes_by_state"})

_UNITS_TO_CAMEL = (("_mib", "MiB"), ("_kib", "KiB"), ("_gib", "GiB"))


def to_camel(name: str) -> str:
    """``memory_mib`` -> ``memoryMiB``, ``idle_timeout_ms`` -> ``idleTimeoutMs``."""
    if "_" not in name:
        return name
    for snake, camel in _UNITS_TO_CAMEL:
        name = re.sub(snake + r"(?=_|$)", camel, name)
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def to_snake(name: str) -> str:
    """``memoryMiB`` -> ``memory_mib``, ``exitCode`` -> ``exit_code``."""
    name = re.sub(r"([KMG])iB(?=[A-Z]|$)", lambda m: "_" + m.group(1).lower() + "ib", name)
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def camelize(value: Any) -> Any:
    """A request value with its keys in the API's camelCase (user maps are left alone)."""
    if isinstance(value, dict):
        return {to_camel(k): (v if k in _OPAQUE else camelize(v)) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [camelize(v) for v in value]
    return value


def snakify(value: Any) -> Any:
    """A reply value with its keys in snake_case (user maps are left alone)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            sk = to_snake(k)
            out[sk] = v if sk in _OPAQUE else snakify(v)
        return out
    if isinstance(value, list):
        return [snakify(v) for v in value]
    return value


def from_api(cls: Type[T], data: Any) -> T:
    """Builds a result dataclass from the API's JSON: keys to snake_case, unknown keys kept
    only in ``raw`` (newer servers), nested results built by their own class."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    snake = snakify(data)
    nested: Dict[str, Any] = getattr(cls, "_nested", {})
    kwargs: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name == "raw":
            kwargs["raw"] = data
        elif f.name in snake:
            v = snake[f.name]
            sub = nested.get(f.name)
            if sub is not None and v is not None:
                v = [from_api(sub, x) for x in v] if isinstance(v, list) else from_api(sub, data[to_camel(f.name)])
            kwargs[f.name] = v
    return cls(**kwargs)


@dataclass
class SandboxInfo:
    """A sandbox as the API describes it."""

    id: str = ""
    project: str = ""
    node: str = ""
    backend: str = ""
    state: str = ""
    image: Dict[str, Any] = field(default_factory=dict)
    snapshot: Optional[str] = None
    layers: List[str] = field(default_factory=list)
    resources: Dict[str, Any] = field(default_factory=dict)
    labels: Dict[str, str] = field(default_factory=dict)
    env_keys: List[str] = field(default_factory=list)
    network: Dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    expires_at: str = ""
    lease: Dict[str, Any] = field(default_factory=dict)
    owner: Optional[str] = None
    last_active_at: str = ""
    paused_at: Optional[str] = None
    pause_reason: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ExitInfo:
    """How a process ended."""

    exit_code: Optional[int] = None
    signal: Optional[str] = None
    timed_out: bool = False
    oom_killed: bool = False
    duration_ms: float = 0
    cpu_user_ms: float = 0
    cpu_sys_ms: float = 0
    peak_memory_kib: float = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ExecResult(ExitInfo):
    """A command run to completion: its exit, its collected output and its process handle."""

    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    pid: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class OutputEvent:
    """One chunk of a process's output; ``offset`` is its byte offset in its stream."""

    stream: str
    data: bytes
    offset: int


@dataclass
class ProcessInfo:
    pid: int = 0
    os_pid: int = 0
    argv: List[str] = field(default_factory=list)
    state: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    exit_code: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class FileInfo:
    name: str = ""
    type: str = ""
    mode: int = 0
    size: int = 0
    mtime_ms: float = 0
    uid: Optional[int] = None
    gid: Optional[int] = None
    link_target: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class PauseResult:
    sandbox: SandboxInfo = field(default_factory=SandboxInfo)
    duration_ms: float = 0
    memory_before_bytes: int = 0
    memory_after_bytes: int = 0
    swap_bytes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    _nested = {"sandbox": SandboxInfo}


@dataclass
class SandboxStats:
    cpu_usage_ms: float = 0
    memory_bytes: int = 0
    memory_peak_bytes: int = 0
    memory_limit_bytes: int = 0
    pids: int = 0
    pids_limit: int = 0
    disk_used_bytes: int = 0
    disk_limit_bytes: int = 0
    oom_kills: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class LayerInfo:
    digest: str = ""
    kind: str = ""
    names: List[str] = field(default_factory=list)
    project: str = ""
    content_bytes: int = 0
    files: int = 0
    created_at: str = ""
    snapshot: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class OwnerInfo:
    id: str = ""
    project: str = ""
    name: Optional[str] = None
    state: str = ""
    grace_ms: int = 0
    heartbeat_interval_ms: int = 0
    created_at: str = ""
    heartbeat_at: str = ""
    sandboxes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class PoolInfo:
    name: str = ""
    project: str = ""
    spec: Dict[str, Any] = field(default_factory=dict)
    size: int = 0
    idle_timeout_ms: int = 0
    ready: int = 0
    creating: int = 0
    idle: bool = False
    last_error: Optional[str] = None
    last_used_at: str = ""
    created_at: str = ""
    updated_at: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class KeyInfo:
    """An API key; ``key`` (the secret) is set only in the reply of ``keys.create``."""

    id: str = ""
    name: str = ""
    role: str = ""
    project: str = ""
    created_at: str = ""
    revoked_at: Optional[str] = None
    key: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ProjectInfo:
    id: str = ""
    name: str = ""
    parent: Optional[str] = None
    quota: Optional[Dict[str, Any]] = None
    usage: Optional[Dict[str, Any]] = None
    created_at: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class CallResult:
    """A function call's outcome (a non-zero exit is a result); ``error`` set when a batch item could not run."""

    exit_code: Optional[int] = None
    signal: Optional[str] = None
    stdout: str = ""
    stderr: str = ""
    duration_ms: float = 0
    cpu_ms: float = 0
    peak_memory_kib: float = 0
    truncated: bool = False
    timed_out: bool = False
    oom_killed: bool = False
    error: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class NetworkInfo:
    """A sandbox's network: policy, addresses, counters (nested values in snake_case)."""

    policy: Dict[str, Any] = field(default_factory=dict)
    address: Optional[str] = None
    gateway: Optional[str] = None
    proxy: Optional[str] = None
    stats: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class TrajectoryPage:
    sandbox_id: str = ""
    project: str = ""
    sandbox_state: str = ""
    image: Dict[str, Any] = field(default_factory=dict)
    snapshots: List[str] = field(default_factory=list)
    created_at: str = ""
    ended_at: Optional[str] = None
    steps: int = 0
    bytes: int = 0
    truncated: bool = False
    items: List[Dict[str, Any]] = field(default_factory=list)
    next_cursor: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Page:
    items: List[Any] = field(default_factory=list)
    next_cursor: Optional[str] = None
