"""Measurement: what checks and times the runtime's calls on the GPUs of one process group.

- :mod:`.reference`: the float32 results the fused ops must compute, and the relative error;
- :mod:`.timing`: the one benchmark method (warm-up, L2 flush, ranks started together, events,
  max over ranks);
- :mod:`.harness`: :class:`~syncopate.measure.harness.Harness`, which verifies and times a
  workload's candidates and baselines on a gang (the GPU workers, `syncopate bench`);
- :mod:`.bench`: `syncopate bench`; :mod:`.calibrate`: `syncopate calibrate`;
- :mod:`.local_ranks`: one process per local GPU, joined in an NCCL group.

This package imports :mod:`syncopate.kernels`; the runtime never imports it back, so a job that
calls the ops loads none of it. `reference`, `timing` and `harness` import torch; `bench`,
`calibrate` and `local_ranks` import it only inside what runs on a GPU, so the command line reads
their options without it.
"""
