"""Interoperability with other tools' formats.

- :mod:`schedsim.interop.torch_format`: torch.distributed.pipelining action strings and
  schedule CSV (compute-only and compute+comms), read and written;
- :mod:`schedsim.interop.perfetto`: Perfetto / Chrome trace JSON of timelines.
"""
