"""Module reprs of ``maxfx.experimental.nn`` print as MAX prints them (issue 35).

MAX's ``Module.__repr__`` is ``rich.pretty.pretty_repr(self)``: each layer's
``__rich_repr__`` yields ``(name, value)`` or ``(name, value, default)``
(omitted when equal to the default), on one line up to 80 columns, else one
item per line. The comment on each assertion quotes the line of MAX's source
(``max/python/max/experimental/nn/...``) it matches. maxfx's one departure: a
Tensor prints as its type, never its values (a repr never realizes a lazy
Tensor).
"""

from __future__ import annotations

import pytest

from maxfx.experimental import functional as F
from maxfx.experimental.nn import Conv2d, Embedding, Linear, Module, ModuleList, Sequential, module_dataclass
from maxfx.experimental.nn.dropout import Dropout
from maxfx.experimental.nn.norm import GemmaRMSNorm, GroupNorm, LayerNorm, RMSNorm
from maxfx.experimental.nn.rope import RotaryEmbedding, TransposedRotaryEmbedding
from maxfx.experimental.tensor import Tensor


def test_rms_norm():
    # norm/rms_norm.py: yield "dim", self.dim; yield "eps", self.eps, 1e-6
    # MAX's unit test: repr(RMSNorm(2)) == "RMSNorm(dim=Dim(2))"
    assert repr(RMSNorm(2)) == "RMSNorm(dim=Dim(2))"
    assert RMSNorm(2).dim == 2
    assert repr(RMSNorm(8, eps=1e-5)) == "RMSNorm(dim=Dim(8), eps=1e-05)"
    # GemmaRMSNorm(RMSNorm) inherits the repr; rich prints the class's own name
    assert repr(GemmaRMSNorm(4)) == "GemmaRMSNorm(dim=Dim(4))"


def test_layer_norm():
    # norm/layer_norm.py: yield "dim", self.dim; yield "eps", self.eps, 1e-5  (self.dim is the int given)
    assert repr(LayerNorm(3)) == "LayerNorm(dim=3)"
    assert repr(LayerNorm(3, eps=1e-6)) == "LayerNorm(dim=3, eps=1e-06)"


def test_group_norm():
    # norm/group_norm.py: yield "num_groups", ...; yield "num_channels", ...; yield "eps", self.eps, 1e-5; yield
    # "affine", self.affine, True
    assert repr(GroupNorm(2, 4)) == "GroupNorm(num_groups=2, num_channels=4)"
    assert (
        repr(GroupNorm(2, 4, eps=1e-3, affine=False))
        == "GroupNorm(num_groups=2, num_channels=4, eps=0.001, affine=False)"
    )


def test_linear():
    # linear.py: yield "in_dim", self.in_dim; yield "out_dim", self.out_dim; yield "bias", isinstance(self.bias,
    # Tensor), True
    assert repr(Linear(4, 2)) == "Linear(in_dim=Dim(4), out_dim=Dim(2))"
    assert repr(Linear(4, 2, bias=False)) == "Linear(in_dim=Dim(4), out_dim=Dim(2), bias=False)"


def test_embedding():
    # embedding.py: yield "vocab_size", self.vocab_size; if self.weight.rank == 2: yield "dim", self.dim; else: yield
    # "dims", self.dims
    assert repr(Embedding(10, dim=4)) == "Embedding(vocab_size=Dim(10), dim=Dim(4))"
    assert repr(Embedding(10, dims=[2, 3])) == "Embedding(vocab_size=Dim(10), dims=[Dim(2), Dim(3)])"


def test_rotary_embedding():
    # rope/rope.py: yield "dim", self.dim; yield "max_sequence_length", self.max_sequence_length
    assert repr(RotaryEmbedding(Tensor.zeros([2, 3, 2]))) == "RotaryEmbedding(dim=6, max_sequence_length=2)"
    assert (
        repr(TransposedRotaryEmbedding(Tensor.zeros([2, 3, 2])))
        == "TransposedRotaryEmbedding(dim=6, max_sequence_length=2)"
    )


def test_layers_without_their_own_rich_repr_print_their_children():
    # module.py: Module.__rich_repr__: yield from self.children  (conv.py, dropout.py define none: no children,
    # "Name()")
    assert repr(Dropout(0.1)) == "Dropout()"
    assert repr(Conv2d(3, 3, 8)) == "Conv2d()"


def test_sequential_and_module_list():
    # sequential.py: ModuleList.__rich_repr__: for _, child in self.children: yield child  (Sequential inherits it)
    assert (
        repr(Sequential(Linear(4, 8), RMSNorm(8)))
        == "Sequential(Linear(in_dim=Dim(4), out_dim=Dim(8)), RMSNorm(dim=Dim(8)))"
    )
    assert repr(ModuleList([Linear(2, 2)])) == "ModuleList(Linear(in_dim=Dim(2), out_dim=Dim(2)))"
    assert repr(Sequential()) == "Sequential()"


