"""Read a topology from a preset name or a YAML/JSON file, with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from hiercoll.errors import HiercollError, format_validation_error
from hiercoll.topology.model import Topology
from hiercoll.topology.presets import _NODE_TYPES, preset


def read_structured_file(path: Path) -> object:
    """Parse a YAML or JSON file, turning parse errors into one line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise HiercollError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        line = getattr(exc, "lineno", None) or getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" near line {line + (0 if path.suffix == '.json' else 1)}" if line is not None else ""
        fmt = "JSON" if path.suffix == ".json" else "YAML"
        raise HiercollError(f"{path}: not valid {fmt}{where}") from None


def topology_from_dict(data: object, source: str, num_nodes: int | None = None) -> Topology:
    if not isinstance(data, dict):
        raise HiercollError(f"{source}: expected a mapping with num_nodes, gpus_per_node, gpu, intra")
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
    if not path.exists():
        raise HiercollError(f"--topology: {text!r} is neither a preset ({', '.join(sorted(_NODE_TYPES))}) "
                            "nor an existing file")
    return topology_from_dict(read_structured_file(path), str(path), nodes)
