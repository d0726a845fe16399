"""Golden images for the Pillow operations of AugMix and RandAugment (include/composer/data_algos.h,
cm_pil_*), from Debian's python3-pil, plus AugMix's mixing in numpy f32.

Run from the repository root:  /usr/bin/python3 tests/golden/gen_pil_ops.py
Images are stored (C, H, W) u8 as the datasets hold raw pixels; Pillow sees them as "RGB" (HWC) or
"L". Every result must match exactly. Read by tests/test_pil_ops.c."""
import os
import sys

import numpy as np
import PIL
import torch
from PIL import Image, ImageEnhance, ImageOps
from PIL.Image import Resampling, Transform

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

rng = np.random.default_rng(20240614)
out = {}


def pil(x):
    """(C, H, W) u8 -> PIL image."""
    return Image.fromarray(x[0]) if x.shape[0] == 1 else Image.fromarray(np.ascontiguousarray(x.transpose(1, 2, 0)))


def back(img, C):
    a = np.asarray(img)
    return a[None] if C == 1 else np.ascontiguousarray(a.transpose(2, 0, 1))


def u8(a):
    return torch.from_numpy(np.array(a, dtype=np.uint8))  # a writable copy


images = {
    "rgb": rng.integers(30, 221, (3, 13, 17)).astype(np.uint8),          # a middle range: autocontrast stretches it
    "rgbfull": rng.integers(0, 256, (3, 12, 12)).astype(np.uint8),       # square: rotate's 90/180 fast paths
    "gray": rng.integers(60, 120, (1, 11, 9)).astype(np.uint8),
    "flat": np.full((3, 5, 6), 77, np.uint8),                            # autocontrast / equalize leave it
}
# equalize's table past 255 (clipped by Image.point): 150 zeros, 149 ones, one 255
e = np.zeros(300, np.uint8)
e[150:299] = 1
e[299] = 255
images["eqedge"] = e.reshape(1, 20, 15)

for name, x in images.items():
    C = x.shape[0]
    img = pil(x)
    out[f"{name}.in"] = u8(x)
    out[f"{name}.autocontrast"] = u8(back(ImageOps.autocontrast(img), C))
    out[f"{name}.equalize"] = u8(back(ImageOps.equalize(img), C))
    for bits in [1, 2, 3, 4]:
        out[f"{name}.posterize{bits}"] = u8(back(ImageOps.posterize(img, bits), C))
    for thr in [256, 200, 128, 31, 1]:
        out[f"{name}.solarize{thr}"] = u8(back(ImageOps.solarize(img, thr), C))
    for deg in [3, -7, 17, -29, 90, 180]:
        out[f"{name}.rotate{deg}"] = u8(back(img.rotate(deg, resample=Resampling.BILINEAR), C))
    affines = {"shearx": (1, 0.27, 0, 0, 1, 0), "shearxn": (1, -0.18, 0, 0, 1, 0), "sheary": (1, 0, 0, 0.12, 1, 0),
               "shearyn": (1, 0, 0, -0.29, 1, 0), "transx": (1, 0, 5, 0, 1, 0), "transxn": (1, 0, -4, 0, 1, 0),
               "transy": (1, 0, 0, 0, 1, 3), "transyn": (1, 0, 0, 0, 1, -2)}
    for k, a in affines.items():
        out[f"{name}.{k}"] = u8(back(img.transform(img.size, Transform.AFFINE, a, resample=Resampling.BILINEAR), C))
    for f in [0.1, 0.55, 1.0, 1.45, 3.2]:
        tag = str(f).replace(".", "p")
        out[f"{name}.color{tag}"] = u8(back(ImageEnhance.Color(img).enhance(f), C))
        out[f"{name}.contrast{tag}"] = u8(back(ImageEnhance.Contrast(img).enhance(f), C))
        out[f"{name}.brightness{tag}"] = u8(back(ImageEnhance.Brightness(img).enhance(f), C))
        out[f"{name}.sharpness{tag}"] = u8(back(ImageEnhance.Sharpness(img).enhance(f), C))

# AugMix's mixing (composer's _augmix_pil_image, numpy f32) of three fixed chains
x = images["rgb"]
chains = [back(ImageOps.equalize(pil(x)), 3), back(pil(x).rotate(-11, resample=Resampling.BILINEAR), 3),
          back(ImageEnhance.Contrast(pil(x)).enhance(1.8), 3)]
chain_weights = np.array([0.2, 0.5, 0.3], dtype=np.float32)
mixing_weight = np.float32(0.37)
augmented_combination = np.zeros_like(pil(x), dtype=np.float32)
for i in range(3):
    augmented_combination += chain_weights[i] * np.asarray(pil(chains[i]))
mixed = (1 - mixing_weight) * np.asarray(pil(x), dtype=np.float32) + mixing_weight * augmented_combination
out["augmix.chains"] = u8(np.stack(chains))
out["augmix.weights"] = torch.from_numpy(chain_weights)
out["augmix.mixing"] = torch.tensor([mixing_weight], dtype=torch.float32)
out["augmix.out"] = u8(back(Image.fromarray(np.uint8(mixed)), 3))

stwrite.save(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pil_ops.safetensors"), out,
             {"generator": "gen_pil_ops.py", "pillow": PIL.__version__, "numpy": np.__version__})
print("wrote", len(out), "tensors")
