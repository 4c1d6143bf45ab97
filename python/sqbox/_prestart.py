"""Pre-started interpreters (`sqbox serve --prestart N --preload MODULES`, docs/serve.md) and the
`run_python` request that uses them: shared by the threaded and the asyncio client."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, List, Mapping, Optional

from . import _protocol as proto
from ._protocol import Size, Stdin
from ._results import Result

# Interpreters kept started when the caller gives `preload` but no `prestart`.
DEFAULT_PRESTART = 2


def serve_args(prestart: Optional[int], preload: Optional[Iterable[str]],
               zygote: bool = False) -> List[str]:
    """The `sqbox serve` options for `prestart`/`preload`/`zygote`."""
    modules = [preload] if isinstance(preload, str) else list(preload or ())
    if prestart is None and modules and not zygote:
        prestart = DEFAULT_PRESTART
    args: List[str] = ["--zygote"] if zygote else []
    if prestart is not None:
        args += ["--prestart", str(int(prestart))]
    if modules:
        args += ["--preload", ",".join(modules)]
    return args


def python_request(defaults: proto.Defaults, code: str, *, timeout: Optional[float],
                   memory: Optional[Size], mounts: Optional[Iterable[Any]],
                   env: Optional[Mapping[str, Any]], stdin: Stdin,
                   output_limit: Optional[int], cpu_time: Optional[int]) -> Dict[str, Any]:
    """The `run_python` op: `code` as `python3 -c` runs it, in a sandbox used once."""
    if not isinstance(code, str):
        raise TypeError("code must be a str")
    request = defaults.run_request(["python3"], timeout=timeout, memory=memory, mounts=mounts,
                                   env=env, stdin=stdin, output_limit=output_limit)
    del request["command"]
    request["op"] = "run_python"
    request["code"] = code
    if cpu_time is not None:
        request["cpu_time"] = int(cpu_time)
    return request


def result_from_reply(reply: Mapping[str, Any]) -> Result:
    """The `Result` of a `run_python` reply (the shape of a run's, and whether a pre-started
    interpreter served it)."""
    result = proto.result_from_reply(reply)
    return dataclasses.replace(result, prestarted=reply.get("prestarted") is True)
