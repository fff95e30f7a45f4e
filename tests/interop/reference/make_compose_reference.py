#!/usr/bin/python3
# Writes PyTorch reference data for the modules that compose without backward code (issue 39): SiLU, Tanh, Sigmoid,
# Identity, Flatten, and a residual CNN built from Sequential, a generic Residual (the twin of ddp's nn::Residual),
# Conv2d, BatchNorm2d, ReLU, Dropout, Flatten and Linear. Read by tests/interop/reference/test_compose_ops.cpp.
# SPDX-License-Identifier: MIT
#
# Usage: /usr/bin/python3 make_compose_reference.py OUT_FILE      (exits 77 when torch is not importable)
#
# File format: reference_records.py's. Single modules run in float32, the model in float64 (so ddp's double
# model must match to ~1e-12, not to float rounding). 4-D tensors are NCHW/OIHW (the reader converts them).
# The model's state_dict keys are stored as names "model/key/<i>/<key>" beside "model/key_count"; its initial
# state as "model/init/<key>", gradients as "model/grad/<key>", running statistics after the training forward as
# "model/after/<key>".
import sys

from reference_records import Records, import_torch  # shared by these scripts

torch, F = import_torch(seed=3939)
nn = torch.nn
records = Records()
put = records.put

# Element-wise activations and Identity, float32, on one x and dy.
x = (torch.randn(2, 16, 33) * 3).requires_grad_(True)
dy = torch.randn(2, 16, 33)
put("act/x", x); put("act/dy", dy)
for name, module in [("silu", nn.SiLU()), ("tanh", nn.Tanh()), ("sigmoid", nn.Sigmoid()), ("mish", nn.Mish()),
                     ("identity", nn.Identity())]:
    x.grad = None
    y = module(x)
    y.backward(dy)
    put(f"{name}/y", y); put(f"{name}/dx", x.grad)

# Flatten: (input shape, start_dim, end_dim); 4-D inputs are NCHW here, NHWC in ddp.
flatten_cases = [((2, 3, 4, 5), 1, -1), ((2, 3, 4, 5), 2, 3), ((2, 3, 4, 5), 0, 2),
                 ((3, 4, 6), 0, 1), ((3, 4, 6), 1, 2)]
for i, (shape, s, e) in enumerate(flatten_cases):
    c = f"flatten{i}"
    x = torch.randn(*shape).requires_grad_(True)
    y = nn.Flatten(s, e)(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    put(c + "/x", x); put(c + "/y", y); put(c + "/dy", dy); put(c + "/dx", x.grad)
    put(c + "/dims", [s, e])
put("flatten/count", len(flatten_cases))


class Residual(nn.Module):
    """y = body(x) + (shortcut(x) if shortcut else x): what a PyTorch user writes, and ddp's nn::Residual."""

    def __init__(self, body, shortcut=None):
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x):
        return self.body(x) + (x if self.shortcut is None else self.shortcut(x))


def conv(i, o, k, stride=1, bias=False):
    return nn.Conv2d(i, o, k, stride=stride, padding=k // 2, bias=bias)


model = nn.Sequential(
    conv(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),                                      # 0 1 2
    Residual(nn.Sequential(conv(4, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), conv(4, 4, 3), nn.BatchNorm2d(4))),  # 3
    nn.ReLU(),                                                                        # 4: relu(body(x) + x)
    Residual(nn.Sequential(conv(4, 6, 3, stride=2, bias=True), nn.BatchNorm2d(6), nn.SiLU(), conv(6, 6, 3),
                           nn.BatchNorm2d(6)),
             nn.Sequential(conv(4, 6, 1, stride=2), nn.BatchNorm2d(6))),              # 5: projection shortcut
    nn.Tanh(), nn.Dropout(0.5), nn.Flatten(), nn.Linear(6 * 4 * 4, 5), nn.Sigmoid(),  # 6 .. 10
    nn.Sequential(nn.Identity(), nn.Linear(5, 3)),                                    # 11: nested Sequential
).double()
with torch.no_grad():  # BatchNorm's affine parameters and statistics away from their defaults
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.copy_(torch.rand(m.num_features) + 0.5)
            m.bias.copy_(torch.randn(m.num_features) * 0.3)
            m.running_mean.copy_(torch.randn(m.num_features) * 0.2)
            m.running_var.copy_(torch.rand(m.num_features) + 0.5)
            m.num_batches_tracked.fill_(2)
keys = list(model.state_dict().keys())
put("model/key_count", len(keys))
for i, k in enumerate(keys):
    put(f"model/key/{i}/{k}", 0)
for k, v in model.state_dict().items():
    put("model/init/" + k, v)

# Training forward and backward, with Dropout's p set to 0 (torch's mask comes from its own generator).
model[7].p = 0.0
model.train()
x = torch.randn(2, 3, 8, 8, dtype=torch.float64).requires_grad_(True)
y = model(x)
dy = torch.randn_like(y)
y.backward(dy)
put("model/x", x); put("model/y", y); put("model/dy", dy); put("model/dx", x.grad)
for k, p in model.named_parameters():
    put("model/grad/" + k, p.grad)
for k, b in model.named_buffers():
    put("model/after/" + k, b)

# Evaluation forward and backward with p = 0.5: Dropout is the identity and BatchNorm uses the running statistics.
model[7].p = 0.5
model.eval()
x.grad = None
model.zero_grad()
y = model(x)
dy = torch.randn_like(y)
y.backward(dy)
put("eval/y", y); put("eval/dy", dy); put("eval/dx", x.grad)
for k, p in model.named_parameters():
    put("eval/grad/" + k, p.grad)

records.write(sys.argv[1])
