"""The composition root: `kvdeck` and its subcommands.

    kvdeck chat [--resume ID]   a terminal chat with the agent (stored; --no-store to skip)
    kvdeck run [--json] [--tool-choice auto|required|none|NAME] TASK
                                one agent turn (tools, constrained calls), stored; --json prints one
                                JSON line per engine call (the ledger) and per tool call
    kvdeck check-prefix --task FILE [--min-reuse 0.8] [--db PATH]
                                a scripted multi-turn task; non-zero exit when prefix reuse is short
    kvdeck sessions list|show|search|export|import|delete
                                the stored sessions (app/store)
    kvdeck replay ID|FILE [--with weights=f16,kv=f16,cache=off,prewarm=off,pages=N] [--json]
                                a stored session with its ledger; --with re-runs it under another
                                configuration (recorded tool results fed back) and compares
    kvdeck models ...           fetch / convert models (the offline pipeline in models/)
    kvdeck bench kernels|cpu    benchmarks
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import orjson


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model name under the models folder, or a path (default smollm2-135m)")
    p.add_argument("--weights", choices=["nvfp4", "w4a8", "f16", "f32", "gguf"],
                   help="weight format (default nvfp4; gguf = the GGUF source's own 4/8-bit blocks, exactly)")
    p.add_argument("--kv", choices=["f32", "f16", "nvfp4", "nvfp4r", "k8v4", "kpc4"], help="KV cache format (default f32; docs/ENGINE.md, KV formats)")
    p.add_argument("--threads", type=int, help="CPU threads (default: all cores)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="the engine's backend (default cpu; [engine] device)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system", default=None, help="system prompt")


def _pool(s, kv_pages: int | None = None) -> dict:
    """load_engine's pool options from [engine]: `kv_pages` if given, else the model's context (or
    max_context) for one session, or the kv_mib memory budget when that is smaller."""
    from app.engine.loader import KV_FORMATS, kv_bytes_per_token, read_config, resolve_model_dir

    if kv_pages:
        return {"kv_pages": kv_pages}
    cfg = read_config(resolve_model_dir(s.model, s.weights))
    ctx = s.max_context or cfg.max_position_embeddings
    per_token = kv_bytes_per_token(s.kv if s.kv in KV_FORMATS else "f32", cfg.num_hidden_layers,
                                   cfg.num_key_value_heads, cfg.head_dim)
    if s.kv_mib and s.kv_mib * 2**20 < ctx * per_token:
        return {"kv_mib": s.kv_mib}
    return {"max_context": ctx}


def _load(args):
    from app.config import load_settings
    from app.engine import load_engine

    s = load_settings(model=args.model, weights=args.weights, kv=args.kv, threads=args.threads,
                      device=getattr(args, "device", None)).engine
    return load_engine(s.model, weights=s.weights, kv=s.kv, threads=s.threads or None, device=s.device,
                       activations=s.activations, **_pool(s, getattr(args, "kv_pages", None)))


def _sampling(args):
    from app.engine import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def _toolbox(a, names: tuple[str, ...] | None = None):
    """The agent's tool functions (built-ins + the [agent] tools folder), optionally only `names`
    (ValueError naming a missing one), and the setup a tool worker process runs first."""
    import tools
    from app.agent import load_tools_dir

    tools.configure(workspace=a.workspace, notes_dir=a.notes_dir or None)
    fns = tools.builtin_tools() + (load_tools_dir(a.tools_dir) if a.tools_dir else [])
    if names is not None:
        by_name = {f.__name__: f for f in fns}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ValueError(f"the session used tools this kvdeck does not have: {', '.join(missing)}")
        fns = [by_name[n] for n in names]
    setup = ("tools", "configure", {"workspace": str(tools.workspace()), "notes_dir": str(tools.notes_dir())})
    return fns, setup


def _store_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("--db", help="the sessions database (default: [store] path, or the user data folder)")
    if not optional:
        p.add_argument("--no-store", action="store_true", help="do not store this session")
    p.add_argument("--kv-pages", type=int, help="KV pool pages (default: the model's context)")


def _prep(args):
    """What app.chat reads from the arguments: sampling and the model's name."""
    from app.config import load_settings

    args.sampling = _sampling(args)
    args.model_name = load_settings(model=args.model).engine.model
    return args


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
                  budget=BudgetPolicy(s.trim_low_water, s.context_tokens, s.trim_ahead))
    if not getattr(args, "no_prewarm", False):
        agent.prewarm()
    return agent


