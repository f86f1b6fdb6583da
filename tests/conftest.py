import os

# Rank processes of the multi-process tests use few threads: the CI machine has 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
