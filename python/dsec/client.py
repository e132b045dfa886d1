"""``dsec.Client``: connection settings (``DSEC_API_URL``, ``DSEC_API_KEY``) plus the
project-wide APIs: keys, projects, function calls, pools, owner sessions, network apply."""

from __future__ import annotations

import os
import re
import ssl
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Union

from ._errors import ConflictError, DsecError, NotFoundError, invalid_argument
from ._http import Transport, path_segment
from ._types import CallResult, KeyInfo, OwnerInfo, PoolInfo, ProjectInfo, camelize, from_api, snakify

#: API URL used when neither the arguments nor ``DSEC_API_URL`` give one.
DEFAULT_API_URL = "http://127.0.0.1:7878"
#: Deadline of one API call (seconds) unless the call says otherwise.
DEFAULT_TIMEOUT = 30.0
#: Home of a local platform when ``DSEC_HOME`` is not set (its ``admin.key`` is read like the CLI does).
DEFAULT_DSEC_HOME = "/var/lib/dsec"

_default_lock = threading.Lock()
_default_client: "Optional[Client]" = None


def resolve_api_key(api_key: Optional[str] = None, env: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The key as the CLI finds it: the argument, ``$DSEC_API_KEY``, or ``$DSEC_HOME/admin.key``."""
    env = dict(os.environ) if env is None else env
    if api_key:
        return api_key
    if env.get("DSEC_API_KEY"):
        return env["DSEC_API_KEY"]
    try:
        with open(os.path.join(env.get("DSEC_HOME") or DEFAULT_DSEC_HOME, "admin.key"), encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


class Client:
    """A connection to one dsec API (several URLs: replicas, tried in turn).

    ``api_url``: a URL, a comma-separated list or a list (default ``$DSEC_API_URL``, else
    ``http://127.0.0.1:7878``); ``api_key``: default ``$DSEC_API_KEY``, else
    ``$DSEC_HOME/admin.key``; ``timeout``: deadline of each call in seconds (None: none);
    ``max_retries``: retries of a 429/503 (with backoff, honouring Retry-After);
    ``owner``: ``True`` or ``{"grace_ms": ..., "name": ...}`` to own the sandboxes this client
    creates through an owner session heartbeated by a daemon thread: if the process dies, they
    are paused after the grace period and kept; a client that connects to them takes them over.
    Connections are pooled and reused; the client is thread-safe. ``close()`` ends the session.
    """

    def __init__(
        self,
        api_url: Union[str, Sequence[str], None] = None,
        api_key: Optional[str] = None,
        *,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        max_retries: int = 4,
        owner: Union[bool, Dict[str, Any], None] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        given: Union[str, Sequence[str]] = api_url if api_url is not None else (os.environ.get("DSEC_API_URL") or DEFAULT_API_URL)
        urls = given.split(",") if isinstance(given, str) else list(given)
        urls = [u.strip() for u in urls if u and u.strip()]
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise invalid_argument("timeout", "must be a number of seconds >= 0, or None")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise invalid_argument("max_retries", "must be an integer >= 0")
        self.transport = Transport(urls, resolve_api_key(api_key), timeout or None, max_retries, ssl_context)
        self.timeout = timeout or None
        self.keys = KeysApi(self)
        self.projects = ProjectsApi(self)
        self.calls = CallsApi(self)
        self.pools = PoolsApi(self)
        self.owners = OwnersApi(self)
        self.owner_session: Optional[OwnerSession] = None
        if owner:
            self.owner_session = OwnerSession(self.owners, {} if owner is True else dict(owner))  # type: ignore[arg-type]

    @classmethod
    def default(cls) -> "Client":
        """The process-wide client built from the environment (used when no client is passed)."""
        global _default_client
        with _default_lock:
            if _default_client is None:
                _default_client = cls()
            return _default_client

    @property
    def api_url(self) -> str:
        return self.transport.api_urls[0]

    @property
    def api_urls(self) -> List[str]:
        return self.transport.api_urls

    def close(self) -> None:
        """Ends this client's owner session (its sandboxes then get their ``on_owner_lost``
        action) and closes pooled connections."""
        if self.owner_session is not None:
            self.owner_session.close()
        self.transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def health(self) -> bool:
        """True when the API answers ``/healthz``."""
        reply = self.transport.request("GET", "/healthz").json()
        return isinstance(reply, dict) and reply.get("status") == "ok"

    def apply_network(self, selector: Dict[str, Any], *, policy: Optional[Dict[str, Any]] = None, patch: Optional[Dict[str, Any]] = None, timeout: Any = "default") -> Dict[str, Any]:
        """Replaces (``policy``) or patches (``patch``) the network policy of every sandbox
        carrying the selector's labels (``{"labels": {...}}``). Each changes atomically."""
        body: Dict[str, Any] = {"selector": selector}
        if policy is not None:
            body["policy"] = camelize(policy)
        if patch is not None:
            body["patch"] = camelize(patch)
        return snakify(self.transport.request("POST", "/v1/network:apply", json_body=body, timeout=timeout).json())  # type: ignore[no-any-return]

    # ---- shorthands ----

    def _json(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        return self.transport.request(method, path, json_body=body, **kw).json()


class KeysApi:
    """API keys of the caller's project and its sub-projects."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, name: str, role: str, project: Optional[str] = None) -> KeyInfo:
        """Creates a key; the reply's ``key`` is the secret, shown only this once."""
        return from_api(KeyInfo, self._c._json("POST", "/v1/keys", camelize({"name": name, "role": role, "project": project})))

    def list(self) -> List[KeyInfo]:
        return [from_api(KeyInfo, k) for k in self._c._json("GET", "/v1/keys")["items"]]

    def revoke(self, key_id: str) -> None:
        """Revokes a key: requests made with it fail with UNAUTHENTICATED from then on."""
        self._c.transport.request("DELETE", f"/v1/keys/{path_segment(_check_id(key_id, 'key_id'))}")


class ProjectsApi:
    """The caller's project and its sub-projects."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, name: str, *, parent: Optional[str] = None, quota: Optional[Dict[str, Any]] = None) -> ProjectInfo:
        body = camelize({"name": name, "parent": parent, "quota": quota})
        return from_api(ProjectInfo, self._c._json("POST", "/v1/projects", body))

    def list(self) -> List[ProjectInfo]:
        return [from_api(ProjectInfo, p) for p in self._c._json("GET", "/v1/projects")["items"]]

    def get(self, project_id: str) -> ProjectInfo:
        return from_api(ProjectInfo, self._c._json("GET", f"/v1/projects/{path_segment(_check_id(project_id, 'project_id'))}"))


#: Time a call's request may take beyond the call's own limit (queueing, transfer), seconds.
_CALL_MARGIN_S = 30.0


class CallsApi:
    """Stateless function calls: each runs as a fresh process in a fresh sandbox."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def run(self, code: Optional[str] = None, *, runtime: Optional[str] = "sh", timeout: Any = "default", **fields: Any) -> CallResult:
        """Runs one call: ``calls.run("print(1)", runtime="python3")``; other fields: ``argv``,
        ``image``, ``files`` (relative path -> text, under /work), ``stdin``, ``env``,
        ``timeout_ms``, ``memory_mib``, ``output_limit_bytes``. A non-zero exit is a result."""
        body = _call_body(code, runtime, fields)
        t = timeout
        if t == "default":
            limit_s = body.get("timeoutMs", 30_000) / 1000.0
            t = max(self._c.timeout or 0, limit_s + _CALL_MARGIN_S)
        return from_api(CallResult, self._c._json("POST", "/v1/calls", body, timeout=t))

    def run_batch(self, calls: Sequence[Dict[str, Any]], *, timeout: Optional[float] = None) -> List[CallResult]:
        """Runs up to 1,000 calls (dicts of ``run``'s fields, ``code`` included); one result per
        call in order, with ``error`` set where a call could not run. No deadline by default."""
        if not isinstance(calls, (list, tuple)) or not calls:
            raise invalid_argument("calls", "must be a non-empty list")
        body = []
        for i, c in enumerate(calls):
            if not isinstance(c, dict):
                raise invalid_argument(f"calls.{i}", "must be a dict")
            c = dict(c)
            body.append(_call_body(c.pop("code", None), c.pop("runtime", "sh" if "image" not in c else None), c))
        reply = self._c._json("POST", "/v1/calls/batch", {"calls": body}, timeout=timeout)
        return [from_api(CallResult, r) for r in reply["results"]]


def _call_body(code: Optional[str], runtime: Optional[str], fields: Dict[str, Any]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"code": code}
    if "image" not in fields:
        body["runtime"] = runtime
    body.update(fields)
    return camelize(body)  # type: ignore[no-any-return]


class PoolsApi:
    """Warm pools: sandboxes kept ready for creates that match them."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def _route(self, name: str) -> str:
        if not isinstance(name, str) or not re.match(r"^[a-z0-9][a-z0-9-]{0,62}$", name):
            raise invalid_argument("name", "lowercase letters, digits and -, at most 63")
        return f"/v1/pools/{name}"

    def put(self, name: str, spec: Dict[str, Any], size: int, *, idle_timeout_ms: Optional[int] = None) -> PoolInfo:
        """Creates or replaces a pool; it fills in the background."""
        body = camelize({"spec": spec, "size": size, "idle_timeout_ms": idle_timeout_ms})
        return from_api(PoolInfo, self._c._json("PUT", self._route(name), body))

    def get(self, name: str) -> PoolInfo:
        return from_api(PoolInfo, self._c._json("GET", self._route(name)))

    def list(self) -> List[PoolInfo]:
        return [from_api(PoolInfo, p) for p in self._c._json("GET", "/v1/pools")["items"]]

    def delete(self, name: str) -> None:
        """Deletes a pool and destroys its ready sandboxes (claimed ones are not affected)."""
        self._c.transport.request("DELETE", self._route(name))


def _owner_path(owner_id: str) -> str:
    if not isinstance(owner_id, str) or not re.match(r"^own_[0-9a-f]{1,64}$", owner_id):
        raise invalid_argument("owner_id", "not an owner id")
    return f"/v1/owners/{owner_id}"


class OwnersApi:
    """Owner sessions (the low-level API; ``Client(owner=True)`` runs one for you)."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, *, name: Optional[str] = None, grace_ms: Optional[int] = None) -> OwnerInfo:
        return from_api(OwnerInfo, self._c._json("POST", "/v1/owners", camelize({"name": name, "grace_ms": grace_ms})))

    def get(self, owner_id: str) -> OwnerInfo:
        return from_api(OwnerInfo, self._c._json("GET", _owner_path(owner_id)))

    def heartbeat(self, owner_id: str, *, timeout: Any = "default") -> OwnerInfo:
        """Keeps a session alive (a lost one becomes active again, resuming what its loss paused)."""
        return from_api(OwnerInfo, self._c._json("POST", f"{_owner_path(owner_id)}/heartbeat", timeout=timeout))

    def close(self, owner_id: str) -> None:
        """Closes a session: its sandboxes get their ``on_owner_lost`` action (pause by default)."""
        self._c.transport.request("DELETE", _owner_path(owner_id))


class OwnerSession:
    """The owner session a client keeps: opened on first use, heartbeated by a daemon thread
    (it never keeps the process alive), closed by ``client.close()``."""

    def __init__(self, api: OwnersApi, options: Dict[str, Any]) -> None:
        self._api = api
        self._options = {k: v for k, v in options.items() if k in ("name", "grace_ms")}
        self._lock = threading.Lock()
        self._info: Optional[OwnerInfo] = None
        self._closed = threading.Event()
        self._thread: Optional[threading.Thread] = None
        #: The last error a heartbeat met (a transient one is retried on the next beat).
        self.last_error: Optional[BaseException] = None

    def id(self) -> str:
        """The session's id, opening it on first use."""
        with self._lock:
            if self._closed.is_set():
                raise ConflictError("the owner session of this client is closed", details={"field": "owner"})
            if self._info is None:
                self._info = self._api.create(**self._options)
                self._thread = threading.Thread(target=_beat, args=(weakref.ref(self), self._info.id, self._info.heartbeat_interval_ms), name=f"dsec-owner-{self._info.id}", daemon=True)
                self._thread.start()
            return self._info.id

    def close(self) -> None:
        """Stops heartbeating and closes the session on the server."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            info = self._info
        if info is not None:
            try:
                self._api.close(info.id)
            except (ConflictError, NotFoundError):
                pass


def _beat(ref: "weakref.ref[OwnerSession]", owner_id: str, interval_ms: int) -> None:
    while True:
        session = ref()
        if session is None:
            return
        closed = session._closed
        del session
        if closed.wait(interval_ms / 1000.0):
            return
        session = ref()
        if session is None:
            return
        try:
            info = session._api.heartbeat(owner_id, timeout=max(interval_ms / 1000.0, 1.0))
            interval_ms = info.heartbeat_interval_ms or interval_ms
            session.last_error = None
        except (ConflictError, NotFoundError) as e:
            session.last_error = e
            return
        except DsecError as e:
            session.last_error = e
        del session


def _check_id(value: str, field: str) -> str:
    if not isinstance(value, str) or not re.match(r"^[A-Za-z0-9._:-]{1,128}$", value):
        raise invalid_argument(field, "not an id")
    return value
