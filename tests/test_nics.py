"""Launch-template NIC layout, pure: one interface per network card up to the EFA maximum."""

from __future__ import annotations

import pytest

from gpucluster import catalog
from gpucluster.aws.nics import Nic, network_interfaces


def layout(name: str, efa: bool) -> list[tuple[int, int, str]]:
    record = catalog.get(name)
    assert record is not None
    return [(n.network_card_index, n.device_index, n.interface_type) for n in network_interfaces(record, efa)]


@pytest.mark.parametrize(("name", "count"), [("p5.48xlarge", 32), ("p4d.24xlarge", 4),
                                             ("g6e.48xlarge", 4), ("p5en.48xlarge", 16),
                                             ("p6-b200.48xlarge", 8), ("g6e.12xlarge", 1)])
def test_efa_layout_is_primary_efa_then_efa_only_per_card(name: str, count: int) -> None:
    nics = layout(name, efa=True)
    assert nics == [(0, 0, "efa")] + [(card, 0, "efa-only") for card in range(1, count)]


def test_p5_uses_all_32_cards_once() -> None:
    nics = layout("p5.48xlarge", efa=True)
    assert len(nics) == 32
    assert sorted(card for card, _, _ in nics) == list(range(32))
    assert sum(kind == "efa" for _, _, kind in nics) == 1  # one IP-carrying interface


def test_primary_is_never_efa_only() -> None:
    for name in catalog.names():
        record = catalog.get(name)
        assert record is not None
        if record.supports_efa:
            assert network_interfaces(record, efa=True)[0] == Nic(0, 0, "efa")


@pytest.mark.parametrize("name", ["g5.xlarge", "p5.48xlarge", "g6e.48xlarge"])
def test_efa_off_is_one_plain_ena_interface(name: str) -> None:
    assert layout(name, efa=False) == [(0, 0, "interface")]


def test_efa_on_a_type_without_efa_is_refused() -> None:
    record = catalog.get("g5.xlarge")
    assert record is not None
    with pytest.raises(ValueError, match=r"g5\.xlarge has no EFA"):
        network_interfaces(record, efa=True)
