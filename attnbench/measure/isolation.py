"""Process isolation: one measurement in a fresh child process, so that the memory it reports is its own.

:func:`run_in_child` runs a target in a forkserver child (torch preloaded in the server, so a child costs a fork,
not an import), with a hard time limit (the child is killed: ``timeout``), an optional address-space budget
(``RLIMIT_DATA``: an allocation past it fails like an out-of-memory), and out-of-memory detection (torch's
allocator errors, ``MemoryError``, or a child killed by SIGKILL, as the kernel's OOM killer does).
:func:`run_inline` is the same contract without a child, for debugging and tests.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import traceback
from typing import Any, Callable

from attnbench.core.errors import is_oom
from attnbench.core.protocol import UnsupportedError
from attnbench.measure.memory import _proc_status_kb


@dataclasses.dataclass
class ChildOutcome:
    status: str                     # ok | oom | timeout | failed | unsupported | incorrect
    result: dict | None = None      # what the target returned (when it returned)
    error: str | None = None
    exitcode: int | None = None
    wall_s: float = 0.0


_CTX = None


def _context(target_module: str):
    """A forkserver context with torch, attnbench and the first target's module preloaded (spawn where forkserver
    does not exist). The preload list is fixed when the server starts: the first caller's module is in it."""
    global _CTX
    if _CTX is None:
        import multiprocessing as mp

        try:
            ctx = mp.get_context("forkserver")
            # FlopCounterMode imports torch._dynamo on first use, slowly: preload it with the mechanisms
            ctx.set_forkserver_preload(["torch", "torch._dynamo", "torch.utils.flop_counter", "attnbench",
                                        "attnbench.attention", "attnbench.checks.verify", __name__,
                                        target_module])
        except ValueError:
            ctx = mp.get_context("spawn")
        _CTX = ctx
    return _CTX


def _limit_memory(budget_bytes: int | None) -> None:
    if not budget_bytes:
        return
    try:
        import resource

        data_now = _proc_status_kb("VmData").get("VmData", 0) * 1024
        limit = data_now + int(budget_bytes)
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (ImportError, OSError, ValueError):
        pass


def _child_main(conn, target: Callable[[Any], dict], payload: Any, mem_budget: int | None,
                plugins: str | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills us
    if plugins:  # the parent's plug-ins (the forkserver may predate them): loaded by the registry on first use
        os.environ["ATTNBENCH_PLUGINS"] = plugins
    _limit_memory(mem_budget)
    try:
        result = target(payload)
        msg = {"status": result.get("status", "ok"), "result": result, "error": result.get("error")}
    except UnsupportedError as e:
        msg = {"status": "unsupported", "result": None, "error": str(e)}
    except BaseException as e:  # noqa: BLE001 - every failure becomes a record
        status = "oom" if is_oom(e) else "failed"
        tb = "".join(traceback.format_exception_only(type(e), e)).strip()
        if status == "failed":
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:]).strip()
        msg = {"status": status, "result": None, "error": tb[-4000:]}
    try:
        conn.send(msg)
    finally:
        conn.close()


def run_in_child(target: Callable[[Any], dict], payload: Any, *, timeout: float | None = None,
                 mem_budget_bytes: int | None = None) -> ChildOutcome:
    """Run ``target(payload)`` in a fresh child; never raises for the child's failures (but re-raises Ctrl-C
    after killing the child). ``target`` must be importable (a module-level function)."""
    ctx = _context(target.__module__)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, daemon=True,
                       args=(send, target, payload, mem_budget_bytes, os.environ.get("ATTNBENCH_PLUGINS")))
    t0 = time.perf_counter()
    proc.start()
    send.close()
    try:
        ready = recv.poll(timeout)
        if not ready:
            proc.kill()
            proc.join()
            return ChildOutcome("timeout", error=f"exceeded the time budget of {timeout:g} s; child killed",
                                exitcode=proc.exitcode, wall_s=time.perf_counter() - t0)
        try:
            msg = recv.recv()
        except (EOFError, OSError):
            msg = None
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    except BaseException:
        if proc.is_alive():
            proc.kill()
            proc.join()
        raise
    finally:
        recv.close()
    wall = time.perf_counter() - t0
    if msg is None:
        code = proc.exitcode
        if code is not None and code < 0 and -code == signal.SIGKILL:
            return ChildOutcome("oom", error="child killed by SIGKILL (the kernel's OOM killer, most likely)",
                                exitcode=code, wall_s=wall)
        what = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        return ChildOutcome("failed", error=f"child died without a result ({what})", exitcode=code, wall_s=wall)
    return ChildOutcome(msg["status"], result=msg["result"], error=msg["error"], exitcode=proc.exitcode,
                        wall_s=wall)


def run_inline(target: Callable[[Any], dict], payload: Any) -> ChildOutcome:
    """:func:`run_in_child` without a child (no memory isolation, no time limit): for debugging."""
    t0 = time.perf_counter()
    try:
        result = target(payload)
        return ChildOutcome(result.get("status", "ok"), result=result, error=result.get("error"),
                            wall_s=time.perf_counter() - t0)
    except UnsupportedError as e:
        return ChildOutcome("unsupported", error=str(e), wall_s=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001
        return ChildOutcome("oom" if is_oom(e) else "failed", error=f"{type(e).__name__}: {e}",
                            wall_s=time.perf_counter() - t0)
