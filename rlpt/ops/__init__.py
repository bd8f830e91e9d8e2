"""Attention kernels (reference, blockwise, ring; the CPU decode-attention kernel).

Imports only JAX (and the standard library / numpy to build and load the C++ kernel)."""
