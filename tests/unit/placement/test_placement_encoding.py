"""Kueue v1beta2 topologyAssignment encoding and per-pod node selectors."""

from __future__ import annotations

from typing import Any

import pytest
from placement_builders import BLOCK, HOST, RACK, fill, gang, make_topology, node_name

from phalanx.placement import decode_topology_assignment, encode_topology_assignment

BLOCK_RACK_EXAMPLE: dict[str, Any] = {
    # KEP-2724 "Since v1beta2", the example equivalent to v1beta1's
    # domains [{values: [block-1, rack-1], count: 4}, {values: [block-1, rack-2], count: 2}].
    "levels": [BLOCK, RACK],
    "slices": [
        {
            "domainCount": 2,
            "valuesPerLevel": [
                {"universal": "block-1"},
                {"individual": {"prefix": "rack-", "roots": ["1", "2"]}},
            ],
            "podCounts": {"individual": [4, 2]},
        }
    ],
}


def test_encodes_the_kep_example() -> None:
    domains = [(("block-1", "rack-1"), 4), (("block-1", "rack-2"), 2)]
    assert encode_topology_assignment([BLOCK, RACK], domains) == BLOCK_RACK_EXAMPLE


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["a1", "a1"], {"universal": "a1"}),
        (["a1", "b2"], {"individual": {"roots": ["a1", "b2"]}}),
        (
            ["node-1-x", "node-22-x"],
            {"individual": {"prefix": "node-", "suffix": "-x", "roots": ["1", "22"]}},
        ),
        # prefix and suffix must not overlap ("aba" is both of "aba" and "ababa")
        (["aba", "ababa"], {"individual": {"suffix": "aba", "roots": ["", "ab"]}}),
    ],
)
def test_compacts_values(values: list[str], expected: dict[str, Any]) -> None:
    encoded = encode_topology_assignment([HOST], [((v,), 1) for v in values])
    assert encoded["slices"][0]["valuesPerLevel"][0] == expected
    assert encoded["slices"][0]["podCounts"] == {"universal": 1}
    _, decoded = decode_topology_assignment(encoded)
    assert [d[0][0] for d in decoded] == values


def test_empty_assignment_has_no_slices() -> None:
    assert encode_topology_assignment([HOST], []) == {"levels": [HOST], "slices": []}


def test_kueue_multi_slice_form_decodes() -> None:
    # KEP-2724 Example 4: several slices, each with its own prefix.
    levels, domains = decode_topology_assignment(
        {
            "levels": [HOST],
            "slices": [
                {
                    "domainCount": 2,
                    "valuesPerLevel": [{"individual": {"prefix": "b1-r1-n", "roots": ["1", "2"]}}],
                    "podCounts": {"universal": 1},
                },
                {
                    "domainCount": 1,
                    "valuesPerLevel": [{"universal": "b1-r2-n1"}],
                    "podCounts": {"individual": [3]},
                },
            ],
        }
    )
    assert levels == (HOST,)
    assert domains == ((("b1-r1-n1",), 1), (("b1-r1-n2",), 1), (("b1-r2-n1",), 3))


def test_round_trip() -> None:
    levels, domains = decode_topology_assignment(BLOCK_RACK_EXAMPLE)
    assert levels == (BLOCK, RACK)
    assert domains == ((("block-1", "rack-1"), 4), (("block-1", "rack-2"), 2))
    assert encode_topology_assignment(levels, domains) == BLOCK_RACK_EXAMPLE


@pytest.mark.parametrize(
    ("broken", "field"),
    [
        ({"levels": [], "slices": []}, "topologyAssignment.levels"),
        (
            {"levels": [HOST], "slices": [{"domainCount": 2, "valuesPerLevel": []}]},
            "slices[0].valuesPerLevel",
        ),
        (
            {
                "levels": [HOST],
                "slices": [
                    {
                        "domainCount": 2,
                        "valuesPerLevel": [{"individual": {"roots": ["a"]}}],
                        "podCounts": {"universal": 1},
                    }
                ],
            },
            "slices[0].valuesPerLevel[0].individual.roots",
        ),
        (
            {
                "levels": [HOST],
                "slices": [
                    {
                        "domainCount": 1,
                        "valuesPerLevel": [{"individual": {"roots": ["a"]}, "universal": "a"}],
                        "podCounts": {"universal": 1},
                    }
                ],
            },
            "exactly one of universal, individual",
        ),
        (
            {
                "levels": [HOST],
                "slices": [{"domainCount": 1, "valuesPerLevel": [{"universal": "a"}]}],
            },
            "podCounts: exactly one of universal, individual",
        ),
        (
            {
                "levels": [HOST],
                "slices": [
                    {
                        "domainCount": 2,
                        "valuesPerLevel": [{"universal": "a"}],
                        "podCounts": {"individual": [1]},
                    }
                ],
            },
            "slices[0].podCounts.individual",
        ),
    ],
)
def test_decode_rejects_inconsistent_input(broken: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        decode_topology_assignment(broken)


def test_placement_with_hostname_level_writes_hostnames_only() -> None:
    topo = make_topology(blocks=1, racks=1, hosts=4)
    fill(topo, node_name(0, 0, 1), 4)
    result = topo.place(gang().preferred(3, gpus=4).obj())
    assert result.placement is not None
    ps = result.placement.pod_sets[0]
    assignment = ps.topology_assignment()
    assert assignment["levels"] == [HOST]
    _, domains = decode_topology_assignment(assignment)
    assert sum(count for _, count in domains) == 3
    selectors = ps.pod_node_selectors()
    assert len(selectors) == 3
    # pod index i -> the host its domain names, in the encoding's domain order
    expanded = [values[0] for values, count in domains for _ in range(count)]
    assert [s[HOST] for s in selectors] == expanded
    assert all(set(s) == {HOST} for s in selectors)
