"""Kueue's pod-template TAS annotations -> TopologyRequest."""

from __future__ import annotations

import pytest
from placement_builders import RACK

from phalanx.placement import (
    PlacementRequestError,
    TopologyRequest,
    topology_request_from_annotations,
)

REQ = "kueue.x-k8s.io/podset-required-topology"
PREF = "kueue.x-k8s.io/podset-preferred-topology"
UNC = "kueue.x-k8s.io/podset-unconstrained-topology"
SLICE = "kueue.x-k8s.io/podset-slice-required-topology"
SIZE = "kueue.x-k8s.io/podset-slice-size"


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, None),
        ({"unrelated": "x"}, None),
        ({REQ: RACK}, TopologyRequest.required(RACK)),
        ({PREF: RACK}, TopologyRequest.preferred(RACK)),
        ({UNC: "true"}, TopologyRequest.unconstrained()),
        ({UNC: "false"}, None),
        (
            {REQ: "block", SLICE: RACK, SIZE: "4"},
            TopologyRequest.required("block", slice_level=RACK, slice_size=4),
        ),
        ({SLICE: RACK, SIZE: "2"}, TopologyRequest.unconstrained(slice_level=RACK, slice_size=2)),
    ],
)
def test_annotations(annotations: dict[str, str], expected: TopologyRequest | None) -> None:
    assert topology_request_from_annotations(annotations) == expected


@pytest.mark.parametrize(
    ("annotations", "needle"),
    [
        ({REQ: RACK, PREF: RACK}, "mutually exclusive"),
        ({UNC: "yes"}, UNC),
        ({REQ: RACK, SIZE: "2"}, SLICE),
        ({SLICE: RACK, SIZE: "0"}, SIZE),
        ({SLICE: RACK, SIZE: "two"}, SIZE),
    ],
)
def test_bad_annotations_name_the_annotation(annotations: dict[str, str], needle: str) -> None:
    with pytest.raises(PlacementRequestError, match=needle):
        topology_request_from_annotations(annotations)
