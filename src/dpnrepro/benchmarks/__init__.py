"""Benchmarks: training throughput / MFU (train_throughput, flops) and the input pipeline."""
