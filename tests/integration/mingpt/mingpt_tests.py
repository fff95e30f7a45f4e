#!/usr/bin/python3
"""The mingpt example as a user runs it: several ranks under a real launcher (issue 19's must-shows 2 and 3).

Usage: mingpt_tests.py world|resume|learn|gpu --mingpt BIN --ddprun BIN [--mingpt-faults BIN]
  world   world 1, 2 and 4 (ddprun, global batch 8, dropout 0) train on the same samples: the final parameters
          agree to a relative 5e-5 per tensor (the gradient all-reduce sums in another order, which AdamW
          magnifies; the attention's key bias, whose exact gradient is 0, is bounded by AdamW's step instead).
  resume  under torchrun --max_restarts=1, rank 1 SIGKILLs itself after epoch 1's snapshot (--mingpt-faults: the
          program with the test hook tests/integration/examples/die_after_epoch.cpp, DDP_TEST_DIE_AFTER_EPOCH=1); the restarted job
          resumes at epoch 2 and its final snapshot is byte-identical to an uninterrupted run's (dropout on, 0.1 on
          the embeddings, the residual branches and the attention probabilities, so every mask's step is restored
          too). Exits 77 when torchrun (python3-torch) is missing.
  learn   2 ranks on /usr/share/common-licenses/GPL-3: the eval loss falls from ln(vocab) to below 2.7 in 80
          steps, `mingpt generate` continues a prompt with text that has English's share of spaces, and resuming
          the snapshot on another text is refused.
          Then the loss scaler: a power-of-two --loss_scale ends bit-identical, one past float's range skips two steps;
          and --config: the tutorial's JSON sections apply, flags win, bad keys, types and values are refused.
  gpu     (label gpu; exits 77 without a GPU) one process trains 8 steps on --device cpu and on --device cuda from
          the same weights and samples (dropout 0): every step's loss and the eval loss agree to a relative 1e-3 in
          fp32, 3e-2 with --use_amp (bf16) and 1e-2 with --use_amp --amp_dtype fp16 (no step skipped).
Every run has a timeout; the text and snapshots live in a temporary directory that is removed.
"""
import argparse
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "interop", "reference"))

TEXT = "/usr/share/common-licenses/GPL-3"
SMALL = ["--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "16", "--log_every", "1"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, timeout=120, extra_env=None):
    env = dict(os.environ, DDP_TIMEOUT_MS="20000", **(extra_env or {}))  # a lost peer ends every rank within seconds
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout}")
    return p.stdout


def ddprun(args, nproc, prog_args):
    return run([args.ddprun, "--nproc-per-node", str(nproc), "--standalone", args.mingpt] + prog_args)


def model_tensors(path):
    from safetensors_py import load_file  # needs torch
    return {k: v for k, v in load_file(path).items() if not k.startswith("optimizer.")}