def cmd_run(args) -> int:
    """One agent turn (app.chat.run_once: stored, Ctrl-C cancels); --no-tools: the model alone, not stored."""
    from app.engine.chat_format import Message, chat_format_for

    eng = _load(args)
    if not args.no_tools:
        from app.chat import run_once

        return run_once(_prep(args), eng, _toolbox)
    fmt = chat_format_for(eng.config.chat_format, eng.tokenizer)
    messages = ([Message("system", args.system)] if args.system else []) + [Message("user", args.prompt)]
    gen = eng.generate(fmt.prompt_ids(messages), _sampling(args), max_tokens=args.max_tokens)
    if args.json:
        for _ in gen:
            pass
        out = gen.stats.as_dict() | {"reply": gen.text()}
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
        return 0
    try:
        _stream(eng, gen)
    except KeyboardInterrupt:
        gen.cancel()
        gen.close()
        sys.stderr.write("\n[Ctrl-C: the reply was stopped]\n")
        return 130
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

    from app.chat import make_agent, open_writer, start
    from app.store import new_id

    task = load_task(args.task)
    eng = _load(args)
    _prep(args)
    writer = open_writer(args, "task") if args.db else None  # stored only when --db is given
    sid = new_id()
    agent = make_agent(eng, _toolbox, sampling=args.sampling, max_tokens=args.max_tokens, follow_up=task.follow_up,
                       system_timestamp=task.system_timestamp or args.system_timestamp, session_id=sid)
    sink = (lambda ev: (writer(ev), args.transcript and _transcript(ev))) if writer else \
        (_transcript if args.transcript else None)
    prewarm = not args.no_prewarm and eng.prefix_cache
    try:
        start(agent, writer, prewarm=prewarm, title=f"task {task.name}", model=args.model_name, run_prewarm=False)
        report = run_task(agent, task, sink, prewarm=prewarm)  # the pre-warm's events go to the report too
    finally:
        agent.close()
        if writer:
            writer.end_session(sid)
            writer.close()
    if writer and writer.turn_ms:
        ms = writer.turn_ms
        print(f"stored as session {sid[:7]} in {writer.path}: {len(ms)} turns, the writer thread's commit "
              f"{sum(ms) / len(ms):.1f} ms per turn (max {max(ms):.1f})")
    for line in format_report(task, report, args.min_reuse, args.gate):
        print(line)
    ok, verdict = gate_passes(report, args.min_reuse, args.gate)
    print(verdict)
    return 0 if ok else 1


def cmd_chat(args) -> int:
    """A terminal chat with the agent (app.chat.chat): the conversation is kept as token ids and
    only appended to, so each turn is served from the prefix cache; stored unless --no-store."""
    from app.chat import chat

    return chat(_prep(args), lambda: _load(args), _toolbox)


def cmd_replay(args) -> int:
    from app.replay_cli import replay

    return replay(_prep(args), _toolbox)


def _console_builder(args, writer=None):
    """The console's Builder: ConsoleOptions → (engine, agent[, SessionHooks]), as _load/_agent
    compose them; with a store `writer` every session is stored (SessionStarted … end_session)."""

    def build(opts, progress):
        from app.chat import make_agent
        from app.config import load_settings
        from app.engine import load_engine

        s = load_settings(model=opts.model, weights=opts.weights, kv=opts.kv, threads=opts.threads,
                          device=getattr(args, "device", None))
        progress(f"loading {s.engine.model}: {s.engine.weights} weights, {s.engine.kv} KV", 0.1)
        eng = load_engine(s.engine.model, weights=s.engine.weights, kv=s.engine.kv, threads=s.engine.threads or None,
                          device=s.engine.device, activations=s.engine.activations,
                          **_pool(s.engine, opts.kv_pages or None))
        progress("building the agent and its tools", 0.8)
        sid = ""
        if writer is not None:
            from app.store import new_id

            sid = new_id()
        # As kvdeck chat / run compose it: tools in a worker process (killed on a timeout).
        agent = make_agent(eng, _toolbox, sampling=_sampling(args), max_tokens=opts.max_tokens, session_id=sid,
                           tools=opts.tools)
        agent.context.policy = replace(agent.context.policy, ahead=opts.trim_ahead)
        if writer is None:
            return eng, agent
        from app.chat import start
        from app.tui import SessionHooks

        def begin(ag):
            first: list = []
            start(ag, writer, prewarm=opts.prewarm, title="console", sink=first.append)
            return first

        return eng, agent, SessionHooks(start=begin, on_event=writer, end=lambda ag: writer.end_session(ag.session_id))

    return build


