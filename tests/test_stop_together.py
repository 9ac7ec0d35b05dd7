"""Issue 36, item 13: stopping every rank at the same step, the pattern report's docs show."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from runtime import preemption, report

README = Path(__file__).parent.parent / "templates/project/{{cookiecutter.project_name}}/README.md"


class PretendPeer:
    """The other rank of a pretend two-rank group: its flag, and the flags this rank sent to all_reduce."""

    def __init__(self) -> None:
        self.flag = 0
        self.sent: list[int] = []

    def all_reduce(self, tensor: torch.Tensor, op: object = None) -> None:
        assert op == dist.ReduceOp.MAX
        self.sent.append(int(tensor.item()))
        tensor.fill_(max(int(tensor.item()), self.flag))


@pytest.fixture
def peer(monkeypatch: pytest.MonkeyPatch) -> PretendPeer:
    monkeypatch.setattr(preemption, "_received", None)
    monkeypatch.setattr(preemption, "_watched", False)
    other = PretendPeer()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(dist, "all_reduce", other.all_reduce)
    return other


def test_a_rank_without_the_signal_stops_with_the_peer_that_got_it(peer: PretendPeer) -> None:
    peer.flag = signal.SIGTERM.value
    assert report.should_stop_together() is True
    assert peer.sent == [0]  # this rank had no signal of its own
    assert preemption.requested() == "SIGTERM"  # it stops as if it got it


def test_no_rank_stops_when_none_got_a_signal(peer: PretendPeer) -> None:
    assert report.should_stop_together() is False
    assert peer.sent == [0]
    assert preemption.requested() is None


def test_asking_together_counts_as_asking_so_a_signal_is_noted_not_fatal(peer: PretendPeer) -> None:
    report.should_stop_together()
    assert preemption._watched


def test_report_and_the_readme_show_the_agreeing_form() -> None:
    for text in (report.__doc__ or "", README.read_text()):
        assert "report.should_stop_together()" in text
        assert not re.search(r"if report\.should_stop\(\):", text)  # one rank alone stops, its peers hang
