"""Kernel fingerprint: a sha256 of the output of every kind of CPU op the pipeline runs, and the kernel
choices in force (determinism.cpu's switches), so that a machine whose kernels give other bits is caught
by one fast test that names the op, not by an end-to-end hash 20 minutes later.

``python -m dpnrepro.determinism.fingerprint`` prints the choices and the hashes; ``--check`` compares them
with the committed ``tests/fixtures/kernel_fingerprint.json`` (exit 1 naming the ops that differ);
``--write`` records them there. The maintainers' sweeps over the switches and their cost are
``tools/kernel_sweep.py``.

Inputs are real Fashion-MNIST images (the smoke data) where the op is a data op, and seeded normal
tensors of the smoke models' sizes (Mu/7: width 64, 16 tokens + cls, 4 heads, MLP 256, batch 64) for the
tensor kernels. Every op runs on the threads a stage runs on (:func:`dpnrepro.determinism.cpu.pin_threads`).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import dpnrepro  # noqa: F401  (pins the kernel choices before numpy, torch or cv2 load)
from dpnrepro.determinism.cpu import describe, library_choices, pin_threads
from dpnrepro.io import write_text_atomic

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
COMMITTED = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "kernel_fingerprint.json"
BATCH, TOKENS, WIDTH, HEADS, MLP = 64, 17, 64, 4, 256


def _sha(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = a.detach().contiguous().numpy() if hasattr(a, "detach") else a
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _images(n: int):
    """The first ``n`` Fashion-MNIST training images, uint8 (n, 28, 28)."""
    import numpy as np

    if not FASHION_MNIST.is_file():
        raise FileNotFoundError(f"{FASHION_MNIST} is missing: run `make env` (installs Debian's dataset-fashion-mnist)")
    with gzip.open(FASHION_MNIST) as f:
        raw = f.read(16 + n * 28 * 28)
    return np.frombuffer(raw[16:], np.uint8).reshape(n, 28, 28).copy()


def _normal(*shape, seed: int):
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def tensor_ops() -> dict[str, str]:
    """Torch kernels of a smoke training step: GEMMs, attention's batched GEMMs, conv stem, LN, activations, AdamW."""
    import torch
    import torch.nn.functional as F

    out = {}
    x, w = _normal(BATCH * TOKENS, WIDTH, seed=1), _normal(MLP, WIDTH, seed=2) * 0.1
    out["gemm_fwd"] = _sha(x @ w.t())
    g = _normal(BATCH * TOKENS, MLP, seed=3)
    out["gemm_bwd_input"] = _sha(g @ w)
    out["gemm_bwd_weight"] = _sha(g.t() @ x)
    q, k = _normal(BATCH * HEADS, TOKENS, WIDTH // HEADS, seed=4), _normal(BATCH * HEADS, TOKENS, WIDTH // HEADS, seed=5)
    out["bmm_attention"] = _sha(torch.bmm(q, k.transpose(1, 2)))
    qh, kh, vh = (t.view(BATCH, HEADS, TOKENS, -1).requires_grad_() for t in (q.clone(), k.clone(), _normal(*q.shape, seed=6)))
    att = F.scaled_dot_product_attention(qh, kh, vh)
    att.sum().backward()
    out["sdpa_fwd_bwd"] = _sha(att, qh.grad, kh.grad, vh.grad)
    img = torch.from_numpy(_images(BATCH)).float().div(255).unsqueeze(1).requires_grad_()
    cw = (_normal(WIDTH, 1, 7, 7, seed=7) * 0.1).requires_grad_()
    y = F.conv2d(img, cw, stride=7)
    (y * _normal(*y.shape, seed=8)).sum().backward()
    out["conv_stem_fwd_bwd"] = _sha(y, cw.grad, img.grad)
    t = x.clone().requires_grad_()
    ln = F.layer_norm(t, (WIDTH,), torch.ones(WIDTH), torch.zeros(WIDTH), 1e-6)
    (ln * _normal(*ln.shape, seed=9)).sum().backward()
    out["layernorm_fwd_bwd"] = _sha(ln, t.grad)
    s = _normal(BATCH * HEADS, TOKENS, TOKENS, seed=10)
    out["softmax"] = _sha(torch.softmax(s, -1))
    out["gelu"] = _sha(F.gelu(g), F.gelu(g, approximate="tanh"))
    out["exp_log_tanh"] = _sha(torch.exp(s), torch.log(s.abs() + 1e-3), torch.tanh(s))
    logits = _normal(BATCH, 10, seed=11)
    out["cross_entropy"] = _sha(F.cross_entropy(logits, torch.arange(BATCH) % 10, label_smoothing=0.1))
    out["sum_mean_norm"] = _sha(x.sum(), x.mean(0), x.norm(), x.var(0))
    g = _normal(*w.shape, seed=20)
    clipped = torch.nn.Parameter(w.clone())
    clipped.grad = g.clone()
    torch.nn.utils.clip_grad_norm_([clipped], 1.0)
    out["clip_grad_norm"] = _sha(clipped.grad)
    return out


def optimizer_ops(steps: int = 3) -> dict[str, str]:
    """The pipeline's optimizers (training/optim.py) on a Mu/7-sized weight, split into what each step
    computes, so a machine that differs names the part: the decoupled decay alone (zero gradient), the two
    moments, the updated weights, the bias corrections (libm's pow in double, as the fused kernel takes
    them), and SGD with momentum (the fine-tunes)."""
    from types import SimpleNamespace

    import torch

    from dpnrepro.training.optim import build_optimizer

    w = _normal(MLP, WIDTH, seed=2) * 0.1
    grads = [_normal(*w.shape, seed=20 + i) for i in range(steps)]

    def run(optimizer: str, zero_grad: bool = False):
        model = torch.nn.Linear(WIDTH, MLP, bias=False)
        model.weight.data.copy_(w)
        opt = build_optimizer(model, SimpleNamespace(optimizer=optimizer, lr=1e-3, weight_decay=1e-4))
        for g in grads:
            model.weight.grad = torch.zeros_like(g) if zero_grad else g.clone()
            opt.step()
        return model.weight, opt.state[model.weight]

    out = {}
    p, _ = run("adamw", zero_grad=True)
    out["adamw_decay"] = _sha(p)
    p, state = run("adamw")
    out["adamw_moments"] = _sha(state["exp_avg"], state["exp_avg_sq"])
    out["adamw_update"] = _sha(p)
    out["adamw_bias_correction"] = _sha(torch.tensor(
        [c for t in range(1, 1001) for c in (1 - 0.9 ** t, (1 - 0.999 ** t) ** 0.5)], dtype=torch.float64))
    p, _ = run("sgd_momentum")
    out["sgd_momentum"] = _sha(p)
    return out


def python_float_ops() -> dict[str, str]:
    """Python's float math (the C library's libm): AdamW's bias corrections, the learning-rate schedules."""
    import math

    import numpy as np

    xs = [i / 97 for i in range(1, 400)]
    values = [0.9 ** i for i in range(1, 200)] + [(1 - 0.999 ** i) ** 0.5 for i in range(1, 200)]
    values += [f(x) for x in xs for f in (math.exp, math.log, math.cos, math.sin, math.sqrt, math.tanh)]
    return {"python_libm": _sha(np.asarray(values, np.float64))}


def numpy_ops() -> dict[str, str]:
    """NumPy float ops of data, statistics and evaluation (few-shot's closed-form ridge solve)."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((500, 64)), rng.standard_normal((500, 10))
    x32 = _images(64).astype(np.float32) / 255
    return {
        "np_float32_math": _sha(np.exp(x32), np.log1p(x32), np.sqrt(x32), np.tanh(x32), np.power(x32, 2.2)),
        "np_float64_math": _sha(np.exp(a), np.log(np.abs(a) + 1e-3), np.sin(a), np.cos(a), np.arctan2(a, a.T[:1].T)),
        "np_reductions": _sha(np.asarray([a.sum(), a.mean(), a.std(), np.percentile(a, 2.5), np.median(a)]),
                              x32.mean((1, 2)), x32.std((1, 2))),
        "np_matmul": _sha(a.T @ a, a @ a.T[:, :8], x32.reshape(64, -1) @ x32.reshape(64, -1).T),
        "np_linalg_solve": _sha(np.linalg.solve(a.T @ a + np.eye(64), a.T @ b)),
    }


def image_ops() -> dict[str, str]:
    """The fast backend's OpenCV ops (RandAugment's warps and Sharpness, flips) and PIL's on real images."""
    import cv2
    import numpy as np
    from PIL import Image, ImageEnhance, ImageOps

    imgs = _images(8)
    rgb = np.repeat(cv2.resize(imgs[0], (56, 56), interpolation=cv2.INTER_CUBIC)[:, :, None], 3, axis=2)
    m = np.array([[0.96, 0.28, -3.1], [-0.28, 0.96, 4.7]])
    out = {}
    for name, interp in (("nearest", cv2.INTER_NEAREST), ("bilinear", cv2.INTER_LINEAR), ("bicubic", cv2.INTER_CUBIC)):
        out[f"cv2_warp_affine_{name}"] = _sha(*(cv2.warpAffine(a, m, a.shape[1::-1], flags=interp | cv2.WARP_INVERSE_MAP,
                                                               borderMode=cv2.BORDER_REPLICATE) for a in (*imgs, rgb)))
    k = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / 13
    out["cv2_filter2d_resize"] = _sha(*(cv2.filter2D(a, -1, k, borderType=cv2.BORDER_REPLICATE) for a in (*imgs, rgb)),
                                      cv2.resize(rgb, (224, 224), interpolation=cv2.INTER_LINEAR),
                                      cv2.resize(rgb, (17, 17), interpolation=cv2.INTER_AREA), cv2.flip(rgb, 1))
    pil = Image.fromarray(rgb)
    out["pil_ops"] = _sha(*(np.asarray(im) for im in (
        pil.rotate(17, resample=Image.Resampling.BICUBIC), pil.resize((224, 224), Image.Resampling.BICUBIC),
        pil.resize((20, 20), Image.Resampling.BILINEAR, reducing_gap=None), ImageEnhance.Color(pil).enhance(1.7),
        ImageEnhance.Contrast(pil).enhance(0.4), ImageEnhance.Sharpness(pil).enhance(1.9), ImageOps.equalize(pil),
        ImageOps.autocontrast(pil))))
    return out


