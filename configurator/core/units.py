"""Unit constants. SI inside the core; GiB (2**30) is not GB (1e9)."""

GB = 1e9
GiB = 2**30
MiB = 2**20
TFLOP = 1e12
US = 1e-6
