"""Datasets: raw sources, the prepare protocol, the pixel store and the train/eval input pipelines."""
