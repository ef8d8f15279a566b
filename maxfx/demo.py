"""The maxfx showcase, run by ``make demo``.

0. The MAX developer guide's eager tour: lazy Tensors realized as one fused
   program when printed, in the guide's exact output format.
1. The MAX developer guide's graph workflow, verbatim with ``max`` → ``maxfx``.
2. A two-layer MLP graph with a symbolic batch dim and weights bound at load
   time, run at batch 1, 7 and 64: one XLA compile per shape, then cache hits.
3. What a user sees when an input does not match the graph.
4. A tiny Llama (`maxfx.models`) trained on a built-in text for a few hundred
   steps (`maxfx.optim.make_train_step`: maxfx.value_and_grad + optax over the
   Module pytree), then text generated with
   the KV cache (greedy and sampled), with tokens/s.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("MAXFX_DEFAULT_DEVICE", "cpu")

import numpy as np  # noqa: E402
import optax  # noqa: E402

from lowering.compile import compile_stats  # noqa: E402
from maxfx import functional as F  # noqa: E402
from maxfx import optim, random  # noqa: E402
from maxfx.driver import CPU  # noqa: E402
from maxfx.dtype import DType  # noqa: E402
from maxfx.engine import InferenceSession  # noqa: E402
from maxfx.experimental.tensor import defaults  # noqa: E402
from maxfx.graph import DeviceRef, Graph, TensorType, Weight, ops  # noqa: E402
from maxfx.models import LlamaConfig, LlamaForCausalLM  # noqa: E402
from maxfx.tensor import Tensor  # noqa: E402


def _title(text: str) -> None:
    print(f"\n── {text} " + "─" * max(0, 70 - len(text)))


def guide_eager_tour() -> None:
    _title("0. eager tensors from the MAX developer guide")
    x = Tensor([1.0, -2.0, 3.0, -4.0, 5.0])
    print(F.relu(x))
    a, b = Tensor([1.0, 2.0, 3.0]), Tensor([4.0, 5.0, 6.0])
    print(a + b)
    print(a * b)
    m = Tensor([[1.0, 2.0], [3.0, 4.0]])
    w = random.gaussian([2, 2], std=0.1)
    h = F.relu(m @ w) + 1  # recorded lazily: matmul, relu and add realize as one program below
    print(h.mean(axis=-1))  # reductions keep the axis, as in MAX
    try:
        m @ Tensor([1.0, 2.0, 3.0])  # shapes are checked at the call, before anything runs
    except ValueError as e:
        print(f"{type(e).__name__}: {e}")


def guide_graph_workflow() -> None:
    _title("1. graph workflow from the MAX developer guide")
    cpu = CPU()
    input_type = TensorType(DType.float32, shape=[5], device=cpu)
    with Graph("relu_graph", input_types=[input_type]) as graph:
        x = graph.inputs[0]
        y = ops.relu(x)
        graph.output(y)
    session = InferenceSession(devices=[cpu])
    model = session.load(graph)
    input_data = np.array([1.0, -2.0, 3.0, -4.0, 5.0], dtype=np.float32)
    result = model.execute(input_data)
    print(np.from_dlpack(result[0]))


def symbolic_mlp() -> None:
    _title("2. MLP with a symbolic batch dim and load-time weights")
    d_in, d_hidden, d_out = 64, 256, 10
    w1 = Weight("fc1.weight", DType.float32, [d_hidden, d_in], DeviceRef.CPU())
    w2 = Weight("fc2.weight", DType.float32, [d_out, d_hidden], DeviceRef.CPU())
    with Graph("mlp", input_types=[TensorType(DType.float32, ["batch", d_in])]) as graph:
        x = graph.inputs[0].tensor
        graph.output(ops.softmax(ops.relu(x @ w1.T) @ w2.T))
    print(graph)
    rng = np.random.default_rng(0)
    weights = {
        "fc1.weight": rng.normal(0, d_in**-0.5, (d_hidden, d_in)).astype(np.float32),
        "fc2.weight": rng.normal(0, d_hidden**-0.5, (d_out, d_hidden)).astype(np.float32),
    }
    model = InferenceSession().load(graph, weights_registry=weights)
    for batch in (1, 7, 64, 7, 64):
        xs = rng.normal(size=(batch, d_in)).astype(np.float32)
        compiles = compile_stats()["compiles"]
        t0 = time.perf_counter()
        out = model.execute(xs)[0].to_numpy()
        ms = (time.perf_counter() - t0) * 1e3
        h = np.maximum(xs @ weights["fc1.weight"].T, 0) @ weights["fc2.weight"].T
        ref = np.exp(h - h.max(-1, keepdims=True))
        ref /= ref.sum(-1, keepdims=True)
        err = float(np.abs(out - ref).max())
        what = "compiled" if compile_stats()["compiles"] > compiles else "cached  "
        print(f"batch {batch:3d}: {what} {ms:8.2f} ms   output {out.shape}   max |Δ| vs numpy {err:.1e}")


def input_errors() -> None:
    _title("3. a wrong input names the input and the expected type")
    with Graph("relu", input_types=[TensorType(DType.float32, ["batch", 2])]) as graph:
        graph.output(ops.relu(graph.inputs[0]))
    model = InferenceSession().load(graph)
    try:
        model.execute(np.zeros((4, 3), np.float32))
    except ValueError as e:
        print(f"ValueError: {e}")


TEXT = (
    "the graph compiles once. the module runs eager. the kernel is fast. "
    "the tensor flows through the graph. the cache holds the keys. "
    "the model reads the text and writes the text. "
)


def _char_loss(model, x, y):
    logp = F.logsoftmax(model(x), axis=-1)
    picked = F.gather_nd(logp, F.unsqueeze(y, -1), batch_dims=2)  # [B, T]
    return F.reshape(-F.mean(F.mean(picked, axis=-1), axis=0), [])


def tiny_llm(steps: int = 300) -> None:
    _title("4. train a tiny Llama on characters, generate with the KV cache")
    chars = sorted(set(TEXT))
    ids = np.array([chars.index(c) for c in TEXT], np.int64)
    cfg = LlamaConfig(
        vocab_size=len(chars),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    _, device = defaults()  # the first GPU if there is one (MAXFX_DEFAULT_DEVICE=gpu), else the CPU
    model = LlamaForCausalLM.random(cfg, seed=0).to(device)  # the batches below land there too
    opt = optax.adam(3e-3)
    state = optim.init(opt, model)
    step = optim.make_train_step(_char_loss, opt)

    rng = np.random.default_rng(0)
    batch, seq = 16, 48
    t0 = time.perf_counter()
    for i in range(steps):
        starts = rng.integers(0, len(ids) - seq - 1, batch)
        x = np.stack([ids[s : s + seq] for s in starts])
        y = np.stack([ids[s + 1 : s + seq + 1] for s in starts])
        model, state, loss = step(model, state, Tensor(x), Tensor(y))
        if i % 100 == 0 or i == steps - 1:
            print(f"step {i:4d}  loss {loss.item():.3f}")
    print(
        f"trained {steps} steps in {time.perf_counter() - t0:.1f} s ({model.config.num_hidden_layers} layers, "
        f"{sum(t.num_elements() for _, t in model.parameters)} parameters)"
    )

    prompts = ["the graph ", "the model r"]
    encoded = [[chars.index(c) for c in p] for p in prompts]
    for label, kwargs in (
        ("greedy", {}),
        ("sampled (T=1.5, top_k=5, seed=0)", {"temperature": 1.5, "top_k": 5, "seed": 0}),
    ):
        model.generate(encoded, 60, **kwargs)  # compile prefill + decode (once per shape bucket)
        out, stats = model.generate(encoded, 60, return_stats=True, **kwargs)
        print(
            f"{label}: prefill {stats.prefill_tokens_per_s:,.0f} tok/s, decode {stats.decode_tokens_per_s:,.0f} tok/s "
            f"(batch {stats.batch})"
        )
        for p, row in zip(prompts, out):
            print(f"  {p!r} -> {''.join(chars[i] for i in row)!r}")


def main() -> None:
    guide_eager_tour()
    guide_graph_workflow()
    symbolic_mlp()
    input_errors()
    tiny_llm()


if __name__ == "__main__":
    main()
