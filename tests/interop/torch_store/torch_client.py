# A PyTorch TCPStore client driven against ddp's TcpStoreServer (tests/interop/torch_store/test_torch_interop.cpp).
# SPDX-License-Identifier: MIT
# Usage: python3 torch_client.py PORT   (exit 0 = every check passed; prints one line per failed check)
import sys
from datetime import timedelta

import torch.distributed as dist

port = int(sys.argv[1])
failures = []


def expect(name, got, want):
    if got != want:
        failures.append(f"{name}: got {got!r}, want {want!r}")


store = dist.TCPStore("127.0.0.1", port, 1, False, timedelta(seconds=5))
# Set by the C++ side before starting us: keys cross the languages with the same '/' prefix.
expect("get from_cpp", store.get("from_cpp"), b"cpp-value")
store.set("k1", "v1")
expect("get k1", store.get("k1"), b"v1")
store.set("bin", b"\x00\x01\xff")
expect("get bin", store.get("bin"), b"\x00\x01\xff")
expect("add new", store.add("ctr", 5), 5)
expect("add again", store.add("ctr", -2), 3)
expect("get ctr", store.get("ctr"), b"3")
expect("compare_set absent", store.compare_set("cas", "x", "y"), b"x")
expect("compare_set absent empty", store.compare_set("cas", "", "a"), b"a")
expect("compare_set mismatch", store.compare_set("cas", "zz", "b"), b"a")
expect("compare_set match", store.compare_set("cas", "a", "b"), b"b")
store.wait(["k1", "ctr"])
store.wait(["k1"], timedelta(seconds=1))
try:
    store.wait(["never"], timedelta(milliseconds=200))
    failures.append("wait on a missing key did not time out")
except Exception:  # 1.13 raises RuntimeError('Socket Timeout'), 2.x DistStoreError
    pass
# After a timed-out wait PyTorch's client may be out of step with the server; use a fresh client.
store = dist.TCPStore("127.0.0.1", port, 1, False, timedelta(seconds=5))
n = store.num_keys()
store.set("extra", "1")
expect("num_keys after set", store.num_keys(), n + 1)
expect("delete_key present", store.delete_key("extra"), True)
expect("delete_key absent", store.delete_key("extra"), False)
expect("num_keys after delete", store.num_keys(), n)
if hasattr(store, "check"):
    expect("check present", store.check(["k1"]), True)
    expect("check absent", store.check(["nope"]), False)
if hasattr(store, "append"):
    store.append("log", "ab")
    store.append("log", "cd")
    expect("append", store.get("log"), b"abcd")
if hasattr(store, "multi_set"):
    store.multi_set(["m1", "m2"], ["one", "two"])
    expect("multi_get", store.multi_get(["m1", "m2"]), [b"one", b"two"])
store.set("from_py", "py-value")  # read back by the C++ side
for f in failures:
    print("FAIL", f, flush=True)
print("torch", dist.__name__, "client checks:", "ok" if not failures else f"{len(failures)} failed", flush=True)
sys.exit(1 if failures else 0)
