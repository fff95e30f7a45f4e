#!/usr/bin/python3
"""Draws one PNG per comparison from the JSON lines bench/run_all.sh wrote into DIR, and a Markdown table of
the ratios (DIR/summary.md) for the README. Needs python3-matplotlib. A missing .jsonl skips its chart.

Usage: /usr/bin/python3 bench/plot_all.py DIR
"""
# SPDX-License-Identifier: MIT
import json, os, sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except Exception as e:
    sys.exit(f"plot_all.py: matplotlib missing ({e}); install python3-matplotlib")


def rows(d, name):
    path = os.path.join(d, name + ".jsonl")
    if not os.path.exists(path):
        print(f"plot_all.py: {path} missing, its chart skipped", file=sys.stderr)
        return []
    return [json.loads(line) for line in open(path) if line.startswith("{")]


def size_label(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"


def pair_bars(path, labels, ours, theirs, their_label, ylabel, title, legend_loc, min_width):
    """Writes `path`: per configuration (labels), ddp's bar beside the reference's on a log axis, labelled with
    the ratio. ours: [(value, ratio)], theirs: [value]; `title` says what the ratio means."""
    x = range(len(labels))
    fig, ax = plt.subplots(figsize=(max(min_width, 1.3 * len(labels)), 4.5))
    ax.bar([i - 0.2 for i in x], [v for v, _ in ours], 0.4, label="ddp")
    ax.bar([i + 0.2 for i in x], theirs, 0.4, label=their_label)
    for i, (v, ratio) in enumerate(ours):
        ax.annotate(f"{ratio:.2f}x", (i, max(v, theirs[i])), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x)); ax.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log"); ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc=legend_loc); fig.tight_layout(); fig.savefig(path, dpi=110); plt.close(fig)


def ratio_cell(r):
    """An Open MPI comparison's ratio of medians, and of the two sides' best runs where compare_mpi.py gave it
    (docs/decisions/0059: the host's fast and slow states can split the medians)."""
    runs = len(r.get("ours_runs_us", []))
    return f"{r['ratio']} (best of {runs}: {r['ratio_best']})" if "ratio_best" in r else f"{r['ratio']}"


