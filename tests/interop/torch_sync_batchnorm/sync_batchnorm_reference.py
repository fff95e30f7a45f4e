#!/usr/bin/python3
"""Reference for tests/interop/torch_sync_batchnorm: torch.nn.BatchNorm2d on the whole (concatenated) batch.

usage: sync_batchnorm_reference.py REFERENCE_DIR OUT_FILE
Writes (every activation NHWC, float32): gamma, beta; step 1 (plain BN): x1, dy1, y1, dx1, dgamma1, dbeta1;
step 2 (y = relu(bn(x) + residual), the blocks' fused form): x2, res2, dy2, y2, dx2, dres2, dgamma2, dbeta2;
after both: running_mean, running_var, num_batches_tracked; eval on x1: y_eval. Exit 77 without torch.
"""
import sys

try:
    import torch
except ImportError:
    sys.exit(77)

sys.path.insert(0, sys.argv[1])
from safetensors_py import save_file  # noqa: E402

N, C, H, W = 8, 6, 3, 3
torch.manual_seed(0)
bn = torch.nn.BatchNorm2d(C)
with torch.no_grad():
    bn.weight.copy_(torch.rand(C) + 0.5)
    bn.bias.copy_(torch.randn(C) * 0.1)
out = {"gamma": bn.weight.detach().clone(), "beta": bn.bias.detach().clone()}


def nhwc(t):
    return t.detach().permute(0, 2, 3, 1).contiguous()


bn.train()
x1 = (1.5 + 2.0 * torch.randn(N, C, H, W)).requires_grad_()  # a mean away from 0
dy1 = torch.randn(N, C, H, W)
y1 = bn(x1)
y1.backward(dy1)
out.update(x1=nhwc(x1), dy1=nhwc(dy1), y1=nhwc(y1), dx1=nhwc(x1.grad), dgamma1=bn.weight.grad.clone(),
           dbeta1=bn.bias.grad.clone())
bn.weight.grad = None
bn.bias.grad = None

x2 = (-0.5 + 3.0 * torch.randn(N, C, H, W)).requires_grad_()
res2 = torch.randn(N, C, H, W).requires_grad_()
dy2 = torch.randn(N, C, H, W)
y2 = torch.relu(bn(x2) + res2)
y2.backward(dy2)
out.update(x2=nhwc(x2), res2=nhwc(res2), dy2=nhwc(dy2), y2=nhwc(y2), dx2=nhwc(x2.grad), dres2=nhwc(res2.grad),
           dgamma2=bn.weight.grad.clone(), dbeta2=bn.bias.grad.clone())

out.update(running_mean=bn.running_mean.clone(), running_var=bn.running_var.clone(),
           num_batches_tracked=bn.num_batches_tracked.clone())
bn.eval()
with torch.no_grad():
    out["y_eval"] = nhwc(bn(x1.detach()))
save_file(out, sys.argv[2], {"torch": torch.__version__})
