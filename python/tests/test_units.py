"""Pure parts of the SDK (no platform): name mapping, error mapping, request building."""

from __future__ import annotations

import pytest

import dsec
from dsec._http import build_query, error_from_reply, streamed_error
from dsec._types import ExecResult, SandboxInfo, camelize, from_api, snakify, to_camel, to_snake


def test_names_map_both_ways():
    for camel, snake in [("memoryMiB", "memory_mib"), ("peakMemoryKiB", "peak_memory_kib"), ("exitCode", "exit_code"), ("heartbeatIntervalMs", "heartbeat_interval_ms"), ("stdoutSha256", "stdout_sha256"), ("osPid", "os_pid")]:
        assert to_snake(camel) == snake and to_camel(snake) == camel
    # The caller's maps (env, labels, files) keep their keys; None fields are left out.
    body = camelize({"resources": {"memory_mib": 64}, "env": {"MY_VAR": "1"}, "labels": {"a_b": "c"}, "lease": {"idle_timeout_ms": 0, "on_idle": None}})
    assert body == {"resources": {"memoryMiB": 64}, "env": {"MY_VAR": "1"}, "labels": {"a_b": "c"}, "lease": {"idleTimeoutMs": 0}}
    assert snakify({"labels": {"someKey": "v"}, "envKeys": ["A"]}) == {"labels": {"someKey": "v"}, "env_keys": ["A"]}


def test_results_are_dataclasses_with_the_raw_reply():
    raw = {"exitCode": 0, "signal": None, "timedOut": False, "stdout": "x", "stderr": "", "pid": 3, "truncated": False, "newField": 1}
    r = from_api(ExecResult, raw)
    assert (r.exit_code, r.stdout, r.pid, r.ok) == (0, "x", 3, True) and r.raw["newField"] == 1
    info = from_api(SandboxInfo, {"id": "n-1", "state": "running", "labels": {"k": "v"}, "envKeys": ["A"]})
    assert info.env_keys == ["A"] and info.labels == {"k": "v"}


def test_errors_map_codes_to_classes():
    e = error_from_reply(404, b'{"error":{"code":"SANDBOX_NOT_FOUND","message":"no","sandboxId":"x"}}')
    assert type(e) is dsec.SandboxNotFoundError and isinstance(e, dsec.NotFoundError) and e.details["sandboxId"] == "x"
    e = error_from_reply(429, b'{"error":{"code":"QUOTA_EXCEEDED","message":"full"}}', "2")
    assert isinstance(e, dsec.QuotaExceededError) and e.retry_after == 2.0 and e.status == 429
    e = error_from_reply(503, b"<html>bad gateway</html>")
    assert isinstance(e, dsec.UnavailableError) and "bad gateway" in e.message
    e = error_from_reply(418, b'{"error":{"code":"SOMETHING_NEW","message":"?"}}')
    assert e.code == "SOMETHING_NEW" and e.status == 418 and isinstance(e, dsec.DsecError)
    assert isinstance(streamed_error({"code": "TIMEOUT", "message": "late"}), TimeoutError)
    for code in dsec.ERROR_STATUS:
        if code != "COMMAND_FAILED":
            assert error_from_reply(dsec.ERROR_STATUS[code], ('{"error":{"code":"%s","message":""}}' % code).encode()).code == code


def test_query_and_client_validation():
    assert build_query({"label": ["a=1", "b=2"], "state": None, "x": True}) == "?label=a%3D1&label=b%3D2&x=true"
    with pytest.raises(dsec.InvalidArgumentError) as e:
        dsec.Client("ftp://x")
    assert e.value.field == "api_url"
    c = dsec.Client("http://127.0.0.1:1, http://127.0.0.1:2/", "k")
    assert c.api_urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
