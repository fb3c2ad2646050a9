"""Run the real `neuronpack` CLI, stopping at every progress marker until the parent says go (or SIGKILLs it).

Usage (from killpoints.py, not by hand): ``python marker_driver.py WRITE_FD READ_FD ROOT -- neuronpack-args...``

Markers are every progress step the CLI reports (a task advancing, an info line) and, for paths under ROOT, every
filesystem mutation that decides what is visible: os.replace / os.rename / os.fsync / os.unlink / os.rmdir /
os.mkdir. At each one the driver writes one line ``<n> <what>`` to WRITE_FD and blocks reading one byte from READ_FD.
So a kill "at marker n" happens exactly before that step, whatever the machine's speed: no sleeps are involved.
Nothing is faked: every call goes through to the real function once acknowledged.
"""

from __future__ import annotations

import os
import sys
import threading

WRITE_FD, READ_FD, ROOT = int(sys.argv[1]), int(sys.argv[2]), os.path.realpath(sys.argv[3])
ARGS = sys.argv[sys.argv.index("--") + 1:]
_lock = threading.Lock()
_count = 0


def marker(what: str) -> None:
    global _count
    with _lock:
        _count += 1
        os.write(WRITE_FD, f"{_count} {what}".replace("\n", " ").encode() + b"\n")
        if not os.read(READ_FD, 1):  # the parent went away
            os._exit(99)


def _under_root(path: object) -> bool:
    try:
        return os.path.realpath(os.fspath(path)).startswith(ROOT)
    except TypeError:
        return False  # an fd (os.fsync(fd)): resolved below


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _wrap(name: str):
    real = getattr(os, name)

    def wrapper(*args, **kwargs):
        first = args[0] if args else None
        if isinstance(first, int) and name == "fsync":
            target = _fd_path(first)
            if target.startswith(ROOT):
                marker(f"fsync {os.path.relpath(target, ROOT)}")
        elif kwargs.get("dir_fd") is not None:  # shutil.rmtree's fd-based walk: name relative to a directory fd
            parent = _fd_path(kwargs["dir_fd"])
            if parent.startswith(ROOT):
                marker(f"{name} {os.path.relpath(os.path.join(parent, os.fspath(first)), ROOT)}")
        elif _under_root(first):
            marker(f"{name} {os.path.relpath(os.path.realpath(os.fspath(first)), ROOT)}")
        return real(*args, **kwargs)

    wrapper.__wrapped__ = real
    return wrapper


def install() -> None:
    for name in ("replace", "rename", "fsync", "unlink", "rmdir", "mkdir"):
        setattr(os, name, _wrap(name))
    from neuronpack.cli import _console

    advance, info = _console._RichTask.advance, _console.RichReporter.info

    def marked_advance(self, amount: float = 1) -> None:
        marker("progress advance")
        advance(self, amount)

    def marked_info(self, message: str) -> None:
        marker(f"progress info {message[:60]}")
        info(self, message)

    _console._RichTask.advance = marked_advance
    _console.RichReporter.info = marked_info


if __name__ == "__main__":
    install()
    from neuronpack.cli.app import main

    sys.argv = ["neuronpack", *ARGS]
    main()