def busbw_chart(ax, series, title):
    """series: [(label, style, [(bytes, GB/s)])] on a log2 size axis."""
    for label, style, pts in series:
        pts = sorted(pts)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes, float32)")
    ax.set_ylabel("bus bandwidth (GB/s, nccl-tests' busbw)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def main():
    d = sys.argv[1]
    summary = ["| comparison | case | ours | reference | ratio (> 1: ours faster) |", "| --- | --- | --- | --- | --- |"]

    mpi = rows(d, "allreduce_mpi")
    if mpi:
        # Rows without ours_shm predate docs/decisions/0055: the mpi backend then always used MPI messages.
        shm = [r for r in mpi if r.get("ours_shm", False)]
        msgs = [r for r in mpi if not r.get("ours_shm", False)]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        busbw_chart(ax, [("ddp --backend mpi (shared memory, one host)", "o-", [(r["bytes"], r["ours_busbw_GBps"]) for r in shm]),
                         ("ddp --backend mpi --shm 0 (MPI messages)", "^-", [(r["bytes"], r["ours_busbw_GBps"]) for r in msgs]),
                         ("Open MPI MPI_Allreduce (mpi4py)", "s--", [(r["bytes"], r["openmpi_busbw_GBps"]) for r in shm or msgs])],
                    f"all-reduce, mpi backend vs Open MPI, {mpi[0]['ranks']} ranks")
        fig.tight_layout(); fig.savefig(os.path.join(d, "allreduce_mpi.png"), dpi=110); plt.close(fig)
        for name, rs in (("mpi backend vs Open MPI", shm), ("mpi backend --shm 0 vs Open MPI", msgs)):
            for r in rs:
                summary.append(f"| {name} | {size_label(r['bytes'])} | {r['ours_us']} us | "
                               f"{r['openmpi_us']} us | {ratio_cell(r)} |")

    tcp = rows(d, "allreduce_tcp")
    if tcp:
        ranks = sorted({r["ranks"] for r in tcp})
        fig, axes = plt.subplots(1, len(ranks), figsize=(6.5 * len(ranks), 4.5), squeeze=False)
        for ax, n in zip(axes[0], ranks):
            ompi = [r for r in tcp if r["ranks"] == n and "openmpi_us" in r]
            gloo = [r for r in tcp if r["ranks"] == n and "gloo_us" in r]
            # Ours was measured beside each reference; draw the runs beside Open MPI (medians of --reps),
            # the gloo pairing only for sizes that one lacks.
            ours = {r["bytes"]: r["ours_busbw_GBps"] for r in gloo} | {r["bytes"]: r["ours_busbw_GBps"] for r in ompi}
            busbw_chart(ax, [("ddp tcp backend (shared memory)", "o-", list(ours.items())),
                             ("Open MPI MPI_Allreduce (vader)", "s--", [(r["bytes"], r["openmpi_busbw_GBps"]) for r in ompi]),
                             ("PyTorch gloo", "^:", [(r["bytes"], r["gloo_busbw_GBps"]) for r in gloo])],
                        f"all-reduce on one host, {n} ranks")
            for r in ompi:
                summary.append(f"| tcp vs Open MPI, {n} ranks | {size_label(r['bytes'])} | {r['ours_us']} us | "
                               f"{r['openmpi_us']} us | {ratio_cell(r)} |")
            for r in ompi:
                if "copy_bound_us" in r:  # the target is >= 0.5 (issue 17)
                    summary.append(f"| tcp vs one memcpy per rank (traffic bound), {n} ranks | {size_label(r['bytes'])} | "
                                   f"{r['ours_us']} us | {r['copy_bound_us']} us | {r['of_copy_bound']} |")
            for r in gloo:
                summary.append(f"| tcp vs gloo, {n} ranks | {size_label(r['bytes'])} | {r['ours_us']} us | "
                               f"{r['gloo_us']} us | {r['speedup']} |")
        fig.tight_layout(); fig.savefig(os.path.join(d, "allreduce_tcp.png"), dpi=110); plt.close(fig)

    res = rows(d, "resnet_cpu")
    if res:
        labels = [f"{r['arch']}\n{r['image_size']}px b{r['batch']}\n{r['threads']} thr" for r in res]
        pair_bars(os.path.join(d, "resnet_cpu.png"), labels,
                  [(r["ddp_step_s"], r["torch_step_s"] / r["ddp_step_s"]) for r in res], [r["torch_step_s"] for r in res],
                  "PyTorch + oneDNN", "training step (s, log)",
                  "CPU ResNet training step (forward, loss, backward, SGD)\n"
                  "label: PyTorch time / ours (> 1: ddp faster)", "lower right", 7)
        for r in res:
            summary.append(f"| ResNet CPU step | {r['arch']} {r['image_size']} px b{r['batch']}, {r['threads']} thr | "
                           f"{r['ddp_step_s']:.3f} s | {r['torch_step_s']:.3f} s | {r['torch_step_s'] / r['ddp_step_s']:.2f} |")

    gpt = [r for r in rows(d, "gpt_cpu") if "torch_step_s" in r]
    if gpt:
        labels = [f"{r['config']}\nL{r['n_layer']} C{r['n_embd']} T{r['block_size']}\nb{r['batch']}, {r['threads']} thr"
                  for r in gpt]
        pair_bars(os.path.join(d, "gpt_cpu.png"), labels,
                  [(r["ours_tokens_per_s"], r["ratio_torch_over_ours"]) for r in gpt], [r["torch_tokens_per_s"] for r in gpt],
                  "PyTorch", "training tokens / s (log)",
                  "CPU minGPT training step (forward, loss, backward, clip, AdamW)\n"
                  "label: PyTorch step time / ours (> 1: ddp faster)", "upper right", 6)
        for r in gpt:
            summary.append(f"| minGPT CPU step | {r['config']} (L{r['n_layer']} C{r['n_embd']} T{r['block_size']}) "
                           f"b{r['batch']}, {r['threads']} thr | {r['ours_step_s']:.3f} s | {r['torch_step_s']:.3f} s | "
                           f"{r['ratio_torch_over_ours']:.2f} |")

    ov = rows(d, "ddp_overlap")
    if ov:
        # One panel per layout: the default (every thread where the OS puts it) and, when run, the training
        # threads on one CPU with the communication threads on another (comm_cpus set).
        fig, axes = plt.subplots(1, len(ov), figsize=(7 * len(ov), 4.5), squeeze=False)
        for ax, r in zip(axes[0], ov):
            where = (f"compute on CPU {r['compute_cpus']}, comm on CPU {r['comm_cpus']}" if r.get("comm_cpus")
                     else "all threads anywhere")
            names = ["bare step", "flat all-reduce", "bare + all-reduce", "DDP (copies)", "DDP (bucket view,\nCPU default)"]
            vals = [r["local_ms"], r["comm_ms"], r["local_ms"] + r["comm_ms"], r["local_ms"] + r["overhead_ms"],
                    r["local_ms"] + r["overhead_view_ms"]]
            ax.bar(names, vals, color=["C0", "C1", "C7", "C2", "C3"])
            ax.set_ylabel("ms per step (median; DDP = bare + median overhead)")
            ax.set_title(f"DDP overhead, {r['arch']} {r['image_size']} px b{r['batch_size']}, {r['world_size']} ranks, "
                         f"{where}:\nhidden {r['hidden_fraction']:.0%} (copies) / {r['hidden_fraction_view']:.0%} (view)",
                         fontsize=9)
            plt.setp(ax.get_xticklabels(), fontsize=8)
            layout = f", comm on CPU {r['comm_cpus']}" if r.get("comm_cpus") else ""
            # Gradients in the buckets is the CPU default (docs/decisions/0054); copies are torch's default.
            for label, key in (("DDP overhead (DDP - bare, default: bucket views) vs one flat all-reduce",
                                "overhead_view_ms"),
                               ("DDP overhead, gradient copies (--gradient-as-bucket-view=false), vs one flat all-reduce",
                                "overhead_ms")):
                # A median overhead at or below zero (the DDP step no slower than the bare one, which happens
                # when the bare step's own swings are larger than what communication adds) has no ratio to print.
                ratio = (f"{r['comm_ms'] / r[key]:.2f}" if r[key] > 0 else
                         "all hidden (DDP step no slower than the bare step)")
                summary.append(f"| {label} | {r['arch']} {r['image_size']} px b{r['batch_size']}{layout} | "
                               f"{r[key]:.1f} ms | {r['comm_ms']:.1f} ms | {ratio} |")
        fig.tight_layout(); fig.savefig(os.path.join(d, "ddp_overlap.png"), dpi=110); plt.close(fig)

    toy = rows(d, "ddp_toy")
    if toy:
        r = toy[-1]
        fig, ax = plt.subplots(figsize=(5, 4.5))
        ax.bar(["ddp", "PyTorch DDP (gloo)"], [r["ddp"]["median_ms"], r["pytorch_ddp_gloo"]["median_ms"]], color=["C0", "C1"])
        ax.set_yscale("log"); ax.set_ylabel("step (ms, median, log)")
        ax.set_title(f"tutorial toy DDP job, 2 ranks: {r['speedup_median']:.1f}x")
        fig.tight_layout(); fig.savefig(os.path.join(d, "ddp_toy.png"), dpi=110); plt.close(fig)
        summary.append(f"| toy DDP step vs PyTorch DDP | multinode tutorial, 2 ranks | {r['ddp']['median_ms']:.3f} ms | "
                       f"{r['pytorch_ddp_gloo']['median_ms']:.3f} ms | {r['speedup_median']:.1f} |")

    data = rows(d, "data")
    if data:
        # Bars: the median over repetitions of images/s per core (images/s / W, W threads or worker processes);
        # dots: each repetition. Label: the median of the per-pair ratios ours / torchvision's (each pair ran
        # back to back, so a neighbour's load on this shared machine hits both sides of a pair alike).
        workers = sorted({r["workers"] for r in data if "impl" in r})
        impls = [("ddp", "ddp ImageFolder + DataLoader (threads)"),
                 ("torchvision", "torchvision ImageFolder + torch DataLoader (processes)")]
        per = {(impl, w): sorted(r["images_per_sec_per_core"] for r in data if r.get("impl") == impl and r["workers"] == w)
               for impl, _ in impls for w in workers}
        med = {k: v[len(v) // 2] if v else 0.0 for k, v in per.items()}  # upper median: one of the measured points
        ratio = {}
        for w in workers:
            pairs = sorted(r["ratio"] for r in data if "ratio" in r and r["workers"] == w)
            if pairs:
                ratio[w] = pairs[len(pairs) // 2]
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for k, (impl, label) in enumerate(impls):
            xs = [i + (k - 0.5) * 0.4 for i in range(len(workers))]
            ax.bar(xs, [med[(impl, w)] for w in workers], 0.4, label=label, color=f"C{k}")
            for x, w in zip(xs, workers):
                ax.plot([x] * len(per[(impl, w)]), per[(impl, w)], "k.", ms=4)
        for i, w in enumerate(workers):
            if w in ratio:
                ax.annotate(f"{ratio[w]:.2f}x",
                            (i, max(per[("ddp", w)] + per[("torchvision", w)])), ha="center", va="bottom", fontsize=9)
        r0 = next(r for r in data if "impl" in r)
        ax.set_xticks(range(len(workers))); ax.set_xticklabels([f"{w} worker{'s' if w > 1 else ''}" for w in workers])
        ax.set_ylabel("images / s per core (images / s / workers)")
        ax.set_ylim(0, 1.35 * max(max(v) for v in per.values() if v))
        ax.set_title(f"JPEG loading, RandomResizedCrop({r0['crop']}) + flip + normalise, batch {r0['batch_size']}\n"
                     "label: median ratio ours / torchvision (> 1: ddp faster); dots: repetitions", fontsize=9)
        ax.legend(fontsize=8, loc="upper right"); fig.tight_layout()
        fig.savefig(os.path.join(d, "data.png"), dpi=110); plt.close(fig)
        for w in workers:
            if w in ratio:
                summary.append(f"| ImageFolder loader vs torchvision DataLoader | {r0['crop']} px train transform, "
                               f"b{r0['batch_size']}, {w} worker{'s' if w > 1 else ''} | {med[('ddp', w)] * w:.0f} img/s | "
                               f"{med[('torchvision', w)] * w:.0f} img/s | {ratio[w]:.2f} |")

    with open(os.path.join(d, "summary.md"), "w") as f:
        f.write("\n".join(summary) + "\n")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
