# bench/ddp_toy: the multinode tutorial job, ddp (multinode example under ddprun) vs PyTorch DDP (torchrun, gloo),
# 2 ranks on this machine, measured in one run. Prints one JSON object with per-step times and the ratio.
# Usage: /usr/bin/python3 bench/ddp_toy/compare.py <build>/tools/ddprun <build>/examples/multinode/multinode [--epochs 5]
# Step time = forward + loss + backward (with the all-reduce) + optimizer step on rank 0, from each program's
# per-step JSON lines; the first epoch is warm-up and is left out.
# SPDX-License-Identifier: MIT
import argparse, json, os, socket, statistics, subprocess, sys, tempfile

p = argparse.ArgumentParser()
p.add_argument("ddprun")
p.add_argument("multinode")
p.add_argument("--epochs", type=int, default=5)
a = p.parse_args()
here = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_ms(path):
    rows = [json.loads(l) for l in open(path)]
    rows = [r for r in rows if r["epoch"] > 0] or rows
    ms = sorted(r["step_ms"] for r in rows)
    return {"steps": len(ms), "median_ms": statistics.median(ms), "mean_ms": statistics.fmean(ms),
            "p90_ms": ms[int(0.9 * (len(ms) - 1))]}


with tempfile.TemporaryDirectory() as tmp:
    ours_file, torch_file = os.path.join(tmp, "ours.jsonl"), os.path.join(tmp, "torch.jsonl")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([a.ddprun, "--nproc-per-node", "2", "--standalone", a.multinode, str(a.epochs), str(a.epochs + 1),
                    "--snapshot_path", os.path.join(tmp, "s.safetensors"), "--metrics-file", ours_file],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--redirects", "9:1", "--tee", "9:1",
                    "--nproc_per_node=2", "--master_addr=127.0.0.1",
                    f"--master_port={free_port()}", os.path.join(here, "torch_toy.py"), "--epochs", str(a.epochs),
                    "--metrics-file", torch_file],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    ours, theirs = step_ms(ours_file), step_ms(torch_file)
    print(json.dumps({"bench": "ddp_toy", "world_size": 2, "batch_size": 32, "epochs": a.epochs, "ddp": ours,
                      "pytorch_ddp_gloo": theirs, "speedup_median": theirs["median_ms"] / ours["median_ms"]}))
