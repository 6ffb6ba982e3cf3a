"""The params of ``params.yaml`` by concern, so that a stage depends on the config it reads
(:mod:`dpnrepro.codedeps`): :mod:`.core` (datasets, input, model, train), :mod:`.runtime` (execution only),
:mod:`.sweeps` (the sweeps' one definition and a run's resolved recipe), :mod:`.transfer`, :mod:`.lit`,
:mod:`.segmentation`, :mod:`.benchmarks`, :mod:`.figures`, and :mod:`.params` (the whole file, validated up
front: :func:`~dpnrepro.config.params.load_params`). Import from those modules: this one re-exports nothing.
"""
