"""Production latency in: nccl-tests logs and PyTorch profiler (Kineto) traces as profile sources, re-targeted to
a cluster's scale by the cost model (docs/profile.md, "Where production latency comes from"; docs/costmodel.md).

Pure Python and NumPy: the readers (:mod:`.nccl_tests`, :mod:`.kineto`), the op names (:mod:`.ops`), the histograms
(:mod:`.histogram`) and the profile builder (:mod:`.build`) that ``python -m delaycomm profile`` calls.
"""