def training_run(steps: int = 20) -> dict[str, str]:
    """A 20-step Mu/7 training on real Fashion-MNIST (both stems), the pipeline's AdamW + clipping: the end
    weights."""
    from types import SimpleNamespace

    import torch
    import torch.nn.functional as F

    from dpnrepro.models.vision_transformer_dpn import build_vit
    from dpnrepro.training.optim import build_optimizer

    out = {}
    labels_path = FASHION_MNIST.with_name("train-labels-idx1-ubyte.gz")
    with gzip.open(labels_path) as f:
        labels = torch.frombuffer(bytearray(f.read(8 + steps * 32)[8:]), dtype=torch.uint8).long()
    images = torch.from_numpy(_images(steps * 32)).float().div(255).unsqueeze(1)
    for stem in ("dpn", "conv"):
        torch.manual_seed(0)
        model = build_vit("Mu/7", stem=stem, img_size=28, in_chans=1, num_classes=10)
        opt = build_optimizer(model, SimpleNamespace(optimizer="adamw", lr=1e-3, weight_decay=1e-4))
        for i in range(steps):
            sl = slice(32 * i, 32 * (i + 1))
            loss = F.cross_entropy(model(images[sl]), labels[sl])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        out[f"train_{steps}_steps_{stem}"] = _sha(*model.state_dict().values())
    return out


