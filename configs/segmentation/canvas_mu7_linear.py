# Smoke scale-down of ade20k_b16_linear.py (the appendix G recipe) for a 2-core CPU: Mu/7 initialised
# from the smoke Table 1 runs (grey 28 px Fashion-MNIST, so one input channel), canvases of real
# Fashion-MNIST items (dpnrepro.data.segmentation) in the ADE20K layout, 84 px canvases with 56 px
# crops (8 x 8 patch grid; the pretraining 4 x 4 position embeddings are resized to it) and sliding
# windows with appendix G's stride ratio (341 / 512 of the crop). Everything not set here is the
# appendix G recipe (optimizer, weight-decay rule, poly schedule, stochastic depth, linear decoder).
# Steps: the smoke table1 backbones (100 pretraining steps) give patch tokens that a linear probe reads
# no better than a random init's, so the decoder and encoder learn the canvases here: at 40 steps the
# loss stays at ln 10 (mIoU at the constant-prediction level), at 400 it reaches 11-14 % against ~2 %.
_base_ = ['./ade20k_b16_linear.py']

crop_size = (56, 56)
max_iters = 400
data_root = 'data/raw/seg_canvases'
dataset_type = 'FashionCanvasDataset'

# the pretraining's own input scaling (x / 127.5 - 1, training/step.py), not the canvases' statistics: the
# pretrained patch embedding sees the value range it was trained on
data_preprocessor = dict(mean=[127.5], std=[127.5], bgr_to_rgb=False, size=crop_size,
                         test_cfg=dict(size_divisor=7))  # eval padding to whole 7-px patches (84 px: none)
model = dict(
    data_preprocessor=data_preprocessor,
    backbone=dict(arch='Mu/7', img_size=56, in_channels=1),
    decode_head=dict(in_channels=64, channels=64, num_classes=10),
    test_cfg=dict(crop_size=crop_size, stride=(37, 37)))

optim_wrapper = dict(optimizer=dict(lr=1e-3))     # a 400-step schedule needs a larger lr than 161664 steps
param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=max_iters, by_epoch=False)]
train_cfg = dict(max_iters=max_iters, val_interval=max_iters + 1)
default_hooks = dict(checkpoint=dict(interval=100), logger=dict(interval=100))

train_pipeline = [
    dict(type='LoadImageFromFile', color_type='grayscale'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs')]
test_pipeline = [
    dict(type='LoadImageFromFile', color_type='grayscale'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs')]
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
env_cfg = dict(cudnn_benchmark=False)
