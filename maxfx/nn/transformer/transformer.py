"""``max.nn.transformer.transformer``: `Transformer`, `TransformerBlock`, `ReturnLogits`."""

from maxfx.nn.transformer._transformer import ReturnLogits, Transformer, TransformerBlock

__all__ = ["ReturnLogits", "Transformer", "TransformerBlock"]
