"""The warm fork server: the process every warm rank worker is forked from.

Starting an interpreter and importing torch costs seconds per rank, so warm workers are forked
from a ``multiprocessing`` *forkserver* that has imported torch and the rank job's modules
(:mod:`harness.rank_preload`). The server is itself a fork of the harness process where that is
safe (torch imported with one intra-op thread, no process group, the stdlib's server protocol as
known: see :func:`fork_warm_server`), so it costs a fork, not a second interpreter importing
torch; elsewhere it is spawned, with :mod:`harness.warm_start` as its preload. The server never
runs torch code, so forking it is safe (forking a process whose thread pools are running could
deadlock the child). It exits with the harness process (multiprocessing closes its "alive"
pipe); if it dies, the next start brings up a new one (spawned).
"""

from __future__ import annotations

import gc
import importlib
import multiprocessing
import multiprocessing.context
import os
import signal
import socket
import sys
import threading
from typing import Any, Callable

__all__ = ["FORKED_PRELOAD", "WARM_PRELOAD", "warm_context", "warm_server_pid"]

WARM_PRELOAD = ("__main__", "harness.warm_start")
"""What a spawned warm fork server imports before it forks (plus the module of the first ``fn``)."""

FORKED_PRELOAD = ("harness.rank_preload",)
"""What this process imports before it forks the warm fork server (plus the module of ``fn``)."""


def warm_server_pid() -> int | None:
    """The pid of this process's warm fork server, None before the first warm run."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver  # noqa: SLF001 - the stdlib has no public getter (nor typeshed its state)
    pid: int | None = server._forkserver_pid
    return pid


def warm_context(fn: Callable[..., object]) -> multiprocessing.context.ForkServerContext:
    """The forkserver context; the server (started on first use) preloads torch and ``fn``'s module.

    The preload list only matters when the server starts: later runs reuse the server, and a
    ``fn`` from a module it did not preload is imported in the worker (still no torch import).
    """
    ctx = multiprocessing.get_context("forkserver")
    if warm_server_pid() is None:
        module = getattr(fn, "__module__", None)
        ctx.set_forkserver_preload([*WARM_PRELOAD, module or "harness.warm_start"])
        fork_warm_server([*FORKED_PRELOAD, *([module] if module and module != "__main__" else [])])
    return ctx


def fork_warm_server(preload: list[str]) -> None:
    """Start multiprocessing's fork server as a fork of this process rather than a fresh
    interpreter: this process has imported torch already, so the server costs a fork instead
    of seconds of imports (per pytest process, or per xdist worker).

    Only when that is safe, which is when no torch thread pool can be running here: torch is
    imported with one intra-op thread (the pytest plugin sets it), no process group exists and no
    device runtime is initialised (CUDA, or torch_npu imported).
    The server closes every descriptor it inherited but its own and never touches this
    process's objects. Only where the stdlib's server protocol is the one known here (Linux,
    CPython before 3.14, which added an authentication key). Otherwise the server is spawned as
    before."""
    from multiprocessing import connection, forkserver, resource_tracker, util

    server: Any = forkserver._forkserver  # noqa: SLF001 - the stdlib's own server object (private: typeshed omits its state)
    if sys.platform != "linux" or sys.version_info >= (3, 14) or hasattr(server, "_forkserver_authkey"):
        return
    torch = sys.modules.get("torch")
    if torch is None or torch.get_num_threads() != 1:
        return
    if torch.cuda.is_initialized() or "torch_npu" in sys.modules:  # a device runtime does not survive a fork
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    for name in preload:
        importlib.import_module(name)  # the server holds what a spawned one would import
    with server._lock:  # noqa: SLF001
        if server._forkserver_pid is not None:  # noqa: SLF001
            return
        resource_tracker.ensure_running()
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]  # private, not in typeshed
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()  # the server exits once every holder of alive_w has
            forked: list[int] = []
            # From a thread of its own, so that the server's stack (which every rank's stack
            # dump shows) is that thread's few frames, not the caller's (a pytest session).
            forker = threading.Thread(target=_fork_server, args=(listener.fileno(), alive_r, forked))
            forker.start()
            forker.join()
            os.close(alive_r)
            if not forked:
                os.close(alive_w)
                return  # fork failed: the context spawns the server instead
            pid = forked[0]
        server._forkserver_address = address  # noqa: SLF001 - what ensure_running would set
        server._forkserver_alive_fd = alive_w  # noqa: SLF001
        server._forkserver_pid = pid  # noqa: SLF001


def _fork_server(listener_fd: int, alive_r: int, forked: list[int]) -> None:
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:
        _serve_forks(listener_fd, alive_r)
    forked.append(pid)


def _serve_forks(listener_fd: int, alive_r: int) -> None:
    """The forked server's whole life: drop what it inherited, then the stdlib's server loop."""
    code = 1
    try:
        _close_fds_except({0, 1, 2, listener_fd, alive_r})
        # Fresh streams on the descriptors: this process's may be pytest's capture objects
        # (no file descriptor), and a rank writes its log and stack dumps through fds 1 and 2.
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # an item's time limit is not the server's
        gc.collect()
        gc.freeze()  # ranks' collections never walk (and so copy) the inherited heap
        from multiprocessing import forkserver

        forkserver.main(listener_fd, alive_r, [])  # the preload is imported already
        code = 0
    except SystemExit:  # the loop's way out: every client is gone
        code = 0
    finally:
        os._exit(code)


def _close_fds_except(keep: set[int]) -> None:
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        open_fds = list(range(3, 1024))
    for fd in open_fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
