"""Reads a --tensorboard-dir with TensorBoard's own readers and checks it against the run's --metrics-file.

Usage: check_events.py <event dir> <metrics.jsonl> <tag>...
Checks: the directory holds exactly one event file (rank 0's) whose records all pass TensorBoard's CRC checks and
whose first event is file_version brain.Event:2; both of TensorBoard's accumulators (the legacy scalar one and the
plugin one behind the web UI, which turns simple values into scalar-plugin tensors) list every number of every
metrics record under its key at the record's global_step, equal to the float32 of the JSON value; the tags named on
the command line are among them; nothing else is there. Exit 0 when all hold.
SPDX-License-Identifier: MIT
"""
import json
import math
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader, plugin_event_accumulator
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
from tensorboard.util import tensor_util

event_dir, metrics_path, *required = sys.argv[1:]
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
failures = []

files = [f for f in os.listdir(event_dir) if "tfevents" in f]
if len(files) != 1:
    sys.exit(f"expected one event file (rank 0's) in {event_dir}, found {files}")
path = os.path.join(event_dir, files[0])
print("event file:", files[0], os.path.getsize(path), "bytes")

# Raw records through TensorBoard's record reader, which checks both CRCs of every record and raises DataLossError
# (the event loaders below stop quietly at a bad record instead, so the count of their events is checked too).
reader = pywrap_tensorflow.PyRecordReader_New(path)
n_records = 0
while True:
    try:
        reader.GetNext()
    except errors.OutOfRangeError:
        break
    n_records += 1
events = list(event_file_loader.LegacyEventFileLoader(path).Load())
if len(events) != n_records:
    failures.append(f"the event loader read {len(events)} of {n_records} records")
if not events or events[0].file_version != "brain.Event:2":
    failures.append(f"first event is not file_version brain.Event:2: {events[:1]}")

# What the run recorded: every number but the step fields, at global_step.
want = {}
for line in open(metrics_path):
    r = json.loads(line)
    for k, v in r.items():
        if k in ("step", "global_step") or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        want.setdefault(k, {})[r["global_step"]] = f32(v)
n_values = sum(len(v) for v in want.values())
for tag in required:
    if tag not in want:
        failures.append(f"the metrics file has no {tag!r}")
if len(events) != 1 + len(next(iter(want.values()), {})):
    failures.append(f"{len(events)} events, expected 1 + one per metrics record")


def compare(reader, got):
    if set(got) != set(want):
        failures.append(f"{reader}: tags {sorted(got)} != {sorted(want)}")
    for tag, steps in want.items():
        have = got.get(tag, {})
        if have != steps:
            bad = [(s, steps.get(s), have.get(s)) for s in sorted(set(steps) | set(have)) if steps.get(s) != have.get(s)]
            failures.append(f"{reader}: {tag}: (step, want, got) {bad[:5]}")


legacy = event_accumulator.EventAccumulator(event_dir, size_guidance={event_accumulator.SCALARS: 0})
legacy.Reload()
compare("EventAccumulator", {t: {e.step: e.value for e in legacy.Scalars(t)} for t in legacy.Tags()["scalars"]})

plugin = plugin_event_accumulator.EventAccumulator(event_dir, size_guidance={plugin_event_accumulator.TENSORS: 0})
plugin.Reload()
got = {}
for t in plugin.Tags()["tensors"]:
    if plugin.SummaryMetadata(t).plugin_data.plugin_name != "scalars":
        failures.append(f"plugin accumulator: {t} is not a scalars-plugin series")
    got[t] = {e.step: float(tensor_util.make_ndarray(e.tensor_proto).item()) for e in plugin.Tensors(t)}
compare("plugin EventAccumulator", got)

finite = all(math.isfinite(v) for steps in want.values() for v in steps.values())
print(f"{len(want)} tags, {n_values} values over {len(events) - 1} steps; tags: {', '.join(sorted(want))}")
if not finite:
    failures.append("a non-finite value in the metrics file")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
