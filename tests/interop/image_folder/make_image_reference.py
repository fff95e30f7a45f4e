#!/usr/bin/python3
# Writes a small ImageFolder tree of JPEGs and PNGs with PIL and what torchvision makes of it, for
# tests/interop/image_folder/test_image_folder.cpp.
# SPDX-License-Identifier: MIT
#
# Usage: /usr/bin/python3 make_image_reference.py TREE_DIR OUT_FILE   (exits 77 when torch/torchvision/PIL
# are not importable). TREE_DIR gets good/<class>/... (a valid ImageFolder) and bad/<class>/... (one good
# JPEG, a truncated JPEG, garbage named .png, a truncated PNG).
# OUT_FILE: tests/interop/reference/make_op_reference.py's record format (name, kind 0 float64 / 1 int64, dims, values):
#   classes/<k>            UTF-8 bytes of class name k (torchvision's ImageFolder.classes)
#   sample/<i>             UTF-8 bytes of sample i's path relative to TREE_DIR/good; label/<i> its class index
#   decoded/<i>            (H, W, 3) uint8 of Image.open(path).convert("RGB")
#   eval/<cfg>/<i>         (S, S, 3) float32: Resize(R) + CenterCrop(S) + ToTensor + Normalize(ImageNet), for
#                          cfg in {"256_224", "64_56", "40_56"} ("40_56": the crop is larger, CenterCrop pads)
#   train/<S>/<i>          (S, S, 3) float32: F.resized_crop(img, i, j, h, w, [S, S], BILINEAR) [+ hflip]
#                          + ToTensor + Normalize, with params/<S>/<i> = (i, j, h, w, flip) from
#                          RandomResizedCrop.get_params(img, (0.08, 1), (3/4, 4/3)) under torch.manual_seed
#   bad_pil_fails/<name>   1 when PIL's loader raises on bad/<...>/<name>, else 0
import io
import os
import struct
import sys

try:
    import numpy as np
    import torch
    import torchvision
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from PIL import Image
except Exception as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: torch/torchvision/PIL not importable by {sys.executable} ({e}); install python3-torchvision python3-pil")
    sys.exit(77)

tree, out_path = sys.argv[1], sys.argv[2]
torch.manual_seed(20261124)
rng = np.random.default_rng(18)
records = []


def put(name, arr, kind):
    arr = np.asarray(arr)
    b = name.encode()
    rec = struct.pack("<I", len(b)) + b + struct.pack("<BI", kind, arr.ndim) + struct.pack(f"<{arr.ndim}q", *arr.shape)
    rec += arr.astype("<f8" if kind == 0 else "<i8").tobytes()
    records.append(rec)


def put_bytes(name, s):
    put(name, np.frombuffer(s.encode(), dtype=np.uint8), 1)


def natural(h, w, channels=3):
    # Smooth gradients plus noise: JPEG-like content with edges, so subsampling and the IDCT matter.
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = []
    for c in range(channels):
        a, b = rng.uniform(0.02, 0.3, 2)
        p = 127 + 100 * np.sin(a * x + c) * np.cos(b * y) + rng.normal(0, 12, (h, w))
        planes.append(p)
    img = np.clip(np.stack(planes, -1), 0, 255).astype(np.uint8)
    return img if channels > 1 else img[..., 0]


def save(path, img, **kw):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img.save(path, **kw)


