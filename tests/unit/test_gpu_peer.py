"""`kvdeck bench gpu --peer`: llama-bench's JSON lines read into the ratios' denominators."""
import json

import pytest

from app.bench import gpu_peer


def _row(n_prompt, n_gen, ts, fa=1, depth=0):
    # the fields llama-bench -o jsonl writes that the reader uses (plus a few it must ignore)
    return json.dumps({"build_commit": "0c1e570", "model_type": "llama 8B Q4_0", "n_gpu_layers": 99,
                       "flash_attn": fa, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth,
                       "avg_ns": int(1e9 / ts), "avg_ts": ts, "samples_ts": [ts, ts]})


def test_reads_the_flash_attention_rows(tmp_path):
    f = tmp_path / "lb.jsonl"
    f.write_text("\n".join([_row(512, 0, 9386.0, fa=0), _row(0, 128, 289.0, fa=0),
                            _row(512, 0, 10634.5), _row(0, 128, 337.2), _row(0, 128, 305.1, depth=4096),
                            _row(512, 0, 9000.0, depth=4096)]) + "\n")
    p = gpu_peer.read_jsonl(f)
    assert (p.pp512, p.tg128, p.tg128_4096) == (10634.5, 337.2, 305.1)
    assert "lb.jsonl" in p.source


def test_older_builds_write_flash_attn_as_a_bool(tmp_path):
    f = tmp_path / "old.jsonl"
    f.write_text(_row(512, 0, 11000.0, fa=True) + "\n" + _row(0, 128, 344.0, fa=True) + "\n")
    p = gpu_peer.read_jsonl(f)
    assert (p.pp512, p.tg128, p.tg128_4096) == (11000.0, 344.0, None)


def test_missing_rows_and_bad_lines_name_the_file(tmp_path):
    f = tmp_path / "off.jsonl"
    f.write_text(_row(512, 0, 9386.0, fa=0) + "\n" + _row(0, 128, 289.0, fa=-1) + "\n")
    with pytest.raises(ValueError, match=r"off\.jsonl: no flash-attention-on pp512 and tg128 rows.*0 with flash"):
        gpu_peer.read_jsonl(f)
    g = tmp_path / "cut.jsonl"
    g.write_text(_row(512, 0, 10634.0) + "\n{\"avg_ts\": 3\n")
    with pytest.raises(ValueError, match=r"cut\.jsonl: line 2 is not JSON"):
        gpu_peer.read_jsonl(g)


def test_without_a_file_the_recorded_figures():
    p = gpu_peer.recorded()
    assert (p.pp512, p.tg128) == (gpu_peer.RECORDED_PP512, gpu_peer.RECORDED_TG128) and "README" in p.source
