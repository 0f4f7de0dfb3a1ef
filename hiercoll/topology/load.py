"""Read a topology from a preset name or a YAML/JSON file, with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hiercoll.errors import HiercollError, format_validation_error
from hiercoll.topology.model import Topology
from hiercoll.topology.presets import _NODE_TYPES, preset


def read_text(path: Path) -> str:
    """A user's file as UTF-8 text; unreadable or not UTF-8: one line naming the file."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise HiercollError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HiercollError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start}); save it as UTF-8") from None


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]
    """yaml.SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:   # the mapping's own keys; `<<: *anchor` may be overridden
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:      # an unhashable key: construct_mapping says so below
                    continue
                if dup:
                    raise _DuplicateKey(f"key {key!r} appears twice", key_node.start_mark.line)
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(ValueError):
    def __init__(self, what: str, line: int | None = None):
        super().__init__(what)
        self.what, self.line = what, line


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} appears twice")
        out[key] = value
    return out


# A YAML document may stand for this many values (lists, mappings and scalars, aliases expanded)
# or 10 per character of its text, whichever is more; without aliases it is at most 1 per character.
MIN_VALUE_LIMIT = 1_000_000


def _refuse_alias_blowup(data: object, path: Path, limit: int) -> None:
    """YAML aliases share one object between places: a few lines can stand for billions of
    values ("billion laughs") or contain themselves (`&a [*a]`), and pydantic or json.dumps
    expands them (minutes and GBs, or a traceback). Counted here with one visit per distinct
    object, before anything walks the document."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: object) -> int:
        if not isinstance(node, (list, dict)):
            return 1
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise HiercollError(f"{path}: a YAML alias refers to the value that contains it (a "
                                "cycle); write the value out instead of the alias")
        open_.add(key)
        total = 1
        for child in (node.values() if isinstance(node, dict) else node):
            total += size(child)
            if total > limit:
                raise HiercollError(f"{path}: its YAML aliases expand to more than {limit} values "
                                    "(a 'billion laughs' document); write the values out")
        open_.discard(key)
        sizes[key] = total
        return total

    size(data)


def read_structured_file(path: Path) -> object:
    """Parse a YAML or JSON file (UTF-8, no key twice in a mapping), turning every problem into one
    line naming the file."""
    text = read_text(path)
    fmt = "JSON" if path.suffix == ".json" else "YAML"
    try:
        if path.suffix == ".json":
            return json.loads(text, object_pairs_hook=_unique_pairs)
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
        _refuse_alias_blowup(data, path, limit=max(MIN_VALUE_LIMIT, 10 * len(text)))
        return data
    except _DuplicateKey as exc:
        where = f" (line {exc.line + 1})" if exc.line is not None else ""
        raise HiercollError(f"{path}: {exc.what}{where}; keep one") from None
    except RecursionError:
        raise HiercollError(f"{path}: not valid {fmt}: nested too deeply") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        line = getattr(exc, "lineno", None) or getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" near line {line + (0 if path.suffix == '.json' else 1)}" if line is not None else ""
        raise HiercollError(f"{path}: not valid {fmt}{where}") from None


# Keys `topo show --json` adds that are derived from the rest: accepted on load so its output
# is a topology file again; `world_size` must agree with the file, `fingerprint` is recomputed.
DERIVED_KEYS = ("fingerprint", "world_size")


def topology_from_dict(data: object, source: str, num_nodes: int | None = None) -> Topology:
    if not isinstance(data, dict):
        raise HiercollError(f"{source}: expected a mapping with num_nodes, gpus_per_node, gpu, intra")
    derived = {k: data[k] for k in DERIVED_KEYS if k in data}
    if derived:
        data = {k: v for k, v in data.items() if k not in DERIVED_KEYS}
    if "world_size" in derived:
        want = data.get("num_nodes", 0), data.get("gpus_per_node", 0)
        ws = derived["world_size"]
        if not (type(ws) is int and all(type(x) is int for x in want) and ws == want[0] * want[1]):
            raise HiercollError(f"{source}: world_size: {ws!r} is not num_nodes x gpus_per_node "
                                f"({want[0]!r} x {want[1]!r}); remove it (it is derived)")
    if num_nodes is not None:
        data = dict(data) | {"num_nodes": num_nodes}
    try:
        return Topology.model_validate(data)
    except ValidationError as err:
        raise HiercollError(format_validation_error(err, source)) from None


def load_topology(name_or_path: str | Path | Topology, nodes: int | None = None,
                  uncalibrated: bool = False) -> Topology:
    """A preset (`dgx-h100`, with `nodes`) or a file; a file's num_nodes is overridden by `nodes`.
    `uncalibrated`: a preset with its default costs even where a calibration ships."""
    if isinstance(name_or_path, Topology):
        return name_or_path if nodes is None else name_or_path.model_copy(update={"num_nodes": nodes})
    text = str(name_or_path)
    if text in _NODE_TYPES:
        return preset(text, nodes, uncalibrated)
    path = Path(text)
    try:
        exists = path.exists()
    except OSError as exc:      # e.g. a name longer than the file system allows
        raise HiercollError(f"--topology: {text!r}: cannot read ({exc.strerror})") from None
    if not exists:
        raise HiercollError(f"--topology: {text!r} is neither a preset ({', '.join(sorted(_NODE_TYPES))}) "
                            "nor an existing file")
    return topology_from_dict(read_structured_file(path), str(path), nodes)
