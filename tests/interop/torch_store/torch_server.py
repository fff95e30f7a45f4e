# Hosts a PyTorch TCPStore server for ddp's client (tests/interop/torch_store/test_torch_interop.cpp).
# SPDX-License-Identifier: MIT
# Usage: python3 torch_server.py   -> prints "PORT <n>", then serves until the C++ side sets "done"
# (or 30 s pass). Before that it checks what the C++ client wrote, through its own PyTorch client.
import sys
from datetime import timedelta

import torch.distributed as dist

server = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30), wait_for_workers=False)
print("PORT", server.port, flush=True)
client = dist.TCPStore("127.0.0.1", server.port, 1, False, timedelta(seconds=30))
client.wait(["from_cpp"])
ok = client.get("from_cpp") == b"cpp-value"
client.set("from_py", "py-value" if ok else "bad")
client.wait(["done"])
print("server side saw from_cpp:", "ok" if ok else "WRONG", flush=True)
sys.exit(0 if ok else 1)
