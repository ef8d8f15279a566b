"""``max.graph.weights.weights``: the `Weights` protocol and the `WeightData` container (also in
``max.graph.weights``).
"""

from maxfx.graph.weights._protocol import Weights
from maxfx.graph.weights._weight_data import WeightData

__all__ = ["WeightData", "Weights"]