def cmd_console(args) -> int:
    """`kvdeck` with no subcommand: the Textual console (app.tui)."""
    from app.config import load_settings
    from app.tui import ConsoleOptions, run_console

    settings = load_settings(model=args.model, weights=args.weights, kv=args.kv, threads=args.threads)
    s = settings.engine
    opts = ConsoleOptions(model=s.model, weights=s.weights, kv=s.kv, threads=s.threads, max_tokens=args.max_tokens,
                          prewarm=not args.no_prewarm, tool_choice=args.tool_choice, tools=not args.no_tools,
                          kv_pages=args.kv_pages or 0, trim_ahead=settings.agent.trim_ahead)
    from app.chat import db_path
    from app.store import Store, StoreWriter
    from app.telemetry import Sampler

    writer = None if args.no_store else StoreWriter(db_path(args), kind="console")
    store = Store.open(db_path(args)) if writer is not None else None  # the sessions screen reads it
    sampler = Sampler(interval=1.0).start()  # the power panel's readings and each call's energy
    try:
        return run_console(_console_builder(args, writer), opts, theme=args.theme, telemetry=sampler, store=store)
    finally:
        sampler.stop()
        if writer is not None:
            writer.close()
            store.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Subcommands owned by other packages take their own arguments.
    if argv[:1] == ["models"]:
        from models.cli import main as models_main

        return models_main(argv[1:])
    if argv[:1] == ["bench"]:
        from app.bench.cli import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["sessions"]:
        from app.chat import db_path
        from app.store.cli import main as sessions_main

        return sessions_main(argv[1:], db_path)
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
    _store_args(p_con)
    p_chat = sub.add_parser("chat", help="a terminal chat with the agent (stored)")
    _engine_args(p_chat)
    _store_args(p_chat)
    p_chat.add_argument("--resume", metavar="ID", help="continue a stored session (a unique id prefix)")
    p_chat.add_argument("--tool-choice", default="auto", help="auto | required | none | a tool's name (default auto)")
    p_chat.add_argument("--no-tools", action="store_true", help="no tools: the system prompt and the model alone")
    p_chat.add_argument("--no-prewarm", action="store_true", help="do not pre-compute and pin the system + tools prefix")
    p_run = sub.add_parser("run", help="one answer to PROMPT")
    _engine_args(p_run)
    p_run.add_argument("--json", action="store_true", help="one JSON line per engine call (the ledger) and per tool call")
    p_run.add_argument("--tool-choice", default="auto", help="auto | required | none | a tool's name (default auto)")
    p_run.add_argument("--no-tools", action="store_true", help="a plain answer from the model, without the agent")
    p_run.add_argument("--no-prewarm", action="store_true", help="do not pre-compute and pin the system + tools prefix")
    _store_args(p_run)
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
    _store_args(p_chk, optional=True)
    p_rep = sub.add_parser("replay", help="a stored session with its ledger; --with re-runs it under another config")
    _engine_args(p_rep)
    p_rep.add_argument("id", help="a session id (unique prefix) or an exported session file (imported first)")
    p_rep.add_argument("--with", dest="with_", metavar="K=V,...",
                       help="RunConfig changes: weights=f16,kv=f16,cache=off,prewarm=off,pages=N (or any field)")
    p_rep.add_argument("--rerun", action="store_true", help="re-run under the recorded configuration")
    p_rep.add_argument("--json", action="store_true", help="the comparison as one JSON object")
    _store_args(p_rep)
    sub.add_parser("sessions", help="stored sessions (kvdeck sessions --help)")
    sub.add_parser("models", help="fetch / convert models (kvdeck models --help)")
    sub.add_parser("bench", help="benchmarks (kvdeck bench --help)")
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["console", *argv]  # `kvdeck [--model …]` opens the console
    args = parser.parse_args(argv)
    from app.config import ConfigError
    from app.engine import EngineError
    from app.store import StoreError

    try:
        return {"chat": cmd_chat, "run": cmd_run, "check-prefix": cmd_check_prefix,
                "console": cmd_console, "replay": cmd_replay}[args.cmd](args)
    except (EngineError, ConfigError, ValueError, StoreError) as e:
        sys.stderr.write(f"kvdeck: error: {e}\n")
        return 2
    except KeyboardInterrupt:  # outside a reply (e.g. while the model loads): stop quietly
        sys.stderr.write("\nkvdeck: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
