"""Attention kernels (reference, blockwise, ring). Imports only JAX."""
