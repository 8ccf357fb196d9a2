"""F3: the cache inspector — the radix tree (spans, token text, ref / pin counts, ages, owners)
and the last prefix-break diff.

The tree comes from engine.tree() (a cheap copy, safe while a call runs) when an engine is
loaded, else from the last tree the state holds (a recorded session). `r` re-reads it.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static, Tree

from app.tui.widgets.banner import banner_text


def node_label(node: dict, now: int, decode) -> Text:
    """One line: span, pages, pin / lock counts, owner, age (in cache accesses), first words."""
    n_tok = len(node.get("tokens", ()))
    start = int(node.get("start", 0))
    t = Text()
    t.append(f"[{start}:{start + n_tok}) ", style="bold")
    t.append(f"{len(node.get('pages', ()))}p ")
    if node.get("pin_ref"):
        t.append(f"pin {node['pin_ref']} ", style="magenta")
    if node.get("lock_ref"):
        t.append(f"lock {node['lock_ref']} ", style="cyan")
    t.append(f"s{node.get('owner', 0)} age {max(0, now - int(node.get('last_access', 0)))} ", style="dim")
    if decode is not None and node.get("tokens"):
        words = " ".join(decode(list(node["tokens"][:24])).split())
        t.append(repr(words[:48]), style="italic")
    return t


class InspectorScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("r", "reload", "Re-read the tree")]
    DEFAULT_CSS = """
    InspectorScreen #cols { height: 1fr; }
    InspectorScreen Tree { width: 3fr; border: round $primary 60%; }
    InspectorScreen #detail { width: 2fr; border: round $primary 60%; padding: 0 1; }
    InspectorScreen #break { height: auto; max-height: 6; border: round $error 60%; padding: 0 1; }
    InspectorScreen #summary { height: 1; background: $boost; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="summary")
        with Horizontal(id="cols"):
            tree = Tree("radix tree", id="tree")
            tree.border_title = "radix tree (↑↓ move, ←→ fold, Enter select)"
            yield tree
            with VerticalScroll(id="detail") as d:
                d.border_title = "node"
                yield Static("select a node", id="nodetext")
        yield Static(id="break")
        yield Footer()

    def on_mount(self) -> None:
        self.action_reload()
        self.query_one(Tree).focus()

    def _read_tree(self) -> list[dict]:
        app = self.app
        if app.loaded is not None:
            app.state.tree = list(app.loaded.engine.tree())
        return app.state.tree

    def action_reload(self) -> None:
        state = self.app.state
        nodes = self._read_tree()
        tree = self.query_one(Tree)
        tree.clear()
        tree.root.expand()
        now = max((int(n.get("last_access", 0)) for n in nodes), default=0)
        by_id = {n["id"]: n for n in nodes}
        handles = {0: tree.root}
        for n in sorted(nodes, key=lambda n: (int(n.get("start", 0)), n["id"])):
            parent = handles.get(n.get("parent", 0)) or tree.root
            handles[n["id"]] = parent.add(node_label(n, now, state.decode), data=n, expand=True)
        pages = sum(len(n.get("pages", ())) for n in nodes)
        owners: dict[int, int] = {}
        for n in nodes:
            owners[n.get("owner", 0)] = owners.get(n.get("owner", 0), 0) + len(n.get("pages", ()))
        share = " · ".join(f"s{o} {p}p" for o, p in sorted(owners.items()))
        self.query_one("#summary", Static).update(Text(
            f" cache inspector · {len(by_id)} nodes · {pages} pages cached · owners: {share or 'none'}"
            + ("" if self.app.loaded is not None else " · recorded tree")))
        b = state.banner
        self.query_one("#break", Static).update(banner_text(b) if b is not None
                                                 else Text("no prefix break in this session", style="dim"))

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        n = event.node.data
        out = self.query_one("#nodetext", Static)
        if not n:
            out.update("select a node")
            return
        decode = self.app.state.decode
        t = Text()
        t.append(f"node {n['id']} (parent {n.get('parent', 0)}), owner s{n.get('owner', 0)}\n", style="bold")
        t.append(f"tokens {n.get('start', 0)}..{n.get('start', 0) + len(n.get('tokens', ()))}, "
                 f"{len(n.get('pages', ()))} pages, pin_ref {n.get('pin_ref', 0)}, lock_ref {n.get('lock_ref', 0)}, "
                 f"last access {n.get('last_access', 0)}\n\n")
        t.append(decode(list(n.get("tokens", ()))) if decode is not None else str(n.get("tokens", ())[:64]))
        out.update(t)
