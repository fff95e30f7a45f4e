# What every Python test driver under tests/ shares (launch, netns, slurm, mpich, faults): the skip exit
# code CTest knows, the Skip exception, expect() with context, a free loopback port and run() with a deadline.
# Import: sys.path.insert(0, <tests>/support); from driver import SKIP, Skip, expect, free_port, run
# SPDX-License-Identifier: MIT
import os
import signal
import socket
import subprocess

SKIP = 77  # CTest's SKIP_RETURN_CODE for our tests (tests/CMakeLists.txt DDP_SKIP_CODE)
PY = "/usr/bin/python3"  # Debian's python3 with torch 1.13 (the pyenv python3 on PATH has no torch)


class Skip(Exception):
    """The case cannot run here (not root, a launcher or torch missing); the driver exits SKIP."""


def expect(cond, msg, *context):
    """Fails the case with msg, followed by each piece of context (outputs, commands) when cond is false."""
    if not cond:
        raise AssertionError(msg + "".join("\n---\n" + str(c) for c in context))


def free_port():
    """A TCP port free on 127.0.0.1 right now (the OS's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, timeout=30, env=None, **kw):
    """Runs cmd in its own session and returns (returncode, stdout, stderr); on timeout kills the whole process
    group (a launcher and its workers) and fails with both outputs."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"timed out after {timeout} s: {cmd}\nstdout:\n{out}\nstderr:\n{err}")
    return p.returncode, out, err
