"""The training step's compute (training/step.py): on-device scaling of uint8 images, per-micro-step
seeding, forward + loss compiled as one graph, the fused optimizer, and the sampler's per-epoch permutation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpnrepro.training.step import LossStep, reseed, unit_range

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


def test_unit_range_is_bit_identical_to_both_backends_own_scaling_for_all_256_values():
    from torchvision.transforms import v2

    from dpnrepro.data.fast import to_tensor

    hwc = np.arange(256 * 3, dtype=np.int64).reshape(16, 16, 3).__mod__(256).astype(np.uint8)
    chw = torch.from_numpy(hwc.transpose(2, 0, 1).copy())
    pil_ref = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.5] * 3)])(chw)
    assert torch.equal(unit_range(chw[None])[0], pil_ref)
    assert torch.equal(unit_range(chw[None])[0], to_tensor(hwc))
    assert unit_range(chw).dtype == torch.float32 and unit_range(chw).min() == -1 and unit_range(chw).max() == 1
    floats = torch.rand(2, 3, 4, 4)
    assert unit_range(floats) is floats  # already scaled (random erasing keeps floats)


@pytest.mark.parametrize("backend", ["pil", "fast"])
def test_train_transform_in_uint8_then_scaled_equals_the_float_transform(backend):
    from PIL import Image

    from dpnrepro.data.loader import build_transform

    cfg = {"image_size": 24, "channels": 3, "eval_resize": 24, "inception_crop": True, "flip": True,
           "randaug": "rand-n2-m15-tbigvision", "backend": backend}
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 30, 3), dtype=np.uint8))
    outs = []
    for uint8 in (False, True):
        torch.manual_seed(3)
        import random
        random.seed(3)
        outs.append(build_transform(cfg, train=True, uint8=uint8)(img))
    assert outs[1].dtype == torch.uint8
    assert torch.equal(unit_range(outs[1][None])[0], outs[0])


def test_reseed_gives_the_dropout_masks_of_torch_manual_seed():
    x = torch.ones(1000)
    torch.manual_seed(123)
    a = torch.nn.functional.dropout(x, 0.5)
    torch.manual_seed(7)
    reseed(torch.device("cpu"), 123)
    b = torch.nn.functional.dropout(x, 0.5)
    assert torch.equal(a, b)


def _mu_model(device, seed=0):
    from dpnrepro.models import build_vit

    torch.manual_seed(seed)
    return build_vit("Mu/7", stem="dpn", img_size=28, num_classes=10, in_chans=1).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cudagraphs", [False, True])
def test_compiled_loss_and_gradients_match_eager(device, cudagraphs):
    """forward + loss compiled as one graph (and its AOTAutograd backward) computes what eager computes:
    fp32 on the CPU to 1e-5, bf16 autocast on CUDA to bf16 rounding."""
    from dpnrepro.training.losses import sigmoid_xent

    if cudagraphs and device == "cpu":
        pytest.skip("CUDA graphs are CUDA only")
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (8, 1, 28, 28), generator=gen, dtype=torch.uint8).to(dev)
    t = torch.nn.functional.one_hot(torch.randint(0, 10, (8,), generator=gen), 10).float().to(dev)
    results = []
    for compile_ in (False, True):
        model = _mu_model(dev)
        step = LossStep(model, sigmoid_xent, dev, compile=compile_, cudagraphs=cudagraphs)
        for _ in range(2 if cudagraphs else 1):  # CUDA graphs record on a later call
            model.zero_grad(set_to_none=True)
            step.begin_step()
            loss = step(unit_range(x), t)
            loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((loss.detach().clone(), grads))
    (l0, g0), (l1, g1) = results
    tol = 1e-5 if device == "cpu" else 2e-2
    assert torch.allclose(l0, l1, rtol=tol, atol=tol), (l0, l1)
    assert (g1 - g0).norm() / g0.norm() < tol * 10


def test_fused_adamw_takes_the_for_each_step_to_rounding():
    from types import SimpleNamespace

    from dpnrepro.training.optim import build_optimizer

    cfg = SimpleNamespace(optimizer="adam", lr=1e-3, weight_decay=1e-4)
    finals = []
    for fused in (False, True):
        model = _mu_model("cpu")
        opt = build_optimizer(model, cfg, fused=fused)
        assert all(g.get("fused") is (True if fused else None) for g in opt.param_groups)
        for k in range(3):
            for p in model.parameters():
                p.grad = torch.full_like(p, 0.01 * (k + 1))
            opt.step()
        finals.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(finals[0], finals[1], rtol=1e-6, atol=1e-7)


def test_sampler_reads_each_epoch_permutation_once_and_gives_the_same_batches():
    from dpnrepro.data.loader import StepBatchSampler, _mix

    s = StepBatchSampler(50, 8, seed=3, start_step=0, total_steps=24)
    calls = []
    real = torch.randperm

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    torch.randperm = counting
    try:
        batches = [s.batch_for_step(step) for step in range(24)]  # 6 steps an epoch: 4 epochs
    finally:
        torch.randperm = real
    assert len(calls) == 4  # the next epoch's is prefetched, and only while the run reaches it
    for step, batch in enumerate(batches):  # the definition: positions of the epoch's seeded permutation
        epoch, pos = divmod(step, s.steps_per_epoch)
        perm = torch.randperm(50, generator=torch.Generator().manual_seed(_mix(3, epoch)))
        assert [i for i, _ in batch] == perm[pos * 8:(pos + 1) * 8].tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_a_kept_loss_survives_the_next_step(device):
    """The trainer logs losses after later steps ran: with CUDA graphs the returned loss lives in the graph's
    pool and the next replay overwrites it, so ``LossStep.kept`` must copy it (on CUDA, with and without
    graphs; on the CPU a detached view is enough). Driven as the trainer drives it: per optimizer step
    ``zero_grad(set_to_none=True)``, ``begin_step``, then the micro-batches (1 and 2) and their backwards."""
    from dpnrepro.training.losses import sigmoid_xent

    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randint(0, 256, (8, 1, 28, 28), generator=gen, dtype=torch.uint8).to(dev) for _ in range(8)]
    t = torch.nn.functional.one_hot(torch.randint(0, 10, (8,), generator=gen), 10).float().to(dev)
    for cudagraphs in ([False, True] if device == "cuda" else [False]):
        for accum in (1, 2):
            model = _mu_model(dev)
            params = [p for p in model.parameters() if p.requires_grad]
            step = LossStep(model, sigmoid_xent, dev, compile=cudagraphs, cudagraphs=cudagraphs)
            kept, fresh = [], []
            for k in range(0, len(xs), accum):  # 8 micro-batches: warm-up, recording, then replays
                model.zero_grad(set_to_none=True)
                step.begin_step(params)
                for x in xs[k:k + accum]:
                    loss = step(unit_range(x), t)
                    (loss / accum).backward()
                    fresh.append(float(loss))
                    kept.append(step.kept(loss))
            assert not kept[0].requires_grad
            assert [float(k) for k in kept] == fresh, f"cudagraphs={cudagraphs} accum={accum}: a kept loss overwritten"


def test_begin_step_is_required_and_refuses_gradients_kept_from_the_last_step():
    """With CUDA graphs a step's micro-batches share one graph step (``begin_step``), and gradients cannot carry
    over to the next one (they live in the graph pool, freed at the next mark: pytorch/pytorch#169545). Both
    misuses are refused in one line; the guard is checked here on the CPU (the flag forced, no graphs made)."""
    from dpnrepro.training.losses import sigmoid_xent

    model = _mu_model("cpu")
    params = list(model.parameters())
    step = LossStep(model, sigmoid_xent, torch.device("cpu"))
    step.begin_step(params)  # no graphs: nothing to check, nothing refused
    step.cudagraphs = True
    x = unit_range(torch.zeros(2, 1, 28, 28, dtype=torch.uint8))
    t = torch.zeros(2, 10)
    with pytest.raises(RuntimeError, match="begin_step"):
        step(x, t)
    step.begin_step(params)
    step(x, t).backward()
    step(x, t).backward()  # a second micro-batch of the same step accumulates
    with pytest.raises(ValueError, match="set_to_none=True"):
        step.begin_step(params)  # .grad still held from the last step
    model.zero_grad(set_to_none=True)
    step.begin_step(params)


def _accumulated_grads(model, step, micro_batches, t, steps):
    """Per optimizer step: zero_grad(set_to_none), begin_step, then each micro-batch's mean-loss backward (the
    trainer's loop); the flattened gradient of each step, copied out."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for s in range(steps):
        model.zero_grad(set_to_none=True)
        step.begin_step(params)
        for x in micro_batches[s]:
            (step(unit_range(x), t) / len(micro_batches[s])).backward()
        grads.append(torch.cat([p.grad.flatten() for p in params]).float().clone())
    return grads


@needs_cuda
def test_two_micro_batches_with_compile_and_cuda_graphs_give_the_eager_gradients():
    """Gradient accumulation under CUDA graphs (runtime.accum_steps 2 + compile + cudagraphs): one graph step per
    optimizer step, the second micro-batch's backward adds into the first's .grad (a graph output). Over 4 steps
    (warm-up, recording, replays) with other data each step: the eager gradients to bf16 rounding (as
    test_compiled_loss_and_gradients_match_eager), those of the same compiled graph without CUDA graphs closer;
    a lost micro-batch is far outside both."""
    from dpnrepro.training.losses import sigmoid_xent

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    steps, accum = 4, 2
    batches = [[torch.randint(0, 256, (8, 1, 28, 28), generator=gen, dtype=torch.uint8).to(dev) for _ in range(accum)]
               for _ in range(steps)]
    t = torch.nn.functional.one_hot(torch.randint(0, 10, (8,), generator=gen), 10).float().to(dev)
    runs = {}
    for name, compile_, graphs in (("eager", False, False), ("compiled", True, False), ("cudagraphs", True, True)):
        model = _mu_model(dev)
        runs[name] = _accumulated_grads(model, LossStep(model, sigmoid_xent, dev, compile=compile_, cudagraphs=graphs),
                                        batches, t, steps)
    model = _mu_model(dev)  # what a lost micro-batch would leave: the first one's half of the mean
    lost = 0.5 * _accumulated_grads(model, LossStep(model, sigmoid_xent, dev), [b[:1] for b in batches], t, 1)[0]

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    for s in range(steps):
        assert rel(runs["cudagraphs"][s], runs["compiled"][s]) < 1e-2, s
        assert rel(runs["cudagraphs"][s], runs["eager"][s]) < 0.15, s
    assert rel(lost, runs["eager"][0]) > 0.3  # the bounds above tell a lost micro-batch apart


@needs_cuda
def test_the_trainer_accumulates_two_micro_batches_under_cuda_graphs(tmp_path):
    """The trainer with runtime.accum_steps 2 + compile + cudagraphs (before the fix it marked a graph step per
    micro-batch and crashed at the second one): 4 optimizer steps (warm-up, recording, replays) move the
    weights as the eager trainer does, to bf16 rounding (momentum SGD: the update is linear in the gradient, so a
    lost micro-batch would show as a ~50 % difference)."""
    from helpers import tiny_mu7_training

    from dpnrepro.config.core import InputParams, TrainParams
    from dpnrepro.config.runtime import RuntimeParams
    from dpnrepro.training.trainer import seed_everything, train_classifier

    ds, spec = tiny_mu7_training()
    seed_everything(0)  # the trainer's own seeding before it builds the model: its initial weights
    inp = InputParams(image_size=28, channels=1, eval_resize=28, inception_crop=False, flip=False)
    cfg = TrainParams(optimizer="sgd_momentum", lr=0.01, weight_decay=0.0, batch_size=16, steps=4, warmup_steps=0,
                      grad_clip=0.0, device="cuda")
    w0 = torch.cat([p.detach().flatten() for p in spec.build().parameters()]).cuda()
    moved = {}
    for name, graphs in (("eager", False), ("cudagraphs", True)):
        model = train_classifier(spec, ds, inp, cfg, seed=0, ckpt_dir=tmp_path / name, progress=False,
                                 runtime=RuntimeParams(accum_steps=2, compile=graphs, cudagraphs=graphs))
        moved[name] = torch.cat([p.detach().flatten() for p in model.parameters()]).cuda() - w0
    assert float((moved["cudagraphs"] - moved["eager"]).norm() / moved["eager"].norm()) < 0.15
