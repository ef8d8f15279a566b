"""The functional API (``max.experimental.functional``, also ``maxfx.functional``; ``F``).

Every function here is an op front of the registry (the same function as
``maxfx.graph.ops.X``) wrapped by `functional`: called on eager `Tensor`\\ s it
records lazily and returns Tensors; called on graph values inside a ``Graph``
(or while ``Module.compile`` traces) it records graph ops; called on tracers
inside ``jax.jit`` it runs directly. No op math lives here.

The names are assigned one by one (``add = _eager_front(ops.add)``) so that
grep, IDEs and ``help()`` find them; each keeps its front's docstring and
example, and reports this module as its home.

Example:
    >>> from maxfx import functional as F
    >>> from maxfx.tensor import Tensor
    >>> print(F.relu(Tensor([1.0, -2.0, 3.0, -4.0, 5.0])))
    TensorType(dtype=float32, shape=[Dim(5)], device=cpu:0): [1.0, 0.0, 3.0, 0.0, 5.0]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from lowering.context import call_in_context, current_context, use_context
from lowering.eager import is_lazy, lazy, realize
from maxfx.experimental._tensor import EAGER as _EAGER
from maxfx.experimental._tensor import Tensor as _Tensor
from maxfx.graph import ops as _ops

__all__ = [
    "functional",
    "abs",
    "add",
    "argmax",
    "argmin",
    "argsort",
    "as_interleaved_complex",
    "atanh",
    "avg_pool2d",
    "band_part",
    "broadcast_to",
    "buffer_store",
    "buffer_store_slice",
    "cast",
    "chunk",
    "concat",
    "constant",
    "constant_external",
    "conv2d",
    "conv2d_transpose",
    "conv3d",
    "cos",
    "cumsum",
    "custom",
    "div",
    "equal",
    "erf",
    "exp",
    "flatten",
    "floor",
    "fold",
    "gather",
    "gather_nd",
    "gelu",
    "greater",
    "greater_equal",
    "hann_window",
    "irfft",
    "is_inf",
    "is_nan",
    "layer_norm",
    "lazy",
    "log",
    "log1p",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "logsoftmax",
    "masked_scatter",
    "matmul",
    "max",
    "max_pool2d",
    "mean",
    "min",
    "mod",
    "mul",
    "negate",
    "nonzero",
    "not_equal",
    "outer",
    "pad",
    "permute",
    "pow",
    "range",
    "relu",
    "repeat_interleave",
    "reshape",
    "round",
    "rsqrt",
    "scatter",
    "scatter_nd",
    "sigmoid",
    "silu",
    "sin",
    "slice_tensor",
    "softmax",
    "split",
    "sqrt",
    "squeeze",
    "stack",
    "sub",
    "sum",
    "tanh",
    "tile",
    "top_k",
    "transfer_to",
    "transpose",
    "trunc",
    "unsqueeze",
    "where",
]


def functional(op: Callable[..., Any]) -> Callable[..., Any]:
    """Make a graph-building function usable on eager Tensors too.

    Inside a ``Graph`` (or on graph values) the wrapped function records graph
    ops as before. On eager tensors a call is one realization, as in MAX: its
    ops are recorded and run together as one fused program when it returns
    (inside ``F.lazy()`` they stay pending, like any other op there), so a
    tensor made inside the function is not ``real`` until then.

    Example:
        >>> from maxfx.experimental.functional import functional
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> @functional
        ... def swish(x):
        ...     return x * ops.sigmoid(x)
        >>> y = swish(Tensor([0.0]))
        >>> y.real, y.item()
        (True, 0.0)
    """

    @functools.wraps(op)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if current_context() is not None:
            return op(*args, **kwargs)
        if is_lazy():
            with use_context(_EAGER):
                return op(*args, **kwargs)
        with use_context(_EAGER), lazy():
            out = op(*args, **kwargs)
        pending = [
            t._var
            for t in jax.tree.leaves(out, is_leaf=lambda x: isinstance(x, _Tensor))
            if isinstance(t, _Tensor) and not t.real
        ]
        if pending:
            realize(pending)
        return out

    return wrapper


def _eager_front(op: Callable[..., Any]) -> Callable[..., Any]:
    """A registry front usable on eager Tensors: one op, run at once (recorded inside ``F.lazy()``).

    Reported as living in this module (for ``help()``).
    """

    @functools.wraps(op)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if current_context() is not None or (args and args[0].__class__ is _Tensor and args[0]._gv is None):
            return op(*args, **kwargs)  # a graph is being built, or an eager tensor names its context
        # No graph: the eager context answers for inputs that name none (JAX arrays, Python data).
        return call_in_context(_EAGER, op, *args, **kwargs)

    wrapper.__module__ = __name__
    return wrapper


def constant(value: Any, dtype: Any = None, device: Any = None) -> Any:
    """A constant tensor from a scalar, nested list or DLPack array (a Tensor outside a Graph).

    Outside a Graph this is `Tensor.constant` (default dtype and device from
    ``defaults()``); inside one it records ``ops.constant``.

    Example:
        >>> from maxfx import functional as F
        >>> print(F.constant([[1, 2], [3, 4]]))
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [1.0, 2.0, 3.0, 4.0]
    """
    if current_context() is None:
        return _Tensor._constant(value, dtype=dtype, device=device)
    return _ops.constant(value, dtype, device)


# MAX's documented functional ops, in __all__'s order (``constant`` is defined above). These
# assignments shadow builtins (abs, max, min, pow, range, round, sum) from here on, so they
# come last and no function above uses those builtins.
abs = _eager_front(_ops.abs)
add = _eager_front(_ops.add)
argmax = _eager_front(_ops.argmax)
argmin = _eager_front(_ops.argmin)
argsort = _eager_front(_ops.argsort)
as_interleaved_complex = _eager_front(_ops.as_interleaved_complex)
atanh = _eager_front(_ops.atanh)
avg_pool2d = _eager_front(_ops.avg_pool2d)
band_part = _eager_front(_ops.band_part)
broadcast_to = _eager_front(_ops.broadcast_to)
buffer_store = _eager_front(_ops.buffer_store)
buffer_store_slice = _eager_front(_ops.buffer_store_slice)
cast = _eager_front(_ops.cast)
chunk = _eager_front(_ops.chunk)
concat = _eager_front(_ops.concat)
constant_external = _eager_front(_ops.constant_external)
conv2d = _eager_front(_ops.conv2d)
conv2d_transpose = _eager_front(_ops.conv2d_transpose)
conv3d = _eager_front(_ops.conv3d)
cos = _eager_front(_ops.cos)
cumsum = _eager_front(_ops.cumsum)
custom = _eager_front(_ops.custom)
div = _eager_front(_ops.div)
equal = _eager_front(_ops.equal)
erf = _eager_front(_ops.erf)
exp = _eager_front(_ops.exp)
flatten = _eager_front(_ops.flatten)
floor = _eager_front(_ops.floor)
fold = _eager_front(_ops.fold)
gather = _eager_front(_ops.gather)
gather_nd = _eager_front(_ops.gather_nd)
gelu = _eager_front(_ops.gelu)
greater = _eager_front(_ops.greater)
greater_equal = _eager_front(_ops.greater_equal)
hann_window = _eager_front(_ops.hann_window)
irfft = _eager_front(_ops.irfft)
is_inf = _eager_front(_ops.is_inf)
is_nan = _eager_front(_ops.is_nan)
layer_norm = _eager_front(_ops.layer_norm)
log = _eager_front(_ops.log)
log1p = _eager_front(_ops.log1p)
logical_and = _eager_front(_ops.logical_and)
logical_not = _eager_front(_ops.logical_not)
logical_or = _eager_front(_ops.logical_or)
logical_xor = _eager_front(_ops.logical_xor)
logsoftmax = _eager_front(_ops.logsoftmax)
masked_scatter = _eager_front(_ops.masked_scatter)
matmul = _eager_front(_ops.matmul)
max = _eager_front(_ops.max)
max_pool2d = _eager_front(_ops.max_pool2d)
mean = _eager_front(_ops.mean)
min = _eager_front(_ops.min)
mod = _eager_front(_ops.mod)
mul = _eager_front(_ops.mul)
negate = _eager_front(_ops.negate)
nonzero = _eager_front(_ops.nonzero)
not_equal = _eager_front(_ops.not_equal)
outer = _eager_front(_ops.outer)
pad = _eager_front(_ops.pad)
permute = _eager_front(_ops.permute)
pow = _eager_front(_ops.pow)
range = _eager_front(_ops.range)
relu = _eager_front(_ops.relu)
repeat_interleave = _eager_front(_ops.repeat_interleave)
reshape = _eager_front(_ops.reshape)
round = _eager_front(_ops.round)
rsqrt = _eager_front(_ops.rsqrt)
scatter = _eager_front(_ops.scatter)
scatter_nd = _eager_front(_ops.scatter_nd)
sigmoid = _eager_front(_ops.sigmoid)
silu = _eager_front(_ops.silu)
sin = _eager_front(_ops.sin)
slice_tensor = _eager_front(_ops.slice_tensor)
softmax = _eager_front(_ops.softmax)
split = _eager_front(_ops.split)
sqrt = _eager_front(_ops.sqrt)
squeeze = _eager_front(_ops.squeeze)
stack = _eager_front(_ops.stack)
sub = _eager_front(_ops.sub)
sum = _eager_front(_ops.sum)
tanh = _eager_front(_ops.tanh)
tile = _eager_front(_ops.tile)
top_k = _eager_front(_ops.top_k)
transfer_to = _eager_front(_ops.transfer_to)
transpose = _eager_front(_ops.transpose)
trunc = _eager_front(_ops.trunc)
unsqueeze = _eager_front(_ops.unsqueeze)
where = _eager_front(_ops.where)

# In MAX's current functional module though not among the documented names above (so not in
# __all__): control flow. On eager tensors the predicate is computed and Python runs the branch
# or the loop; in a Graph or under jax.jit they record cond / while_loop.
cond = _eager_front(_ops.cond)
while_loop = _eager_front(_ops.while_loop)

# maxfx extensions: registry fronts MAX's functional module lacks (docs/pages/kernels.md).
# Module attributes like the rest, but kept out of __all__, which lists MAX's documented names.
flash_attention = _eager_front(_ops.flash_attention)

# ─── MAX's current functional module, beyond the seed documents' names ──────
# MAX 26.x's ``max.experimental.functional`` also has these (not in __all__, which lists the
# documented names). Registry fronts are wrapped as above; the rest compose fronts.
acos = _eager_front(_ops.acos)
ceil = _eager_front(_ops.ceil)
complex_mul = _eager_front(_ops.complex.mul)
dequantize = _eager_front(_ops.dequantize)
floor_div = _eager_front(_ops.floor_div)
group_norm = _eager_front(_ops.group_norm)
inplace_custom = _eager_front(_ops.inplace_custom)
qmatmul = _eager_front(_ops.qmatmul)
rebind = _eager_front(_ops.rebind)
resize = _eager_front(_ops.resize)
resize_bicubic = _eager_front(_ops.resize_bicubic)
resize_linear = _eager_front(_ops.resize_linear)
resize_nearest = _eager_front(_ops.resize_nearest)
rms_norm = _eager_front(_ops.rms_norm)
roi_align = _eager_front(_ops.roi_align)
scatter_add = _eager_front(_ops.scatter_add)
scatter_max = _eager_front(_ops.scatter_max)
scatter_min = _eager_front(_ops.scatter_min)
scatter_mul = _eager_front(_ops.scatter_mul)
scatter_nd_add = _eager_front(_ops.scatter_nd_add)
scatter_nd_max = _eager_front(_ops.scatter_nd_max)
scatter_nd_min = _eager_front(_ops.scatter_nd_min)
scatter_nd_mul = _eager_front(_ops.scatter_nd_mul)
shape_to_tensor = _eager_front(_ops.shape_to_tensor)
allgather = _eager_front(_ops.allgather)
allreduce_sum = _eager_front(_ops.allreduce_sum)
distributed_broadcast = _eager_front(_ops.distributed_broadcast)
from maxfx.experimental import _composed_functional as _composed  # noqa: E402 - beside the assignments it feeds

arange = _composed.arange
bottom_k = _composed.bottom_k
clamp = _composed.clamp
clip = _composed.clip
elementwise_max = _composed.elementwise_max
elementwise_min = _composed.elementwise_min
ensure_context = _composed.ensure_context
full = _composed.full
full_like = _composed.full_like
gaussian = _composed.gaussian
gaussian_like = _composed.gaussian_like
in_graph_context = _composed.in_graph_context
normal = _composed.normal
normal_like = _composed.normal_like
ones = _composed.ones
ones_like = _composed.ones_like
prod = _composed.prod
uniform = _composed.uniform
uniform_like = _composed.uniform_like
zeros = _composed.zeros
zeros_like = _composed.zeros_like
