"""Attention kernels: a plain-jnp reference (`custom_calls.attention.reference`) and Pallas kernels."""