good = os.path.join(tree, "good")
# Class names chosen so that byte order matters: upper case sorts before lower case, '-' before '_'.
files = {
    "a_b/x1.jpg": lambda: Image.fromarray(natural(37, 53)),
    "a_b/X0.JPG": lambda: Image.fromarray(natural(64, 48)),
    "a_b/sub/deep.jpeg": lambda: Image.fromarray(natural(300, 260)),
    "a_b/sub-2/k.png": lambda: Image.fromarray(natural(29, 31)),
    "a-b/p444.jpg": lambda: (Image.fromarray(natural(81, 67)), dict(quality=90, subsampling=0)),
    "a-b/p422.jpg": lambda: (Image.fromarray(natural(50, 77)), dict(quality=75, subsampling=1)),
    "a-b/prog.jpg": lambda: (Image.fromarray(natural(90, 120)), dict(quality=85, progressive=True)),
    "a-b/notes.txt": None,
    "B/gray.jpg": lambda: Image.fromarray(natural(45, 60, 1), mode="L"),
    "B/gray.png": lambda: Image.fromarray(natural(33, 21, 1), mode="L"),
    "B/rgba.png": lambda: Image.fromarray(np.dstack([natural(40, 40), natural(40, 40, 1)]), mode="RGBA"),
    "B/pal.png": lambda: Image.fromarray(natural(52, 44)).convert("P", palette=Image.ADAPTIVE, colors=64),
    "B/interlaced.PNG": lambda: (Image.fromarray(natural(26, 35)), dict(interlace=1)),
    "Z/big.jpeg": lambda: (Image.fromarray(natural(333, 500)), dict(quality=95)),
    "Z/tiny.jpg": lambda: Image.fromarray(natural(3, 5)),
}
for rel, make in files.items():
    path = os.path.join(good, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if make is None:
        with open(path, "w") as f:
            f.write("not an image\n")
        continue
    r = make()
    img, kw = r if isinstance(r, tuple) else (r, {})
    save(path, img, **kw)

ds = torchvision.datasets.ImageFolder(good)
for k, c in enumerate(ds.classes):
    put_bytes(f"classes/{k}", c)
mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
to_tensor_norm = T.Compose([T.ToTensor(), T.Normalize(mean, std)])


def hwc(t):
    return t.permute(1, 2, 0).contiguous().numpy().astype(np.float64)


for i, (path, label) in enumerate(ds.samples):
    put_bytes(f"sample/{i}", os.path.relpath(path, good))
    put(f"label/{i}", [label], 1)
    img = ds.loader(path)  # Image.open(path).convert("RGB")
    put(f"decoded/{i}", np.asarray(img), 1)
    for name, (r, s) in {"256_224": (256, 224), "64_56": (64, 56), "40_56": (40, 56)}.items():
        t = T.Compose([T.Resize(r), T.CenterCrop(s), T.ToTensor(), T.Normalize(mean, std)])(img)
        put(f"eval/{name}/{i}", hwc(t), 0)
    for s in (224, 48):
        ci, cj, ch, cw = T.RandomResizedCrop.get_params(img, scale=[0.08, 1.0], ratio=[3.0 / 4.0, 4.0 / 3.0])
        flip = int(torch.rand(1).item() < 0.5)
        crop = F.resized_crop(img, ci, cj, ch, cw, [s, s], T.InterpolationMode.BILINEAR)
        if flip:
            crop = F.hflip(crop)
        put(f"params/{s}/{i}", [ci, cj, ch, cw, flip], 1)
        put(f"train/{s}/{i}", hwc(to_tensor_norm(crop)), 0)

bad = os.path.join(tree, "bad")
good_jpg = io.BytesIO()
Image.fromarray(natural(160, 200)).save(good_jpg, format="JPEG")
good_png = io.BytesIO()
Image.fromarray(natural(40, 40)).save(good_png, format="PNG")
bad_files = {
    "c0/good.jpg": good_jpg.getvalue(),
    "c0/truncated.jpg": good_jpg.getvalue()[:600],  # cut in the headers
    "c0/truncated_scan.jpg": good_jpg.getvalue()[: len(good_jpg.getvalue()) * 3 // 4],  # cut in the scan data
    "c1/garbage.png": bytes(rng.integers(0, 256, 500, dtype=np.uint8)),
    "c1/truncated.png": good_png.getvalue()[: len(good_png.getvalue()) // 2],
}
for rel, data in bad_files.items():
    path = os.path.join(bad, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    try:
        torchvision.datasets.folder.pil_loader(path)
        fails = 0
    except Exception:
        fails = 1
    put(f"bad_pil_fails/{os.path.basename(rel)}", [fails], 1)

with open(out_path, "wb") as f:
    for r in records:
        f.write(r)
print(f"make_image_reference: {len(ds.samples)} samples in {len(ds.classes)} classes, torchvision {torchvision.__version__}")
