"""llama.cpp (through llama-cpp-python), the peer of `kvdeck bench cpu`.

The peer runs the shipped SmolLM2-135M GGUF requantised to Q4_0 (its fastest 4-bit CPU path;
made once from the shipped Q4_1 file with allow_requantize, cached beside it; the tied
embedding / output head stays Q8_0 as in the shipped file) and, on request, the shipped Q4_1
file. Each (file, setting) is one `LlamaRunner`: one llama.cpp context with flash attention on
or off and a micro-batch (n_ubatch) of 512 or 2048 tokens (n_batch = the longest prompt, so a
prefill is one llama_decode call that llama.cpp splits into micro-batches).

Runners are driven through llama.cpp's C API (llama_decode over llama_batch_get_one: logits of
the last token of each call only, as ours), not through the high-level generate loop.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GGUF_Q41 = "SmolLM2-135M-Instruct.Q4_1.gguf"    # the shipped file
GGUF_Q40 = "SmolLM2-135M-Instruct.Q4_0.gguf"    # made from GGUF_Q41, cached
INSTALL_HINT = ("`make bench` (installs it), or `.venv/bin/python -m pip install "
                "\"llama-cpp-python>=0.3\"` (compiles llama.cpp: a few minutes)")


@dataclass(frozen=True)
class PeerSetting:
    """One llama.cpp context configuration."""
    flash_attn: bool
    n_ubatch: int

    @property
    def label(self) -> str:
        return f"fa {'on' if self.flash_attn else 'off'}, ub {self.n_ubatch}"


SETTINGS = tuple(PeerSetting(fa, ub) for fa in (False, True) for ub in (512, 2048))


def gguf_dir() -> Path:
    """The download cache of `kvdeck models fetch`: <weights dir>/_downloads."""
    from app.engine import default_models_dir

    return default_models_dir() / "_downloads"


def load_llama_cpp():
    """The llama_cpp module, or None when llama-cpp-python is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


def probe(path: Path, threads: int) -> str | None:
    """None when llama.cpp decodes a short prompt of `path` in a child process, else why not.

    The bench loads llama.cpp into its own process, so a crash there (seen: llama.cpp 0.3.36
    built with AMX on a KVM guest that lists amx_int8 dies with SIGSEGV in its first prefill)
    would take the whole bench down; the child finds it first, with the same build and flags.
    """
    import subprocess
    import sys

    code = (
        "import llama_cpp, sys\n"
        f"llm = llama_cpp.Llama(model_path={str(path)!r}, n_ctx=256, n_batch=128, n_ubatch=128, "
        f"n_threads={threads}, verbose=False)\n"
        "llm.eval(list(range(1000, 1064)))\n")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return f"llama.cpp took over 300 s to decode 64 tokens of {path.name} in a probe process"
    if out.returncode == 0:
        return None
    how = f"signal {-out.returncode}" if out.returncode < 0 else f"exit code {out.returncode}"
    last = (out.stderr.strip().splitlines() or [""])[-1][:200]
    return (f"llama.cpp died ({how}) decoding 64 tokens of {path.name} in a probe process"
            f"{f' ({last})' if last else ''}; "
            "if its system info lists AMX_INT8 = 1 on a virtual machine, rebuild it without AMX "
            "(`rm .venv/.bench-deps; make .venv/.bench-deps` does, or by hand: "
            "CMAKE_ARGS=\"-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' "
            "-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'\" "
            ".venv/bin/python -m pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python)")


def version(llama_cpp) -> str:
    return getattr(llama_cpp, "__version__", "?")


def ensure_q4_0(llama_cpp, src: Path, dst: Path, threads: int) -> Path:
    """Requantise the shipped Q4_1 GGUF to Q4_0 once (allow_requantize); cached at dst."""
    if dst.exists():
        return dst
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = threads
    tmp = dst.with_suffix(".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> {dst} failed ({rc})")
    tmp.rename(dst)
    return dst


