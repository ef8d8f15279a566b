"""``max.experimental.nn.common_layers.mesh_axis``: the mesh-axis names of the parallelisms.

Layers of ``common_layers`` read a `DeviceMesh`'s axis names to know how to
lay out their weights: ``TP`` splits them (tensor parallelism), ``DP`` runs a
replica per device on its share of the batch (data parallelism).

Example:
    >>> TP, DP
    ('tp', 'dp')
"""

TP = "tp"
"""Tensor parallelism: weights split over this mesh axis."""

DP = "dp"
"""Data parallelism: the batch split over this mesh axis."""

__all__ = ["DP", "TP"]
