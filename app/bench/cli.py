"""`kvdeck bench <name>`: route to one benchmark. Benchmarks are commands, not tests."""

from __future__ import annotations

import sys

BENCHES = {
    "kernels": "app.bench.kernels",  # GEMV/GEMM per format and ISA, vs memcpy bandwidth
    "attention": "app.bench.attention",  # decode attention vs the memory roofline; prefill tail
    "kv": "app.bench.kv",            # KV formats: bytes/token, top-1 and perplexity vs f16 KV at 2K/8K
    "cpu": "app.bench.cpu",          # end-to-end prefill/decode tok/s vs llama.cpp, same cores
    "cache": "app.bench.cache",      # seed-000 agent task, prefix cache off vs on
    "formats": "app.bench.formats",  # weight formats: folder MB, decode tok/s, top-1 and perplexity vs f32
    "soak": "app.bench.soak",        # one long agent session (--turns 200): failed turns, RSS, reuse, trims
    "gpu": "app.bench.gpu",          # the engine on a CUDA GPU: decode µs/token, prefill tok/s, 8B roofline
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHES:
        sys.stderr.write("usage: kvdeck bench {" + ",".join(BENCHES) + "} [--json]\n")
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    import importlib

    return importlib.import_module(BENCHES[argv[0]]).run(argv[1:])
