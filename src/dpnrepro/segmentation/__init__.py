"""Segmentation (Table 5, ADE20K through mmsegmentation): not built yet."""
