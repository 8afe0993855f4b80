"""The state file of a devcluster: ports, binaries, topology and the processes it started."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.devcluster.components import COMPONENTS, Layout, Ports
from phalanx.devcluster.processes import ProcessRecord


@dataclass(frozen=True)
class ClusterState:
    """What state.json records: enough for status and down to find the processes."""

    ports: Ports
    bin_dir: Path
    topology: Path | None
    expected_nodes: int | None
    processes: dict[str, ProcessRecord]

    def to_json(self) -> dict[str, Any]:
        return {
            "ports": self.ports.to_json(),
            "bin_dir": str(self.bin_dir),
            "topology": str(self.topology) if self.topology else None,
            "expected_nodes": self.expected_nodes,
            "processes": {name: rec.to_json() for name, rec in self.processes.items()},
        }


def load_state(layout: Layout) -> ClusterState | None:
    try:
        data = json.loads(layout.state_file.read_text())
    except FileNotFoundError:
        return None
    return ClusterState(
        ports=Ports.from_json(data["ports"]),
        bin_dir=Path(data["bin_dir"]),
        topology=Path(data["topology"]) if data.get("topology") else None,
        expected_nodes=data.get("expected_nodes"),
        processes={
            name: ProcessRecord.from_json(name, rec) for name, rec in data["processes"].items()
        },
    )


def save_state(layout: Layout, state: ClusterState) -> None:
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    tmp = layout.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    tmp.replace(layout.state_file)
    for name in COMPONENTS:
        pid_file = layout.pid_file(name)
        record = state.processes.get(name)
        if record is None:
            pid_file.unlink(missing_ok=True)
        else:
            pid_file.parent.mkdir(parents=True, exist_ok=True)
            pid_file.write_text(f"{record.pid}\n")
