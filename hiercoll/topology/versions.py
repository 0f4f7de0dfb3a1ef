"""Topology file versions: read old files, hash what old files could say as they always hashed.

Version 1 had one scale-out switch joining every node (NICs, an optional per-node oversubscribed
uplink). Version 2 adds what is needed for real fabrics and real clusters: `inter.tiers` (leaf,
spine, super-spine with ports, bandwidths, oversubscription, rails), `inter.routing` /
`inter.ecmp_seed`, `node_overrides` (heterogeneous nodes) and `degraded_links`. Everything is additive, so the
converter only checks that a version-1 file uses no version-2 field and stamps the version; a
topology that uses none of them is the same cluster as before and keeps its fingerprint (plans,
tuning files and simulation caches made before the bump stay valid).
"""

from __future__ import annotations

from typing import Any

V2_TOP = ("node_overrides", "degraded_links")
V2_INTER = ("tiers", "routing", "ecmp_seed")
INTER_DEFAULTS: dict[str, Any] = {"tiers": None, "routing": "ecmp", "ecmp_seed": 0}


def v2_fields(data: dict[str, Any]) -> list[str]:
    """Version-2 fields a raw topology mapping uses (dotted paths)."""
    used = [k for k in V2_TOP if k in data]
    inter = data.get("inter")
    if isinstance(inter, dict):
        used += [f"inter.{k}" for k in V2_INTER if k in inter]
    return used


def upgrade(data: object) -> object:
    """A raw topology mapping of any version, as version 2 (anything else: unchanged, for the
    model to refuse). A file without `schema_version` is version 1 unless it uses version-2
    fields; `schema_version: 1` with version-2 fields is refused (one line)."""
    if not isinstance(data, dict):
        return data
    version = data.get("schema_version")
    if isinstance(version, bool) or version not in (None, 1):
        return data          # 2 as it is; a bool, string or unknown number: the field says so
    used = v2_fields(data)
    if version == 1 and used:
        raise ValueError(f"schema_version: 1 has no {', '.join(used)}; set schema_version: 2")
    return dict(data) | {"schema_version": 2}


def fingerprint_view(dump: dict[str, Any]) -> dict[str, Any]:
    """A topology's JSON dump as its fingerprint hashes it: without version-2 fields at their
    defaults, and as version 1 when nothing else is left (what a version-1 file hashed)."""
    out = dict(dump)
    for key in V2_TOP:
        if out.get(key) == []:
            out.pop(key)
    inter = out.get("inter")
    if isinstance(inter, dict):
        inter = dict(inter)
        for key, default in INTER_DEFAULTS.items():
            if key in inter and inter[key] == default:
                inter.pop(key)
        out["inter"] = inter
    if not v2_fields(out):
        out["schema_version"] = 1
    return out
