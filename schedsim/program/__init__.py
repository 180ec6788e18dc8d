"""The program model: IR, text tokens, message routing, schedule validation, lowering
and comm policies. Imports nothing of schedsim but :mod:`schedsim.errors` and
:mod:`schedsim.util`."""
