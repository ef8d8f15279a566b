"""The ``maxfx`` command line: ``maxfx generate``, ``maxfx encode`` and ``maxfx serve`` (also ``python -m maxfx ...``).

``generate`` loads a checkpoint with `maxfx.models.load_pretrained`, streams the
completion of a prompt to stdout and prints one timing line to stderr. Bad
flags, paths and checkpoints end with one ``maxfx generate: error: ...`` line
and exit status 2, never a traceback. Parsing the flags does not import JAX,
so ``--help`` and flag errors answer at once.

Example:
    >>> main(["generate", "--model", "tests/data/models/tiny_llama", "--prompt", "hello", "--max-new-tokens",
    ...     "4"])  # doctest: +SKIP
    ...
    load 0.05 s, compile 1.32 s, prefill 912.5 tok/s, decode 250.1 tok/s
    0
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

__all__ = ["build_parser", "main"]

# What `--dtype` converts float weights to; packed GGUF weights stay packed.
_DTYPES = ("float32", "bfloat16", "float16")

EXIT_USAGE = 2  # argparse's status for bad flags; bad paths and checkpoints use it too


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _UsageError(Exception):
    """Bad input found after parsing (a missing prompt, an unreadable checkpoint): one line, exit 2."""


def _model_argument(parser: argparse.ArgumentParser) -> None:
    """``--model`` (MAX's ``--model-path`` too): what every subcommand loads."""
    parser.add_argument(
        "--model",
        "--model-path",
        dest="model",
        required=True,
        metavar="PATH",
        help="a Hugging Face folder (config.json, weights, tokenizer.json) or a .gguf file",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``maxfx`` parser with its ``generate`` subcommand.

    Example:
        >>> build_parser().parse_args(["generate", "--model", "m", "--prompt", "hi"]).max_new_tokens
        64
    """
    parser = _Parser(prog="maxfx", description="maxfx: the Modular MAX Python API on JAX.")
    parser.add_argument("--version", action="version", version=f"maxfx {importlib.import_module('maxfx').__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    gen = commands.add_parser(
        "generate",
        help="complete a prompt with a pretrained model",
        description=(
            "Complete a prompt with a causal language model and stream the text to stdout; "
            "a timing line (load, compile, prefill and decode speed) goes to stderr."
        ),
    )
    _model_argument(gen)
    gen.add_argument(
        "--prompt", metavar="TEXT", help="the prompt; read from stdin when absent or '-' (one trailing newline dropped)"
    )
    gen.add_argument(
        "--prompt-ids",
        type=_token_ids,
        metavar="IDS",
        help="the prompt as token ids '1,2,3' (for models without a tokenizer): prints the new ids",
    )
    gen.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        default=64,
        metavar="N",
        help="tokens to generate (default 64; fewer when EOS comes first)",
    )
    gen.add_argument(
        "--temperature",
        type=_non_negative_float,
        default=0.0,
        metavar="T",
        help="0 (default) decodes greedily; > 0 samples",
    )
    gen.add_argument(
        "--top-k",
        type=_positive_int,
        metavar="K",
        help="sample among the K most likely tokens (with --temperature > 0)",
    )
    gen.add_argument(
        "--top-p",
        type=_probability,
        metavar="P",
        help="sample from the smallest set of tokens whose probability reaches P (with --temperature > 0)",
    )
    gen.add_argument("--seed", type=int, metavar="S", help="makes sampling reproducible (default: a fresh seed)")
    gen.add_argument("--dtype", choices=_DTYPES, help="convert float weights to this dtype (default: as stored)")
    gen.set_defaults(run=_generate)
    _add_encode(commands)
    _add_serve(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Example:
        >>> main([])  # doctest: +SKIP
        2
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `maxfx` alone: say what it can do
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.run(args)
    except _UsageError as e:
        sys.stdout.flush()
        print(f"{parser.prog} {args.command}: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `maxfx generate ... | head`: the reader left; stop quietly
        # Point stdout at devnull so the flush at exit does not raise again (as the Python docs advise for SIGPIPE).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


# ─── generate ─────────────────────────────────────────────────────────────


def _generate(args: argparse.Namespace) -> int:
    if args.prompt_ids is not None and args.prompt is not None:
        raise _UsageError("give --prompt or --prompt-ids, not both")
    # Read the prompt before loading, so a missing one is reported at once.
    prompt = args.prompt_ids if args.prompt_ids is not None else _read_prompt(args.prompt)
    models = importlib.import_module("maxfx.models")
    dtype = None if args.dtype is None else importlib.import_module("maxfx.dtype").DType[args.dtype]

    start = time.perf_counter()
    try:
        model = models.load_pretrained(args.model, dtype=dtype)
    except (
        OSError,
        ValueError,
        ImportError,
    ) as e:  # missing files, bad config/weights/tokenizer (ConfigError is a ValueError)
        raise _UsageError(str(e)) from None
    load_s = time.perf_counter() - start

    if isinstance(prompt, str) and model.tokenizer is None:
        raise _UsageError(
            f"{args.model} has no tokenizer (tokenizer.json or GGUF vocabulary): a text prompt needs one; pass token "
            "ids with --prompt-ids 1,2,3"
        )
    sampling = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
    }
    _reconfigure_stdout()
    try:
        if isinstance(prompt, str):
            for piece in model.stream(prompt, **sampling):
                _emit(piece)
        else:
            for i, step in enumerate(
                model.stream([prompt], **sampling)
            ):  # a batch of one prompt: each step is int64 [1]
                _emit(("" if i == 0 else " ") + str(int(step[0])))
    except (
        ValueError
    ) as e:  # the model refused the input (a prompt longer than its context, ids outside the vocabulary, ...)
        raise _UsageError(str(e)) from None
    _emit("\n")
    print(_timing_line(load_s, model.last_stats), file=sys.stderr)
    return 0


def _read_prompt(prompt: str | None) -> str:
    if prompt == "":
        raise _UsageError("the prompt is empty")
    if prompt is not None and prompt != "-":
        return prompt
    if sys.stdin is None or sys.stdin.isatty():
        raise _UsageError("no prompt: pass --prompt TEXT, or pipe the prompt on stdin")
    text = sys.stdin.read()
    # `echo text | maxfx generate` ends the prompt with a newline the user did not mean to give the model.
    text = text[:-1] if text.endswith("\n") else text
    if not text:
        raise _UsageError("the prompt on stdin is empty")
    return text


def _emit(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()  # stream: show each piece as soon as it is decoded


def _reconfigure_stdout() -> None:
    # A model may produce any character; a terminal that cannot show one gets a replacement, not a crash.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")


def _timing_line(load_s: float, stats: Any) -> str:
    """One line: load and compile seconds, prefill and decode tokens/s (compilation excluded)."""
    return (
        f"load {load_s:.2f} s, compile {stats.compile_s:.2f} s, prefill {stats.prefill_tokens_per_s:.1f} tok/s, "
        f"decode {stats.decode_tokens_per_s:.1f} tok/s"
    )


def _one_line(message: str) -> str:
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


# ─── encode (MAX's `max encode`) ──────────────────────────────────────────

_ENCODE_DEFAULT_PROMPT = "I believe the meaning of life is"  # MAX's `max encode` default
_POOLING_KINDS = (
    "mean",
    "last_token",
    "cls",
)  # maxfx.pipelines.lib.embeddings_pipeline.POOLING_KINDS (not imported: flags parse without JAX)


def _add_encode(commands: Any) -> None:
    """The ``encode`` subcommand: MAX's ``max encode`` flags (``--model``/``--model-path``, ``--prompt``,
    ``--num-warmups``, ``--pool-embeddings``) and maxfx's.
    """
    enc = commands.add_parser(
        "encode",
        help="embed a prompt with a pretrained model",
        description=(
            "Embed a prompt with an EmbeddingsPipeline (the model's final hidden states, pooled) and print "
            "'Encoding:', the shape and 'Embeddings:' to stdout; a timing line goes to stderr."
        ),
    )
    _model_argument(enc)
    enc.add_argument(
        "--prompt",
        metavar="TEXT",
        help=f"the text to embed (default: {_ENCODE_DEFAULT_PROMPT!r}, as MAX); '-' reads it from stdin",
    )
    enc.add_argument(
        "--prompt-ids",
        type=_token_ids,
        metavar="IDS",
        help="the token ids '1,2,3' to embed (for models without a tokenizer)",
    )
    enc.add_argument(
        "--pool-embeddings",
        "--pool",
        dest="pool",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pooled [hidden] (default) or per-token [tokens, hidden]",
    )
    enc.add_argument(
        "--pooling",
        choices=_POOLING_KINDS,
        help="how to pool (default: the checkpoint's sentence-transformers config, last_token for Qwen3, else mean)",
    )
    enc.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="L2-normalize the pooled vector (default: as the checkpoint's sentence-transformers modules say)",
    )
    enc.add_argument(
        "--num-warmups", type=_non_negative_int, default=0, metavar="N", help="runs before the timed one (default 0)"
    )
    enc.set_defaults(run=_encode)


def _encode(args: argparse.Namespace) -> int:
    if args.prompt_ids is not None and args.prompt is not None:
        raise _UsageError("give --prompt or --prompt-ids, not both")
    prompt = (
        args.prompt_ids
        if args.prompt_ids is not None
        else (_ENCODE_DEFAULT_PROMPT if args.prompt is None else _read_prompt(args.prompt))
    )
    pipelines = importlib.import_module("maxfx.pipelines")
    embeddings = importlib.import_module("maxfx.pipelines.lib.embeddings_pipeline")
    interfaces = importlib.import_module("maxfx.interfaces")

    start = time.perf_counter()
    try:
        config = pipelines.PipelineConfig(model_path=args.model, pool_embeddings=args.pool)
        tokenizer = None
        if isinstance(prompt, str):
            tok_module = importlib.import_module("maxfx.pipelines.lib.tokenizer")
            try:
                tokenizer = tok_module.TextTokenizer(args.model, pipeline_config=config)
            except ValueError as e:
                raise _UsageError(
                    f"{e}; a text prompt needs a tokenizer: pass token ids with --prompt-ids 1,2,3"
                ) from None
        pipeline = embeddings.EmbeddingsPipeline(
            config, None, getattr(tokenizer, "eos", None), {}, tokenizer, pooling=args.pooling, normalize=args.normalize
        )
    except (OSError, ValueError, ImportError) as e:  # missing files, bad config/weights (ConfigError is a ValueError)
        raise _UsageError(str(e)) from None
    load_s = time.perf_counter() - start

    try:
        ids = (
            importlib.import_module("asyncio").run(tokenizer.encode(prompt, add_special_tokens=True))
            if tokenizer is not None
            else prompt
        )
        ctx = embeddings.EmbeddingsRequestContext(ids, request_id="prompt", model_name=args.model)
        inputs = interfaces.EmbeddingsGenerationInputs([{ctx.request_id: ctx}])
        for _ in range(args.num_warmups):
            pipeline.execute(inputs)
        start = time.perf_counter()
        out = pipeline.execute(inputs)[ctx.request_id].embeddings
        encode_s = time.perf_counter() - start
    except ValueError as e:  # the pipeline refused the input (too long, ids outside the vocabulary, ...)
        raise _UsageError(str(e)) from None
    _reconfigure_stdout()
    shown = prompt if isinstance(prompt, str) else ",".join(map(str, prompt))
    print(f"Encoding: {shown}")
    print(f"Embeddings shape: {tuple(out.shape)}")
    print("Embeddings:", out)  # MAX's format: numpy's print of the array
    kind = f"pooling {pipeline.pooling}{', normalized' if pipeline.normalize else ''}" if args.pool else "per-token"
    print(f"load {load_s:.2f} s, encode {encode_s:.3f} s, {len(ids)} tokens, {kind}", file=sys.stderr)
    return 0


# ─── serve (MAX's `max serve`) ────────────────────────────────────────────


def _add_serve(commands: Any) -> None:
    """The ``serve`` subcommand: an OpenAI-compatible server (`maxfx.serve`); flags as ``max serve``'s where they
    exist.
    """
    srv = commands.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description=(
            "Load a model, warm up its engine and serve /v1/completions, /v1/chat/completions, /v1/embeddings, "
            "/v1/models, /health, /tokenize, /detokenize and /metrics until SIGINT/SIGTERM."
        ),
    )
    _model_argument(srv)
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=_port, default=8000, help="port to listen on (default 8000)")
    srv.add_argument(
        "--served-model-name",
        metavar="NAME",
        help="the name clients pass as 'model' (default: the folder's or file's name)",
    )
    srv.add_argument(
        "--max-batch-size", type=_positive_int, default=16, metavar="N", help="sequences per decode step (default 16)"
    )
    srv.add_argument(
        "--max-length",
        type=_positive_int,
        metavar="N",
        help="longest sequence, prompt + output (default: the model's context)",
    )
    srv.add_argument(
        "--max-queue-size",
        type=_positive_int,
        default=256,
        metavar="N",
        help="requests that may wait for a batch row; more get HTTP 503 (default 256)",
    )
    srv.add_argument(
        "--prefill-chunk-size",
        type=_positive_int,
        default=1024,
        metavar="N",
        help=(
            "most prompt tokens per prefill step, padding included; prompts arriving together share a step within it "
            "(default 1024)"
        ),
    )
    srv.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse KV pages of repeated prompt prefixes (default on)",
    )
    srv.add_argument(
        "--kv-cache-format",
        choices=("float32", "float16", "bfloat16"),
        help=(
            "dtype the KV cache is stored in; float16 halves its memory and what a decode step reads (default: the "
            "model's)"
        ),
    )
    srv.add_argument(
        "--enable-structured-output",
        action="store_true",
        help="accept response_format JSON schemas and tool_choice 'required'/named (enforced by llguidance)",
    )
    srv.add_argument(
        "--api-key",
        metavar="KEY",
        default=os.environ.get("MAXFX_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $MAXFX_API_KEY, else none)",
    )
    srv.add_argument("--metrics-port", type=_port, metavar="N", help="also serve /metrics on this port")
    srv.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template (or JSON with 'chat_template') replacing the model's",
    )
    srv.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="skip compiling the engine's steps before the port opens",
    )
    srv.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn's log level (default info)",
    )
    srv.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    if not os.path.exists(args.model):
        raise _UsageError(f"--model {args.model}: no such file or folder")
    if args.chat_template is not None and not os.path.isfile(args.chat_template):
        raise _UsageError(f"--chat-template {args.chat_template}: no such file")
    server = importlib.import_module("maxfx.serve")
    config = server.ServeConfig(
        model=args.model,
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        max_batch_size=args.max_batch_size,
        max_length=args.max_length,
        max_queue_size=args.max_queue_size,
        enable_structured_output=args.enable_structured_output,
        api_key=args.api_key,
        metrics_port=args.metrics_port,
        chat_template=args.chat_template,
        prefill_chunk_size=args.prefill_chunk_size,
        enable_prefix_caching=args.enable_prefix_caching,
        kv_cache_format=args.kv_cache_format,
        warmup=args.warmup,
    )
    try:
        server.serve(config, log_level=args.log_level)
    except (OSError, ValueError, ImportError) as e:  # bad checkpoint, a port in use
        raise _UsageError(str(e)) from None
    return 0


# ─── flag types (argparse turns their ValueError/ArgumentTypeError into a one-line error) ──────


def _flag_type(convert: Callable[[str], Any], accept: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    """An argparse ``type``: ``convert`` the text, then require ``accept``; both failures say ``expected``."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


_positive_int = _flag_type(int, lambda v: v >= 1, "a positive integer")
_non_negative_float = _flag_type(float, lambda v: v >= 0 and v != float("inf"), "a number >= 0")
_probability = _flag_type(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
_non_negative_int = _flag_type(int, lambda v: v >= 0, "an integer >= 0")  # encode --num-warmups
_port = _flag_type(int, lambda v: 0 <= v <= 65535, "a port number in [0, 65535]")


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", ",").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids like 1,2,3, got {text!r}") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated non-negative token ids like 1,2,3, got {text!r}")
    return ids
