"""``max.graph.ops.allreduce``: sum one tensor per device across devices.

`sum` takes one tensor and one signal buffer per device and gives every
device the total. Defined in `lowering.ops.collective`; re-exported here by name.
"""

from lowering.ops.collective import allreduce_sum as sum  # noqa: A001 - MAX's name

__all__ = ["sum"]