def world(args, work):
    common = SMALL + ["--data_path", TEXT, "--truncate", "0.2", "--train_split", "1", "--max_epochs", "1",
                      "--max_iters", "4", "--embd_pdrop", "0", "--resid_pdrop", "0", "--attn_pdrop", "0",
                      "--learning_rate", "1e-3"]
    snaps = {}
    for w in (1, 2, 4):
        snaps[w] = os.path.join(work, f"w{w}.safetensors")
        ddprun(args, w, common + ["--batch_size", str(8 // w), "--snapshot_path", snaps[w]])
    ref = model_tensors(snaps[1])
    c = 32  # --n_embd
    for w in (2, 4):
        got = model_tensors(snaps[w])
        assert got.keys() == ref.keys(), f"world {w}: tensors {sorted(got)} != {sorted(ref)}"
        worst, worst_key = 0.0, None
        for k in ref:
            a, b = ref[k], got[k]
            if k.endswith("attn.attn.c_attn.bias"):
                # The key bias's gradient is zero in exact arithmetic (it adds q.b_k to every score of a row, which
                # softmax ignores), so it is rounding noise, different for every reduction order, and AdamW turns
                # noise into steps of +-lr: those elements may differ by 2 lr per step, no more.
                kb = (a[c:2 * c] - b[c:2 * c]).abs().max().item()
                if not kb <= 2 * 1e-3 * 4:
                    sys.exit(f"FAIL: world {w}: {k}'s key part differs by {kb:.2e}, more than 2 lr x 4 steps")
                a, b = a[list(range(c)) + list(range(2 * c, 3 * c))], b[list(range(c)) + list(range(2 * c, 3 * c))]
            d = ((b - a).abs().max() / a.abs().max().clamp(min=1e-12)).item()
            if d > worst:
                worst, worst_key = d, k
        print(f"world {w} vs world 1: worst per-tensor relative difference {worst:.2e} ({worst_key}) over "
              f"{len(ref)} tensors")
        # 5e-5: the all-reduce sums in another order (~1e-7 relative in a gradient), and AdamW's m / sqrt(v)
        # magnifies that for elements whose gradient is mostly cancellation.
        if not worst <= 5e-5:
            sys.exit(f"FAIL: world {w} differs from world 1 by {worst:.2e} in {worst_key} (> 5e-5)")
    # And the training really moved the weights (else equality would prove nothing).
    init = os.path.join(work, "w0.safetensors")
    ddprun(args, 1, common + ["--batch_size", "8", "--max_iters", "1", "--learning_rate", "0",
                              "--snapshot_path", init])
    moved = max((model_tensors(init)[k] - ref[k]).abs().max().item() for k in ref)
    if not moved > 1e-4:
        sys.exit(f"FAIL: 4 steps moved no weight by more than {moved:.2e}")
    print("PASS: world 2 and 4 equal world 1")
    loss_scaler(args, work, common, snaps[2])
    config_file(args, work)


def config_file(args, work):
    """--config: the tutorial's gpt2_train_cfg sections as JSON (its data_loader_workers and compile accepted and
    ignored), a flag given beside it wins, and an unknown key, a wrong type or a negative count is refused by name."""
    def write(name, cfg):
        path = os.path.join(work, name)
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path
    good = write("cfg.json", {
        "data_config": {"path": TEXT, "block_size": 16, "train_split": 0.9, "truncate": 0.1},
        "gpt_config": {"n_layer": 1, "n_head": 2, "n_embd": 16, "embd_pdrop": 0.0, "resid_pdrop": 0.0},
        "trainer_config": {"max_epochs": 1, "batch_size": 4, "grad_norm_clip": 1.0, "save_every": 1,
                           "snapshot_path": os.path.join(work, "cfg.safetensors"), "use_amp": False,
                           "data_loader_workers": 4},
        "optimizer_config": {"weight_decay": 0.1, "learning_rate": 0.0003}, "compile": False})
    log = run([args.mingpt, "--device", "cpu", "--config", good, "--n_embd", "32", "--max_iters", "1"])
    if "GPT(vocab_size=" not in log or "n_layer=1, n_head=2, n_embd=32)" not in log or "x batch 4," not in log:
        sys.exit(f"FAIL: --config's settings (and the --n_embd flag over them) were not applied:\n{log}")
    for cfg, flags, want in [({"gpt_config": {"n_layers": 1}}, [], "unknown setting --config file"),
                             ({"trainer_config": {"batch_size": "4"}}, [], "trainer_config.batch_size has the wrong type"),
                             ({"trainer_config": {"batch_size": -4}}, [], "trainer_config.batch_size must be >= 0"),
                             ({}, ["--seed", "-1"], "--seed must be >= 0")]:
        p = subprocess.run([args.mingpt, "--device", "cpu", "--data_path", TEXT, "--config", write("bad.json", cfg)]
                           + flags, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        if p.returncode == 0 or want not in p.stdout:
            sys.exit(f"FAIL: {cfg} {flags}: expected an error with {want!r}, got exit {p.returncode}:\n{p.stdout}")
    print("PASS: --config applies the tutorial's sections, flags win, bad settings are refused by name")


def snapshot_metadata(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))["__metadata__"]


def loss_scaler(args, work, common, plain):
    """The dynamic loss scaler (optim/grad_scaler.hpp) in the job, on the CPU in fp32, at world 2.

    A power-of-two scale multiplies and divides exactly, so a scaled run must end with the unscaled run's tensors, bit
    for bit. A scale beyond float's range (1e39 becomes inf, as fp16's GEMMs overflow past 65504) makes every gradient
    inf or NaN: those steps are skipped and the scale halves until it fits (1e39 -> 5e38 -> 2.5e38: two skips)."""
    from safetensors_py import load_file
    scaled = os.path.join(work, "scaled.safetensors")
    ddprun(args, 2, common + ["--batch_size", "4", "--snapshot_path", scaled, "--loss_scale", "1024"])
    a, b = load_file(plain), load_file(scaled)  # model and AdamW state
    differ = [k for k in a if not torch_equal(a[k], b[k])]
    if a.keys() != b.keys() or differ:
        sys.exit(f"FAIL: loss scale 1024 changed the trained tensors {differ[:5]}")
    if snapshot_metadata(scaled).get("grad_scaler.scale") != "1024":
        sys.exit(f"FAIL: the snapshot does not record the scale: {snapshot_metadata(scaled)}")
    over = os.path.join(work, "overflow.safetensors")
    log = ddprun(args, 2, common + ["--batch_size", "4", "--snapshot_path", over, "--loss_scale", "1e39"])
    skips = re.findall(r"\[GPU0\] Epoch 1 \| Iter (\d) \| gradients overflowed at loss scale ([0-9.e+]+): step skipped",
                       log)
    meta = snapshot_metadata(over)
    got = (skips, meta.get("grad_scaler.skipped_steps"), meta.get("optimizer.steps"), meta.get("grad_scaler.scale"))
    if got != ([("0", "1e+39"), ("1", "5e+38")], "2", "2", "2.5e+38"):
        sys.exit(f"FAIL: loss scale 1e39: (skipped lines, skipped_steps, optimizer steps, scale) = {got}:\n{log}")
    print("PASS: loss scale 1024 leaves training bit-identical; 1e39 skips two steps and backs off to 2.5e38")


def torch_equal(x, y):
    return x.shape == y.shape and bool((x == y).all())


def resume(args, work):
    try:
        import torch.distributed.run  # noqa: F401
    except Exception:
        print("skip: no torchrun (python3-torch)")
        sys.exit(77)

    if not args.mingpt_faults:
        sys.exit("FAIL: the resume case needs --mingpt-faults (the mingpt_faults test build)")

    def torchrun(restarts, snap, env=None):
        # --redirects/--tee: Debian's torch 1.13 torchrun fails without them (tests/integration/examples/exact_resume.sh).
        return run([sys.executable, "-m", "torch.distributed.run", "--redirects", "9:1", "--tee", "9:1",
                    "--max_restarts", str(restarts),
                    "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                    "--no_python", args.mingpt_faults] + SMALL +
                   ["--data_path", TEXT, "--truncate", "0.1", "--max_epochs", "3", "--max_iters", "3",
                    "--save_every", "1", "--batch_size", "4", "--embd_pdrop", "0.1", "--resid_pdrop", "0.1",
                    "--attn_pdrop", "0.1", "--snapshot_path", snap], extra_env=env)

    a, b = os.path.join(work, "a.safetensors"), os.path.join(work, "b.safetensors")
    torchrun(0, a)
    log = torchrun(1, b, {"DDP_TEST_DIE_AFTER_EPOCH": "1"})
    if "Resuming training from snapshot at Epoch 1" not in log:
        sys.exit(f"FAIL: the restarted job did not resume at epoch 1:\n{log}")
    after = log[log.index("Resuming training"):]
    if re.search(r"\[GPU0\] Epoch 1 \| Iter", after) or len(re.findall(r"\[GPU0\] Epoch 2 \| Iter 0 ", after)) != 1:
        sys.exit(f"FAIL: after the restart epoch 1 ran again or epoch 2 not exactly once:\n{log}")
    with open(a, "rb") as fa, open(b, "rb") as fb:
        if fa.read() != fb.read():
            sys.exit("FAIL: the resumed run's final snapshot differs from the uninterrupted run's")
    print("PASS: killed after epoch 1, restarted by torchrun, final snapshot byte-identical")


def learn(args, work):
    snap = os.path.join(work, "learn.safetensors")
    log = ddprun(args, 2, ["--data_path", TEXT, "--truncate", "1", "--n_layer", "2", "--n_head", "4", "--n_embd",
                           "64", "--block_size", "32", "--batch_size", "16", "--max_epochs", "2", "--max_iters", "40",
                           "--log_every", "10", "--learning_rate", "3e-3", "--snapshot_path", snap])
    vocab = int(re.search(r"vocabulary (\d+)", log).group(1))
    first = float(re.search(r"\[GPU0\] Epoch 1 \| Iter 0 \| Train Loss ([0-9.]+)", log).group(1))
    evals = [float(x) for x in re.findall(r"\[GPU0\] Epoch \d+ \| Eval Loss ([0-9.]+)", log)]
    print(f"vocabulary {vocab} (ln {math.log(vocab):.3f}); first train loss {first:.3f}; eval losses {evals}")
    if abs(first - math.log(vocab)) > 0.3:
        sys.exit(f"FAIL: the untrained loss {first} is not near ln(vocab) = {math.log(vocab):.3f}")
    if len(evals) != 2 or not evals[-1] < 2.7:
        sys.exit(f"FAIL: the eval loss did not fall below 2.7 in 80 steps: {evals}")
    prompt = "The Program"
    # The text is generate's stdout; ddp's log lines (e.g. a warning) go to stderr and are not part of it.
    g = subprocess.run([args.mingpt, "generate", "--snapshot_path", snap, "--prompt", prompt, "--max_new_tokens",
                        "300", "--seed", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120,
                       env=dict(os.environ, DDP_TIMEOUT_MS="20000"))
    if g.returncode != 0:
        sys.exit(f"FAIL: generate exited {g.returncode}:\n{g.stdout}{g.stderr}")
    text = g.stdout.rstrip("\n")
    sample = text[len(prompt):]
    spaces = sample.count(" ") / max(1, len(sample))
    print(f"generated: {text!r}\nspaces: {spaces:.1%}")
    if not text.startswith(prompt) or len(sample) != 300:
        sys.exit(f"FAIL: generate did not continue the prompt with 300 characters: {text!r}")
    # English text is ~15-20% spaces; a model that learned nothing samples each of ~76 characters alike (~1%).
    if not spaces > 0.10:
        sys.exit(f"FAIL: the generated text has {spaces:.1%} spaces; the model did not learn word structure")
    # Resuming that snapshot on another text (an other vocabulary) is refused with the reason, not trained on.
    p = subprocess.run([args.mingpt, "--data_path", "/usr/share/common-licenses/GPL-2", "--snapshot_path", snap,
                        "--max_epochs", "3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    if p.returncode == 0 or "was trained on a text with another vocabulary" not in p.stdout:
        sys.exit(f"FAIL: resuming on another text was not refused (exit {p.returncode}):\n{p.stdout}")
    print("PASS: the loss fell, generate continues the prompt, another text's resume is refused")


def gpu(args, work):
    p = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) \
        if shutil.which("nvidia-smi") else None
    if p is None or "GPU " not in p.stdout:
        print("skip: no GPU (nvidia-smi -L lists none)")
        sys.exit(77)
    losses = {}
    # (name, flags, tolerance against the CPU's fp32 losses): fp32 on the GPU; mixed precision in bf16 (8 bits of
    # mantissa in the GEMM operands) and fp16 with the loss scaler (11 bits; no step may be skipped at this size).
    runs = [("cpu", ["--device", "cpu"], 0), ("cuda", ["--device", "cuda"], 1e-3),
            ("bf16", ["--device", "cuda", "--use_amp"], 3e-2),
            ("fp16", ["--device", "cuda", "--use_amp", "--amp_dtype", "fp16"], 1e-2)]
    for name, flags, _ in runs:
        metrics = os.path.join(work, f"{name}.jsonl")
        log = run([args.mingpt, "--backend", "gloo", "--snapshot_path",
                   os.path.join(work, f"{name}.safetensors"), "--metrics-file", metrics] + flags + SMALL +
                  ["--data_path", TEXT, "--truncate", "0.1", "--max_epochs", "1", "--max_iters", "8",
                   "--batch_size", "8", "--embd_pdrop", "0", "--resid_pdrop", "0", "--attn_pdrop", "0",
                   "--learning_rate", "1e-3"])
        with open(metrics) as f:
            records = [json.loads(line) for line in f]
        if any(r.get("skipped") for r in records):
            sys.exit(f"FAIL: {name}: the loss scaler skipped a step: {records}")
        evals = [float(x) for x in re.findall(r"Eval Loss ([0-9.]+)", log)]
        losses[name] = [r["loss"] for r in records] + evals
        print(f"{name}: {losses[name]}")
        if len(losses[name]) != 9:
            sys.exit(f"FAIL: {name}: expected 8 step losses and one eval loss")
    for name, _, tol in runs[1:]:
        worst = max(abs(g - c) / abs(c) for c, g in zip(losses["cpu"], losses[name]))
        if not worst <= tol:
            sys.exit(f"FAIL: {name} losses differ from the CPU's by {worst:.2e} relative (> {tol})")
        print(f"PASS: {name} losses equal the CPU's to {worst:.2e} (bound {tol})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=["world", "resume", "learn", "gpu"])
    ap.add_argument("--mingpt", required=True)
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--mingpt-faults", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddp_mingpt_") as work:
        {"world": world, "resume": resume, "learn": learn, "gpu": gpu}[args.case](args, work)


if __name__ == "__main__":
    main()