def test_nested_sequential_is_multi_line_only_over_80_columns():
    # module.py: return pretty_repr(self)  (rich: max_width=80, indent 4; each nested node stays on one line when it
    # fits)
    net = Sequential(Sequential(Linear(4, 8), RMSNorm(8)), Sequential(Linear(8, 2), Dropout(0.1)))
    assert repr(net) == (
        "Sequential(\n"
        "    Sequential(Linear(in_dim=Dim(4), out_dim=Dim(8)), RMSNorm(dim=Dim(8))),\n"
        "    Sequential(Linear(in_dim=Dim(8), out_dim=Dim(2)), Dropout())\n"
        ")"
    )
    deep = Sequential(Linear(4, 8), RMSNorm(8), Sequential(Linear(8, 16), Linear(16, 8), Linear(8, 4)))
    assert repr(deep) == (
        "Sequential(\n"
        "    Linear(in_dim=Dim(4), out_dim=Dim(8)),\n"
        "    RMSNorm(dim=Dim(8)),\n"
        "    Sequential(\n"
        "        Linear(in_dim=Dim(8), out_dim=Dim(16)),\n"
        "        Linear(in_dim=Dim(16), out_dim=Dim(8)),\n"
        "        Linear(in_dim=Dim(8), out_dim=Dim(4))\n"
        "    )\n"
        ")"
    )
    assert str(deep) == repr(deep)


class _Block(Module):
    def __init__(self):
        self.norm = RMSNorm(4)
        self.proj = Linear(4, 4, bias=False)
        self.scale = Tensor.ones([4])  # a parameter, not a child: MAX's Module repr shows children only
        self.eps = 1e-6

    def forward(self, x):
        return self.proj(self.norm(x)) * self.scale


def test_plain_module_prints_its_children_by_name():
    # module.py: def __rich_repr__(self): yield from self.children
    assert (
        repr(_Block())
        == "_Block(\n    norm=RMSNorm(dim=Dim(4)),\n    proj=Linear(in_dim=Dim(4), out_dim=Dim(4), bias=False)\n)"
    )


@module_dataclass
class _Affine(Module):
    weight: Tensor
    bias: Tensor | int = 0
    name: str = "affine"

    def forward(self, x):
        return x @ self.weight.T + self.bias


def test_module_dataclass_prints_its_fields_omitting_defaults():
    # module.py: _module_dataclass_rich_repr: yield field.name, value (a Tensor) / yield field.name, value,
    # field.default
    assert repr(_Affine(Tensor.zeros([5, 4]))) == "_Affine(weight=Tensor(dtype=float32, shape=[5, 4], device=cpu:0))"
    assert repr(_Affine(Tensor.zeros([2, 2]), Tensor.zeros([2]), name="x")) == (
        "_Affine(\n"
        "    weight=Tensor(dtype=float32, shape=[2, 2], device=cpu:0),\n"
        "    bias=Tensor(dtype=float32, shape=[2], device=cpu:0),\n"
        "    name='x'\n"
        ")"
    )


def test_repr_never_realizes_a_lazy_tensor():
    with F.lazy():
        layer = _Affine(Tensor.ones([2, 3]) * 2.0)
        text = repr(layer)
    assert text == "_Affine(weight=Tensor(dtype=float32, shape=[2, 3], device=cpu:0))"
    assert not layer.weight.real


@pytest.mark.parametrize("make", [lambda: Linear(4, 2), lambda: RMSNorm(2), lambda: Sequential(Linear(2, 2))])
def test_repr_does_not_touch_parameter_values(make, monkeypatch):
    module = make()
    monkeypatch.setattr(Tensor, "__repr__", lambda self: pytest.fail("a Tensor's repr was called"))
    repr(module)


class _Stack(Module):
    def __init__(self):
        self.layers = [Linear(2, 2), RMSNorm(2)]  # a list field (maxfx; MAX would use a ModuleList)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_list_of_modules_prints_once_under_its_field_name():
    assert repr(_Stack()) == "_Stack(layers=[Linear(in_dim=Dim(2), out_dim=Dim(2)), RMSNorm(dim=Dim(2))])"


def test_quantized_linear_keeps_its_format_and_prints_nested():
    # maxfx's layer (MAX has none): in_dim and out_dim as Linear's, then the encoding's name
    import numpy as np

    from maxfx.experimental.nn import QuantizedLinear

    layer = QuantizedLinear(Tensor(np.zeros((3, 18), np.uint8)), "Q4_0")
    assert repr(layer) == "QuantizedLinear(in_dim=Dim(32), out_dim=Dim(3), encoding=Q4_0)"
    assert repr(Sequential(layer)) == "Sequential(QuantizedLinear(in_dim=Dim(32), out_dim=Dim(3), encoding=Q4_0))"
