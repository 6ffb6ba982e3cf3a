# Table 5 (appendix G): ImageNet-pretrained B/16 with or without DPN, linear decoder, ADE20K 512 x 512.
# mmseg's own ADE20K dataset and runtime configs, with appendix G's values wherever it gives one
# (tests/test_segmentation.py checks each against the paper's text). Run through stages/segment.py,
# which sets the stem, seed, training fraction, data root and pretraining run of each run.
_base_ = ['mmseg::_base_/datasets/ade20k.py', 'mmseg::_base_/default_runtime.py']
custom_imports = dict(imports=['dpnrepro.segmentation'], allow_failed_imports=False)

crop_size = (512, 512)                    # appendix G: random_crop_with_mask(size=512)
num_classes = 150
max_iters = 128 * (20210 // 16)           # appendix G: 128 epochs x 20210 // batch 16 = 161664 steps, every fraction

data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],   # appendix G: standardize(ImageNet mean, std)
    std=[0.229 * 255, 0.224 * 255, 0.225 * 255],
    bgr_to_rgb=True, pad_val=0, seg_pad_val=255, size=crop_size,
    # evaluation: each image padded right / bottom (pad_val 0, i.e. the mean colour after standardize) to a
    # multiple of the patch, so every sliding window (smaller than 512 on a smaller image) tiles into whole
    # patches; EncoderDecoder.postprocess_result cuts the padding off the logits (mmseg 1.2.2's test-time
    # padding, as its san_vit-b16 config uses it). Without it a 375 x 500 image raises in the backbone.
    test_cfg=dict(size_divisor=16))

model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='DPNVisionTransformer',
        arch='B/16', stem='dpn',          # appendix G: VARIANT B/16, model.dpn
        img_size=512,                     # posembs (32, 32) = 512 / 16: pretraining ones resized (bilinear)
        in_channels=3,
        drop_path_rate=0.1,               # stochastic_depth 0.1; dropout / attention dropout 0.0
        out_indices=(-1,),                # the last block only (concat_backbone_output False)
        final_norm=False,                 # out_with_norm False
        pretrained=None),                 # a runs/<sweep>/<arch>_<stem>_s<seed> directory (stages/segment.py)
    decode_head=dict(
        # Segmenter-linear as mmseg writes it (segmenter_vit-s_fcn): one 1x1 conv from the last block's
        # tokens to the class logits, then bilinear upsampling (appendix G: fcn, no UperNet, no BN,
        # no auxiliary loss)
        type='FCNHead', in_channels=768, in_index=0, channels=768, num_convs=0, concat_input=False,
        dropout_ratio=0.0, num_classes=num_classes, align_corners=False,
        # per-pixel softmax cross-entropy averaged over the labelled pixels (scenic's weighted mean;
        # "other" = label 0 carries no weight)
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0, avg_non_ignore=True)),
    train_cfg=dict(),
    # appendix G: window_stride 341 for the 512 windows
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(341, 341)))

# appendix G: AdamW, lr 3e-5, weight decay 0.01, none on scales and biases
# (skip_scale_and_bias_regularization: every 1-D parameter), no gradient clipping (max_grad_norm None);
# torch's fused kernel, the same bits on every x86 CPU (dpnrepro.training.optim.build_optimizer says why)
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=3e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True),
    paramwise_cfg=dict(flat_decay_mult=0.0),
    clip_grad=None)
# appendix G: constant * polynomial(power 0.9, end factor 0) * linear_warmup(0 steps) over all steps
param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=max_iters, by_epoch=False)]

train_cfg = dict(type='ResumableIterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters + 1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
custom_hooks = [dict(type='ResumeStateHook')]
default_hooks = dict(
    # two kept: mmengine deletes the oldest before it writes the next, so a failed write leaves the last
    # complete checkpoint (and last_checkpoint still names it)
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=4000, max_keep_ckpts=2),
    logger=dict(type='LoggerHook', interval=500, log_metric_by_epoch=False))

# appendix G: batch 16 (global; divide by the GPU count under torchrun)
train_dataloader = dict(batch_size=16, num_workers=8)
# appendix G's pp_eval: no resize, sliding windows over the image as it is (padded to a multiple of 16 by
# the data preprocessor, above)
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs')]
val_dataloader = dict(batch_size=1, num_workers=4, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
randomness = dict(seed=0)                 # set per run by stages/segment.py
