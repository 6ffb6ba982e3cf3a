"""Same bits everywhere it can be promised: the CPU pins (:mod:`.cpu`), the kernel fingerprint that checks
them op by op (:mod:`.fingerprint`), the ``train.deterministic`` switch for CUDA kernels (:mod:`.cuda`), and
the random state a resume restores, as plain values (:mod:`.rng`). Imports nothing: :mod:`dpnrepro` applies the CPU pins before numpy or torch load."""
