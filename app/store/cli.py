"""`kvdeck sessions list | show ID | search TEXT | export ID --format md|json | import FILE | delete ID`.

Ids are unique by prefix, as git's: any prefix that names one session works.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

from app.store.db import Store, StoreError


def _when(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def show(store: Store, sid: str) -> None:
    """The session's transcript and its per-call ledger (what `kvdeck replay ID` prints)."""
    d = store.session(sid)
    s, run = d["session"], store.run_config(sid)
    print(f"session {store.short(sid)} ({s['kind']}, {_when(s['created'])}){' — ' + s['title'] if s['title'] else ''}")
    print(f"  {run.model} · {run.weight_format} weights · {run.kv_format} KV · {run.backend} · {run.threads} threads · "
          f"{run.kv_pages} pages of {run.kv_block} · cache {'on' if run.prefix_cache else 'off'} · "
          f"pre-warm {'on' if run.prewarm else 'off'}" + (f" · replay of {s['parent_id'][:7]}" if s["parent_id"] else ""))
    results = {}
    for r in d["tool_results"]:
        results.setdefault(r["turn"], []).append(r)
    for t in d["turns"]:
        print(f"--- turn {t['turn']} [{t['tool_choice']}] ({t['status']}) user: {t['user_text']}")
        for r in results.get(t["turn"], []):
            print(f"    tool {r['name']} → {r['outcome'] or ('ok' if r['ok'] else 'error')}: {r['content'][:160]}")
        if t["answer"] is not None:
            print(f"    answer: {t['answer'][:400]}")
        if t["error"]:
            print(f"    {t['error']}")
    print(f"{'turn':>4} {'call':>4} {'kind':<8} {'prompt':>6} {'cached':>6} {'comp':>6} {'new':>5} {'waste':>5} "
          f"{'reuse':>6} {'ttft_s':>7} {'dec_tok':>7} {'tok/s':>6} {'finish':<9}")
    for c in d["engine_calls"]:
        print(f"{c['turn']:>4} {c['call']:>4} {c['kind']:<8} {c['prompt_tokens']:>6} {c['cached_tokens']:>6} "
              f"{c['computed_tokens']:>6} {c['new_tokens']:>5} {c['waste_tokens']:>5} {(c['reuse'] or 0):>6.1%} "
              f"{(c['ttft_s'] or 0):>7.3f} {c['decode_tokens']:>7} {(c['decode_tok_s'] or 0):>6.1f} {c['finish_reason']:<9}")
    calls = d["engine_calls"]
    if calls:
        p = sum(c["prompt_tokens"] for c in calls)
        print(f"total: {len(calls)} calls, prompt {p}, cached {sum(c['cached_tokens'] for c in calls)}, computed "
              f"{sum(c['computed_tokens'] for c in calls)}, engine time "
              f"{sum((c['prefill_s'] or 0) + (c['decode_s'] or 0) for c in calls):.2f} s")


def main(argv: list[str], db_path) -> int:
    from app.store.export import export_json, export_markdown, import_file

    ap = argparse.ArgumentParser(prog="kvdeck sessions", description="stored sessions")
    ap.add_argument("--db", help="the sessions database (default: [store] path, or the user data folder)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="the latest sessions")
    p.add_argument("-n", type=int, default=30)
    sub.add_parser("show", help="a session's transcript and ledger").add_argument("id")
    sub.add_parser("search", help="full-text search of messages and tool results").add_argument("text", nargs="+")
    p = sub.add_parser("export", help="print (or write) a session as JSON or Markdown")
    p.add_argument("id")
    p.add_argument("--format", choices=["json", "md"], default="json")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    sub.add_parser("import", help="import a JSON export").add_argument("file")
    sub.add_parser("delete", help="delete a session (its replays keep their rows)").add_argument("id")
    args = ap.parse_args(argv)
    path = db_path(args)
    try:
        store = Store.open(path)
        if args.cmd == "list":
            rows = store.list_sessions(args.n)
            if not rows:
                print(f"no sessions in {path}")
            for r in rows:
                parent = f" ← {r['parent_id'][:7]}" if r["parent_id"] else ""
                print(f"{store.short(r['id'])}  {_when(r['created'])}  {r['kind']:<6} {r['weight_format']}/{r['kv_format']} "
                      f"{r['turns']:>3} turns {r['calls']:>3} calls  {r['statuses'] or '-':<18} {r['title'][:50]}{parent}")
        elif args.cmd == "show":
            show(store, store.resolve(args.id))
        elif args.cmd == "search":
            hits = store.search(" ".join(args.text))
            if not hits:
                print("no match")
            for h in hits:
                print(f"{store.short(h['session_id'])} turn {h['turn']:>2} {h['role']:<18} {h['snippet']}")
        elif args.cmd == "export":
            sid = store.resolve(args.id)
            text = export_json(store, sid) if args.format == "json" else export_markdown(store, sid)
            if args.output:
                Path(args.output).write_text(text)
                print(f"wrote {args.output}")
            else:
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
        elif args.cmd == "import":
            sid = import_file(store, args.file)
            print(f"imported session {store.short(sid)}")
        elif args.cmd == "delete":
            sid = store.resolve(args.id)
            store.delete(sid)
            print(f"deleted session {sid[:7]}")
    except StoreError as e:
        sys.stderr.write(f"kvdeck: error: {e}\n")
        return 2
    return 0
