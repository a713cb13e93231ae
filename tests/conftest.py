"""Suite-wide settings: offline hub access, and one torch thread per xdist worker.

`make test` runs two workers on two cores; letting each worker's torch spawn two threads
oversubscribes the cores and makes every test several times slower.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)