def fingerprint(onednn_convolutions: bool = False) -> dict[str, str]:
    """op -> sha256 prefix of its outputs, with the stages' threads and convolution path."""
    import torch

    pin_threads()
    if onednn_convolutions:
        torch.backends.mkldnn.enabled = True
        torch.backends.nnpack.set_flags(True)
    return {**tensor_ops(), **optimizer_ops(), **python_float_ops(), **numpy_ops(), **image_ops(), **training_run()}


def in_force() -> dict[str, str]:
    """What decides the bits in a stage's process: each library's kernel choice, read back from the library."""
    import cv2
    import numpy as np

    pin_threads()
    blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    return {
        **library_choices(),
        "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "unset"),
        "numpy_blas": f"{blas.get('name', '?')} {blas.get('version', '')}".strip(),
        "opencv_dispatch": cv2.getCPUFeaturesLine(),
        "opencv_ipp": str(cv2.ipp.useIPP()),
    }


def machine() -> str:
    """CPU model and whether it has AVX-512 (who wrote a fingerprint)."""
    from dpnrepro.cli import cpu_model

    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0] if Path("/proc/cpuinfo").exists() else ""
    return f"{cpu_model()} ({platform.machine()}, {'AVX-512' if 'avx512f' in flags else 'no AVX-512'})"


