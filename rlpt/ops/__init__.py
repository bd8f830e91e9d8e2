"""Attention kernels: reference and blockwise (`attention`), ring (`ring_attention`), the
decoder's dense masked / causal attention (`dense_attention`), the CPU decode-attention
kernel (`decode_attention`), and the flash-style tiles they share (`flash`).

Imports only JAX (and the standard library / numpy to build and load the C++ kernel)."""
