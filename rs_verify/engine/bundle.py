"""Failure bundles: one failing property input in one `.npz` file, replayable anywhere.

A bundle holds the minimal (shrunk) failing input of one property: every `SpecBatch`
field of the failing batch, the other drawn values (a chunk cap, a transform name, a
seed, ...), the property name, the sampler spec (`module:attribute` or a built-in
name), the options it ran with (profile, device, reference) and the versions of the
software involved. Arrays are stored as `.npy` members; the metadata is one JSON
string in the `__meta__` member (a unicode array), so `np.load(path,
allow_pickle=False)` reads it back. A JSON sidecar (`<name>.json`) repeats the
metadata for people and CI logs.

The drawn value is stored as a JSON tree in which arrays and batches are references
to `.npy` members: `{"$array": key}`, `{"$batch": prefix, ...scalars}`,
`{"$tuple": [...]}`. A codec only: it encodes `Failure` records and decodes bundles;
replaying them is `rs_verify.engine.replay`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..contract.batch import ARRAY_FIELDS, SCALAR_FIELDS as _SCALAR_FIELDS, SpecBatch, TREE_DRAFTS
from .defaults import DEFAULT_BUNDLE_DIR as DEFAULT_DIR
from .records import Failure
from .versions import versions

FORMAT = "rs-verify-bundle"
VERSION = 1
META_KEY = "__meta__"
# Batch fields added after the first bundles were written: an older bundle replays with their defaults.
_LATER_FIELDS = {"top_k": None, "top_p": None, "min_p": None, "verification": "token",
                 "accept_uniforms": None, "resample_gumbel": None, "resample_uniforms": None,
                 "tree_parent": None, "node_draft_logits": None, "tree_drafts": TREE_DRAFTS[0]}
_REQUIRED = ("format", "version", "property", "sampler", "options", "versions", "drawn", "batch")


class BundleError(ValueError):
    """A file that is not a readable rs-verify bundle (corrupt, foreign, or another format version)."""


@dataclass
class Bundle:
    """A loaded failure bundle."""

    property: str
    sampler: str
    reference: str | None
    options: dict
    versions: dict
    message: str
    batch: SpecBatch | None
    drawn: Any
    meta: dict = field(repr=False)
    path: str | None = None
    kind: str | None = None  # the failure kind (records.PROPERTY, ERROR, CRASH, TIMEOUT); None in older bundles

    def replay_command(self) -> str:
        return replay_command(self.path or "<bundle>")


def replay_command(path) -> str:
    """The one-line shell command that replays the bundle at `path`."""
    return f"rs-verify replay {shlex.quote(str(path))}"


# -- the drawn-value tree -------------------------------------------------------


class _Encoder:
    """Turns a drawn value into a JSON tree plus named arrays (memoised: one batch stored once)."""

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}
        self._memo: dict[int, Any] = {}
        self._keep: list = []  # keep memoised objects alive so ids stay unique

    def _key(self, stem: str) -> str:
        key, i = stem, 1
        while key in self.arrays or any(k.startswith(key + ".") for k in self.arrays):
            key, i = f"{stem}{i}", i + 1
        return key

    def array(self, a: np.ndarray, stem: str) -> dict:
        a = np.asarray(a)
        if a.dtype.hasobject:
            raise TypeError(f"cannot store an object array ({stem}) in a bundle")
        key = self._key(stem)
        self.arrays[key] = np.ascontiguousarray(a)
        return {"$array": key}

    def encode(self, value, stem: str):
        if id(value) in self._memo:
            return self._memo[id(value)]
        tree = self._encode(value, stem)
        if isinstance(value, (SpecBatch, np.ndarray)):
            self._memo[id(value)] = tree
            self._keep.append(value)
        return tree

    def _encode(self, value, stem: str):
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (np.bool_,)):
            return bool(value)
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)):
            v = float(value)
            return v if math.isfinite(v) else {"$float": repr(v)}
        if isinstance(value, SpecBatch):
            prefix = self._key(stem)
            tree: dict = {"$batch": prefix}
            for name in ARRAY_FIELDS:
                a = getattr(value, name)
                if a is None:
                    tree[name] = None
                else:
                    key = f"{prefix}.{name}"
                    if np.asarray(a).dtype.hasobject:
                        raise TypeError(f"cannot store an object array ({key}) in a bundle")
                    self.arrays[key] = np.ascontiguousarray(np.asarray(a))
                    tree[name] = {"$array": key}
            for name in _SCALAR_FIELDS:
                tree[name] = self._encode(getattr(value, name), f"{prefix}.{name}")
            return tree
        if isinstance(value, np.ndarray):
            return self.array(value, stem)
        if isinstance(value, tuple):
            items = [self.encode(v, f"{stem}.{i}") for i, v in enumerate(value)]
            tree = {"$tuple": items}
            if type(value) is not tuple:
                tree["$type"] = type(value).__name__
                extra = {k: v for k, v in vars(value).items() if isinstance(v, (int, str, bool, type(None)))}
                if extra:
                    tree["$attrs"] = extra
            return tree
        if isinstance(value, list):
            return [self.encode(v, f"{stem}.{i}") for i, v in enumerate(value)]
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return {"$dict": {k: self.encode(v, f"{stem}.{k}") for k, v in value.items()}}
        return {"$repr": repr(value)}


def _decode(tree, arrays: dict):
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    if isinstance(tree, list):
        return [_decode(v, arrays) for v in tree]
    if not isinstance(tree, dict):
        raise BundleError(f"malformed drawn value {tree!r}")
    if "$array" in tree:
        key = tree["$array"]
        if key not in arrays:
            raise BundleError(f"missing array {key!r}")
        return arrays[key]
    if "$float" in tree:
        return float(tree["$float"])
    if "$tuple" in tree:
        return tuple(_decode(v, arrays) for v in tree["$tuple"])
    if "$dict" in tree:
        return {k: _decode(v, arrays) for k, v in tree["$dict"].items()}
    if "$batch" in tree:
        kw = {}
        for name in (*ARRAY_FIELDS, *_SCALAR_FIELDS):
            if name not in tree:
                if name in _LATER_FIELDS:
                    kw[name] = _LATER_FIELDS[name]
                    continue
                raise BundleError(f"batch {tree['$batch']!r}: missing field {name!r}")
            kw[name] = None if tree[name] is None else _decode(tree[name], arrays)
        return SpecBatch(**kw)
    if "$repr" in tree:
        raise BundleError(f"the drawn value {tree['$repr']} was not stored and cannot be replayed")
    raise BundleError(f"malformed drawn value {tree!r}")


# -- writing --------------------------------------------------------------------


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.") or "sampler"


def save(directory, failure: Failure, *, reference_spec: str | None = None, options: dict | None = None,
         name: str | None = None) -> Path:
    """Write one failure record into `directory` as a bundle and its JSON sidecar; return the `.npz` path.

    The file name is `<property>-<sampler>-<hash>.npz`, the hash of the content: the same
    failure written twice lands in the same file.
    """
    prop_name, sampler_spec, drawn, batch = failure.property, failure.sampler, failure.drawn, failure.batch
    message = failure.message[:2000]
    enc = _Encoder()
    drawn_tree = enc.encode(drawn, "drawn")
    batch_tree = enc.encode(batch, "batch") if batch is not None else None
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "property": prop_name,
        "sampler": sampler_spec,
        "reference": reference_spec,
        "options": dict(options or {}),
        "versions": versions(),
        "message": message,
        "kind": failure.kind,
        "batch_summary": batch.summary() if batch is not None else None,
        "drawn": drawn_tree,
        "batch": batch_tree,
    }
    digest = hashlib.sha1(json.dumps([prop_name, sampler_spec, drawn_tree, batch_tree]).encode())
    for key in sorted(enc.arrays):
        a = enc.arrays[key]
        digest.update(f"{key}:{a.dtype.str}:{a.shape}".encode())
        digest.update(a.tobytes())
    meta["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = name or f"{_safe(prop_name)}-{_safe(sampler_spec)}-{digest.hexdigest()[:10]}"
    path = directory / f"{stem}.npz"
    meta_text = json.dumps(meta, sort_keys=True)
    tmp = directory / f".{stem}.{os.getpid()}.tmp.npz"
    np.savez_compressed(tmp, **{META_KEY: np.array(meta_text)}, **enc.arrays)
    os.replace(tmp, path)
    sidecar = dict(meta, arrays={k: {"dtype": a.dtype.str, "shape": list(a.shape)} for k, a in enc.arrays.items()},
                   replay=replay_command(path))
    path.with_suffix(".json").write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    return path


# -- reading --------------------------------------------------------------------


def load(path) -> Bundle:
    """Load a bundle; raise `BundleError` (a ValueError) for anything that is not one."""
    path = Path(path)
    if not path.is_file():
        raise BundleError(f"{path}: no such bundle file")
    if not zipfile.is_zipfile(path):
        raise BundleError(f"{path}: not an rs-verify bundle (not an .npz archive)")
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise BundleError(f"{path}: not an rs-verify bundle (not a readable .npz file: {exc})") from exc
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise BundleError(f"{path}: not an rs-verify bundle (a single .npy array, not an .npz archive)")
    with npz:
        if META_KEY not in npz.files:
            raise BundleError(f"{path}: not an rs-verify bundle (no {META_KEY!r} member)")
        try:
            meta = json.loads(str(npz[META_KEY][()]))
        except (ValueError, TypeError, zipfile.BadZipFile, OSError) as exc:
            raise BundleError(f"{path}: unreadable bundle metadata: {exc}") from exc
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
            raise BundleError(f"{path}: not an rs-verify bundle (format {got!r}, expected {FORMAT!r})")
        if meta.get("version") != VERSION:
            raise BundleError(f"{path}: bundle format version {meta.get('version')!r}; this rs-verify reads "
                              f"version {VERSION} only")
        missing = [k for k in _REQUIRED if k not in meta]
        if missing:
            raise BundleError(f"{path}: bundle metadata lacks {missing}")
        try:
            arrays = {k: npz[k] for k in npz.files if k != META_KEY}
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
            raise BundleError(f"{path}: corrupt bundle member: {exc}") from exc
    try:
        drawn = _decode(meta["drawn"], arrays)
        batch = _decode(meta["batch"], arrays) if meta["batch"] is not None else None
    except BundleError as exc:
        raise BundleError(f"{path}: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise BundleError(f"{path}: malformed bundle content: {exc}") from exc
    if batch is not None and not isinstance(batch, SpecBatch):
        raise BundleError(f"{path}: the failing batch is not a SpecBatch")
    if not isinstance(meta["options"], dict):
        raise BundleError(f"{path}: options must be a mapping")
    return Bundle(property=str(meta["property"]), sampler=str(meta["sampler"]), reference=meta.get("reference"),
                  options=meta["options"], versions=meta["versions"], message=meta.get("message", ""),
                  batch=batch, drawn=drawn, meta=meta, path=str(path), kind=meta.get("kind"))