def versions() -> dict[str, str]:
    import cv2
    import numpy as np
    import PIL
    import torch

    return {"torch": torch.__version__, "numpy": np.__version__, "opencv": cv2.__version__, "pillow": PIL.__version__,
            "python": platform.python_version(), "libc": " ".join(platform.libc_ver())}


def in_fresh_process(code: str, env: dict, *args: str) -> dict:
    """Run ``code`` in a new interpreter with exactly ``env``; the JSON of its last output line."""
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def diff(found: dict[str, str], committed: dict[str, str]) -> list[str]:
    """The keys (ops, or versions) whose values differ or are missing on either side."""
    return sorted(k for k in set(found) | set(committed) if found.get(k) != committed.get(k))


def pin_changes(found: dict[str, str], committed: dict[str, str]) -> list[str]:
    """The versions that differ from the fingerprint's: every library and the C library exactly, Python by its
    feature version (3.11): a micro release fixes bugs in the interpreter, none of whose code the hashed ops run,
    so a distribution's 3.11.2 and pyenv's 3.11.7 compare alike (tests/test_pipeline.py checks every output hash
    under whichever `make env` chose)."""
    def feature(versions: dict[str, str]) -> dict[str, str]:
        return {**versions, "python": ".".join(versions.get("python", "").split(".")[:2])}

    return diff(feature(found), feature(committed))


def report() -> dict:
    """Who computed it (machine, versions), what was in force, and the hashes of every op."""
    return {"machine": machine(), "versions": versions(), "in_force": in_force(), "summary": describe(),
            "hashes": fingerprint()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the committed fingerprint; exit 1 on a difference")
    ap.add_argument("--write", action="store_true", help="record this machine's fingerprint as the committed one")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    if args.write or args.check:  # the committed fingerprint is of the pinned kernels: not comparable otherwise
        from dpnrepro.determinism.cpu import PinConflict, require_pins

        try:
            require_pins(opt_out=not args.write)
        except PinConflict as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    result = report()
    print(json.dumps(result, indent=1))
    if args.json:
        write_text_atomic(args.json, json.dumps(result, indent=1) + "\n")
    if args.write:
        write_text_atomic(COMMITTED, json.dumps({k: result[k] for k in ("machine", "versions", "in_force", "hashes")},
                                                indent=1) + "\n")
    if args.check:
        committed = json.loads(COMMITTED.read_text())
        differ = diff(result["hashes"], committed["hashes"])
        if differ:
            print(f"kernel fingerprint differs from the one written on {committed['machine']} in: {', '.join(differ)}",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
