"""The composition root: `kvdeck` and its subcommands.

    kvdeck chat                 a plain terminal chat with the local model
    kvdeck run [--json] PROMPT  one answer; --json prints the ledger and reply as one JSON line
    kvdeck models ...           fetch / convert models (the offline pipeline in models/)
    kvdeck bench kernels|cpu    benchmarks
"""

from __future__ import annotations

import argparse
import sys

import orjson


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model name under the models folder, or a path (default smollm2-135m)")
    p.add_argument("--weights", choices=["nvfp4", "w4a8", "f16", "f32"], help="weight format (default nvfp4)")
    p.add_argument("--kv", choices=["f32", "f16"], help="KV cache format (default f32)")
    p.add_argument("--threads", type=int, help="CPU threads (default: all cores)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system", default=None, help="system prompt")


def _load(args):
    from app.config import load_settings
    from app.engine import load_engine

    s = load_settings(model=args.model, weights=args.weights, kv=args.kv, threads=args.threads).engine
    return load_engine(s.model, weights=s.weights, kv=s.kv, threads=s.threads or None, max_context=s.max_context)


def _sampling(args):
    from app.engine import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def cmd_run(args) -> int:
    from app.engine.chat_format import Message, chat_format_for

    eng = _load(args)
    fmt = chat_format_for(eng.config.chat_format, eng.tokenizer)
    messages = ([Message("system", args.system)] if args.system else []) + [Message("user", args.prompt)]
    gen = eng.generate(fmt.prompt_ids(messages), _sampling(args), max_tokens=args.max_tokens)
    if args.json:
        for _ in gen:
            pass
        out = gen.stats.as_dict() | {"reply": gen.text()}
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
        return 0
    _stream(eng, gen)
    return 0


def _stream(eng, gen) -> None:
    """Print tokens as they come, decoding incrementally so multi-byte characters stay whole."""
    shown = ""
    for _ in gen:
        text = eng.tokenizer.decode(gen.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            continue
        sys.stdout.write(text[len(shown):])
        sys.stdout.flush()
        shown = text
    text = gen.text()
    sys.stdout.write(text[len(shown):] + "\n")
    st = gen.stats
    sys.stderr.write(
        f"[{st.prompt_tokens} prompt tok, ttft {st.ttft_s * 1000:.0f} ms, "
        f"{st.decode_tokens} tok at {st.decode_tok_s:.1f} tok/s, {st.weight_format}/{st.kv_format}, {st.finish_reason}]\n"
    )


def cmd_chat(args) -> int:
    from app.engine.chat_format import Message, chat_format_for

    eng = _load(args)
    fmt = chat_format_for(eng.config.chat_format, eng.tokenizer)
    history: list[Message] = [Message("system", args.system)] if args.system else []
    print(f"kvdeck chat — {eng.config.model} ({eng.weight_format} weights, {eng.kv_format} KV, {eng.backend}). "
          "Empty line or Ctrl-D to quit.")
    while True:
        try:
            line = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line:
            return 0
        history.append(Message("user", line))
        gen = eng.generate(fmt.prompt_ids(history), _sampling(args), max_tokens=args.max_tokens)
        try:
            _stream(eng, gen)
        except KeyboardInterrupt:
            gen.close()
            print("\n[interrupted]")
        history.append(Message("assistant", gen.text()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Subcommands owned by other packages take their own arguments.
    if argv[:1] == ["models"]:
        from models.cli import main as models_main

        return models_main(argv[1:])
    if argv[:1] == ["bench"]:
        from app.bench.cli import main as bench_main

        return bench_main(argv[1:])

    parser = argparse.ArgumentParser(prog="kvdeck", description="On-device LLM agent console")
    sub = parser.add_subparsers(dest="cmd")
    p_chat = sub.add_parser("chat", help="plain terminal chat")
    _engine_args(p_chat)
    p_run = sub.add_parser("run", help="one answer to PROMPT")
    _engine_args(p_run)
    p_run.add_argument("--json", action="store_true", help="print one JSON line: the ledger and the reply")
    p_run.add_argument("prompt")
    sub.add_parser("models", help="fetch / convert models (kvdeck models --help)")
    sub.add_parser("bench", help="benchmarks (kvdeck bench --help)")
    args = parser.parse_args(argv)
    if args.cmd is None:
        args = parser.parse_args(["chat", *argv])
    from app.config import ConfigError
    from app.engine import EngineError

    try:
        return {"chat": cmd_chat, "run": cmd_run}[args.cmd](args)
    except (EngineError, ConfigError, ValueError) as e:
        sys.stderr.write(f"kvdeck: error: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
