"""Workload scenario texts that several test files write (one home):

- :func:`my70`: the new-user trial's ``my70.toml`` (llama3.1-70b on 64 H100s, tp 8, pp 4,
  seq 8192, global batch 512, selective recompute; 256 microbatches under 1F1B);
- :data:`SMALL`: llama3.1-8b on an H100, tp 2, pp 4, seq 4096, global batch 16 (fast).
"""
from __future__ import annotations


def my70(schedule: str = "", tables: str = "") -> str:
    """``my70.toml`` with ``schedule`` (more ``[schedule]`` lines) and ``tables`` (more
    tables, between ``[schedule]`` and ``[workload]``) added."""
    return f"""
[schedule]
name = "1f1b"
{schedule}
{tables}
[workload]
model = "llama3.1-70b"
gpu = "h100-sxm"
num_gpus = 64
seq = 8192
global_batch_size = 512
tp = 8
pp = 4
recompute = "selective"
"""


SMALL = """
[schedule]
name = "1f1b"
[workload]
model = "llama3.1-8b"
gpu = "h100-sxm"
seq = 4096
global_batch_size = 16
tp = 2
pp = 4
"""
