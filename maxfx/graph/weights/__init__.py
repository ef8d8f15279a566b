"""Checkpoint loaders (``max.graph.weights``): safetensors, GGUF and PyTorch files.

Each loader is a `Weights` tree: ``weights.model.layers[0].wq`` names a tensor,
``.allocate()`` makes a graph `Weight` and records its (memory-mapped) value in
``weights.allocated_weights`` for ``InferenceSession.load(graph,
weights_registry=weights.allocated_weights)``.

Example:
    >>> from maxfx.graph.weights import load_weights
    >>> weights = load_weights(["model.safetensors"])  # doctest: +SKIP
    >>> w = weights.lm_head.weight.allocate()  # doctest: +SKIP
"""

from maxfx.graph.weights._format import WeightsFormat, load_weights, weights_format
from maxfx.graph.weights._gguf import GGUFWeights
from maxfx.graph.weights._protocol import Weights
from maxfx.graph.weights._pytorch import PytorchWeights
from maxfx.graph.weights._safetensors import SafetensorWeights
from maxfx.graph.weights._weight_data import WeightData

__all__ = [
    "GGUFWeights",
    "PytorchWeights",
    "SafetensorWeights",
    "WeightData",
    "Weights",
    "WeightsFormat",
    "load_weights",
    "weights_format",
]
