# What every Python test driver under tests/ shares (launch, netns, slurm, mpich, faults): the skip exit
# code CTest knows, the Skip exception, expect() with context, and a free loopback port.
# Import: sys.path.insert(0, <tests>/support); from driver import SKIP, Skip, expect, free_port
# SPDX-License-Identifier: MIT
import socket

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