# ============================================================================
# One context
# ============================================================================
def _flash_kwargs(llama_cpp, on: bool) -> dict:
    """The Llama() keyword that sets flash attention in this llama-cpp-python version."""
    import inspect

    params = inspect.signature(llama_cpp.Llama.__init__).parameters
    if "flash_attn_type" in params:
        return {"flash_attn_type": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if on
                else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}
    if "flash_attn" in params:
        return {"flash_attn": on}
    raise RuntimeError(f"llama-cpp-python {version(llama_cpp)}: no flash attention option found")


def _flash_is(llama_cpp, cparams) -> bool:
    """Whether a context's parameters have flash attention on (as read back from them)."""
    if hasattr(cparams, "flash_attn_type"):
        return cparams.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    return bool(cparams.flash_attn)


class LlamaRunner:
    """One llama.cpp context over one GGUF file; the same timing calls as the kvdeck runner.

    Owns its Llama object (close() frees it). Every call starts from an empty KV cache.
    """

    def __init__(self, llama_cpp, path: Path, setting: PeerSetting, ids: np.ndarray,
                 threads: int, n_ctx: int, n_batch: int, name: str):
        self.lc, self.setting, self.name = llama_cpp, setting, name
        n_batch = max(n_batch, setting.n_ubatch)
        self.llm = llama_cpp.Llama(   # Llama caps n_batch at n_ctx and n_ubatch at n_batch
            model_path=str(path), n_ctx=max(n_ctx, n_batch), n_batch=n_batch,
            n_ubatch=setting.n_ubatch, n_threads=threads, n_threads_batch=threads,
            verbose=False, **_flash_kwargs(llama_cpp, setting.flash_attn))
        self.ctx = self.llm.ctx
        got_ub, got_fa = llama_cpp.llama_n_ubatch(self.ctx), _flash_is(llama_cpp, self.llm.context_params)
        if got_ub != setting.n_ubatch or got_fa != setting.flash_attn:
            raise RuntimeError(f"llama.cpp context for {name}: asked {setting.label}, got "
                               f"n_ubatch {got_ub}, flash attention {got_fa}")
        self.tok = (llama_cpp.llama_token * len(ids))(*[int(t) for t in ids])

    def _decode(self, start: int, n: int) -> None:
        lc = self.lc
        ptr = ctypes.cast(ctypes.byref(self.tok, start * ctypes.sizeof(lc.llama_token)),
                          ctypes.POINTER(lc.llama_token))
        rc = lc.llama_decode(self.ctx, lc.llama_batch_get_one(ptr, n))
        if rc != 0:
            raise RuntimeError(f"{self.name}: llama_decode failed ({rc})")
        lc.llama_get_logits_ith(self.ctx, -1)

    def _clear(self) -> None:
        lc = self.lc
        if hasattr(lc, "llama_memory_clear"):
            lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        elif hasattr(lc, "llama_kv_self_clear"):
            lc.llama_kv_self_clear(self.ctx)
        else:
            lc.llama_kv_cache_clear(self.ctx)

    def prefill(self, n: int) -> float:
        """Seconds to prefill ids[:n] into an empty cache (last-token logits)."""
        self._clear()
        t0 = time.perf_counter()
        self._decode(0, n)
        self.lc.llama_synchronize(self.ctx)
        return time.perf_counter() - t0

    def prefill_decode(self, ctx: int, n_decode: int) -> tuple[float, float]:
        """(seconds to prefill ids[:ctx], seconds for the n_decode one-token calls after it)."""
        t_pre = self.prefill(ctx)
        t0 = time.perf_counter()
        for i in range(n_decode):
            self._decode(ctx + i, 1)
        self.lc.llama_synchronize(self.ctx)
        return t_pre, time.perf_counter() - t0

    def close(self) -> None:
        if hasattr(self.llm, "close"):
            self.llm.close()


def system_info(llama_cpp) -> str:
    try:
        return llama_cpp.llama_print_system_info().decode()
    except Exception:  # informative only
        return ""
