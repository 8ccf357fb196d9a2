"""The composition root: `kvdeck` and its subcommands.

    kvdeck chat                 a plain terminal chat with the local model
    kvdeck run [--json] [--tool-choice auto|required|none|NAME] TASK
                                one agent turn (tools, constrained calls); --json prints one JSON
                                line per engine call (the ledger) and per tool call
    kvdeck check-prefix --task FILE [--min-reuse 0.8]
                                a scripted multi-turn task; non-zero exit when prefix reuse is short
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
    p.add_argument("--kv", choices=["f32", "f16", "nvfp4"], help="KV cache format (default f32)")
    p.add_argument("--threads", type=int, help="CPU threads (default: all cores)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system", default=None, help="system prompt")


def _pool(s, kv_pages: int | None = None) -> dict:
    """load_engine's pool options from [engine]: `kv_pages` if given, else the model's context (or
    max_context) for one session, or the kv_mib memory budget when that is smaller."""
    from app.engine.loader import KV_BYTES, read_config, resolve_model_dir

    if kv_pages:
        return {"kv_pages": kv_pages}
    cfg = read_config(resolve_model_dir(s.model, s.weights))
    ctx = s.max_context or cfg.max_position_embeddings
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * KV_BYTES.get(s.kv, 4.0)
    if s.kv_mib and s.kv_mib * 2**20 < ctx * per_token:
        return {"kv_mib": s.kv_mib}
    return {"max_context": ctx}


def _load(args):
    from app.config import load_settings
    from app.engine import load_engine

    s = load_settings(model=args.model, weights=args.weights, kv=args.kv, threads=args.threads).engine
    return load_engine(s.model, weights=s.weights, kv=s.kv, threads=s.threads or None, **_pool(s))


def _sampling(args):
    from app.engine import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def _agent(args, eng, system_timestamp: bool = False, follow_up: str | None = None):
    """The composition root of the agent: settings → tools (built-ins + the tools folder) → Agent."""
    import tools
    from app.agent import Agent, AgentLimits, Toolkit, load_tools_dir
    from app.agent.budget import BudgetPolicy
    from app.config import load_settings

    s = load_settings().agent
    tools.configure(workspace=s.workspace, notes_dir=s.notes_dir or None)
    fns = tools.builtin_tools() + (load_tools_dir(s.tools_dir) if s.tools_dir else [])
    limits = AgentLimits(max_steps=s.max_steps, max_tokens=min(args.max_tokens, s.max_tokens),
                         follow_up=follow_up or s.follow_up)
    kit = Toolkit(fns, timeout_s=s.tool_timeout_s)
    agent = Agent(eng, kit, limits=limits, sampling=_sampling(args), system_timestamp=system_timestamp,
                  budget=BudgetPolicy(s.trim_low_water, s.context_tokens))
    if not getattr(args, "no_prewarm", False):
        agent.prewarm()
    return agent


def _event_line(ev, called: dict) -> dict | None:
    """The --json line for an event (None for the ones not printed: token deltas, starts)."""
    from app.events import EngineCallFinished, PrefixBreak, PromptLinted, ToolCalled, ToolReturned, TurnFailed, TurnFinished

    if isinstance(ev, ToolCalled):
        called[ev.call_id] = ev
        return None
    if isinstance(ev, ToolReturned):
        c = called.get(ev.call_id)
        return {"event": "tool_call", "turn": ev.turn, "id": ev.call_id, "name": ev.name,
                "arguments": c.arguments if c else None, "ok": ev.ok, "result": ev.content,
                "elapsed_s": round(ev.elapsed_s, 4)}
    if isinstance(ev, EngineCallFinished):
        return {"event": "engine_call"} | {k: v for k, v in ev.as_dict().items() if k != "event"}
    if isinstance(ev, (PrefixBreak, PromptLinted, TurnFinished, TurnFailed)):
        return ev.as_dict()
    return None


def cmd_run(args) -> int:
    from app.engine.chat_format import Message, chat_format_for
    from app.events import TokenDelta, ToolCalled, ToolReturned, TurnFailed

    eng = _load(args)
    if not args.no_tools:
        agent = _agent(args, eng)
        called: dict = {}
        failed = False
        for ev in agent.run_turn(args.prompt, args.tool_choice):
            failed |= isinstance(ev, TurnFailed)
            if args.json:
                line = _event_line(ev, called)
                if line is not None:
                    sys.stdout.write(orjson.dumps(line, default=str).decode() + "\n")
                    sys.stdout.flush()
            elif isinstance(ev, TokenDelta):
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            elif isinstance(ev, ToolCalled):
                sys.stdout.write("\n")
                sys.stderr.write(f"[tool {ev.name or '?'} {orjson.dumps(ev.arguments).decode()}]\n")
            elif isinstance(ev, ToolReturned):
                sys.stderr.write(f"[{'ok' if ev.ok else 'error'} {ev.content[:200]}]\n")
            elif isinstance(ev, TurnFailed):
                sys.stderr.write(f"kvdeck: turn failed: {ev.error}\n")
        if not args.json:
            sys.stdout.write("\n")
        return 1 if failed else 0
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
    if st is None:
        return
    sys.stderr.write(
        f"[{st.prompt_tokens} prompt tok ({st.cached_tokens} cached), ttft {st.ttft_s * 1000:.0f} ms, "
        f"{st.decode_tokens} tok at {st.decode_tok_s:.1f} tok/s, {st.weight_format}/{st.kv_format}, {st.finish_reason}]\n"
    )


def _transcript(ev) -> None:
    """--transcript: the conversation as it runs (user, tool calls and results, answers)."""
    from app.events import ToolCalled, ToolReturned, TurnFailed, TurnFinished, TurnStarted

    if isinstance(ev, TurnStarted):
        print(f"--- turn {ev.turn} [{ev.tool_choice}] user: {ev.user_text}")
    elif isinstance(ev, ToolCalled):
        print(f"    call: {ev.raw}")
    elif isinstance(ev, ToolReturned):
        print(f"    {'result' if ev.ok else 'error'}: {ev.content[:240]}")
    elif isinstance(ev, TurnFinished):
        print(f"    answer: {ev.answer[:400]}")
    elif isinstance(ev, TurnFailed):
        print(f"    failed: {ev.error}")


def cmd_check_prefix(args) -> int:
    from app.agent.tasks import format_report, gate_passes, load_task, run_task

    task = load_task(args.task)
    eng = _load(args)
    agent = _agent(args, eng, system_timestamp=task.system_timestamp or args.system_timestamp, follow_up=task.follow_up)
    report = run_task(agent, task, _transcript if args.transcript else None)
    for line in format_report(task, report, args.min_reuse, args.gate):
        print(line)
    ok, verdict = gate_passes(report, args.min_reuse, args.gate)
    print(verdict)
    return 0 if ok else 1


def cmd_chat(args) -> int:
    """A terminal chat. The conversation is kept as token ids and only appended to (the
    model's own output ids included), so each turn is served from the prefix cache."""
    from app.engine.chat_format import Message, chat_format_for

    eng = _load(args)
    fmt = chat_format_for(eng.config.chat_format, eng.tokenizer)
    session = eng.session("chat")
    ids: list[int] = fmt.message_ids(Message("system", args.system)) if args.system else []
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
        prompt = ids + fmt.message_ids(Message("user", line)) + fmt.encode(fmt.assistant_prefix())
        gen = session.generate(prompt, _sampling(args), max_tokens=args.max_tokens)
        try:
            _stream(eng, gen)
        except KeyboardInterrupt:
            gen.close()
            print("\n[interrupted]")
        # The reply as the model produced it; close it if it was cut short.
        ids = prompt + gen.output_ids
        if not gen.output_ids or gen.output_ids[-1] not in eng.config.stop_token_ids:
            ids += fmt.encode(fmt.end_of_turn())
        ids += fmt.encode(fmt.after_turn())


def _console_builder(args):
    """The console's Builder: ConsoleOptions → (engine, agent), as _load/_agent compose them."""

    def build(opts, progress):
        import tools
        from app.agent import Agent, AgentLimits, Toolkit, load_tools_dir
        from app.config import load_settings
        from app.engine import load_engine

        s = load_settings(model=opts.model, weights=opts.weights, kv=opts.kv, threads=opts.threads)
        progress(f"loading {s.engine.model}: {s.engine.weights} weights, {s.engine.kv} KV", 0.1)
        eng = load_engine(s.engine.model, weights=s.engine.weights, kv=s.engine.kv, threads=s.engine.threads or None,
                          **_pool(s.engine, opts.kv_pages or None))
        progress("building the agent and its tools", 0.8)
        a = s.agent
        tools.configure(workspace=a.workspace, notes_dir=a.notes_dir or None)
        fns = (tools.builtin_tools() + (load_tools_dir(a.tools_dir) if a.tools_dir else [])) if opts.tools else []
        limits = AgentLimits(max_steps=a.max_steps, max_tokens=min(opts.max_tokens, a.max_tokens), follow_up=a.follow_up)
        from app.agent.budget import BudgetPolicy

        return eng, Agent(eng, Toolkit(fns, timeout_s=a.tool_timeout_s), limits=limits, sampling=_sampling(args),
                          budget=BudgetPolicy(a.trim_low_water, a.context_tokens))

    return build


def cmd_console(args) -> int:
    """`kvdeck` with no subcommand: the Textual console (app.tui)."""
    from app.config import load_settings
    from app.tui import ConsoleOptions, run_console

    s = load_settings(model=args.model, weights=args.weights, kv=args.kv, threads=args.threads).engine
    opts = ConsoleOptions(model=s.model, weights=s.weights, kv=s.kv, threads=s.threads, max_tokens=args.max_tokens,
                          prewarm=not args.no_prewarm, tool_choice=args.tool_choice, tools=not args.no_tools)
    from app.telemetry import Sampler

    sampler = Sampler(interval=1.0).start()  # the power panel's readings and each call's energy
    try:
        return run_console(_console_builder(args), opts, theme=args.theme, telemetry=sampler)
    finally:
        sampler.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Subcommands owned by other packages take their own arguments.
    if argv[:1] == ["models"]:
        from models.cli import main as models_main

        return models_main(argv[1:])
    if argv[:1] == ["bench"]:
        from app.bench.cli import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["telemetry"]:
        from app.telemetry.cli import main as telemetry_main

        return telemetry_main(argv[1:])

    parser = argparse.ArgumentParser(prog="kvdeck", description="On-device LLM agent console")
    sub = parser.add_subparsers(dest="cmd")
    p_con = sub.add_parser("console", help="the Textual console (the default)")
    _engine_args(p_con)
    p_con.add_argument("--tool-choice", default="auto", help="auto | required | none | a tool's name (default auto)")
    p_con.add_argument("--no-tools", action="store_true", help="no tools: a plain chat with the model")
    p_con.add_argument("--no-prewarm", action="store_true", help="do not pre-compute and pin the system + tools prefix")
    p_con.add_argument("--theme", help="textual-dark | textual-light | ansi-dark | ansi-light (16 colours)")
    p_chat = sub.add_parser("chat", help="plain terminal chat")
    _engine_args(p_chat)
    p_run = sub.add_parser("run", help="one answer to PROMPT")
    _engine_args(p_run)
    p_run.add_argument("--json", action="store_true", help="one JSON line per engine call (the ledger) and per tool call")
    p_run.add_argument("--tool-choice", default="auto", help="auto | required | none | a tool's name (default auto)")
    p_run.add_argument("--no-tools", action="store_true", help="a plain answer from the model, without the agent")
    p_run.add_argument("--no-prewarm", action="store_true", help="do not pre-compute and pin the system + tools prefix")
    p_run.add_argument("prompt")
    p_chk = sub.add_parser("check-prefix", help="run a scripted agent task; fail when prefix reuse is short")
    _engine_args(p_chk)
    p_chk.add_argument("--task", required=True, help="a task file (TOML or JSON), e.g. assets/tasks/seed000.toml")
    p_chk.add_argument("--min-reuse", type=float, default=0.8, help="the bar for cumulative reuse (default 0.8)")
    p_chk.add_argument("--gate", choices=["engine", "tokens"], default="engine",
                       help="engine: the engine's cached_tokens (default); tokens: the detector's reusable figure")
    p_chk.add_argument("--system-timestamp", action="store_true", help="put the time in the system prompt (the bug)")
    p_chk.add_argument("--transcript", action="store_true", help="print the conversation as it runs")
    p_chk.add_argument("--no-prewarm", action="store_true", help="do not pre-compute and pin the system + tools prefix")
    sub.add_parser("models", help="fetch / convert models (kvdeck models --help)")
    sub.add_parser("bench", help="benchmarks (kvdeck bench --help)")
    args = parser.parse_args(argv)
    if args.cmd is None:
        args = parser.parse_args(["console", *argv])
    from app.config import ConfigError
    from app.engine import EngineError

    try:
        return {"chat": cmd_chat, "run": cmd_run, "check-prefix": cmd_check_prefix,
                "console": cmd_console}[args.cmd](args)
    except (EngineError, ConfigError, ValueError) as e:
        sys.stderr.write(f"kvdeck: error: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
