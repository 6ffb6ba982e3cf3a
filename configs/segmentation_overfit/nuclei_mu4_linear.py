# Overfit check on stardist's DSB-2018 nuclei image (dpnrepro.seg_overfit.prepared_example('nuclei'):
# centred 224 x 224 crop of the 512 x 512 image, halved to 112 x 112, binary nucleus / background).
# Same recipe and 150 steps as voc_mu4_linear.py; what differs is the data: one grey channel
# standardised with the crop's own mean / std (measured: 29.3 / 17.7 grey levels), 2 classes.
_base_ = ['./voc_mu4_linear.py']

image_size = (112, 112)
num_classes = 2
classes = ('background', 'nucleus')

data_preprocessor = dict(mean=[29.3], std=[17.7], bgr_to_rgb=False, size=image_size)
model = dict(
    data_preprocessor=data_preprocessor,
    backbone=dict(img_size=image_size, in_channels=1),
    decode_head=dict(num_classes=num_classes))

pipeline = [
    dict(type='LoadImageFromFile', color_type='grayscale'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs')]
dataset = dict(metainfo=dict(classes=classes), pipeline=pipeline)
train_dataloader = dict(dataset=dataset)
val_dataloader = dict(dataset=dataset)
test_dataloader = val_dataloader
